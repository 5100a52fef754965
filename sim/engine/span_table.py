"""The Timeline's spans as numpy columns, built in one pass and shared by the summary, the charts and the
writers.

A large run holds ~10⁵–10⁶ spans; per-span Python work in every chart and writer is what made the outputs
cost many times the simulation. One pass turns them into arrays (times, GPU, stream, category, micro-batch,
chunk); everything after that is vectorised.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter, methodcaller

import numpy as np

from sim.engine.timeline import Span, Timeline

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
    """Codes of ``values`` into their distinct values, in order of first appearance (C-level passes only)."""
    names = tuple(dict.fromkeys(values))
    index = {v: i for i, v in enumerate(names)}
    return np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values)), names


def build_table(timeline: Timeline) -> SpanTable:
    """Columns of ``timeline.spans`` (one pass per column, each through C-level iterators)."""
    spans = timeline.spans
    n = len(spans)
    stream, streams = _codes(list(map(attrgetter("stream"), spans)))
    category, categories = _codes(list(map(attrgetter("category"), spans)))
    args = list(map(attrgetter("args"), spans))
    return SpanTable(
        gpu=np.fromiter(map(attrgetter("gpu"), spans), dtype=np.int64, count=n),
        stream=stream,
        streams=streams,
        category=category,
        categories=categories,
        start_s=np.fromiter(map(attrgetter("start_s"), spans), dtype=np.float64, count=n),
        dur_s=np.fromiter(map(attrgetter("dur_s"), spans), dtype=np.float64, count=n),
        microbatch=np.fromiter(map(methodcaller("get", "microbatch", NO_MICROBATCH), args), dtype=np.int64, count=n),
        chunk=np.fromiter(map(methodcaller("get", "chunk", 0), args), dtype=np.int64, count=n),
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


class TableSpans(Sequence):
    """Spans rebuilt from a table on demand (``Span`` objects with the table's fields, no name, and
    ``microbatch``/``chunk`` args): what the charts read of a span, for a timeline that crossed a process
    boundary as its table (pickling 10⁵ spans costs seconds, the table milliseconds)."""

    def __init__(self, table: SpanTable):
        self._table = table

    def __len__(self) -> int:
        return len(self._table)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        t = self._table
        args: dict = {"chunk": int(t.chunk[k])}
        if t.microbatch[k] != NO_MICROBATCH:
            args["microbatch"] = int(t.microbatch[k])
        return Span(int(t.gpu[k]), t.streams[t.stream[k]], "", t.categories[t.category[k]],
                    float(t.start_s[k]), float(t.dur_s[k]), args)


def table_timeline(timeline: Timeline) -> Timeline:
    """A copy of ``timeline`` whose spans are its table (``TableSpans``) and no counters: cheap to send to
    another process, and ``span_table`` of the copy, there, is that table."""
    table = span_table(timeline)
    light = Timeline(spans=TableSpans(table), counters=[], gpus=list(timeline.gpus),  # type: ignore[arg-type]
                     represents=dict(timeline.represents), labels=dict(timeline.labels),
                     stage_of=dict(timeline.stage_of), end_s=timeline.end_s)
    return light


def adopt_table(timeline: Timeline) -> None:
    """After unpickling a ``table_timeline``: register its table as its span table (no rebuild)."""
    spans = timeline.spans
    if isinstance(spans, TableSpans):
        _CACHE[id(timeline)] = (weakref.ref(timeline), len(spans), spans._table)
