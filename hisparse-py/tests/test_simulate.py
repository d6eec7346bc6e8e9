"""The simulator from Python: built-ins by name and as classes, Belady in every row, a policy
written in Python replaying exactly like the built-in it copies, errors named."""

import math

import pytest

import hisparse


class PyLRU(hisparse.PythonPolicy):
    """LRU in Python, as the built-in: a slot's first word stamps its last use (a hit ranks
    above a fill of the same step)."""

    name = "py-lru"

    def priority(self, record, env):
        return record[0]

    def on_insert(self, record, env):
        return (2 * env.step, 0)

    def on_hit(self, record, env):
        return (2 * env.step + 1, 0)


class PyFIFO(hisparse.PythonPolicy):
    name = "py-fifo"

    def priority(self, record, env):
        return record[0]

    def on_insert(self, record, env):
        return (env.step, 0)


def test_rows_hold_every_combination_with_belady(trace):
    k = trace.top_k
    rows = hisparse.simulate(trace, ["lru", "fifo", "clock"], [k, 2 * k], ["none", "adjacent-layer"])
    assert len(rows) == 4 * 2 * 2  # belady added
    for r in rows:
        assert r["hits"] + r["misses"] == r["selected"] > 0
        assert math.isclose(r["miss_ratio"], r["misses"] / r["selected"])
        assert r["misses"] >= r["belady_misses"] or r["prefetcher"] != "none"
        assert r["bytes"] >= r["misses"] * trace.row_bytes
    lru = {(r["buffer"], r["prefetcher"]): r for r in rows if r["policy"] == "lru"}
    assert lru[(2 * k, "none")]["misses"] <= lru[(k, "none")]["misses"]
    assert lru[(k, "none")]["misses"] > 0


def test_python_policies_replay_exactly_like_the_builtins(trace):
    # And a trace that evicts every step, where stamps of one step tie and their order matters
    # (an LRU that stamps fills and hits alike misses more on it).
    from conftest import churning

    for t in (trace, hisparse.Trace.from_array(churning())):
        _replay_like_builtins(t)


def _replay_like_builtins(trace):
    k = trace.top_k
    for builtin, mine in (("lru", PyLRU()), ("fifo", PyFIFO())):
        rows = hisparse.simulate(trace, [builtin, mine], [k, 2 * k], ["none", "adjacent-layer"], belady=False)
        by = {(r["policy"], r["buffer"], r["prefetcher"]): r for r in rows}
        for b in (k, 2 * k):
            for f in ("none", "adjacent-layer"):
                ours, theirs = by[(mine.name, b, f)], by[(builtin, b, f)]
                assert (ours["hits"], ours["misses"], ours["bytes"]) == (theirs["hits"], theirs["misses"], theirs["bytes"])


def test_classes_in_libcachesims_shape(trace):
    k = trace.top_k
    lru = hisparse.LRU(cache_size=2 * k)
    row = lru.process(trace)
    assert row["policy"] == "lru" and row["buffer"] == 2 * k
    # libCacheSim's process_trace: the miss ratio and the byte miss ratio.
    miss, byte_miss = lru.process_trace(trace)
    assert miss == row["miss_ratio"] and math.isclose(byte_miss, row["bytes"] / (row["selected"] * trace.row_bytes))
    assert math.isclose(byte_miss, miss)  # rows are one size, nothing prefetched
    assert hisparse.Belady(2 * k).process_trace(trace)[0] <= miss
    assert hisparse.Clock(cache_size=2 * k, hashpower=20).process_trace(trace)[0] > 0
    assert PyLRU().process(trace, 2 * k)["misses"] == row["misses"]
    buffers, ratios = hisparse.miss_ratio_curve(trace, "belady")
    assert buffers == sorted(buffers) and all(a >= b for a, b in zip(ratios, ratios[1:]))
    assert hisparse.miss_ratio_curve(trace, hisparse.LRU(3 * k))[0] == hisparse.miss_ratio_curve(trace, "lru")[0]
    for bad, name in (
        (lambda: hisparse.LRU(0), "cache_size"),
        (lambda: hisparse.LRU(0.1), "cache_size"),
        (lambda: hisparse.LRU(2**70), "cache_size"),
        (lambda: PyLRU().process(trace, -5), "cache_size"),
        (lambda: hisparse.LRU(64, default_ttl=5), "default_ttl"),
        (lambda: hisparse.LRU(64, consider_obj_metadata=True), "consider_obj_metadata"),
        (lambda: hisparse.LRU(64, admissioner=object()), "admissioner"),
        (lambda: hisparse.LRU(64, reader=object()), "reader"),
        (lambda: lru.process_trace(trace, start_req=5), "start_req"),
        (lambda: lru.process_trace(trace, max_req=5), "max_req"),
    ):
        with pytest.raises(ValueError) as e:
            bad()
        assert str(e.value).startswith(name), str(e.value)


