"""Write a run's result folder: summary.json, timeline.csv, trace.json[.gz], resolved.yaml and charts.

For large timelines the two big text files are written by a forked child while this process draws the
charts (they share nothing but the timeline, which the fork copies for free), so on a machine with two
cores the outputs cost about what the slower half does. When the text files are the heavier half the child
is forked before matplotlib is even imported (its import is then part of this process's half), and this
process draws every chart; when they are light the child draws the charts other than the Gantt as well.
Progress goes to stderr when writing takes more than a couple of seconds (tqdm, on a terminal only).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
from pathlib import Path

from tqdm import tqdm

from sim.engine.span_table import span_table
from sim.outputs.timeline_meta import FILE as TIMELINE_META
from sim.outputs.timeline_meta import timeline_meta_json
from sim.outputs.writers import (
    atomic_text,
    atomic_write_text,
    summary_json,
    write_chrome_trace,
    write_timeline_csv,
)
from sim.scenario.load import dump_resolved

PARALLEL_MIN_SPANS = 5_000  # below this the outputs take well under a second: no process is worth it
# Rough costs on one core, to split the work between the two processes: the text files take ~10 µs per
# span (timeline.csv + trace.json of the 175B run: 1.45 s for 151,345 spans); the charts at least ~1.5 s
# with matplotlib's import (0.5 s), the Gantt about half of the drawing.
TEXT_S_PER_SPAN = 10e-6
CHARTS_S = 1.5
TRACE_GZIP_LEVEL = 1  # fastest level: ~7× smaller than the JSON for a few tenths of a second per 10⁵ spans
PROGRESS_DELAY_S = 2.0
ALL_CHARTS = ("gantt", "pipeline", "memory", "goodput")  # the stems sim.outputs.charts.draw_all draws


def trace_name(gzipped: bool) -> str:
    return "trace.json.gz" if gzipped else "trace.json"


def _write_big_files(timeline, out_dir: Path, meta: dict, trace: bool, trace_gz: bool) -> list[Path]:
    paths = [out_dir / "timeline.csv"]
    with atomic_text(paths[0]) as fh:
        write_timeline_csv(timeline, fh)
    if trace:
        path = out_dir / trace_name(trace_gz)
        with atomic_text(path, TRACE_GZIP_LEVEL if trace_gz else None) as fh:
            write_chrome_trace(timeline, fh, meta)
        paths.append(path)
    return paths


def _child(timeline, summary: dict, out_dir: Path, meta: dict, trace: bool, trace_gz: bool,
           parent_charts: tuple[str, ...], reply) -> None:
    """In the forked process: the text files, and every chart not in ``parent_charts``. Any
    failure is reported by exit status only; the parent then does the work itself and reports the error
    the usual way (one line), so the user never sees a child traceback."""
    gc.disable()  # short-lived: a collection would walk (and so copy, page by page) the parent's whole heap
    try:
        _write_big_files(timeline, out_dir, meta, trace, trace_gz)
        drawn: list[Path] = []
        if parent_charts != ALL_CHARTS:
            from sim.outputs.charts import draw_all  # lazy: matplotlib only when charts are drawn

            drawn = draw_all(timeline, summary, out_dir, skip=parent_charts)
        reply.send([str(p) for p in drawn])
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseException:  # noqa: BLE001 - the parent repeats the work and reports the error
        sys.exit(1)


def _fork_context():
    """A fork context where the platform has one and a second core exists, else None (run in turn)."""
    if (os.cpu_count() or 1) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    return multiprocessing.get_context("fork")


def write_run_files(result, out_dir: Path, charts: bool = True, trace: bool = True,
                    trace_gz: bool = False) -> list[Path]:
    """Write the files of ``result`` into ``out_dir`` (each atomically); returns their paths.

    The objects that exist now (the timeline: 10⁵–10⁶ spans) are frozen out of the garbage collector
    meanwhile: every full collection would walk them all again (a second per few collections on a large
    run) and, after the fork, copy their pages into the child."""
    gc.collect()
    gc.freeze()
    try:
        return _write_run_files(result, out_dir, charts, trace, trace_gz)
    finally:
        gc.unfreeze()


def _write_run_files(result, out_dir: Path, charts: bool, trace: bool, trace_gz: bool) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    timeline = result.timeline
    meta = {"scenario": result.summary.get("name")}
    stale = out_dir / trace_name(not trace_gz)
    if trace and stale.is_file():
        stale.unlink()  # our own trace of an earlier run, in the other format: it would describe another run
    paths = []
    for name, text in (("summary.json", summary_json(result.summary)), ("resolved.yaml", dump_resolved(result.scenario)),
                       (TIMELINE_META, timeline_meta_json(timeline))):
        atomic_write_text(out_dir / name, text)
        paths.append(out_dir / name)
    big = [out_dir / "timeline.csv"] + ([out_dir / trace_name(trace_gz)] if trace else [])
    steps = ["timeline.csv + trace"] + (["charts"] if charts else [])
    bar = tqdm(total=len(steps), desc="writing results", unit="step", delay=PROGRESS_DELAY_S, file=sys.stderr,
               disable=None, leave=False)
    with bar:
        ctx = _fork_context() if charts and len(timeline.spans) >= PARALLEL_MIN_SPANS else None
        child = None
        # Balance the two processes: the child writes the text files, and when they are light it also draws
        # every chart but the Gantt (then matplotlib is imported before the fork, for both); when they are
        # heavy this process imports matplotlib after the fork and draws every chart itself.
        heavy = len(timeline.spans) * TEXT_S_PER_SPAN >= CHARTS_S / 2
        parent_charts = ALL_CHARTS if heavy else ("gantt",)
        if ctx is not None and not heavy:  # the child draws charts too: import matplotlib (≈ 0.5 s) once, for both
            import sim.outputs.charts  # noqa: F401
        if ctx is not None:
            span_table(timeline)  # built once, before the fork: both processes read the same columns
            receive, reply = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_child, args=(timeline, result.summary, out_dir, meta, trace, trace_gz,
                                                     parent_charts, reply), daemon=True)
            child.start()
            reply.close()
        else:
            _write_big_files(timeline, out_dir, meta, trace, trace_gz)
            bar.update()
        chart_paths: list[Path] = []
        if charts:
            from sim.outputs.charts import draw_all  # lazy: matplotlib only when charts are drawn

            chart_paths = draw_all(timeline, result.summary, out_dir, only=parent_charts if child else None)
        if child is not None:
            drawn = None
            try:
                if receive.poll(None):
                    drawn = receive.recv()
            except EOFError:  # the child ended without replying: it failed
                pass
            finally:
                child.join(timeout=None if drawn is not None else 60)
                if child.is_alive():  # interrupted while waiting: do not leave it writing behind us
                    child.terminate()
                    child.join()
                receive.close()
            if child.exitcode != 0 or drawn is None:  # do its work in this process (errors surface here)
                _write_big_files(timeline, out_dir, meta, trace, trace_gz)
                drawn = [str(p) for p in draw_all(timeline, result.summary, out_dir, skip=parent_charts)]
            chart_paths += [Path(p) for p in drawn or []]
            bar.update()
        if charts:
            bar.update()
            paths += chart_paths
    return paths[:1] + big + paths[1:]
