"""Miss-ratio curves of a selection trace, as a notebook would draw them.

    python examples/miss_ratio_plot.py [TRACE.hstrace] [--out miss_ratio.png]

Without a trace file it builds one from a NumPy array (two requests whose selections drift).
It replays the trace under LRU, S3-FIFO, Belady's bound and a policy written in Python (LRU
that spares the first 4 positions, attention sinks), prints the table a pandas DataFrame makes
of the rows, and plots miss ratio against buffer size with matplotlib.
"""

import argparse
import time

import numpy as np

import hisparse


class SinkLRU(hisparse.PythonPolicy):
    """LRU that never evicts positions 0..3 while others are there."""

    name = "sink-lru"

    def priority(self, record, env):
        return record[0] + (1 << 40 if env.token < 4 else 0)

    def on_insert(self, record, env):
        return (2 * env.step, 0)

    def on_hit(self, record, env):
        return (2 * env.step + 1, 0)


def synthetic(steps=200, layers=4, k=64, prompt=2048, seed=0):
    """Two requests: each step selects k - 1 positions of a slowly changing hot set, and the
    newest token."""
    rng = np.random.default_rng(seed)
    out = np.full((2, steps, layers, k), -1, dtype=np.int64)
    for r in range(2):
        hot = rng.choice(prompt, size=4 * k, replace=False)
        for s in range(steps):
            hot[rng.integers(len(hot), size=8)] = rng.integers(prompt + s, size=8)
            pool = np.unique(hot)
            for l in range(layers):
                pick = rng.choice(pool, size=min(k - 1, len(pool)), replace=False)
                out[r, s, l, : len(pick)] = pick
                out[r, s, l, k - 1] = prompt + s
    return hisparse.Trace.from_array(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?")
    ap.add_argument("--out", default="miss_ratio.png")
    a = ap.parse_args()
    trace = hisparse.Trace.read(a.trace) if a.trace else synthetic()
    print(trace)
    k = trace.top_k
    buffers = [k, k * 3 // 2, 2 * k, 3 * k, 4 * k]
    t = time.perf_counter()
    rows = hisparse.simulate(trace, ["lru", "s3fifo", SinkLRU()], buffers)
    print(f"simulated in {time.perf_counter() - t:.2f} s")
    try:
        import pandas as pd

        df = pd.DataFrame(rows)
        print(df.pivot(index="buffer", columns="policy", values="miss_ratio").round(4))
    except ImportError:
        for r in rows:
            print(r["policy"], r["buffer"], round(r["miss_ratio"], 4))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ["lru", "s3fifo", "sink-lru", "belady"]:
        pts = sorted((r["buffer"], r["miss_ratio"]) for r in rows if r["policy"] == name)
        ax.plot([b / k for b, _ in pts], [m for _, m in pts], marker="o", label=name)
    ax.set_xlabel("buffer slots / top-k")
    ax.set_ylabel("miss ratio")
    ax.set_title("Miss ratio against buffer size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
