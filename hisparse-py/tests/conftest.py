import numpy as np
import pytest

import hisparse


def drifting(requests=2, steps=40, layers=2, k=8, prompt=64, seed=1):
    """Positions `(requests, steps, layers, k)`: a slowly drifting hot set plus the newest token,
    a few rows padded with -1."""
    rng = np.random.default_rng(seed)
    out = np.full((requests, steps, layers, k), -1, dtype=np.int64)
    for r in range(requests):
        hot = list(rng.choice(prompt, size=k, replace=False))
        for s in range(steps):
            newest = prompt + s
            if rng.random() < 0.3:
                hot[rng.integers(k)] = int(rng.integers(newest))
            for l in range(layers):
                row = set(hot[: k - 1 - (l + s) % 2]) | {newest}
                sel = sorted(row)[:k]
                out[r, s, l, : len(sel)] = rng.permutation(sel)
    return out


@pytest.fixture
def positions():
    return drifting()


@pytest.fixture
def trace(positions):
    return hisparse.Trace.from_array(positions)


def churning(steps=100, layers=2, k=32, prompt=1024, seed=0):
    """One request whose rows each select k - 1 of a pool of 3k positions that changes by a few
    a step (and the newest): many rows leave and come back, so a buffer between k and 2k evicts
    every step and equal priorities happen."""
    rng = np.random.default_rng(seed)
    out = np.full((steps, layers, k), -1, dtype=np.int64)
    pool = rng.choice(prompt, size=3 * k, replace=False)
    for s in range(steps):
        pool[rng.integers(len(pool), size=6)] = rng.integers(prompt + s, size=6)
        uniq = np.unique(pool)
        for l in range(layers):
            pick = rng.choice(uniq, size=min(k - 1, len(uniq)), replace=False)
            out[s, l, : len(pick)] = pick
            out[s, l, k - 1] = prompt + s
    return out
