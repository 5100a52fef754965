"""Write a run's result folder: summary.json, timeline.csv, trace.json[.gz], resolved.yaml and charts.

On a machine with two cores the outputs cost about what the slower of two halves does:
- ``ChartWorker``: ``dtsim run`` forks a process before it simulates; it imports matplotlib (most of a
  second) on the second core while the first simulates, then draws every chart from the timeline's span
  table (sent in milliseconds: pickling 10⁵ spans would take seconds) while this process writes the text
  files.
- Without a worker, for large timelines the two big text files are written by a child forked after the
  simulation while this process draws the charts (they share nothing but the timeline, which the fork
  copies for free). When the text files are the heavier half the child is forked before matplotlib is even
  imported (its import is then part of this process's half), and this process draws every chart; when they
  are light the child draws the charts other than the Gantt as well.
- A large timeline's two text files are seconds of formatting each: a forked process writes trace.json
  while this one writes timeline.csv (``_write_big_files(split=True)``), beside the chart worker only
  when the text outweighs the charts (three processes then share the two cores).
Neither forks while the caller runs threads of its own (``sim.processes``): everything is then written
here, in turn.
Progress goes to stderr when writing takes more than a couple of seconds (tqdm, on a terminal only).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from sim.engine.span_table import adopt_table, span_table, table_timeline
from sim.outputs.timeline_meta import FILE as TIMELINE_META
from sim.outputs.timeline_meta import timeline_meta_json
from sim.outputs.writers import (
    atomic_text,
    atomic_write_text,
    summary_json,
    write_chrome_trace,
    write_timeline_csv,
)
from sim.processes import fork_is_safe
from sim.scenario.load import dump_resolved

PARALLEL_MIN_SPANS = 5_000  # below this the outputs take well under a second: no process is worth it
# Rough costs on one core, to split the work between the two processes: the text files take ~10 µs per
# span (timeline.csv + trace.json of the 175B run: 1.45 s for 151,345 spans); the charts at least ~1.5 s
# with matplotlib's import (0.5 s), the Gantt about half of the drawing.
TEXT_S_PER_SPAN = 10e-6
CHARTS_S = 1.5
# A forked process writes the trace while this one writes the CSV from this many spans (each file then
# takes ≳ 0.7 s); beside the chart worker only when the text files outweigh the charts twice (measured on
# 2 cores: at 151,345 spans the split slowed `dtsim run` of the 175B job by 5 %, the worker's charts being
# the longer half), where three processes share the two cores.
SPLIT_TEXT_MIN_SPANS = 150_000
SPLIT_BESIDE_CHARTS_MIN_SPANS = int(2 * CHARTS_S / TEXT_S_PER_SPAN)
TRACE_GZIP_LEVEL = 1  # fastest level: ~7× smaller than the JSON for a few tenths of a second per 10⁵ spans
PROGRESS_DELAY_S = 2.0
ALL_CHARTS = ("gantt", "pipeline", "memory", "goodput")  # the stems sim.outputs.charts.draw_all draws


def trace_name(gzipped: bool) -> str:
    return "trace.json.gz" if gzipped else "trace.json"


def _write_trace(timeline, out_dir: Path, meta: dict, trace_gz: bool) -> Path:
    path = out_dir / trace_name(trace_gz)
    with atomic_text(path, TRACE_GZIP_LEVEL if trace_gz else None) as fh:
        write_chrome_trace(timeline, fh, meta)
    return path


def _run_in_child(work: Callable[[], object]) -> None:
    """The body of a forked writer: ``work``, with any failure reported by exit status only; the parent
    then does the work itself and reports the error the usual way (one line), so the user never sees a
    child traceback."""
    gc.disable()  # short-lived: a collection would walk (and so copy, page by page) the parent's whole heap
    try:
        work()
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseException:  # noqa: BLE001 - the parent repeats the work and reports the error
        sys.exit(1)


def _trace_child(timeline, out_dir: Path, meta: dict, trace_gz: bool) -> None:
    """In a forked process: trace.json[.gz] only (``_run_in_child``)."""
    _run_in_child(lambda: _write_trace(timeline, out_dir, meta, trace_gz))


def _write_big_files(timeline, out_dir: Path, meta: dict, trace: bool, trace_gz: bool,
                     split: bool = False) -> list[Path]:
    """timeline.csv and, with ``trace``, trace.json[.gz]. ``split``: on a large timeline a forked process
    writes the trace while this one writes the CSV (each is seconds of single-core formatting), where a
    second core exists and forking is safe."""
    child = None
    if trace and split and len(timeline.spans) >= SPLIT_TEXT_MIN_SPANS and (ctx := _fork_context()) is not None:
        span_table(timeline)  # built once, before the fork: both files read the same columns
        child = ctx.Process(target=_trace_child, args=(timeline, out_dir, meta, trace_gz), daemon=True)
        child.start()
    try:
        paths = [out_dir / "timeline.csv"]
        with atomic_text(paths[0]) as fh:
            write_timeline_csv(timeline, fh)
        if trace:
            if child is not None:
                child.join()
            if child is None or child.exitcode != 0:  # no child, or it failed: written here
                _write_trace(timeline, out_dir, meta, trace_gz)
            paths.append(out_dir / trace_name(trace_gz))
    finally:
        if child is not None and child.is_alive():  # interrupted: do not leave it writing behind us
            child.terminate()
            child.join()
    return paths


def _child(timeline, summary: dict, out_dir: Path, meta: dict, trace: bool, trace_gz: bool,
           parent_charts: tuple[str, ...], reply) -> None:
    """In the forked process: the text files, and every chart not in ``parent_charts``
    (``_run_in_child``)."""

    def work() -> None:
        _write_big_files(timeline, out_dir, meta, trace, trace_gz)
        drawn: list[Path] = []
        if parent_charts != ALL_CHARTS:
            from sim.outputs.charts import draw_all  # lazy: matplotlib only when charts are drawn

            drawn = draw_all(timeline, summary, out_dir, skip=parent_charts)
        reply.send([str(p) for p in drawn])

    _run_in_child(work)


def _fork_context():
    """A fork context where a second core exists and forking is safe (``sim.processes``: no other thread
    runs, so the child can hold up on no lock), else None: the work is then done in turn, here."""
    if (os.cpu_count() or 1) < 2 or not fork_is_safe():
        return None
    return multiprocessing.get_context("fork")


class ChartWorker:
    """A forked process that imports matplotlib now (while this process simulates, on the other core) and
    later draws every chart of the run it is sent (``draw``), replying with the paths it wrote.

    Any failure there is reported by its exit status only (``paths`` returns None) and the caller draws
    the charts itself, so errors surface in this process, as one line. It ignores Ctrl-C (this process
    handles it and ``close`` stops the worker)."""

    def __init__(self, ctx) -> None:
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_chart_worker, args=(theirs, self._conn), daemon=True)
        self._proc.start()
        theirs.close()
        self._sent = False
        self._done = False  # its reply arrived
        self._sender: threading.Thread | None = None

    @classmethod
    def start(cls) -> ChartWorker | None:
        """A worker where a second core exists and forking is safe (``_fork_context``), else None (the charts
        are drawn in turn)."""
        ctx = _fork_context()
        return cls(ctx) if ctx is not None else None

    def draw(self, timeline, summary: dict, out_dir: Path) -> bool:
        """Send the charts of a run; False (nothing sent) when the timeline cannot travel as its table."""
        if self._sent or not self._proc.is_alive():
            return False
        if not timeline.gpus or any(g not in timeline.stage_of for g in timeline.gpus):
            return False  # the charts would read stages from the spans' args, which the table lacks
        payload = pickle.dumps((table_timeline(timeline), summary, str(out_dir)), protocol=pickle.HIGHEST_PROTOCOL)
        # Sent from a thread: the pipe holds 64 KB, so a worker still importing would block this process
        # until it reads; the thread waits in the write, without the GIL.
        self._sender = threading.Thread(target=self._send, args=(payload,), daemon=True)
        self._sender.start()
        self._sent = True
        return True

    def sent(self, timeout_s: float) -> bool:
        """Whether the payload has gone (its sending thread ended), waiting up to ``timeout_s``."""
        if self._sender is None:
            return False
        self._sender.join(timeout_s)
        return not self._sender.is_alive()

    def _send(self, payload: bytes) -> None:
        try:
            self._conn.send_bytes(payload)
        except Exception:  # noqa: BLE001 - the worker died, or close() shut the pipe under this thread on
            pass  # Ctrl-C (TypeError from a closed handle): paths() then sees no reply, the parent draws

    def paths(self) -> list[Path] | None:
        """Wait for the charts sent; their paths, or None when the worker failed."""
        drawn = None
        try:
            if self._sender is not None:
                self._sender.join()
            if self._sent and self._conn.poll(None):
                drawn = self._conn.recv()
                self._done = True
        except (EOFError, OSError):  # the worker ended without replying: it failed
            drawn = None
        finally:
            self.close()
        return [Path(p) for p in drawn] if isinstance(drawn, list) else None

    def close(self) -> None:
        """Stop the worker (if still running) and reap it."""
        self._conn.close()
        if not self._done and self._proc.is_alive():
            self._proc.terminate()  # nothing (more) to draw for us: an interrupt or a failure here
        self._proc.join()


def _chart_worker(conn, parents_end) -> None:
    parents_end.close()  # so that the parent's exit, however it ends, reads here as end of file
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C, then closes the pipe
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    gc.freeze()  # the parent's heap, copied on write: never walk it
    try:
        from sim.outputs.charts import draw_all  # the point of this process: matplotlib, imported early

        job = conn.recv()
    except (EOFError, OSError):  # the parent finished (or failed) without charts for us
        os._exit(0)
    try:
        timeline, summary, out_dir = job
        adopt_table(timeline)
        drawn = draw_all(timeline, summary, Path(out_dir))
        conn.send([str(p) for p in drawn])
    except BaseException:  # noqa: BLE001 - the parent draws the charts itself and reports the error
        os._exit(1)
    os._exit(0)


def write_run_files(result, out_dir: Path, charts: bool = True, trace: bool = True,
                    trace_gz: bool = False, worker: ChartWorker | None = None) -> list[Path]:
    """Write the files of ``result`` into ``out_dir`` (each atomically); returns their paths. ``worker``
    (started before the simulation) draws the charts, if given and ``charts``; it is closed either way.

    The objects that exist now (the timeline: 10⁵–10⁶ spans) are frozen out of the garbage collector
    meanwhile: every full collection would walk them all again (a second per few collections on a large
    run) and, after the fork, copy their pages into the child."""
    gc.collect()
    gc.freeze()
    try:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        stale = out_dir / trace_name(not trace_gz)
        if trace and stale.is_file():
            stale.unlink()  # our own trace of an earlier run, in the other format: it would describe another run
        meta = {"scenario": result.summary.get("name")}
        if worker is not None and charts and worker.draw(result.timeline, result.summary, out_dir):
            return _write_with_worker(result, out_dir, meta, trace, trace_gz, worker)
        return _write_run_files(result, out_dir, meta, charts, trace, trace_gz)
    finally:
        gc.unfreeze()
        if worker is not None:
            worker.close()


def _small_files(result, out_dir: Path) -> list[Path]:
    paths = []
    for name, text in (("summary.json", summary_json(result.summary)), ("resolved.yaml", dump_resolved(result.scenario)),
                       (TIMELINE_META, timeline_meta_json(result.timeline))):
        atomic_write_text(out_dir / name, text)
        paths.append(out_dir / name)
    return paths


def _progress(steps: int) -> tqdm:
    return tqdm(total=steps, desc="writing results", unit="step", delay=PROGRESS_DELAY_S, file=sys.stderr,
                disable=None, leave=False)


def _write_with_worker(result, out_dir: Path, meta: dict, trace: bool, trace_gz: bool,
                       worker: ChartWorker) -> list[Path]:
    """The worker draws the charts (already sent) while this process writes the other files."""
    with _progress(2) as bar:
        paths = _small_files(result, out_dir)
        # the worker draws meanwhile; a trace process forks only once the charts' payload is sent (no thread)
        split = len(result.timeline.spans) >= SPLIT_BESIDE_CHARTS_MIN_SPANS and worker.sent(timeout_s=1.0)
        big = _write_big_files(result.timeline, out_dir, meta, trace, trace_gz, split=split)
        bar.update()
        charts = worker.paths()
        if charts is None:  # the worker failed: draw here, where an error is reported the usual way
            from sim.outputs.charts import draw_all

            charts = draw_all(result.timeline, result.summary, out_dir)
        bar.update()
    return paths[:1] + big + paths[1:] + charts


def _write_run_files(result, out_dir: Path, meta: dict, charts: bool, trace: bool, trace_gz: bool) -> list[Path]:
    timeline = result.timeline
    paths = _small_files(result, out_dir)
    big = [out_dir / "timeline.csv"] + ([out_dir / trace_name(trace_gz)] if trace else [])
    with _progress(2 if charts else 1) as bar:
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
            _write_big_files(timeline, out_dir, meta, trace, trace_gz, split=True)
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
