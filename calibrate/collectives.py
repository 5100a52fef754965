"""Collective sweep (nccl-tests style): all_reduce, reduce, broadcast, all_gather, reduce_scatter, send/recv.

The run spawns its own local workers (one per GPU, NCCL; or CPU processes, gloo) and watches them: a
worker that dies or stops reporting progress ends the run with an error after a timeout, never a hang.
Under ``torchrun`` (RANK / WORLD_SIZE set) the same measurement runs in-process on every rank.

Sizes follow nccl-tests: ``size_bytes`` is the full buffer (the gathered output for all_gather, the
input for reduce_scatter). Times are per operation: the median over repeats of the slowest rank's
average over back-to-back iterations.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from calibrate.config import CollectiveConfig, group_sizes_for
from calibrate.launch import (
    PROGRESS_TAG,
    READY_TAG,
    WORKER_FLAG,
    CalibrationError,
    cpu_threads_per_device,
    init_distributed,
    keep_group,
    run_workers,
    torchrun_env,
    worker_entry,
)
from calibrate.progress import progress_bar
from calibrate.timing import import_torch

INTRA_NODE = "intra_node"  # same strings as sim.cost.base
INTER_NODE = "inter_node"
ELEM_BYTES = 4  # collectives move float32 ("float" in nccl-tests tables); bandwidth is per byte
__all__ = ["CalibrationError", "format_table", "run_in_process", "run_local", "torchrun_env", "unmeasurable"]


def busbw_factor(op: str, p: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw × factor (reference.md)."""
    if op == "all_reduce":
        return 2.0 * (p - 1) / p
    if op in ("all_gather", "reduce_scatter"):
        return (p - 1) / p
    return 1.0  # broadcast, reduce, send_recv


def unmeasurable(reason: str, world: int) -> dict:
    """The section as recorded when no collective can be measured (one device)."""
    return {"status": "unmeasurable", "reason": reason, "world_size": world, "measurements": []}


# --------------------------------------------------------------------------------------------- worker side


def _plan(
    ops: tuple[str, ...], group_sizes: tuple[int, ...], sizes: tuple[int, ...], hosts: list[str]
) -> list[tuple[str, tuple[int, ...], str, int]]:
    """Every (op, ranks, scope, size) step in a fixed order all ranks agree on."""
    pairs = [(0, 1)]
    other = next((r for r, h in enumerate(hosts) if h != hosts[0]), None)
    if other is not None:
        pairs.append((0, other))
    steps = []
    for op in ops:
        rank_sets = [tuple(p) for p in pairs] if op == "send_recv" else [tuple(range(g)) for g in group_sizes]
        for ranks in rank_sets:
            scope = INTRA_NODE if len({hosts[r] for r in ranks}) == 1 else INTER_NODE
            for size in sizes:
                steps.append((op, ranks, scope, size))
    return steps