def test_a_class_is_replayed_at_its_own_cache_size(trace):
    k = trace.top_k
    rows = hisparse.simulate(trace, [hisparse.LRU(3 * k), hisparse.FIFO(3 * k)], belady=False)
    assert {(r["policy"], r["buffer"]) for r in rows} == {("lru", 3 * k), ("fifo", 3 * k)}
    with pytest.raises(ValueError, match="^buffers: a policy class of cache_size"):
        hisparse.simulate(trace, [hisparse.LRU(3 * k)], [2 * k])
    with pytest.raises(ValueError, match="^policies: classes of cache_size"):
        hisparse.simulate(trace, [hisparse.LRU(3 * k), hisparse.FIFO(2 * k)])


def test_rows_make_a_dataframe(trace):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(hisparse.simulate(trace, ["lru", "s3fifo"]))
    assert set(df["policy"]) == {"lru", "s3fifo", "belady"}
    assert (df["vs_belady"] >= 1.0).all()


class Raises(hisparse.PythonPolicy):
    name = "raises"

    def priority(self, record, env):
        raise KeyError("boom")

    def on_insert(self, record, env):
        return None


class BadReturn(PyLRU):
    name = "bad-return"

    def on_insert(self, record, env):
        return "not a record"


def test_a_python_policys_failure_is_raised_with_the_hook_named(trace):
    with pytest.raises(RuntimeError, match=r"raises\.priority") as e:
        hisparse.simulate(trace, [Raises()], [trace.top_k])
    assert isinstance(e.value.__cause__, KeyError)
    with pytest.raises(RuntimeError, match=r"bad-return\.on_insert"):
        hisparse.simulate(trace, [BadReturn()], [trace.top_k])


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        ({"buffers": [1]}, ValueError, "buffers"),
        ({"buffers": []}, ValueError, "buffers"),
        ({"buffers": [-4]}, ValueError, "buffers"),
        ({"policies": ["nope"]}, ValueError, "policies"),
        ({"policies": []}, ValueError, "policies"),
        ({"policies": [object()]}, TypeError, "policies"),
        ({"prefetchers": ["nope"]}, ValueError, "prefetchers"),
        ({"prefetchers": ["next-step"]}, ValueError, "prefetchers"),
        ({"policies": ["score"]}, ValueError, "policies"),
        ({"buffers": [2**64]}, ValueError, "buffers"),
        ({"buffers": [2**200]}, ValueError, "buffers"),
        ({"buffers": ["8"]}, TypeError, "buffers"),
        ({"warmup_steps": -1}, ValueError, "warmup_steps"),
        ({"warmup_steps": 2**70}, ValueError, "warmup_steps"),
        ({"warmup_steps": 10_000}, ValueError, "warmup_steps"),
        ({"seed": -3}, ValueError, "seed"),
        ({"seed": 2**64}, ValueError, "seed"),
        ({"seed": True}, TypeError, "seed"),
    ],
)
def test_bad_arguments_name_themselves(trace, kwargs, exc, name):
    with pytest.raises(exc) as e:
        hisparse.simulate(trace, **kwargs)
    assert str(e.value).startswith(name), str(e.value)


def test_names():
    assert "lru" in hisparse.builtin_policies() and "belady" in hisparse.builtin_policies()
    assert "next-step" in hisparse.builtin_prefetchers()


