"""Simulator speed from both sides: hisparse (CLI and Python) against libCacheSim's LRU, on a
version-1 trace and on one that carries near-cut scores (version 2).

    python bench.py HISPARSE_BIN [OLD_HISPARSE_BIN]

Runs in the current folder: makes the two traces with `hisparse trace synth` (once), converts
each (request, layer) stream to an oracleGeneral file for libCacheSim (once; not timed), then
times, pinned to one core (this driver pins itself to core 1 and its children inherit it; one
rayon thread), 5 interleaved rounds after one warm-up round:
  - cli:      `hisparse simulate --trace T --policies lru --buffers 4096` as a whole process;
  - cli-old:  the same with OLD_HISPARSE_BIN (if given);
  - python:   hisparse.Trace.read(T, scores=False) + hisparse.simulate(..., ["lru"], [4096]) in
              a fresh interpreter, timed inside it (the import excluded);
  - lcs:      libCacheSim 0.3.5: per stream an LRU of 4096 objects (hashpower 15) over its
              oracleGeneral file with process_trace, in a fresh interpreter, timed inside it.
Prints medians [min-max] in ms and selected tokens per second, and the miss ratios.
"""

import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile

TRACES = {
    "v1": ["--requests", "8", "--layers", "4", "--steps", "200", "--prompt", "32768", "--top-k", "2048", "--seed", "3"],
    "v2": ["--requests", "2", "--layers", "2", "--steps", "80", "--prompt", "65536", "--rho", "0.85",
           "--score-margin", "6144", "--scores"],
}
CORE = 1
ENV = dict(os.environ, RAYON_NUM_THREADS="1")


def make_traces(hs):
    for name, args in TRACES.items():
        path = f"{name}.hstrace"
        if not os.path.exists(path):
            subprocess.run([hs, "trace", "synth", *args, "--out", path], check=True, capture_output=True)


def convert(name):
    """oracleGeneral files, one per stream: (u32 time, u64 id, u32 size, i64 next) records."""
    import hisparse

    folder = f"{name}-lcs"
    if os.path.isdir(folder):
        return sorted(os.path.join(folder, f) for f in os.listdir(folder))
    os.makedirs(folder)
    t = hisparse.Trace.read(f"{name}.hstrace", scores=False).to_arrays()
    streams = {}
    for i in range(len(t["step"])):
        key = (int(t["request"][i]), int(t["layer"][i]))
        sel = t["selected"][i]
        streams.setdefault(key, []).append((int(t["step"][i]), sel[sel >= 0]))
    paths = []
    for (r, l), rows in sorted(streams.items()):
        p = os.path.join(folder, f"r{r}-l{l}.oracleGeneral")
        with open(p, "wb") as f:
            for step, sel in sorted(rows, key=lambda x: x[0]):
                f.write(b"".join(struct.pack("<IQIq", step, int(x), 1, -1) for x in sel))
        paths.append(p)
    return paths


PY_OURS = """
import sys, time, hisparse
t0 = time.perf_counter()
t = hisparse.Trace.read(sys.argv[1], scores=False)
rows = hisparse.simulate(t, ["lru"], [4096], belady=False)
print(time.perf_counter() - t0, rows[0]["miss_ratio"], rows[0]["selected"])
"""

PY_LCS = """
import sys, time, libcachesim as lcs
t0 = time.perf_counter()
miss = n = 0.0
for p in sys.argv[1:]:
    reader = lcs.TraceReader(p, lcs.TraceType.ORACLE_GENERAL_TRACE)
    cache = lcs.LRU(4096, hashpower=15)
    mr, _ = cache.process_trace(reader)
    k = reader.get_num_of_req() if hasattr(reader, "get_num_of_req") else 1
    miss += mr * k
    n += k
print(time.perf_counter() - t0, miss / n, n)
"""


def timed(cmd):
    out = tempfile.mkdtemp()
    import time

    t0 = time.perf_counter()
    subprocess.run(cmd + ["--out", out + "/o"], check=True, capture_output=True, env=ENV)
    return time.perf_counter() - t0, None


def inner(code, args):
    r = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, env=ENV, text=True)
    secs, mr, n = r.stdout.split()
    return float(secs), (float(mr), float(n))


def main():
    hs = sys.argv[1]
    # Pinned here, not by a `taskset` started before each command: its start-up would be timed
    # as the CLI's.
    os.sched_setaffinity(0, {CORE})
    old = sys.argv[2] if len(sys.argv) > 2 else None
    make_traces(hs)
    results = {}
    for name in TRACES:
        files = convert(name)
        runs = {
            "cli": lambda: timed([hs, "simulate", "--trace", f"{name}.hstrace", "--policies", "lru", "--buffers", "4096"]),
            "python": lambda: inner(PY_OURS, [f"{name}.hstrace"]),
            "lcs": lambda: inner(PY_LCS, files),
        }
        if old:
            runs["cli-old"] = lambda: timed([old, "simulate", "--trace", f"{name}.hstrace", "--policies", "lru", "--buffers", "4096"])
        times = {k: [] for k in runs}
        extra = {}
        for rnd in range(6):
            for k, f in runs.items():
                secs, info = f()
                if rnd > 0:
                    times[k].append(secs)
                if info:
                    extra[k] = info
        results[name] = {k: (statistics.median(v), min(v), max(v)) for k, v in times.items()}
        results[name]["info"] = extra
    print(json.dumps(results, indent=1))
    for name, r in results.items():
        n = r["info"].get("python", (0, 0))[1]
        for k in ("cli", "cli-old", "python", "lcs"):
            if k in r:
                med, lo, hi = r[k]
                print(f"{name} {k:8} {1e3 * med:8.1f} ms [{1e3 * lo:.1f}-{1e3 * hi:.1f}]  {n / med / 1e6:6.1f} M tokens/s")
        print(f"{name} miss ratios: ours {r['info'].get('python')}, libCacheSim {r['info'].get('lcs')}")


if __name__ == "__main__":
    main()
