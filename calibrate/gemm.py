"""Matmul sweep: achieved FLOP/s per (m, n, k) and dtype, the data the calibrated cost model interpolates."""

from __future__ import annotations

from collections.abc import Callable, Iterable
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

FP8_ALIGN = 16  # torch._scaled_mm needs every dimension to be a multiple of 16


def available_dtypes(device: str, wanted: Iterable[str]) -> tuple[list[str], list[dict]]:
    """Split ``wanted`` into dtypes this device can run and skipped entries saying why not."""
    torch = import_torch()
    ok, skipped = [], []
    for dtype in wanted:
        reason = None
        if device == "cpu" and dtype in ("tf32", "fp16", "fp8"):
            reason = f"{dtype} GEMMs are not calibrated on CPU"
        elif dtype == "fp8":
            if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
                reason = f"torch {torch.__version__} has no torch._scaled_mm / float8_e4m3fn"
            elif torch.cuda.get_device_capability() < (8, 9):
                reason = f"GPU capability {torch.cuda.get_device_capability()} < (8, 9): no fp8 tensor cores"
        elif dtype == "bf16" and device == "cuda" and not torch.cuda.is_bf16_supported():
            reason = "GPU does not support bf16"
        if reason:
            skipped.append({"dtype": dtype, "reason": reason})
        else:
            ok.append(dtype)
    return ok, skipped


def _matmul_call(
    m: int, n: int, k: int, dtype: str, device: str, n_sets_for: Callable[[int], int]
) -> tuple[Callable[[int], Any], int]:
    """Build random operand sets and a ``call(i)`` that multiplies set ``i``. Returns (call, n_sets)."""
    torch = import_torch()
    elem = DTYPE_BYTES[dtype]
    n_sets = n_sets_for(elem * (m * k + k * n + m * n))
    gen = torch.Generator(device=device).manual_seed(m * 1_000_003 + n * 1009 + k)
    if dtype == "fp8":
        if m % FP8_ALIGN or n % FP8_ALIGN or k % FP8_ALIGN:
            raise ValueError(f"fp8 needs m, n, k multiples of {FP8_ALIGN}")
        f8 = torch.float8_e4m3fn
        a_sets = [torch.randn(m, k, device=device, generator=gen).to(f8) for _ in range(n_sets)]
        b_sets = [
            torch.randn(n, k, device=device, generator=gen).to(f8).t() for _ in range(n_sets)
        ]  # col-major
        scale = torch.tensor(1.0, device=device)

        def scaled_call(i: int) -> Any:
            # use_fast_accum stays False (torch's default): cuBLASLt's split accumulator, as Transformer Engine
            # runs its fp8 dgrad and wgrad GEMMs and as the reference profiles' MAMF figures were measured. TE's
            # forward GEMMs use fast accumulation (_2X_ACC_FPROP = False) and may run faster: not measured apart.
            return torch._scaled_mm(
                a_sets[i], b_sets[i], scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16
            )

        return scaled_call, n_sets

    tdtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
        dtype
    ]
    if device == "cpu":
        ins = carve(tdtype, "in", [(m, k), (k, n)] * n_sets)
        a_sets, b_sets = ins[0::2], ins[1::2]
        c_sets = carve(tdtype, "out", [(m, n)] * n_sets)
    else:
        a_sets = [torch.randn(m, k, device=device, dtype=tdtype, generator=gen) for _ in range(n_sets)]
        b_sets = [torch.randn(k, n, device=device, dtype=tdtype, generator=gen) for _ in range(n_sets)]
        c_sets = [torch.empty(m, n, device=device, dtype=tdtype) for _ in range(n_sets)]

    def call(i: int) -> Any:
        return torch.matmul(a_sets[i], b_sets[i], out=c_sets[i])

    return call, n_sets


def measure_gemm(
    m: int, n: int, k: int, dtype: str, device: str, config: SweepConfig, lockstep: Lockstep | None = None
) -> dict:
    """Time one GEMM shape; returns the raw measurement record. ``lockstep``: see timing.time_kernel."""
    torch = import_torch()
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        call, n_sets = set_up_point(
            lambda: _matmul_call(m, n, k, dtype, device, lambda b: buffer_sets(b, config.timing)), lockstep
        )
        timing = time_kernel(call, n_sets, device, config.timing, lockstep)
    finally:
        torch.set_float32_matmul_precision(previous)
    flops = 2.0 * m * n * k
    return {
        "dtype": dtype,
        "m": m,
        "n": n,
        "k": k,
        "flops": flops,
        "time_s": timing.median_s,
        "flops_per_s": flops / timing.median_s,
        "min_s": timing.min_s,
        "max_s": timing.max_s,
        "repeats": timing.repeats,
        "inner": timing.inner,
        "buffer_sets": n_sets,
        "retaken": timing.retaken,
        "disturbed": timing.disturbed,
    }


def run_gemm(
    device: str, config: SweepConfig, lockstep: Lockstep | None = None, progress: Progress = progress_bar
) -> dict:
    """The GEMM section: every (shape, dtype) of the sweep, in ``config.timing.passes`` passes (see
    timing.sweep); failures (OOM, unsupported) become skips.

    ``lockstep`` and ``progress`` are for concurrent CPU workers (calibrate.kernels)."""
    dtypes, skipped = available_dtypes(device, config.gemm_dtypes)
    points = [(dtype, *shape) for dtype in dtypes for shape in config.gemm_shapes]
    try:
        measurements, failed = sweep(
            "gemm",
            points,
            lambda p: measure_gemm(p[1], p[2], p[3], p[0], device, config, lockstep),
            label=lambda p: f"{p[0]} {p[1]}x{p[2]}x{p[3]}",
            skip_record=lambda p, reason: {"dtype": p[0], "m": p[1], "n": p[2], "k": p[3], "reason": reason},
            errors=(RuntimeError, ValueError),  # OOM, unsupported layout/dtype on this build
            device=device,
            cfg=config.timing,
            lockstep=lockstep,
            progress=progress,
            work_key="flops",
            rate_key="flops_per_s",
        )
    finally:
        clear_pools()
    return {"dtypes": dtypes, "measurements": measurements,
            "skipped": skipped + list(config.gemm_skipped) + failed}
