"""hisparse from Python: selection traces, KV eviction policies and the trace-driven simulator.

A *trace* records which past positions a sparse-attention model selected at every decode step,
per request and layer (``Trace``: read from hisparse's files, built from a NumPy array with -1
padding, or from SGLang's ``indexer_topk``). ``simulate`` replays it through the hot buffer of
every policy, prefetcher and buffer size you name and returns rows a ``pandas.DataFrame`` takes,
with Belady's offline bound beside each. The policies are also classes in libCacheSim's shape
(``LRU(cache_size=64).process_trace(trace)`` returns the miss ratio and the byte miss ratio), and a policy can be written in Python: a class with
the hooks of hisparse's ``EvictionPolicy`` (see ``PythonPolicy``), replayed by the same
simulator.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ._hisparse import SlotEnv, Trace, builtin_policies, builtin_prefetchers, simulate

__all__ = [
    "Trace",
    "SlotEnv",
    "simulate",
    "miss_ratio_curve",
    "builtin_policies",
    "builtin_prefetchers",
    "Policy",
    "PythonPolicy",
    "LRU",
    "FIFO",
    "Clock",
    "S3FIFO",
    "MQ",
    "Random",
    "Score",
    "Belady",
]


def miss_ratio_curve(
    trace: Trace,
    policy: Any = "lru",
    buffers: Optional[Sequence[int]] = None,
    prefetcher: str = "none",
) -> Tuple[List[int], List[float]]:
    """Miss ratio of ``policy`` (a name, a policy class — its kind, whatever its size — or a
    ``PythonPolicy``) at each buffer size (default: 1, 1.5, 2, 3, 4 and 8 times the trace's
    top-k)."""
    k = trace.top_k
    if buffers is None:
        buffers = [k, k * 3 // 2, 2 * k, 3 * k, 4 * k, 8 * k]
    name = _name_of(policy)
    chosen = name if isinstance(policy, Policy) else policy
    rows = simulate(trace, [chosen], list(buffers), [prefetcher], belady=(name == "belady"))
    mine = sorted((r["buffer"], r["miss_ratio"]) for r in rows if r["policy"] == name)
    return [b for b, _ in mine], [m for _, m in mine]


def _name_of(policy: Any) -> str:
    if isinstance(policy, str):
        return policy
    builtin = getattr(policy, "builtin", None)
    if builtin is not None:
        return builtin
    return getattr(policy, "name", None) or type(policy).__name__


def _check_cache_size(cache_size: Any) -> None:
    if not isinstance(cache_size, int) or isinstance(cache_size, bool) or not 0 < cache_size < 2**32:
        raise ValueError(f"cache_size: {cache_size!r}: a number of slots per buffer, 1 to 2**32 - 1")


class Policy:
    """A built-in eviction policy with a cache size, in libCacheSim's shape:
    ``LRU(cache_size=64).process_trace(trace)`` returns ``(miss_ratio, byte_miss_ratio)``.

    ``cache_size`` is the hot buffer's slots per (request, layer), an int (libCacheSim's float
    ratio of the working set has no meaning here: every request and layer has its own buffer).
    libCacheSim's other keywords are taken: ``hashpower`` (a sizing hint, no effect on results
    in either), and ``default_ttl``, ``consider_obj_metadata``, ``admissioner`` and ``reader``
    at their defaults only (rows never expire, carry no metadata and are always admitted; the
    trace is given to ``process_trace``) — any other value raises ``ValueError`` naming it.
    """

    builtin: str = ""

    def __init__(
        self,
        cache_size: int,
        default_ttl: int = 86400 * 300,
        hashpower: int = 24,
        consider_obj_metadata: bool = False,
        admissioner: Any = None,
        reader: Any = None,
    ) -> None:
        _check_cache_size(cache_size)
        if default_ttl != 86400 * 300:
            raise ValueError(f"default_ttl: {default_ttl!r}: rows in a hot buffer never expire")
        if consider_obj_metadata:
            raise ValueError("consider_obj_metadata: True: rows carry no metadata here")
        if admissioner is not None:
            raise ValueError("admissioner: every missed row is admitted into the hot buffer")
        if reader is not None:
            raise ValueError("reader: give the trace to process_trace(trace)")
        if not isinstance(hashpower, int) or isinstance(hashpower, bool):
            raise TypeError(f"hashpower: {hashpower!r}: an int")
        self.cache_size = cache_size

    def process(self, trace: Trace, prefetcher: str = "none") -> Dict[str, Any]:
        """Replays ``trace`` at ``cache_size`` slots; returns the simulator's row (hits, misses,
        miss_ratio, bytes, belady_misses, ...)."""
        rows = simulate(trace, [self], None, [prefetcher])
        return next(r for r in rows if r["policy"] == self.builtin)

    def process_trace(self, trace: Trace, start_req: int = 0, max_req: int = -1) -> Tuple[float, float]:
        """Replays ``trace``; returns ``(miss_ratio, byte_miss_ratio)`` as libCacheSim does: the
        misses over the selected rows, and the bytes brought in over the bytes selected (the
        same here without prefetch: rows are one size). ``start_req`` and ``max_req`` take their
        defaults only (a trace replays whole steps; see ``simulate(warmup_steps=...)``)."""
        if start_req != 0:
            raise ValueError(f"start_req: {start_req!r}: a trace replays whole; use simulate(warmup_steps=...)")
        if max_req != -1:
            raise ValueError(f"max_req: {max_req!r}: a trace replays whole")
        row = self.process(trace)
        selected_bytes = row["selected"] * trace.row_bytes
        return float(row["miss_ratio"]), float(row["bytes"] / selected_bytes) if selected_bytes else float("nan")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cache_size={self.cache_size})"


class LRU(Policy):
    """Least recently selected first."""

    builtin = "lru"


class FIFO(Policy):
    """First in, first out."""

    builtin = "fifo"


class Clock(Policy):
    """CLOCK with a use counter per slot."""

    builtin = "clock"


class S3FIFO(Policy):
    """S3-FIFO: a small FIFO for new rows, a main FIFO, ghosts of the evicted."""

    builtin = "s3fifo"


class MQ(Policy):
    """Multi-queue by selection frequency."""

    builtin = "mq"


class Random(Policy):
    """A seeded random victim."""

    builtin = "random"


class Score(Policy):
    """Evicts the rows the indexer scores lowest (needs a trace with scores)."""

    builtin = "score"


class Belady(Policy):
    """The offline optimum: evicts the row selected again latest (knows the future)."""

    builtin = "belady"


class PythonPolicy:
    """Base class of an eviction policy written in Python.

    The simulator calls, for each (request, layer) buffer, with ``record`` the slot's two 32-bit
    words ``(a, b)`` and ``env`` a ``SlotEnv`` (step, layer, request, device_buffer_size, slot, token,
    score, prefetched, next_use):

    - ``priority(record, env) -> int``: of every occupied slot that may be evicted; the lowest
      is evicted first (required);
    - ``on_insert(record, env)``: a slot just filled by a missed or prefetched token (required);
    - ``on_hit(record, env)``, ``on_keep(record, env)``: a slot selected again / not evicted;
    - ``on_evict(record, env) -> int``: the leaving token's history word.

    ``on_*`` hooks return the new ``(a, b)`` or None to keep it. Set ``needs_scores = True`` to
    get the indexer's scores in ``env.score`` (a trace with scores), ``needs_future = True`` for
    ``env.next_use``. A hook's exception ends the replay and is raised by ``simulate`` with the
    hook named. Each hook call crosses into Python: expect a replay hundreds of times slower
    than a built-in's.
    """

    name: Optional[str] = None
    needs_scores: bool = False
    needs_future: bool = False

    def priority(self, record: Tuple[int, int], env: SlotEnv) -> int:
        raise NotImplementedError

    def on_insert(self, record: Tuple[int, int], env: SlotEnv) -> Optional[Tuple[int, int]]:
        raise NotImplementedError

    def process(self, trace: Trace, cache_size: int, prefetcher: str = "none") -> Dict[str, Any]:
        """Replays ``trace`` at ``cache_size`` slots; returns the simulator's row."""
        _check_cache_size(cache_size)
        rows = simulate(trace, [self], [cache_size], [prefetcher])
        return next(r for r in rows if r["policy"] == _name_of(self))