def _op_call(
    op: str, size_bytes: int, ranks: tuple[int, ...], group: Any, rank: int, device: Any
) -> tuple[Callable[[], object], int, int]:
    """Buffers and a zero-argument call for one collective; returns (call, bytes, count)."""
    torch = import_torch()
    import torch.distributed as dist

    p = len(ranks)
    count = max(1, size_bytes // ELEM_BYTES)
    if op in ("all_gather", "reduce_scatter"):
        count = max(p, count // p * p)
    buf = torch.randn(count, device=device)
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "all_reduce":
        call = lambda: dist.all_reduce(buf, group=group)  # noqa: E731
    elif op == "reduce":
        call = lambda: dist.reduce(buf, dst=ranks[0], group=group)  # noqa: E731
    elif op == "broadcast":
        call = lambda: dist.broadcast(buf, src=ranks[0], group=group)  # noqa: E731
    elif op == "all_gather":
        shard = torch.randn(count // p, device=device)
        call = lambda: all_gather(buf, shard, group=group)  # noqa: E731
    elif op == "reduce_scatter":
        shard = torch.empty(count // p, device=device)
        call = lambda: reduce_scatter(shard, buf, group=group)  # noqa: E731
    elif op == "send_recv":
        src, dst = ranks
        call = (lambda: dist.send(buf, dst=dst)) if rank == src else (lambda: dist.recv(buf, src=src))  # noqa: E731
    else:
        raise ValueError(f"unknown collective {op!r}")
    return call, count * ELEM_BYTES, count


def _time_step(
    call: Callable[[], object], size_bytes: int, group: Any, device: Any, cfg: CollectiveConfig
) -> dict:
    """Per-op seconds: back-to-back iterations between barriers, slowest rank per repeat, median."""
    torch = import_torch()
    import torch.distributed as dist

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    iters = max(1, min(cfg.max_iters, cfg.target_bytes // max(1, size_bytes)))
    for _ in range(max(1, cfg.warmup)):
        call()
    sync()
    samples = []
    for _ in range(max(1, cfg.repeats)):
        dist.barrier(group=group)
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        sync()
        samples.append((time.perf_counter() - t0) / iters)
    worst = torch.tensor(samples, dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    worst_s = worst.cpu().tolist()
    return {
        "time_s": statistics.median(worst_s),
        "min_s": min(worst_s),
        "max_s": max(worst_s),
        "iters": iters,
    }


def measure(
    device_kind: str, cfg: CollectiveConfig, emit: Callable[[str], None], fault: str | None = None
) -> dict | None:
    """Run the sweep on this rank (process group from env). Rank 0 returns the section; others None."""
    import torch.distributed as dist

    # Longer than the launcher's stall timeout, so a hang is reported as a hang by the launcher.
    rank, world, device, backend = init_distributed(device_kind, cfg.stall_timeout_s + 30)
    try:
        hosts: list[str] = [""] * world
        dist.all_gather_object(hosts, socket.gethostname())
        group_sizes = group_sizes_for(world, cfg.group_sizes)
        steps = _plan(cfg.ops, group_sizes, cfg.sizes_bytes, hosts)
        groups = {}
        for ranks in sorted({s[1] for s in steps}):  # every rank creates every group, in the same order
            groups[ranks] = dist.group.WORLD if len(ranks) == world else dist.new_group(list(ranks))
        emit(f"{READY_TAG} {len(steps)}")
        if fault == "die" and rank == 1:
            os._exit(3)
        if fault == "hang" and rank == 1:
            time.sleep(3600)

        measurements = []
        for i, (op, ranks, scope, size) in enumerate(steps):
            if rank in ranks:
                call, nbytes, count = _op_call(op, size, ranks, groups[ranks], rank, device)
                timing = _time_step(call, nbytes, groups[ranks], device, cfg)
                p = len(ranks)
                algbw = nbytes / timing["time_s"]
                measurements.append(
                    {
                        "op": op,
                        "group_size": p,
                        "ranks": list(ranks),
                        "scope": scope,
                        "size_bytes": nbytes,
                        "count": count,
                        "dtype": "fp32",
                        **timing,
                        "repeats": cfg.repeats,
                        "algbw_Bps": algbw,
                        "busbw_Bps": algbw * busbw_factor(op, p),
                    }
                )
            emit(f"{PROGRESS_TAG} {i + 1} {len(steps)} {op} p={len(ranks)} {size}B")
        dist.barrier()
        if rank != 0:
            return None
        return {
            "status": "done",
            "backend": backend,
            "world_size": world,
            "hosts": sorted(set(hosts)),
            "group_sizes": list(group_sizes),
            "config": asdict(cfg),
            "measurements": measurements,
        }
    finally:
        if not keep_group(device_kind):
            dist.destroy_process_group()


def _worker_run(job: dict, emit: Callable[[str], None]) -> dict | None:
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in job["collectives"].items()}
    cfg = CollectiveConfig(**fields)
    return measure(job["device"], cfg, emit, job.get("fault"))


# --------------------------------------------------------------------------------------------- launcher side


def run_local(device: str, world: int, cfg: CollectiveConfig, fault: str | None = None) -> dict:
    """Spawn ``world`` workers on this machine, watch them, return the section (rank 0's result).

    Raises CalibrationError when a worker exits non-zero, when workers do not connect within
    ``cfg.startup_timeout_s``, or when no progress is reported for ``cfg.stall_timeout_s``.
    ``fault`` ('die' / 'hang' on rank 1) exists so tests can prove the run never hangs.
    """
    job = {"device": device, "collectives": asdict(cfg), "fault": fault}
    section = run_workers(
        "calibrate.collectives",
        job,
        world,
        desc="collectives",
        startup_timeout_s=cfg.startup_timeout_s,
        stall_timeout_s=cfg.stall_timeout_s,
    )
    section["launcher"] = "local"
    section["threads_per_worker"] = cpu_threads_per_device(world) if device == "cpu" else None
    return section


def run_in_process(device: str, cfg: CollectiveConfig) -> dict | None:
    """Under torchrun: measure on this rank; rank 0 returns the section, others None."""
    rank, world = torchrun_env() or (0, 1)
    bar = None

    def emit(line: str) -> None:
        nonlocal bar
        if rank != 0:
            return
        if line.startswith(READY_TAG):
            bar = progress_bar("collectives", int(line.split()[1]))
        elif line.startswith(PROGRESS_TAG) and bar is not None:
            bar.update(int(line.split()[1]) - bar.n)

    try:
        section = measure(device, cfg, emit)
    except Exception as exc:  # a peer died or the collective timed out: one clear line, not a trace
        first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise CalibrationError(f"collectives: rank {rank} of {world} failed: {first}") from exc
    finally:
        if bar is not None:
            bar.close()
    if section is not None:
        section["launcher"] = "torchrun"
    return section


# --------------------------------------------------------------------------------------------- reporting


def format_table(section: dict) -> str:
    """nccl-tests-style table per (op, ranks): size, count, type, time_us, algbw and busbw in GB/s."""
    if section.get("status") != "done":
        return f"# collectives not measured: {section.get('reason', 'unknown')}"
    rows: dict[tuple, list[dict]] = {}
    for m in section["measurements"]:
        rows.setdefault((m["op"], tuple(m["ranks"]), m["scope"]), []).append(m)
    out = []
    for (op, ranks, scope), ms in rows.items():
        out.append(f"# {op}  ranks {len(ranks)} {list(ranks)}  ({scope}, {section.get('backend', '?')})")
        out.append(
            f"#{'size':>12} {'count':>12} {'type':>6} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}"
        )
        for m in sorted(ms, key=lambda m: m["size_bytes"]):
            out.append(
                f" {m['size_bytes']:>12} {m['count']:>12} {'float':>6} {m['time_s'] * 1e6:>10.2f} "
                f"{m['algbw_Bps'] / 1e9:>12.3f} {m['busbw_Bps'] / 1e9:>12.3f}"
            )
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == WORKER_FLAG:
        worker_entry(_worker_run, sys.argv[2])
    print(
        "usage: python -m calibrate.collectives --worker JOB.json (started by dtsim calibrate)",
        file=sys.stderr,
    )
    sys.exit(2)
