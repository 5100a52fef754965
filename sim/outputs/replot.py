"""``dtsim plot RESULT_DIR``: rebuild the Timeline from timeline.csv, timeline_meta.json and summary.json and
redraw (folders from before timeline_meta.json: labels and counters from trace.json)."""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sim.engine.timeline import CounterSample, Span, Timeline
from sim.errors import ScenarioError
from sim.outputs.charts import chart_stems, draw_all
from sim.outputs.style import CHART_FORMATS
from sim.outputs.timeline_meta import FILE, apply_timeline_meta, read_timeline_meta

# What a run's result is made of besides its charts and report (for a folder without a manifest, where
# nothing else can be told from the user's files): ``dtsim plot A --out B`` copies these into B.
DATA_FILES = ("summary.json", "timeline.csv", "timeline_meta.json", "trace.json", "trace.json.gz", "resolved.yaml")
_CSV_READ = ("gpu", "stream", "name", "category", "start_s", "dur_s", "microbatch", "bytes")  # columns read back


def load_result(result_dir: Path) -> tuple[Timeline, dict]:
    """The timeline and summary of a result folder; a missing or corrupt file is one ScenarioError
    naming the file, what is wrong with it and the fix."""
    result_dir = Path(result_dir)
    if not result_dir.is_dir():
        state = "is not a folder" if result_dir.exists() else "not found"
        raise ScenarioError(f"{str(result_dir)!r} {state}; give a folder written by `dtsim run`", "result_dir")
    try:
        return _load(result_dir)
    except ScenarioError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, csv.Error) as exc:
        where = getattr(exc, "dtsim_file", None) or "the result files"
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ScenarioError(
            f"{where} is corrupt or truncated ({type(exc).__name__}: {detail[:120]}); rerun `dtsim run` to "
            "write the result again",
            "result_dir",
        ) from None


@contextmanager
def _tag(path: Path) -> Iterator[None]:
    """Context: an exception raised while reading ``path`` carries its name."""
    try:
        yield
    except Exception as exc:
        if not hasattr(exc, "dtsim_file"):
            try:
                exc.dtsim_file = str(path)  # type: ignore[attr-defined]
            except AttributeError:
                pass
        raise


def _load(result_dir: Path) -> tuple[Timeline, dict]:
    summary_p, csv_p, trace_p = result_dir / "summary.json", result_dir / "timeline.csv", result_dir / "trace.json"
    for p in (summary_p, csv_p):
        if not p.is_file():
            state = "is not a file" if p.exists() else "not found"
            raise ScenarioError(f"{p} {state}; give a folder written by `dtsim run`", "result_dir")
    with _tag(summary_p):
        summary = json.loads(summary_p.read_text(encoding="utf-8"))
        if not isinstance(summary, dict):
            raise ValueError("not a JSON object")
        _check_summary(summary)
    tl = Timeline()
    with _tag(csv_p), csv_p.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in _CSV_READ if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"its header lacks {', '.join(missing)}")
        for row in reader:
            if None in row.values() or None in row:
                raise ValueError(f"line {len(tl.spans) + 2} has the wrong number of fields")
            args: dict[str, float] = {}
            if row["microbatch"] != "":
                args["microbatch"] = int(row["microbatch"])
            if row["bytes"] != "":
                args["bytes"] = float(row["bytes"])
            start, dur = float(row["start_s"]), float(row["dur_s"])
            if not (math.isfinite(start) and math.isfinite(dur) and dur >= 0 and math.isfinite(start + dur)):
                raise ValueError(f"line {len(tl.spans) + 2}: start_s {row['start_s']}, dur_s {row['dur_s']} "
                                 "are not a finite time and a duration ≥ 0")
            tl.spans.append(Span(int(row["gpu"]), row["stream"], row["name"], row["category"], start, dur, args))
        if not tl.spans:
            raise ValueError("it holds no spans")
    meta_p = result_dir / FILE
    with _tag(meta_p):
        meta = read_timeline_meta(meta_p)
        if meta is not None:
            apply_timeline_meta(tl, meta)
            return tl, summary
    # A folder written before timeline_meta.json: labels and counters from the trace, stages from labels.
    if not trace_p.is_file() and trace_p.with_name("trace.json.gz").is_file():
        trace_p = trace_p.with_name("trace.json.gz")  # written with --trace-gz
    if trace_p.is_file():
        with _tag(trace_p):
            if trace_p.suffix == ".gz":
                trace = json.loads(gzip.decompress(trace_p.read_bytes()).decode("utf-8"))
            else:
                trace = json.loads(trace_p.read_text(encoding="utf-8"))
            for ev in trace.get("traceEvents", []):
                if ev.get("ph") == "M" and ev.get("name") == "process_name":
                    tl.gpus.append(ev["pid"])
                    tl.labels[ev["pid"]] = ev["args"]["name"]
                elif ev.get("ph") == "C":
                    name = str(ev["name"])
                    if name.endswith("_GB"):  # the trace names counters in their unit; the timeline in bytes
                        name = name[: -len("_GB")] + "_bytes"
                    tl.counters.append(CounterSample(ev["pid"], name, ev["ts"] / 1e6, _counter_bytes(ev)))
    if not tl.gpus:
        tl.gpus = sorted({s.gpu for s in tl.spans})
    for g, label in tl.labels.items():
        for part in label.split():
            if part.startswith("pp") and part[2:].isdigit():
                tl.stage_of[g] = int(part[2:])
    tl.end_s = max((s.end_s for s in tl.spans), default=0.0)
    return tl, summary


