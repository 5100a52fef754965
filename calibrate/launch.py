"""Local multi-process launching with a watchdog, shared by collective calibration and validation.

The launcher spawns one worker per device (``python -m <module> --worker job.json``), reads rank 0's
progress lines, and ends the run with a CalibrationError when a worker exits non-zero, when the workers
do not connect in time, or when progress stops: a dead or hung worker never hangs the command.

Worker protocol: rank 0 prints ``@@ready <steps>`` once connected and ``@@progress <done> <total> <what>``
after each step, then writes its result as JSON to ``job["result_path"]`` (atomically).
"""

from __future__ import annotations

import json
import os
import queue
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, NoReturn

from calibrate.cores import usable_cores  # also imported from here by cli and metadata
from calibrate.progress import progress_bar
from calibrate.timing import import_torch

WORKER_FLAG = "--worker"
WORKER_ENV = "DTSIM_CALIBRATE_WORKER"
PROGRESS_TAG = "@@progress"
READY_TAG = "@@ready"


class CalibrationError(Exception):
    """A measurement failed (a worker died or hung). One line; the command exits 1."""


def torchrun_env() -> tuple[int, int] | None:
    """(rank, world) when launched by torchrun (or any launcher setting RANK/WORLD_SIZE), else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and not os.environ.get(WORKER_ENV):
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def cpu_threads_per_device(world: int) -> int:
    """On CPU one simulated 'GPU' is one worker process with an equal share of this machine's cores
    (under torchrun the share is per node: LOCAL_WORLD_SIZE workers)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if torchrun_env() else world
    return max(1, usable_cores() // max(1, local))


def init_distributed(device_kind: str, timeout_s: float) -> tuple[int, int, Any, str]:
    """Join the process group described by the environment (or keep the one this process already joined:
    under torchrun on CPU several sections share one group, see ``keep_group``). Returns (rank, world,
    torch device, backend)."""
    torch = import_torch()
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
        device, backend, kwargs = (
            torch.device("cuda", local_rank),
            "nccl",
            {"device_id": torch.device("cuda", local_rank)},
        )
    else:
        device, backend, kwargs = torch.device("cpu"), "gloo", {}
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    return rank, world, device, backend


def keep_group(device_kind: str) -> bool:
    """Whether an in-process (torchrun) measurement leaves the process group up for the next section.
    On CPU every section runs on all ranks; joining a new group right after leaving one races (a fast
    rank can read a slow rank's old address from the store), so the group is kept until the run ends
    (``leave_group``). On GPU only the collectives use it."""
    return device_kind == "cpu" and torchrun_env() is not None


def leave_group() -> None:
    """End of a torchrun calibration: leave the kept process group, if any."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def worker_entry(run: Callable[[dict, Callable[[str], None]], dict | None], job_path: str) -> NoReturn:
    """A spawned worker's main: read the job, ``run`` it, and (rank 0) write the result atomically."""
    job = json.loads(Path(job_path).read_text())
    torch = import_torch()
    if job["device"] == "cpu":
        torch.set_num_threads(max(1, int(job["threads"])))

    def emit(line: str) -> None:
        if os.environ["RANK"] == "0":
            print(line, flush=True)

    result = run(job, emit)
    if result is not None:
        tmp = job["result_path"] + ".tmp"
        Path(tmp).write_text(json.dumps(result))
        os.replace(tmp, job["result_path"])
    # Leave without interpreter teardown: gloo's threads can abort the process (SIGABRT, "terminate called
    # without an active exception") while Python finalises, after the work is done and saved.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class HostLoad:
    """CPU time other processes used on this machine while a measurement ran, in cores on average
    (Linux: /proc/stat's busy and stolen time, less this process's and its waited-for children's)."""

    def __init__(self) -> None:
        self.t0, self.busy0, self.own0 = time.perf_counter(), _machine_busy_s(), _own_cpu_s()

    def other_cores(self) -> float | None:
        busy = _machine_busy_s()
        wall = time.perf_counter() - self.t0
        if busy is None or self.busy0 is None or wall <= 0:
            return None
        other = (busy - self.busy0) - (_own_cpu_s() - self.own0)
        return round(max(0.0, other) / wall, 3)


def _machine_busy_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / ticks


def _own_cpu_s() -> float:
    return sum(
        r.ru_utime + r.ru_stime
        for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stderr_tail(path: Path) -> str:
    """The last informative line a worker wrote (skipping warnings), for the one-line error."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    useful = [
        ln for ln in lines if "Warning" not in ln and not ln.startswith(("warnings.warn", "return func"))
    ]
    return (useful or lines or [""])[-1][:300]


def run_workers(
    module: str,
    job: dict,
    world: int,
    *,
    desc: str,
    startup_timeout_s: float,
    stall_timeout_s: float,
    env: dict[str, str] | None = None,
) -> dict:
    """Spawn ``world`` workers of ``module`` on this machine, watch them, return rank 0's result.
    ``env`` adds environment variables for the workers. The result gains ``other_load_cores``: the CPU
    other processes used meanwhile (HostLoad; None where unknown), since on a shared machine their load
    is in every time measured."""
    tmp = Path(tempfile.mkdtemp(prefix="dtsim-workers-"))
    result_path = tmp / "result.json"
    threads = cpu_threads_per_device(world)
    job = dict(job, result_path=str(result_path), threads=job.get("threads") or threads)
    (tmp / "job.json").write_text(json.dumps(job))
    root = str(Path(__file__).resolve().parents[1])
    base_env = dict(os.environ)
    base_env.update(
        PYTHONPATH=os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        PYTHONUNBUFFERED="1",
        **{WORKER_ENV: "1"},
    )
    if job["device"] == "cpu":
        base_env["OMP_NUM_THREADS"] = str(job["threads"])
    base_env.update(env or {})
    procs: list[subprocess.Popen] = []
    lines: queue.Queue[str] = queue.Queue()
    load = HostLoad()
    try:
        for r in range(world):
            env = dict(base_env, RANK=str(r), LOCAL_RANK=str(r))
            with open(tmp / f"rank{r}.stderr", "w") as err:  # the child keeps its own descriptor
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", module, WORKER_FLAG, str(tmp / "job.json")],
                        env=env,
                        stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                        stderr=err,
                        text=True,
                    )
                )
        threading.Thread(target=_pump, args=(procs[0].stdout, lines), daemon=True).start()
        _watch(procs, lines, tmp, desc, startup_timeout_s, stall_timeout_s)
        if not result_path.exists():
            tail = _stderr_tail(tmp / "rank0.stderr") or "no error output"
            raise CalibrationError(f"{desc}: rank 0 finished without writing results ({tail})")
        result = json.loads(result_path.read_text())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    result["other_load_cores"] = load.other_cores()  # after the workers were waited for (their CPU counts)
    return result


def _pump(stream: IO[str] | None, out: queue.Queue[str]) -> None:
    """Copy rank 0's stdout into ``out`` line by line (a reader thread, so the watcher never blocks)."""
    assert stream is not None  # rank 0 is started with stdout=PIPE
    for line in stream:
        out.put(line)


def _watch(
    procs: list[subprocess.Popen],
    lines: queue.Queue,
    tmp: Path,
    desc: str,
    startup_timeout_s: float,
    stall_timeout_s: float,
) -> None:
    """Drive the progress bar from rank 0's lines; raise on a dead or silent worker."""
    started = time.monotonic()
    last_progress = started
    last_step = "starting workers"
    ready = False
    bar = None
    try:
        while True:
            try:
                line = lines.get(timeout=0.2).strip()
            except queue.Empty:
                line = None
            now = time.monotonic()
            if line and line.startswith(READY_TAG):
                ready = True
                last_progress, last_step = now, "the first step"
                bar = progress_bar(desc, int(line.split()[1]))
            elif line and line.startswith(PROGRESS_TAG):
                parts = line.split(maxsplit=3)
                last_progress, last_step = now, parts[3] if len(parts) > 3 else last_step
                if bar is not None:
                    bar.update(int(parts[1]) - bar.n)
                    bar.set_postfix_str(last_step, refresh=False)
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                detail = "; ".join(
                    f"rank {r} exited with code {c}: {_stderr_tail(tmp / f'rank{r}.stderr') or 'no error output'}"
                    for r, c in failed
                )
                raise CalibrationError(f"{desc}: a worker died during '{last_step}' ({detail})")
            if all(c == 0 for c in codes) and lines.empty():
                return
            if not ready and now - started > startup_timeout_s:
                tail = _stderr_tail(tmp / "rank0.stderr") or "no error output"
                raise CalibrationError(
                    f"{desc}: workers did not connect within {startup_timeout_s:.0f} s ({tail}); "
                    "check that local TCP ports are usable"
                )
            if ready and now - last_progress > stall_timeout_s:
                raise CalibrationError(
                    f"{desc}: no progress for {stall_timeout_s:.0f} s after '{last_step}'; "
                    "a worker hung, so all workers were stopped"
                )
    finally:
        if bar is not None:
            bar.close()
