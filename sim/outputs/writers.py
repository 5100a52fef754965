"""Result files: summary.json, timeline.csv, trace.json (Chrome/Perfetto), resolved.yaml.

All writes are atomic (temp file in the same folder, then rename), so an interrupted run never leaves
a half-written file where a good one was.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from sim.engine.timeline import Timeline


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_open(path: Path, mode: str = "w") -> Iterator[IO]:
    """Open a temp file beside ``path``; on success rename it over ``path``, on error remove it.

    Readers never see a half-written file, and an interrupted write leaves the old file in place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # on disk before it replaces the old file
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are ordinary files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def summary_json(summary: dict) -> str:
    """Stable text: sorted keys, so the same scenario and seed give byte-identical files."""
    return json.dumps(summary, indent=2, sort_keys=True, allow_nan=False, default=float) + "\n"


def timeline_csv(timeline: Timeline) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["gpu", "stream", "name", "category", "start_s", "dur_s", "end_s", "microbatch", "bytes"])
    for s in sorted(timeline.spans, key=lambda s: (s.gpu, s.start_s, s.stream)):
        w.writerow([s.gpu, s.stream, s.name, s.category, repr(s.start_s), repr(s.dur_s), repr(s.end_s),
                    s.args.get("microbatch", ""), s.args.get("bytes", "")])
    return buf.getvalue()


STREAM_ORDER = {"compute": 0, "comm": 1, "dp": 2, "p2p": 3}


def chrome_trace(timeline: Timeline, meta: dict | None = None) -> str:
    """Chrome trace event format (JSON object form): pid = GPU, tid = stream, times in µs.

    Memory counter tracks use "C" events; process and thread names come from the timeline labels."""
    events: list[dict] = []
    tids: dict[tuple[int, str], int] = {}
    for g in timeline.gpus:
        events.append({"ph": "M", "pid": g, "name": "process_name", "args": {"name": timeline.labels.get(g, f"gpu{g}")}})
        events.append({"ph": "M", "pid": g, "name": "process_sort_index", "args": {"sort_index": g}})
    for s in timeline.spans:
        key = (s.gpu, s.stream)
        if key not in tids:
            tid = STREAM_ORDER.get(s.stream, 10 + len(tids))
            tids[key] = tid
            events.append({"ph": "M", "pid": s.gpu, "tid": tid, "name": "thread_name", "args": {"name": s.stream}})
        events.append({"ph": "X", "pid": s.gpu, "tid": tids[key], "name": s.name, "cat": s.category,
                       "ts": s.start_s * 1e6, "dur": s.dur_s * 1e6, "args": s.args})
    for c in timeline.counters:
        name = c.name[: -len("_bytes")] + "_GB" if c.name.endswith("_bytes") else c.name  # named in its unit
        events.append({"ph": "C", "pid": c.gpu, "name": name, "ts": c.t_s * 1e6, "args": {"GB": c.value / 1e9}})
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta or {}},
                      separators=(",", ":"), default=float)
