"""``dtsim plot RESULT_DIR``: rebuild the Timeline from timeline.csv + summary.json and redraw."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from sim.engine.timeline import CounterSample, Span, Timeline
from sim.errors import ScenarioError


def load_result(result_dir: Path) -> tuple[Timeline, dict]:
    summary_p, csv_p, trace_p = result_dir / "summary.json", result_dir / "timeline.csv", result_dir / "trace.json"
    for p in (summary_p, csv_p):
        if not p.is_file():
            raise ScenarioError(f"{p} not found; give a folder written by `dtsim run`", "result_dir")
    summary = json.loads(summary_p.read_text())
    tl = Timeline()
    with csv_p.open() as f:
        for row in csv.DictReader(f):
            args = {}
            if row["microbatch"] != "":
                args["microbatch"] = int(row["microbatch"])
            if row["bytes"] != "":
                args["bytes"] = float(row["bytes"])
            tl.spans.append(Span(int(row["gpu"]), row["stream"], row["name"], row["category"],
                                 float(row["start_s"]), float(row["dur_s"]), args))
    if not trace_p.is_file() and trace_p.with_name("trace.json.gz").is_file():
        trace_p = trace_p.with_name("trace.json.gz")  # written with --trace-gz
    if trace_p.is_file():
        if trace_p.suffix == ".gz":
            import gzip

            trace = json.loads(gzip.decompress(trace_p.read_bytes()).decode("utf-8"))
        else:
            trace = json.loads(trace_p.read_text())
        for ev in trace.get("traceEvents", []):
            if ev.get("ph") == "M" and ev.get("name") == "process_name":
                tl.gpus.append(ev["pid"])
                tl.labels[ev["pid"]] = ev["args"]["name"]
            elif ev.get("ph") == "C":
                tl.counters.append(CounterSample(ev["pid"], ev["name"], ev["ts"] / 1e6, ev["args"]["GB"] * 1e9))
    if not tl.gpus:
        tl.gpus = sorted({s.gpu for s in tl.spans})
    for g, label in tl.labels.items():
        for part in label.split():
            if part.startswith("pp") and part[2:].isdigit():
                tl.stage_of[g] = int(part[2:])
    tl.end_s = max((s.end_s for s in tl.spans), default=0.0)
    return tl, summary


def replot(result_dir: Path, out_dir: Path | None = None) -> list[Path]:
    from sim.outputs.charts import draw_all

    tl, summary = load_result(result_dir)
    return draw_all(tl, summary, out_dir or result_dir)
