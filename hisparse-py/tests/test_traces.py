"""Traces from arrays, SGLang's indexer_topk and files; bad input raises an exception naming
the argument, never a crash."""

import base64

import numpy as np
import pytest

import hisparse


def test_from_array_keeps_every_position_and_pads(positions):
    t = hisparse.Trace.from_array(positions)
    requests, steps, layers, k = positions.shape
    assert len(t) == requests * steps * layers
    assert (t.top_k, t.layers, t.requests) == (k, layers, [0, 1])
    a = t.to_arrays()
    assert a["selected"].shape == (len(t), k)
    # Record order: step, then request, then layer; each row the sorted positions, -1 padded.
    i = 0
    for s in range(steps):
        for r in range(requests):
            for l in range(layers):
                want = np.sort(positions[r, s, l][positions[r, s, l] >= 0])
                got = a["selected"][i]
                assert list(got[: len(want)]) == list(want) and (got[len(want) :] == -1).all()
                assert (a["step"][i], a["request"][i], a["layer"][i]) == (s, r, l)
                # By default the sequence reaches one past the newest position selected so far.
                assert a["seq_len"][i] == positions[r, : s + 1][positions[r, : s + 1] >= 0].max() + 1
                i += 1


def test_one_request_may_drop_the_first_axis(positions):
    one = hisparse.Trace.from_array(positions[0])
    assert one.requests == [0] and len(one) == positions.shape[1] * positions.shape[2]
    shifted = hisparse.Trace.from_array(positions[1], first_request=7)
    assert shifted.requests == [7]


def test_write_read_round_trip_and_no_silent_replace(tmp_path, trace):
    p = tmp_path / "t.hstrace"
    trace.write(p)
    back = hisparse.Trace.read(p)
    for key, col in trace.to_arrays().items():
        assert (back.to_arrays()[key] == col).all(), key
    with pytest.raises(FileExistsError):
        trace.write(p)
    other = hisparse.Trace.from_array(np.array([[[0, 1]]]))
    other.write(str(p), overwrite=True)
    assert len(hisparse.Trace.read(p)) == 1
    assert sorted(x.name for x in tmp_path.iterdir()) == ["t.hstrace"]  # no temporary left


def test_from_sglang_reads_base64_int32(positions):
    one = positions[0].astype(np.int32)  # (tokens, layers, top_k)
    text = base64.b64encode(one.tobytes()).decode()
    prompt = int(one.max()) + 1
    t = hisparse.Trace.from_sglang(text, layers=one.shape[1], top_k=one.shape[2], prompt_tokens=prompt)
    want = hisparse.Trace.from_array(
        one, seq_lens=prompt + np.arange(one.shape[0]) + 1, top_k=one.shape[2]
    )
    for key, col in want.to_arrays().items():
        assert (t.to_arrays()[key] == col).all(), key
    same = hisparse.Trace.from_sglang(text.encode(), layers=one.shape[1], top_k=one.shape[2], prompt_tokens=prompt)
    assert len(same) == len(t)


def _b64(rows):
    import base64

    return base64.b64encode(np.array(rows, dtype="<i4").tobytes()).decode()


