"""The GEMM and memory sections on a fully loaded CPU: every device's worker runs the same sweep at once.

On CPU one simulated device is one worker process with ``cores / world`` threads, and in a multi-process
job (the validate jobs, a user's gloo DDP or pipeline run) all workers compute at the same time: they share
the memory bandwidth, the last-level cache and, with gloo's threads, the cores. A kernel timed by one
worker alone on an otherwise idle machine describes a faster device than any of them. On a 2-core EPYC VM
(1 thread per worker), with a second process running the same loop at the same time: a 64 MiB copy took
1.3–1.55× as long (5.7–6.1 ms alone, 8.0–8.9 ms), a 64 MiB add 1.1–1.7×, a fused Adam step 1.0–1.7×,
while fp32 matmuls of 32–128 × 2048 × 2048 took 0.9–1.15× (compute-bound, one core each).

So on CPU with two or more devices these sections are measured by ``world`` workers (spawned and watched
by calibrate.launch, or the torchrun ranks themselves), each with its device's threads, all running the
same sweep in lockstep: per point they agree on the calls per sample and start every sample together
after a barrier; each worker takes its median over samples and the slowest worker's median is recorded (a
synchronous step waits for its slowest device). The profile then describes one device of a fully loaded
machine, which is how multi-process CPU jobs run. GPUs share neither SMs nor memory between
devices, so on CUDA (and with one CPU device) the sections are measured in the command's own process.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from calibrate.config import GEMM, SweepConfig
from calibrate.launch import (
    PROGRESS_TAG,
    READY_TAG,
    WORKER_FLAG,
    CalibrationError,
    init_distributed,
    keep_group,
    run_workers,
    torchrun_env,
    worker_entry,
)
from calibrate.progress import Bar, Progress, progress_bar
from calibrate.timing import PointFailed, import_torch

STATISTIC = "every worker times the same kernel at once (samples start together); the slowest worker's median"


class DistLockstep:
    """calibrate.timing.Lockstep over the default process group (gloo)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.torch, self.dist = import_torch(), dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def check(self, error: Exception | None) -> None:
        failed = self.torch.zeros(self.world, dtype=self.torch.int32)
        failed[self.rank] = int(error is not None)
        self.dist.all_reduce(failed)
        ranks = [r for r, f in enumerate(failed.tolist()) if f]
        if ranks:
            own = str(error).splitlines()[0] if error is not None and str(error) else None
            raise PointFailed(own or f"could not be set up on worker(s) {ranks}")

    def agree(self, inner: int) -> int:
        t = self.torch.tensor([inner], dtype=self.torch.int64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return int(t.item())

    @property
    def workers(self) -> int:
        return self.world

    def barrier(self) -> None:
        self.dist.barrier()

    def all_undisturbed(self, undisturbed: bool) -> bool:
        t = self.torch.tensor([int(undisturbed)], dtype=self.torch.int32)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN)
        return bool(t.item())

    def slowest(self, median_s: float, min_s: float, max_s: float) -> tuple[float, float, float]:
        t = self.torch.tensor([median_s, -min_s, max_s], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        slowest_median, neg_min, greatest = t.tolist()
        return slowest_median, -neg_min, greatest


class _Emitter:
    """A progress_bar stand-in for spawned workers: rank 0's progress lines drive the launcher's bar and
    its stall watchdog (calibrate.launch)."""

    def __init__(self, emit: Callable[[str], None], total: int):
        self.emit, self.total, self.n, self.what = emit, total, 0, ""

    def __enter__(self) -> _Emitter:
        self.emit(f"{READY_TAG} {self.total}")
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_postfix_str(self, what: str, refresh: bool = False) -> None:
        self.what = what

    def update(self, n: int = 1) -> None:
        self.n += n
        self.emit(f"{PROGRESS_TAG} {self.n} {self.total} {self.what}")


class _Silent:
    def set_postfix_str(self, what: str, refresh: bool = False) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass


def measure(section: str, device: str, config: SweepConfig, progress: Progress, launcher: str) -> dict | None:
    """Run ``section`` on this rank in lockstep with the others (process group from the environment);
    rank 0 returns the section, the other ranks None."""
    from calibrate.gemm import run_gemm
    from calibrate.membw import run_membw

    torch = import_torch()
    import torch.distributed as dist

    # Longer than the launcher's stall timeout, so a hang is reported as a hang by the launcher.
    rank, world, _, _ = init_distributed(device, config.timing.point_timeout_s + 30)
    try:
        run = run_gemm if section == GEMM else run_membw
        result = run(device, config, DistLockstep(), progress)
        dist.barrier()
        if rank != 0:
            return None
        return {
            **result,
            "workers": world,
            "threads_per_worker": torch.get_num_threads(),
            "launcher": launcher,
            "statistic": STATISTIC,
        }
    finally:
        if not keep_group(device):
            dist.destroy_process_group()


def _worker_run(job: dict, emit: Callable[[str], None]) -> dict | None:
    config = SweepConfig.from_dict(job["config"])
    return measure(job["section"], job["device"], config, lambda _desc, total: _Emitter(emit, total), "local")


def run_local(section: str, world: int, config: SweepConfig) -> dict:
    """Spawn ``world`` CPU workers that measure ``section`` together; rank 0's section.

    Raises CalibrationError when a worker exits non-zero, when the workers do not connect within
    ``config.timing.startup_timeout_s``, or when a point takes longer than ``config.timing.point_timeout_s``.
    """
    job = {"device": "cpu", "section": section, "config": config.as_dict()}
    return run_workers(
        "calibrate.kernels",
        job,
        world,
        desc=section,
        startup_timeout_s=config.timing.startup_timeout_s,
        stall_timeout_s=config.timing.point_timeout_s,
    )


def run_in_process(section: str, config: SweepConfig) -> dict | None:
    """Under torchrun on CPU: measure with every rank at once; rank 0 returns the section, others None.
    The caller sets this rank's threads (one device's share of the node's cores)."""
    rank, world = torchrun_env() or (0, 1)

    def progress(desc: str, total: int) -> AbstractContextManager[Bar]:
        return progress_bar(desc, total) if rank == 0 else nullcontext(_Silent())

    try:
        return measure(section, "cpu", config, progress, "torchrun")
    except Exception as exc:  # a peer died or timed out: one clear line, not a trace
        first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise CalibrationError(f"{section}: rank {rank} of {world} failed: {first}") from exc


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == WORKER_FLAG:
        worker_entry(_worker_run, sys.argv[2])
    print(
        "usage: python -m calibrate.kernels --worker JOB.json (started by dtsim calibrate)", file=sys.stderr
    )
    sys.exit(2)
