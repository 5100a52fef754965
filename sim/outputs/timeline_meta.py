"""Timeline metadata beside timeline.csv: what the CSV's rows cannot say.

The GPU order, each GPU's label and pipeline stage, how many real GPUs each simulated one stands for
(symmetric mode) and the counter tracks (memory over time), so ``dtsim plot`` rebuilds the run's exact
Timeline instead of parsing stage numbers out of label text. Result folders written before this file
existed are still read the old way (``sim.outputs.replot``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim.engine.timeline import CounterSample, Timeline

FILE = "timeline_meta.json"
VERSION = 1


def timeline_meta(timeline: Timeline) -> dict[str, Any]:
    """The Timeline's non-span facts as JSON-ready data (GPU ids as string keys, counters as columns)."""
    c = timeline.counters
    return {
        "version": VERSION,
        "gpus": list(timeline.gpus),
        "labels": {str(g): label for g, label in timeline.labels.items()},
        "stage_of": {str(g): s for g, s in timeline.stage_of.items()},
        "represents": {str(g): n for g, n in timeline.represents.items()},
        "end_s": timeline.end_s,
        "counters": {"gpu": [x.gpu for x in c], "name": [x.name for x in c], "t_s": [x.t_s for x in c],
                     "value": [x.value for x in c]},
    }


def timeline_meta_json(timeline: Timeline) -> str:
    """Stable text (sorted keys): the same run gives a byte-identical file."""
    return json.dumps(timeline_meta(timeline), sort_keys=True, allow_nan=False, separators=(",", ":")) + "\n"


def apply_timeline_meta(timeline: Timeline, meta: dict[str, Any]) -> None:
    """Fill ``timeline``'s GPUs, labels, stages, multiplicities, counters and end from ``meta``.

    A malformed file raises ValueError/KeyError/TypeError, which the reader reports as a corrupt file."""
    if meta.get("version") != VERSION:
        raise ValueError(f"version {meta.get('version')!r}, this dtsim reads version {VERSION}")
    timeline.gpus = [int(g) for g in meta["gpus"]]
    timeline.labels = {int(g): str(label) for g, label in meta["labels"].items()}
    timeline.stage_of = {int(g): int(s) for g, s in meta["stage_of"].items()}
    timeline.represents = {int(g): int(n) for g, n in meta["represents"].items()}
    timeline.end_s = float(meta["end_s"])
    c = meta["counters"]
    columns = (c["gpu"], c["name"], c["t_s"], c["value"])
    if len({len(col) for col in columns}) != 1:
        raise ValueError("counter columns of different lengths")
    timeline.counters = [CounterSample(int(g), str(n), float(t), float(v)) for g, n, t, v in zip(*columns, strict=True)]


def read_timeline_meta(path: Path) -> dict[str, Any] | None:
    """The metadata of a result folder's ``timeline_meta.json``, or None when the folder predates it."""
    if not path.is_file():
        return None
    meta = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(meta, dict):
        raise ValueError("not a JSON object")
    return meta