@pytest.mark.parametrize(
    "make, exc, name",
    [
        (lambda: hisparse.Trace.from_array(np.zeros((2, 2, 2), dtype=np.float32)), TypeError, "selected"),
        (lambda: hisparse.Trace.from_array(np.zeros((2, 2), dtype=np.int64)), ValueError, "selected"),
        (lambda: hisparse.Trace.from_array(np.array([[[0, -5]]])), ValueError, "selected[0, 0, 1]"),
        (lambda: hisparse.Trace.from_array(np.array([[[3, 3]]])), ValueError, "selected[0, 0]"),
        (lambda: hisparse.Trace.from_array(np.array([[[2**40, 1]]])), ValueError, "selected"),
        (lambda: hisparse.Trace.from_array(np.array([[[0, 1, 2]]]), top_k=2), ValueError, "top_k"),
        (lambda: hisparse.Trace.from_array(np.array([[[0, 5]]]), seq_lens=[5]), ValueError, "seq_lens[0, 0]"),
        (lambda: hisparse.Trace.from_array(np.array([[[0, 5]]]), seq_lens=[6, 7]), ValueError, "seq_lens"),
        (lambda: hisparse.Trace.from_array("not an array"), TypeError, "selected"),
        (lambda: hisparse.Trace.from_sglang("%%%", layers=1, top_k=2, prompt_tokens=3), ValueError, "indexer_topk"),
        (lambda: hisparse.Trace.from_sglang("AAAA", layers=1, top_k=2, prompt_tokens=3), ValueError, "indexer_topk"),
        (lambda: hisparse.Trace.from_sglang(3, layers=1, top_k=2, prompt_tokens=3), TypeError, "indexer_topk"),
        (lambda: hisparse.Trace.from_sglang("", layers=0, top_k=2, prompt_tokens=3), ValueError, "layers"),
        (lambda: hisparse.Trace.from_sglang("AAAA", layers=1, top_k=0, prompt_tokens=3), ValueError, "top_k"),
        (lambda: hisparse.Trace.from_sglang("AAAA", layers=1, top_k=-2, prompt_tokens=3), ValueError, "top_k"),
        (lambda: hisparse.Trace.from_sglang("AAAA", layers=1, top_k=1, prompt_tokens=-1), ValueError, "prompt_tokens"),
        (lambda: hisparse.Trace.from_sglang("AAAA", layers=1, top_k=1, prompt_tokens=2**31), ValueError, "prompt_tokens"),
        (lambda: hisparse.Trace.from_sglang("AAAA", layers=1, top_k=1, prompt_tokens=3, request=-1), ValueError, "request"),
        (lambda: hisparse.Trace.from_sglang("", layers=1, top_k=1, prompt_tokens=3), ValueError, "indexer_topk"),
        (lambda: hisparse.Trace.from_sglang(_b64([[5]]), layers=1, top_k=1, prompt_tokens=3), ValueError, "indexer_topk[0]"),
        (lambda: hisparse.Trace.from_array(np.array([[[0, 1]]]), top_k=-1), ValueError, "top_k"),
        (lambda: hisparse.Trace.from_array(np.array([[[0, 1]]]), top_k=0), ValueError, "top_k"),
        (lambda: hisparse.Trace.from_array(np.array([[[0, 1]]]), row_bytes=2**40), ValueError, "row_bytes"),
        (lambda: hisparse.Trace.from_array(np.array([[[0, 1]]]), first_request=-1), ValueError, "first_request"),
        (lambda: hisparse.Trace.from_array(np.zeros((2, 1, 1, 1), dtype=np.int64), first_request=2**64 - 1), ValueError, "first_request"),
        (lambda: hisparse.Trace.from_array(np.array([[[2**64 - 1, 1]]], dtype=np.uint64)), ValueError, "selected"),
        (lambda: hisparse.Trace.from_array(np.full((2, 1, 3), -1)), ValueError, "selected"),
        (lambda: hisparse.Trace.from_array(np.zeros((0, 1, 3), dtype=np.int64)), ValueError, "selected"),
        (lambda: hisparse.Trace.from_array(np.array([[[0]], [[1]]]), seq_lens=[9, 5]), ValueError, "seq_lens[0, 1]"),
        (lambda: hisparse.Trace.read("x.hstrace", max_bytes=-1), ValueError, "max_bytes"),
    ],
)
def test_bad_input_names_the_argument(make, exc, name):
    with pytest.raises(exc) as e:
        make()
    assert str(e.value).startswith(name), str(e.value)


def test_bad_files_raise_naming_the_path(tmp_path, trace):
    with pytest.raises(ValueError, match="path"):
        hisparse.Trace.read(tmp_path / "missing.hstrace")
    good = tmp_path / "good.hstrace"
    trace.write(good)
    data = bytearray(good.read_bytes())
    for cut in (7, len(data) // 2):
        bad = tmp_path / f"cut{cut}.hstrace"
        bad.write_bytes(bytes(data[:cut]))
        with pytest.raises(ValueError, match="path"):
            hisparse.Trace.read(bad)
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    bad = tmp_path / "flipped.hstrace"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="path"):
        hisparse.Trace.read(bad)
    with pytest.raises(ValueError, match="path"):
        hisparse.Trace.read(good, max_bytes=10)


