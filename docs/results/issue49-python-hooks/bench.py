"""Issue 49: what one hook call of a Python policy costs in a replay. A PythonPolicy copying
LRU (priority, on_insert, on_hit) replays a churning trace at two buffer sizes; the built-in LRU
replays the same; the cost per call is (Python's time - the built-in's) / calls. Medians of
ROUNDS interleaved rounds after a warm-up; min and max beside them.

    python docs/results/issue49-python-hooks/bench.py [ROUNDS]
"""
import statistics
import sys
import time

import os

import hisparse

# The tests' churning trace (one request whose rows leave and come back, evicting every step).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "hisparse-py", "tests"))
from conftest import churning  # noqa: E402


class Counted(hisparse.PythonPolicy):
    name = "py-lru"
    calls = 0

    def priority(self, record, env):
        Counted.calls += 1
        return record[0]

    def on_insert(self, record, env):
        Counted.calls += 1
        return (2 * env.step, 0)

    def on_hit(self, record, env):
        Counted.calls += 1
        return (2 * env.step + 1, 0)


def timed(trace, policy):
    t = time.perf_counter()
    rows = hisparse.simulate(trace, [policy], [40, 48], belady=False)
    return time.perf_counter() - t, rows


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    trace = hisparse.Trace.from_array(churning(steps=200))
    timed(trace, Counted())  # warm-up
    timed(trace, "lru")
    per_call = []
    for _ in range(rounds):
        Counted.calls = 0
        py, py_rows = timed(trace, Counted())
        builtin, rows = timed(trace, "lru")
        assert [r["misses"] for r in py_rows] == [r["misses"] for r in rows]
        per_call.append((py - builtin) / Counted.calls * 1e6)
    print(f"calls per replay {Counted.calls}, per call: median {statistics.median(per_call):.2f} us "
          f"[{min(per_call):.2f}-{max(per_call):.2f}] over {rounds} rounds")


if __name__ == "__main__":
    main()