class Slow(PyLRU):
    """LRU whose hooks take a millisecond, and that presses Ctrl-C (as a user would) once the
    replay is under way."""

    name = "slow"
    calls = 0

    def priority(self, record, env):
        import _thread
        import time

        Slow.calls += 1
        if Slow.calls == 50:
            _thread.interrupt_main()
        time.sleep(0.001)
        return record[0]


def test_ctrl_c_stops_a_long_replay(trace):
    import time

    from conftest import churning

    import signal

    long = hisparse.Trace.from_array(churning(steps=400))  # about 12 s to replay in full
    # Python's own Ctrl-C handler, even where the runner was started with SIGINT ignored (a
    # background job of a shell).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            hisparse.simulate(long, [Slow()], [40])
        assert time.monotonic() - t0 < 5
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_trace_read_without_scores_replays_from_its_encoded_positions(tmp_path):
    """LRU and FIFO over a file read with scores=False run a stream at a time from the encoded
    positions; the rows are those of the same trace decoded (and of the other policies, which
    decode it)."""
    from conftest import churning

    t = hisparse.Trace.from_array(churning())
    p = tmp_path / "t.hstrace"
    t.write(p)
    encoded = hisparse.Trace.read(p, scores=False)
    for policies in (["lru", "fifo"], ["lru", "fifo", "clock"]):
        want = hisparse.simulate(t, policies, [32, 48], warmup_steps=3, belady=False)
        got = hisparse.simulate(encoded, policies, [32, 48], warmup_steps=3, belady=False)
        assert got == want
        assert sum(r["misses"] for r in got) > 100
    assert (encoded.to_arrays()["selected"] == t.to_arrays()["selected"]).all()
    assert encoded.requests == t.requests and len(encoded) == len(t)


def test_a_trace_read_from_a_pipe_without_scores_replays_alike(tmp_path):
    """A trace read from a FIFO (no length, no seeking) without scores: read whole, positions
    kept encoded, the same rows as the trace it was written from."""
    import os
    import threading

    from conftest import churning

    t = hisparse.Trace.from_array(churning())
    p = tmp_path / "t.hstrace"
    t.write(p)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(p.read_bytes()))
    writer.start()
    piped = hisparse.Trace.read(fifo, scores=False)
    writer.join()
    want = hisparse.simulate(t, ["lru", "fifo"], [32, 48], belady=False)
    assert hisparse.simulate(piped, ["lru", "fifo"], [32, 48], belady=False) == want
    assert len(piped) == len(t)


def test_a_score_policy_on_a_trace_read_without_scores_says_so(tmp_path):
    """The message names scores=False, not a trace version."""
    from conftest import churning

    p = tmp_path / "t.hstrace"
    hisparse.Trace.from_array(churning()).write(p)
    t = hisparse.Trace.read(p, scores=False)
    for kwargs, name in (({"policies": ["score"]}, "policies"), ({"prefetchers": ["next-step"]}, "prefetchers")):
        with pytest.raises(ValueError) as e:
            hisparse.simulate(t, buffers=[64], **kwargs)
        assert str(e.value).startswith(name) and "scores=False" in str(e.value), str(e.value)
    # Read with its scores (it has none), the message says what a trace needs: version 3.
    with pytest.raises(ValueError, match="version 3"):
        hisparse.simulate(hisparse.Trace.read(p), ["score"], [64])


def test_the_interpreter_exits_cleanly_after_a_python_policys_replay():
    """The replay's threads drop their Python thread states before simulate returns: an
    interpreter that exits right after (while the pool's threads are still ending) neither
    aborts nor prints a fatal error."""
    import subprocess
    import sys

    script = (
        "import numpy as np, hisparse\n"
        "class P(hisparse.PythonPolicy):\n"
        "    def priority(self, record, env): return record[0]\n"
        "    def on_insert(self, record, env): return (env.step, 0)\n"
        "t = hisparse.Trace.from_array(np.array([[[0, 1], [1, 2]], [[2, 3], [0, 3]]]))\n"
        "hisparse.simulate(t, [P()], [2])\n"
    )
    for _ in range(5):
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "FATAL" not in r.stderr, r.stderr
