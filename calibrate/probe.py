"""Size a quick CPU sweep from a short probe of this machine's speed.

A fixed quick sweep is minutes on one CPU and hours on another: bf16 matmuls on a CPU without native
bf16 (no AVX512-BF16/AMX) run at 0.2–1.7 GFLOP/s where fp32 reaches tens, so one 1024³ bf16 GEMM there
takes seconds and the sweep's three passes never finish. The probe times one small fp32 and bf16 matmul
(a few tenths of a second), then

* drops a dtype whose matmuls run below ``SLOW_DTYPE_RATIO`` of fp32's speed (the device has no fast
  path for it; ops in that dtype fall back to the datasheet roofline, and the profile says so), and
* takes fewer passes over the sweep, then keeps the GEMM shapes, smallest first, until the predicted
  timing fits ``GEMM_BUDGET_S``.

Everything left out is recorded as a skip with its reason (``SweepConfig.gemm_skipped``), so the profile
and the run's output say what was not measured and how to measure it (the full sweep).
"""

from __future__ import annotations

import time
from dataclasses import replace

from calibrate.config import SweepConfig
from calibrate.timing import import_torch

PROBE_SIZE = 256  # probe GEMM side: ~34 MFLOP, 0.2 s even at 0.2 GFLOP/s
PROBE_S = 0.15  # seconds of calls per dtype once warm
SLOW_DTYPE_RATIO = 0.25  # below this share of fp32's FLOP/s a dtype has no fast path on this device
GEMM_BUDGET_S = 20.0  # predicted seconds for the quick CPU GEMM section (the whole --quick aims at ≤ 60 s)
SETUP_S = 0.03  # per point: operand pools, buffer rotation and bookkeeping besides the timed calls


def gemm_rate(dtype: str, threads: int, size: int = PROBE_SIZE) -> float:
    """FLOP/s of a ``size``³ matmul in ``dtype`` on the CPU with ``threads`` threads (median-free: the
    probe only has to be right within a factor of about two)."""
    torch = import_torch()
    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(size)
        a = torch.randn(size, size, generator=gen).to(tdtype)
        b = torch.randn(size, size, generator=gen).to(tdtype)
        c = torch.empty(size, size, dtype=tdtype)
        torch.matmul(a, b, out=c)  # warm-up (first-call dispatch, page faults)
        calls, t0 = 0, time.perf_counter()
        while True:
            torch.matmul(a, b, out=c)
            calls += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= PROBE_S or calls >= 10_000:
                break
    finally:
        torch.set_num_threads(before)
    return 2.0 * size**3 * calls / elapsed


def predicted_point_s(flops: float, rate: float, config: SweepConfig) -> float:
    """Seconds to time one GEMM point in every pass: warm-up, the batch-sizing probe and the repeats,
    each sample at least ``min_batch_s`` long."""
    t = config.timing
    call = flops / rate
    sample = max(call, min(t.min_batch_s, t.max_inner * call))
    return max(1, t.passes) * ((t.warmup + 1) * call + t.repeats * sample + SETUP_S)


def size_cpu_sweep(config: SweepConfig, threads: int, budget_s: float = GEMM_BUDGET_S,
                   rates: dict[str, float] | None = None) -> SweepConfig:
    """``config`` with its GEMM dtypes and shapes cut to what this CPU measures within ``budget_s``.

    ``rates`` (FLOP/s per dtype) skips the probe (tests)."""
    rates = dict(rates) if rates is not None else {d: gemm_rate(d, threads) for d in config.gemm_dtypes}
    base = rates.get("fp32") or max(rates.values())
    skipped: list[dict] = []
    dtypes = []
    for d in config.gemm_dtypes:
        if rates[d] < SLOW_DTYPE_RATIO * base:
            skipped.append({"dtype": d, "reason": (
                f"{d} matmuls run at {rates[d] / 1e9:.2g} GFLOP/s here vs fp32 {base / 1e9:.3g} GFLOP/s (no fast "
                f"{d} on this CPU): not measured in --quick; {d} ops fall back to the datasheet roofline")})
        else:
            dtypes.append(d)
    order = sorted(config.gemm_shapes, key=lambda s: (s[0] * s[1] * s[2], s))

    def total(cfg: SweepConfig) -> float:
        return sum(predicted_point_s(2.0 * a * b * c, rates[d], cfg) for a, b, c in order for d in dtypes)

    # Fewer passes before fewer shapes: every shape keeps its place in the fit (the largest set the peak,
    # the validate jobs' shapes avoid extrapolation); passes only guard against drift.
    for passes in range(max(1, config.timing.passes), 0, -1):
        config = replace(config, timing=replace(config.timing, passes=passes))
        if total(config) <= budget_s:
            break
    kept: list[tuple[int, int, int]] = []
    spent = 0.0
    for shape in order:
        flops = 2.0 * shape[0] * shape[1] * shape[2]
        cost = sum(predicted_point_s(flops, rates[d], config) for d in dtypes)
        if spent + cost > budget_s:
            for d in dtypes:
                skipped.append({"dtype": d, "m": shape[0], "n": shape[1], "k": shape[2], "reason": (
                    f"over the --quick GEMM budget of {budget_s:.0f} s at {rates[d] / 1e9:.3g} GFLOP/s; the full "
                    "sweep (without --quick) measures it")})
            continue
        kept.append(shape)
        spent += cost
    probe = {"gemm_flops_per_s": rates, "gemm_budget_s": budget_s, "gemm_predicted_s": spent,
             "passes": config.timing.passes,
             "gemm_shapes_kept": len(kept), "gemm_shapes_planned": len(order)}
    return replace(config, gemm_dtypes=tuple(dtypes), gemm_shapes=tuple(kept), gemm_skipped=tuple(skipped),
                   probe=probe)


def describe(config: SweepConfig) -> str:
    """One line for the terminal: what the probe found and what it left out."""
    p = config.probe
    if not p:
        return ""
    rates = ", ".join(f"{d} {r / 1e9:.3g}" for d, r in p["gemm_flops_per_s"].items())
    dropped = sorted({s["dtype"] for s in config.gemm_skipped if "m" not in s})
    text = (f"probe: matmul GFLOP/s {rates}; GEMM sweep sized to {p['gemm_shapes_kept']} of "
            f"{p['gemm_shapes_planned']} shapes in {p['passes']} pass(es) (≈ {p['gemm_predicted_s']:.0f} s)")
    if dropped:
        text += f"; skipped {', '.join(dropped)} (no fast path on this CPU)"
    return text