# The summary keys the charts read, with the JSON types dtsim writes them as (None: absent or null).
_SUMMARY_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "workload": (str,), "step_time_s": (int, float), "bubble_fraction": (int, float),
    "gpu_memory_bytes": (int, float), "num_gpus": (int,), "mfu": (int, float), "fits_in_memory": (bool,),
    "parallel": (dict,), "memory_by_stage": (list,), "reliability": (dict,),
}


def _check_summary(summary: dict) -> None:
    for key, types in _SUMMARY_TYPES.items():
        value = summary.get(key)
        if value is None:
            continue
        wrong = not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        if not wrong and isinstance(value, float):
            wrong = not math.isfinite(value)
        if wrong:
            raise ValueError(f"{key}: {json.dumps(value)[:40]} is not {'/'.join(t.__name__ for t in types)}")
    pipeline = (summary.get("parallel") or {}).get("pipeline", 1)  # the one layout field the charts read;
    # null counts as absent, as for every other key above
    if not isinstance(pipeline, int) or isinstance(pipeline, bool):
        raise ValueError(f"parallel.pipeline: {json.dumps(pipeline)[:40]} is not a whole number")


def _counter_bytes(ev: dict) -> float:
    """A memory counter sample in bytes (traces before 0.1.1 stored GB under "GB")."""
    args = ev["args"]
    if "GB" in args:
        return float(args["GB"]) * 1e9
    return float(args["bytes"])


def draw_loaded(timeline: Timeline, summary: dict, out_dir: Path, result_dir: Path) -> list[Path]:
    """The charts of a loaded result. The files passed ``load_result``'s checks, so what the charts still
    cannot draw sits in summary.json's nested records (memory_by_stage, reliability), edited or written
    by another tool: one ScenarioError naming the file, not an internal error."""
    try:
        return draw_all(timeline, summary, out_dir)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ScenarioError(
            f"{str(Path(result_dir) / 'summary.json')!r} holds values the charts cannot draw "
            f"({type(exc).__name__}: {detail[:120]}); rerun `dtsim run` to write the result again",
            "result_dir",
        ) from None


def plot_outputs(summary: dict) -> list[str]:
    """The files ``dtsim plot`` writes for a result with this summary (its charts and the report), known
    before drawing: an in-place plot refuses first if any of them is the user's file."""
    return [f"{stem}.{fmt}" for stem in chart_stems(summary) for fmt in CHART_FORMATS] + ["report.html"]


def replot(result_dir: Path, out_dir: Path | None = None) -> list[Path]:
    tl, summary = load_result(result_dir)
    return draw_loaded(tl, summary, out_dir or result_dir, result_dir)
