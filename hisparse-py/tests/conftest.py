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