def test_a_trace_read_without_scores_keeps_the_selections(tmp_path):
    import numpy as np

    t = hisparse.Trace.from_array(np.array([[[0, 1]], [[1, 2]]]))
    p = tmp_path / "t.hstrace"
    t.write(p)
    back = hisparse.Trace.read(p, scores=False)
    assert not back.has_scores and len(back) == 2
    assert (back.to_arrays()["selected"] == t.to_arrays()["selected"]).all()


def test_a_trace_iterates_its_records(positions):
    t = hisparse.Trace.from_array(positions)
    rows = list(t)
    assert len(rows) == len(t)
    a = t.to_arrays()
    for i, (step, request, layer, seq_len, selected) in enumerate(rows):
        assert (step, request, layer, seq_len) == (a["step"][i], a["request"][i], a["layer"][i], a["seq_len"][i])
        assert selected == [int(x) for x in a["selected"][i] if x >= 0]


def test_arrays_that_would_not_fit_raise_memory_error():
    import numpy as np

    # A top_k of 2**20 over 20000 records: 80 GB of padded positions, refused before allocating.
    t = hisparse.Trace.from_array(np.zeros((20000, 1, 1), dtype=np.int64), top_k=1 << 20)
    with pytest.raises(MemoryError, match="to_arrays"):
        t.to_arrays()
    assert len(list(t)) == 20000  # iterating holds only what the records hold


def test_a_fault_only_decoding_meets_is_raised_when_the_trace_is_read(tmp_path):
    """A record whose checksum is right but whose count runs past its positions: read without
    scores (positions kept encoded) it raises at read, as the decoding read does."""
    import struct
    import zlib

    def record(step, count, deltas):
        body = struct.pack("<IQIII", step, 0, 0, 100 + step, count) + bytes(deltas)
        body += struct.pack("<I", zlib.crc32(body))
        return b"\x01" + struct.pack("<I", len(body)) + body

    head = b"HSPTRACE" + struct.pack("<HHIIII", 1, 0, 8, 1, 656, 0)
    head += struct.pack("<I", zlib.crc32(head))
    end = struct.pack("<Q", 3)
    data = head + record(1, 2, [3, 4]) + record(2, 3, [3, 4]) + record(3, 2, [5, 1]) + b"\xff" + end
    data += struct.pack("<I", zlib.crc32(end))
    p = tmp_path / "bad.hstrace"
    p.write_bytes(data)
    for scores in (True, False):
        with pytest.raises(ValueError, match="positions run past the record"):
            hisparse.Trace.read(p, scores=scores)
    good = tmp_path / "good.hstrace"
    good.write_bytes(head + record(1, 2, [3, 4]) + record(2, 2, [3, 4]) + record(3, 2, [5, 1]) + b"\xff" + end + struct.pack("<I", zlib.crc32(end)))
    assert len(hisparse.Trace.read(good, scores=False)) == 3


def test_ctrl_c_stops_a_read_waiting_on_a_fifo(tmp_path):
    """A FIFO nobody writes, and one whose writer stalls: Ctrl-C (KeyboardInterrupt) ends the
    wait, as Python's own open does."""
    import _thread
    import os
    import signal
    import threading
    import time

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for stalled in (False, True):
            stop = threading.Event()
            if stalled:
                def writer():
                    with open(fifo, "wb") as f:
                        f.write(b"HSTR")
                        f.flush()
                        stop.wait(10)

                threading.Thread(target=writer, daemon=True).start()
            threading.Timer(0.5, _thread.interrupt_main).start()
            t0 = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                hisparse.Trace.read(fifo)
            assert time.monotonic() - t0 < 5
            stop.set()
    finally:
        signal.signal(signal.SIGINT, before)
