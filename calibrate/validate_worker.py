"""The real side of `dtsim validate`: each worker process builds its rank of the torch job and times steps.

torch is imported through ``calibrate.timing.import_torch`` when a worker runs (an optional dependency:
the simulated side and the CLI's argument checks work without it).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from calibrate.launch import PROGRESS_TAG, READY_TAG, WORKER_FLAG, init_distributed, run_workers, worker_entry
from calibrate.timing import import_torch
from calibrate.validate_jobs import DDP_BUCKET_MB, ValidationJob
from sim.parallel.layout import partition_layers
from sim.schedules.actions import build_schedule

# On CPU, glibc returns large freed blocks to the OS, so every step page-faults fresh activation and
# gradient buffers (a cost GPUs, with the CUDA caching allocator, do not pay and dtsim does not model).
# These keep freed memory for reuse, as a caching allocator would.
CPU_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**30)}


def _adam(params):
    """Fused Adam (one pass over the states), which the simulator's optimizer-bytes model describes;
    torch's default multi-tensor Adam makes several passes."""
    torch = import_torch()
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=1e-4, fused=True)
    except (RuntimeError, TypeError):  # an older torch without fused Adam on this device
        return torch.optim.Adam(params, lr=1e-4)


def _train_step_fn(job: ValidationJob, rank: int, device) -> Callable[[], None]:
    """Build this rank's part of the job and return one training step as a callable."""
    torch = import_torch()
    import torch.distributed as dist  # torch: optional, imported where a worker runs
    import torch.nn.functional as F

    torch.manual_seed(0)
    linears = [torch.nn.Linear(a, b) for a, b in zip(job.widths[:-1], job.widths[1:], strict=True)]
    gen = torch.Generator().manual_seed(rank + 1)
    mb = job.micro_batch

    def batch(width: int):
        return torch.randn(mb, width, generator=gen).to(device)

    if job.pp == 1:
        model = torch.nn.Sequential(*linears).to(device)
        if job.dp > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP  # torch: optional (see above)

            ids = [device.index] if device.type == "cuda" else None
            model = DDP(model, device_ids=ids, bucket_cap_mb=DDP_BUCKET_MB, gradient_as_bucket_view=True)
        opt = _adam(model.parameters())
        x, y = batch(job.widths[0]).requires_grad_(True), batch(job.widths[-1])

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            x.grad = None  # the input gradient is written, not accumulated, as in the simulated dgrad
            F.mse_loss(model(x), y).backward()
            opt.step()

        return step

    stage = rank  # pipeline jobs run one copy (replicas only for single)
    ids = partition_layers(len(linears), job.pp)[stage]
    module = torch.nn.Sequential(*[linears[i] for i in ids]).to(device)
    opt = _adam(module.parameters())
    actions = build_schedule("1f1b", job.pp, job.microbatches)[stage]
    first, last = stage == 0, stage == job.pp - 1
    w_in, w_out = job.widths[ids[0]], job.widths[ids[-1] + 1]
    xs = [batch(w_in).requires_grad_(True) for _ in range(job.microbatches)] if first else []
    ys = [batch(w_out) for _ in range(job.microbatches)] if last else []

    def pipeline_step() -> None:
        opt.zero_grad(set_to_none=True)
        for x in xs:
            x.grad = None
        saved, pending = {}, []
        for act in actions:
            i = act.microbatch
            if act.kind == "F":
                if first:
                    inp = xs[i]
                else:
                    inp = torch.empty(mb, w_in, device=device)
                    dist.recv(inp, src=stage - 1)
                    inp.requires_grad_(True)
                out = module(inp)
                if last:
                    saved[i] = (inp, F.mse_loss(out, ys[i]) / job.microbatches)
                else:
                    saved[i] = (inp, out)
                    sent = out.detach()
                    pending.append((dist.isend(sent, dst=stage + 1), sent))
            else:  # "B": input gradient and weight gradient together
                inp, out = saved.pop(i)
                if last:
                    out.backward()
                else:
                    grad = torch.empty_like(out)
                    dist.recv(grad, src=stage + 1)
                    out.backward(grad)
                if not first:
                    pending.append((dist.isend(inp.grad, dst=stage - 1), inp.grad))
        for work, _ in pending:
            if work is not None:
                work.wait()
        opt.step()

    return pipeline_step


def _worker_run(job: dict, emit: Callable[[str], None]) -> dict | None:
    """One rank of a real job: warm-up steps, then timed steps (slowest rank per step)."""
    torch = import_torch()
    import torch.distributed as dist  # torch: optional, imported where a worker runs

    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in job["job"].items()}
    spec = ValidationJob(**fields)
    torch.set_float32_matmul_precision("high" if spec.dtype == "tf32" else "highest")
    rank, world, device, _ = init_distributed(job["device"], job["stall_timeout_s"] + 30)
    try:
        step = _train_step_fn(spec, rank, device)
        total = spec.warmup + spec.steps
        emit(f"{READY_TAG} {total}")
        times = []
        for s in range(total):
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if s >= spec.warmup:
                times.append(time.perf_counter() - t0)
            emit(f"{PROGRESS_TAG} {s + 1} {total} {spec.name} step {s + 1}")
        worst = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        dist.barrier()
        return {"step_times_s": worst.cpu().tolist()} if rank == 0 else None
    finally:
        dist.destroy_process_group()


def run_real(job: ValidationJob, device: str, threads: int | None, timeout_s: float) -> dict:
    """Run ``job`` with torch on local workers (watched: a dead or hung worker is an error, not a hang)."""
    payload = {"device": device, "job": asdict(job), "stall_timeout_s": timeout_s, "threads": threads}
    return run_workers(
        "calibrate.validate_worker",
        payload,
        job.processes,
        desc=f"validate {job.name}",
        startup_timeout_s=180.0,
        stall_timeout_s=timeout_s,
        env=CPU_ALLOCATOR_ENV if device == "cpu" else None,
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == WORKER_FLAG:
        worker_entry(_worker_run, sys.argv[2])
