"""dtsim forks only a process that runs no other thread; with a caller's thread alive (a notebook, a
service), pools start from a fork server and the result folder is written in this process: same results."""

from __future__ import annotations

import io
import multiprocessing
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import synthetic
from tqdm import tqdm

from sim import processes
from sim.api import simulate, write_results
from sim.explore.runner import run_jobs
from sim.outputs import run_files
from sim.scenario.load import load_scenario

ROOT = Path(__file__).resolve().parents[1]
FORKS = "fork" in multiprocessing.get_all_start_methods()


@contextmanager
def callers_thread() -> Iterator[threading.Thread]:
    """A thread of the caller's, alive (blocked on an event) for the duration."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="callers-thread", daemon=True)
    t.start()
    try:
        yield t
    finally:
        stop.set()
        t.join()


def test_a_callers_thread_makes_fork_unsafe():
    with callers_thread() as t:
        assert t in processes.other_threads()
        assert not processes.fork_is_safe()
        assert run_files._fork_context() is None
        assert processes.pool_context().get_start_method() in ("forkserver", "spawn")


@pytest.mark.skipif(not FORKS, reason="the platform cannot fork")
def test_tqdm_monitor_alone_leaves_fork_safe():
    """dtsim's own progress bars start tqdm's monitor thread; it does not count against forking."""
    bar = tqdm(total=1, file=io.StringIO(), disable=False)  # starts the monitor (tqdm.monitor_interval 10 s)
    try:
        if processes.other_threads():
            pytest.skip(f"other threads alive in this test process: {processes.other_threads()}")
        assert any(processes._harmless(t) for t in threading.enumerate())
        assert processes.fork_is_safe()
        assert processes.pool_context().get_start_method() == "fork"
    finally:
        bar.close()


def test_pool_with_a_callers_thread_gives_the_inline_results():
    jobs = [(synthetic(f"p{k}", model__forward_ms=k + 1), None) for k in range(2)]
    inline = run_jobs(jobs, workers=1, progress=False)
    with callers_thread():
        pooled = run_jobs(jobs, workers=2, progress=False)
    assert [r["summary"]["step_time_s"] for r in pooled] == [r["summary"]["step_time_s"] for r in inline]


def test_result_folder_with_a_callers_thread_is_written_here_without_fork(tmp_path, monkeypatch):
    result = simulate(load_scenario(ROOT / "scenarios" / "seed-pipeline.yaml"))
    one = write_results(result, tmp_path / "one")
    monkeypatch.setattr(run_files, "PARALLEL_MIN_SPANS", 0)  # would fork a text writer if it were safe

    def no_fork(method=None):
        raise AssertionError(f"multiprocessing context {method!r} asked for while the caller has a thread")

    with callers_thread():
        monkeypatch.setattr(multiprocessing, "get_context", no_fork)
        here = write_results(result, tmp_path / "here")
    assert [p.name for p in here] == [p.name for p in one]
    for a, b in zip(one, here, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_pool_worker_interrupted_prints_no_traceback():
    """A pool worker forked while the parent turns SIGINT into KeyboardInterrupt (as ResultDir does) dies
    of the signal quietly (sim.processes.quiet_worker); without the initializer it printed a traceback."""
    import subprocess
    import sys

    script = (
        "import os, signal, sys\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "from concurrent.futures.process import BrokenProcessPool\n"
        "from sim.processes import pool_context, quiet_worker\n"
        "def handler(*a): raise KeyboardInterrupt\n"
        "signal.signal(signal.SIGINT, handler)\n"
        "def hit(): os.kill(os.getpid(), signal.SIGINT)\n"
        "init = quiet_worker if sys.argv[1] == 'quiet' else None\n"
        "with ProcessPoolExecutor(1, mp_context=pool_context(), initializer=init) as pool:\n"
        "    try: pool.submit(hit).result()\n"
        "    except BrokenProcessPool: print('broken')\n"
    )
    runs = {mode: subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=60)
            for mode in ("quiet", "inherited")}
    assert "Traceback" not in runs["quiet"].stderr and "broken" in runs["quiet"].stdout
    assert "Traceback" in runs["inherited"].stderr  # the check can fail: what the initializer prevents
