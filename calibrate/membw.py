"""Memory-bandwidth sweep: streaming and memory-bound kernel families over sizes → achieved bytes/s.

Elementwise ops in a training step (norms, activations, residual adds, optimizer updates) are bound by
memory traffic, so the cost model prices them as bytes / achieved bandwidth at that size. The streaming
kernels (copy, add, mul, gelu) set the generic elementwise curve; norms, softmax and dropout reach a
different share of it (reductions across a row, a random-number generator), so the simulator prices
those families by their own curves, measured here with its byte counts (``family_bytes``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from calibrate.config import MEMBW_FAMILIES, SweepConfig
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

# Row width of each family's [rows, width] operands: a 4096-wide hidden state for the norms and dropout,
# a score-matrix row at sequence 2048 for softmax.
FAMILY_WIDTH = {"norm": 4096, "norm.bwd": 4096, "softmax": 2048, "softmax.bwd": 2048, "dropout": 4096}
# [rows, width] inputs of one set: x, or (dy, x) for the backwards (softmax.bwd's y is made from x).
_FAMILY_INPUTS = {"norm": 1, "norm.bwd": 2, "softmax": 1, "softmax.bwd": 2, "dropout": 1}
STAT_BYTES = 4  # LayerNorm's per-row mean and rstd are fp32 whatever the dtype
DROPOUT_P = 0.1
LAYER_NORM_EPS = 1e-5
# Rounds over a family's sets at set-up. Each call makes its output before the set's old one is freed, so
# the first rotation still grows the heap, and glibc's trim and mmap thresholds settle over the next
# rounds. Measured here, in a fresh process (LayerNorm, 16 sets of 128 KiB): 320, 192 and 128 KiB faulted
# in during rounds 1-3 after a single-round set-up, then none.
FAMILY_SETUP_ROUNDS = 3
assert set(FAMILY_WIDTH) == set(MEMBW_FAMILIES) == set(_FAMILY_INPUTS)


def _tdtype(dtype: str) -> Any:
    torch = import_torch()
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


def _kernel_call(
    kernel: str, size_bytes: int, dtype: str, device: str, config: SweepConfig
) -> tuple[Callable[[int], Any], int, int]:
    """Random input sets and a ``call(i)`` running ``kernel`` on set ``i`` into preallocated outputs
    (a family: ``_family_call``). Returns (call, sets, bytes moved per call)."""
    if kernel in FAMILY_WIDTH:
        return _family_call(kernel, size_bytes, dtype, device, config)
    torch = import_torch()
    tdtype = _tdtype(dtype)
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


def family_rows(kernel: str, size_bytes: int, dtype: str) -> int:
    """Rows of ``kernel``'s [rows, width] operands when one operand is ``size_bytes`` (at least 1)."""
    return max(1, size_bytes // (FAMILY_WIDTH[kernel] * DTYPE_BYTES[dtype]))


def family_bytes(kernel: str, rows: int, width: int, elem_bytes: int) -> int:
    """Bytes one call of family ``kernel`` moves, counted as the simulator counts them: every
    [rows, width] tensor read or written once, LayerNorm's fp32 mean/rstd, dropout's 1-byte mask;
    the width-sized affine weights (and their gradients) are left out."""
    n = rows * width
    if kernel == "norm":
        return 2 * n * elem_bytes + 2 * rows * STAT_BYTES  # x in, y out, mean/rstd out
    if kernel == "norm.bwd":
        return 3 * n * elem_bytes + 2 * rows * STAT_BYTES  # dy, x in, dx out, mean/rstd in
    if kernel == "softmax":
        return 2 * n * elem_bytes
    if kernel == "softmax.bwd":
        return 3 * n * elem_bytes  # dy, y in, dx out
    if kernel == "dropout":
        return (2 * elem_bytes + 1) * n  # x in, y out, bool mask out
    raise ValueError(f"unknown kernel family {kernel!r}; known: {', '.join(FAMILY_WIDTH)}")


def _family_call(
    kernel: str, size_bytes: int, dtype: str, device: str, config: SweepConfig
) -> tuple[Callable[[int], Any], int, int]:
    """As ``_kernel_call`` for a family: the aten op autograd runs, on rotating [rows, width] input sets.

    These ops allocate their outputs (their out= forms copy from a temporary). Each set keeps its last
    outputs until its next call, so the allocator hands the same blocks round and outputs rotate like the
    inputs; every set is called ``FAMILY_SETUP_ROUNDS`` times here, so those blocks exist (and, on CPU, are
    faulted in) before the timing, and an op or dtype this device lacks fails at set-up, where lockstep
    workers skip together.
    On CPU an output above glibc's mmap threshold (32 MiB) is fresh mapped memory on every call, page
    faults included, as in a real CPU training step."""
    torch = import_torch()
    tdtype, e = _tdtype(dtype), DTYPE_BYTES[dtype]
    width = FAMILY_WIDTH[kernel]
    rows = family_rows(kernel, size_bytes, dtype)
    bytes_moved = family_bytes(kernel, rows, width, e)
    n_sets = buffer_sets(bytes_moved, config.timing)
    n_in = _FAMILY_INPUTS[kernel]
    if device == "cpu":
        flat = carve(tdtype, "in", [(rows, width)] * (n_in * n_sets))
        ins = [flat[i * n_in : (i + 1) * n_in] for i in range(n_sets)]
    else:
        gen = torch.Generator(device=device).manual_seed(rows * width)
        ins = [
            [torch.randn(rows, width, device=device, dtype=tdtype, generator=gen) for _ in range(n_in)]
            for _ in range(n_sets)
        ]
    gen_w = torch.Generator(device=device).manual_seed(width)
    weight = torch.randn(width, device=device, dtype=tdtype, generator=gen_w)
    bias = torch.randn(width, device=device, dtype=tdtype, generator=gen_w)
    aten = torch.ops.aten
    kept: list[Any] = [None] * n_sets  # each set's last outputs (see docstring)

    if kernel == "norm":

        def run(i: int) -> Any:
            return aten.native_layer_norm(ins[i][0], [width], weight, bias, LAYER_NORM_EPS)

    elif kernel == "norm.bwd":
        stats = []  # (mean, rstd) of each set's x, from a forward at set-up
        for dy_x in ins:
            _, mean, rstd = aten.native_layer_norm(dy_x[1], [width], weight, bias, LAYER_NORM_EPS)
            stats.append((mean, rstd))
        mask = [True, True, True]

        def run(i: int) -> Any:
            dy, x = ins[i]
            mean, rstd = stats[i]
            return aten.native_layer_norm_backward(dy, x, [width], mean, rstd, weight, bias, mask)

    elif kernel == "softmax":

        def run(i: int) -> Any:
            return torch._softmax(ins[i][0], -1, False)

    elif kernel == "softmax.bwd":
        ys = [torch._softmax(x, -1, False) for _, x in ins]  # the forward's output, as backward reads it

        def run(i: int) -> Any:
            return torch._softmax_backward_data(ins[i][0], ys[i], -1, tdtype)

    else:

        def run(i: int) -> Any:
            return torch.native_dropout(ins[i][0], DROPOUT_P, True)

    def call(i: int) -> Any:
        kept[i] = run(i)
        return kept[i]

    for _ in range(FAMILY_SETUP_ROUNDS):
        for i in range(n_sets):
            call(i)
    return call, n_sets, bytes_moved


def measure_kernel(
    kernel: str,
    size_bytes: int,
    dtype: str,
    device: str,
    config: SweepConfig,
    lockstep: Lockstep | None = None,
) -> dict:
    """Time one kernel at one size; ``bytes_moved`` counts every tensor read and written once (a family:
    ``family_bytes``). ``lockstep``: see timing.time_kernel."""
    call, n_sets, bytes_moved = set_up_point(
        lambda: _kernel_call(kernel, size_bytes, dtype, device, config), lockstep
    )
    timing = time_kernel(call, n_sets, device, config.timing, lockstep)
    shape = (
        {"rows": family_rows(kernel, size_bytes, dtype), "width": FAMILY_WIDTH[kernel]}
        if kernel in FAMILY_WIDTH
        else {}
    )
    return {
        "kernel": kernel,
        "dtype": dtype,
        "size_bytes": size_bytes,
        **shape,
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
    timing.sweep); an out-of-memory size, or an op or dtype the device lacks, becomes a skip, listed
    with the points the sweep leaves out by design (``config.membw_skipped``).

    ``lockstep`` and ``progress`` are for concurrent CPU workers (calibrate.kernels)."""
    points = [
        (k, d, s)
        for d in config.membw_dtypes
        for k in config.membw_kernels
        for s in config.membw_sizes_for(k)
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
            errors=(RuntimeError, ValueError),  # OOM, an op or dtype this device lacks
            device=device,
            cfg=config.timing,
            lockstep=lockstep,
            progress=progress,
            work_key="bytes_moved",
            rate_key="bytes_per_s",
        )
    finally:
        clear_pools()
    return {"measurements": measurements, "skipped": list(config.membw_skipped) + skipped}
