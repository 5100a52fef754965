"""Unit constants, and the two ways dtsim prints a duration. Everything inside dtsim is SI: seconds, bytes,
bytes/s, FLOP/s."""

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 1024
MiB = 1024**2
GiB = 1024**3
US = 1e-6
MS = 1e-3
TFLOPS = 1e12

# Bytes per element of each precision name used in scenarios.
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
# Mixed-precision training: 16- or 8-bit compute with fp32 master weights (and, for bf16/fp8 in Megatron,
# fp32 gradient accumulation).
MIXED_PRECISIONS = ("fp16", "bf16", "fp8")
FULL_PRECISIONS = ("fp32", "tf32")
PRECISIONS = FULL_PRECISIONS + MIXED_PRECISIONS  # training.precision's values (the keys of DTYPE_BYTES)


def storage_dtype(precision: str) -> str:
    """Precision that activations, weights and elementwise kernels are kept in: fp8 training (Transformer
    Engine) casts only GEMM inputs to fp8 and keeps everything else in bf16."""
    return "bf16" if precision == "fp8" else precision


def format_seconds(seconds: float) -> str:
    """A duration with 3 decimals in s, ms or µs: the run summary's fixed-point style (3 significant digits
    from 1e9 s, ~32 years, where fixed point would print the hundreds of digits of a never-failing MTBF's
    optimum)."""
    if seconds >= 1e9:
        return f"{seconds:.3g} s"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= MS:
        return f"{seconds / MS:.3f} ms"
    return f"{seconds / US:.2f} µs"


def format_hours(hours: float) -> str:
    """Hours with 2 decimals, or 3 significant digits from 1e5 h (an MTBF may be up to 1e300 h)."""
    return f"{hours:.2f} h" if abs(hours) < 1e5 else f"{hours:.3g} h"


def format_days(days: float) -> str:
    """A time to train: days from one day up, else hours, else minutes (a short run is not '0.00 days')."""
    if days >= 1:
        return f"{days:.2f} days"
    hours = days * 24
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.1f} min"


def format_duration(seconds: float) -> str:
    """3 significant digits in s, ms or µs, never an exponent: tables and chart titles."""
    for scale, unit in ((1.0, "s"), (MS, "ms"), (US, "µs")):
        if abs(seconds) >= scale or unit == "µs":
            value = seconds / scale
            return f"{value:.3g} {unit}" if abs(value) < 1000 else f"{value:,.0f} {unit}"
    return f"{seconds} s"  # pragma: no cover
