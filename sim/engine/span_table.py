"""The Timeline's spans as numpy columns, built in one pass and shared by the summary, the charts and the
writers.

A large run holds ~10⁵–10⁶ spans; per-span Python work in every chart and writer is what made the outputs
cost many times the simulation. One pass turns them into arrays (times, GPU, stream, category, micro-batch,
chunk); everything after that is vectorised.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from sim.engine.timeline import Timeline

NO_MICROBATCH = -1


@dataclass(frozen=True)
class SpanTable:
    """Column ``k`` of every array describes ``timeline.spans[k]``."""

    gpu: np.ndarray  # int64
    stream: np.ndarray  # int32 index into ``streams``
    streams: tuple[str, ...]
    category: np.ndarray  # int32 index into ``categories``
    categories: tuple[str, ...]
    start_s: np.ndarray  # float64
    dur_s: np.ndarray  # float64
    microbatch: np.ndarray  # int64, NO_MICROBATCH where the span has none
    chunk: np.ndarray  # int64, 0 where the span has none

    @property
    def end_s(self) -> np.ndarray:
        return self.start_s + self.dur_s

    def __len__(self) -> int:
        return len(self.start_s)


def _codes(values: list[str]) -> tuple[np.ndarray, tuple[str, ...]]:
    index: dict[str, int] = {}
    codes = np.fromiter((index.setdefault(v, len(index)) for v in values), dtype=np.int32, count=len(values))
    return codes, tuple(index)


def build_table(timeline: Timeline) -> SpanTable:
    """Columns of ``timeline.spans`` (one pass over the spans)."""
    spans = timeline.spans
    n = len(spans)
    stream, streams = _codes([s.stream for s in spans])
    category, categories = _codes([s.category for s in spans])
    args = [s.args for s in spans]
    return SpanTable(
        gpu=np.fromiter((s.gpu for s in spans), dtype=np.int64, count=n),
        stream=stream,
        streams=streams,
        category=category,
        categories=categories,
        start_s=np.fromiter((s.start_s for s in spans), dtype=np.float64, count=n),
        dur_s=np.fromiter((s.dur_s for s in spans), dtype=np.float64, count=n),
        microbatch=np.fromiter((a.get("microbatch", NO_MICROBATCH) for a in args), dtype=np.int64, count=n),
        chunk=np.fromiter((a.get("chunk", 0) for a in args), dtype=np.int64, count=n),
    )


_CACHE: dict[int, tuple[weakref.ref, int, SpanTable]] = {}


def span_table(timeline: Timeline) -> SpanTable:
    """The table of ``timeline``, built once per timeline (rebuilt if spans were added since)."""
    key = id(timeline)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is timeline and hit[1] == len(timeline.spans):
        return hit[2]
    table = build_table(timeline)
    for k in [k for k, (ref, _, _) in _CACHE.items() if ref() is None]:
        del _CACHE[k]
    _CACHE[key] = (weakref.ref(timeline), len(timeline.spans), table)
    return table
