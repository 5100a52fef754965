"""When dtsim may fork this process, and how its worker pools start otherwise.

``fork`` copies only the calling thread. A lock that another thread of this process holds at that moment
(a notebook kernel's I/O threads, a GUI, a web server, a caller's thread pool) stays held in the child for
ever, so a child that needs it hangs, and so does the parent waiting for its reply; CPython 3.12 warns
about forking a multi-threaded process for that reason. dtsim therefore forks (cheap: the child shares the
parent's imports and data) only while no other thread runs, and worker pools otherwise start from a fork
server, a clean single-threaded process that forks the workers.

tqdm's monitor thread is the one exception: dtsim's own progress bars start it and it lingers up to ten
seconds after them, it only touches tqdm's own bar list under tqdm's lock, and no dtsim child draws a bar.
"""

from __future__ import annotations

import multiprocessing
import threading
from multiprocessing.context import BaseContext


def _harmless(thread: threading.Thread) -> bool:
    try:
        from tqdm._monitor import TMonitor  # private module, stable since tqdm 4.23 (2018)
    except ImportError:  # a tqdm without it starts no such thread
        return False
    return isinstance(thread, TMonitor)


def other_threads() -> list[threading.Thread]:
    """Live threads of this process besides the calling one and tqdm's monitor."""
    me = threading.current_thread()
    return [t for t in threading.enumerate() if t is not me and not _harmless(t)]


def fork_is_safe() -> bool:
    """Whether a forked child inherits no lock some other thread might hold: the platform forks and no
    other thread runs (tqdm's monitor aside)."""
    return "fork" in multiprocessing.get_all_start_methods() and not other_threads()


def pool_context() -> BaseContext:
    """The start method for a pool of workers: fork where that is safe, else a fork server, else spawn."""
    if fork_is_safe():
        return multiprocessing.get_context("fork")
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def quiet_worker() -> None:
    """Pool-worker initializer: Ctrl-C (or SIGTERM) ends a worker by the signal's default action. A forked
    worker inherits the parent's handlers (``ResultDir`` turns both into KeyboardInterrupt), and the
    exception raised in a worker prints a multiprocessing traceback; the parent reports the interrupt."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def interrupt_status(exc: KeyboardInterrupt) -> int:
    """The exit status of an interrupted command, 128 + the signal's number as a shell reports it: 143 for a
    SIGTERM turned into KeyboardInterrupt("SIGTERM") (``ResultDir``, ``dtsim calibrate``), else 130 (Ctrl-C)."""
    return 143 if exc.args and exc.args[0] == "SIGTERM" else 130
