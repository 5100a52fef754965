"""Memory-bandwidth sweep: copy and elementwise kernels over sizes → achieved bytes/s.

Elementwise ops in a training step (norms, activations, residual adds, optimizer updates) are bound by
memory traffic, so the cost model prices them as bytes / achieved bandwidth at that size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from calibrate.config import SweepConfig
from calibrate.progress import Progress, progress_bar
from calibrate.timing import (
    Lockstep,
    buffer_sets,
    carve,
    clear_pools,
    import_torch,
    set_up_point,
    sweep,
    time_kernel,
)
from sim.units import DTYPE_BYTES

# Tensors each kernel touches: (inputs read, outputs written), each of the swept size.
KERNEL_TENSORS = {"copy": (1, 1), "add": (2, 1), "mul": (2, 1), "gelu": (1, 1)}


def _kernel_call(
    kernel: str, size_bytes: int, dtype: str, device: str, config: SweepConfig
) -> tuple[Callable[[int], Any], int, int]:
    """Random input sets and a ``call(i)`` running ``kernel`` on set ``i`` into preallocated outputs.
    Returns (call, sets, bytes moved per call)."""
    torch = import_torch()
    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    numel = max(1, size_bytes // DTYPE_BYTES[dtype])
    n_in, n_out = KERNEL_TENSORS[kernel]
    n_sets = buffer_sets((n_in + n_out) * numel * DTYPE_BYTES[dtype], config.timing)
    if device == "cpu":
        flat = carve(tdtype, "in", [(numel,)] * (n_in * n_sets))
        ins = [flat[i * n_in : (i + 1) * n_in] for i in range(n_sets)]
        outs = carve(tdtype, "out", [(numel,)] * n_sets)
    else:
        gen = torch.Generator(device=device).manual_seed(numel)
        ins = [
            [torch.randn(numel, device=device, dtype=tdtype, generator=gen) for _ in range(n_in)]
            for _ in range(n_sets)
        ]
        outs = [torch.empty(numel, device=device, dtype=tdtype) for _ in range(n_sets)]
    gelu_out = torch.ops.aten.gelu.out

    def call(i: int) -> Any:
        a, out = ins[i], outs[i]
        if kernel == "copy":
            return out.copy_(a[0])
        if kernel == "add":
            return torch.add(a[0], a[1], out=out)
        if kernel == "mul":
            return torch.mul(a[0], a[1], out=out)
        return gelu_out(a[0], approximate="tanh", out=out)

    return call, n_sets, (n_in + n_out) * numel * DTYPE_BYTES[dtype]


def measure_kernel(
    kernel: str,
    size_bytes: int,
    dtype: str,
    device: str,
    config: SweepConfig,
    lockstep: Lockstep | None = None,
) -> dict:
    """Time one kernel at one size; ``bytes_moved`` counts every tensor read and written once.
    ``lockstep``: see timing.time_kernel."""
    call, n_sets, bytes_moved = set_up_point(
        lambda: _kernel_call(kernel, size_bytes, dtype, device, config), lockstep
    )
    timing = time_kernel(call, n_sets, device, config.timing, lockstep)
    return {
        "kernel": kernel,
        "dtype": dtype,
        "size_bytes": size_bytes,
        "bytes_moved": bytes_moved,
        "time_s": timing.median_s,
        "bytes_per_s": bytes_moved / timing.median_s,
        "min_s": timing.min_s,
        "max_s": timing.max_s,
        "repeats": timing.repeats,
        "inner": timing.inner,
        "buffer_sets": n_sets,
        "retaken": timing.retaken,
        "disturbed": timing.disturbed,
    }


def run_membw(
    device: str, config: SweepConfig, lockstep: Lockstep | None = None, progress: Progress = progress_bar
) -> dict:
    """The memory section: every (kernel, dtype, size), in ``config.timing.passes`` passes (see
    timing.sweep); an out-of-memory size becomes a skip.

    ``lockstep`` and ``progress`` are for concurrent CPU workers (calibrate.kernels)."""
    points = [
        (k, d, s) for d in config.membw_dtypes for k in config.membw_kernels for s in config.membw_sizes_bytes
    ]
    try:
        measurements, skipped = sweep(
            "memory",
            points,
            lambda p: measure_kernel(p[0], p[2], p[1], device, config, lockstep),
            label=lambda p: f"{p[0]} {p[1]} {p[2]}",
            skip_record=lambda p, reason: {
                "kernel": p[0],
                "dtype": p[1],
                "size_bytes": p[2],
                "reason": reason,
            },
            errors=(RuntimeError,),
            device=device,
            cfg=config.timing,
            lockstep=lockstep,
            progress=progress,
            work_key="bytes_moved",
            rate_key="bytes_per_s",
        )
    finally:
        clear_pools()
    return {"measurements": measurements, "skipped": skipped}
