"""Matmul sweep: achieved FLOP/s per (m, n, k) and dtype, the data the calibrated cost model interpolates."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from calibrate.config import SweepConfig
from calibrate.progress import progress_bar
from calibrate.timing import buffer_sets, import_torch, time_kernel
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


def _matmul_call(m: int, n: int, k: int, dtype: str, device: str, n_sets_for: Callable[[int], int]):
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

        def call(i: int):
            return torch._scaled_mm(
                a_sets[i], b_sets[i], scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16
            )

        return call, n_sets

    tdtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
        dtype
    ]
    a_sets = [torch.randn(m, k, device=device, dtype=tdtype, generator=gen) for _ in range(n_sets)]
    b_sets = [torch.randn(k, n, device=device, dtype=tdtype, generator=gen) for _ in range(n_sets)]
    c_sets = [torch.empty(m, n, device=device, dtype=tdtype) for _ in range(n_sets)]

    def call(i: int):
        return torch.matmul(a_sets[i], b_sets[i], out=c_sets[i])

    return call, n_sets


def measure_gemm(m: int, n: int, k: int, dtype: str, device: str, config: SweepConfig) -> dict:
    """Time one GEMM shape; returns the raw measurement record."""
    torch = import_torch()
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        call, n_sets = _matmul_call(m, n, k, dtype, device, lambda b: buffer_sets(b, config.timing))
        timing = time_kernel(call, n_sets, device, config.timing)
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
    }


def run_gemm(device: str, config: SweepConfig) -> dict:
    """The GEMM section: every (shape, dtype) of the sweep; failures (OOM, unsupported) become skips."""
    torch = import_torch()
    dtypes, skipped = available_dtypes(device, config.gemm_dtypes)
    measurements = []
    with progress_bar("gemm", len(dtypes) * len(config.gemm_shapes)) as bar:
        for dtype in dtypes:
            for m, n, k in config.gemm_shapes:
                bar.set_postfix_str(f"{dtype} {m}x{n}x{k}", refresh=False)
                try:
                    measurements.append(measure_gemm(m, n, k, dtype, device, config))
                except (RuntimeError, ValueError) as exc:  # OOM, unsupported layout/dtype on this build
                    reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                    skipped.append({"dtype": dtype, "m": m, "n": n, "k": k, "reason": reason})
                    if device == "cuda":
                        torch.cuda.empty_cache()
                bar.update()
    return {"dtypes": dtypes, "measurements": measurements, "skipped": skipped}
