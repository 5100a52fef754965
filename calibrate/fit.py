"""Models fitted to raw measurements: α–β collectives, GEMM throughput over shape, bandwidth over size.

Pure numpy (no torch): the simulator's calibrated cost model and the report use these directly.

Collectives are fitted in the closed form of the algorithm, T = a(p)·α + b(p)·N/B, with (a, b):
  all_reduce (ring)               2(p−1),  2(p−1)/p
  all_gather, reduce_scatter      (p−1),   (p−1)/p
  broadcast, reduce (pipelined)   (p−1),   1
  send_recv                       1,       1
so α is the per-step latency and B the per-link bandwidth (B is the nccl-tests bus bandwidth asymptote).
The fit minimises relative error (small messages count as much as large ones).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np

from sim.cost.profile import (  # noqa: F401 (BandwidthCurve, ShapeTable re-exported)
    GEMM_NEIGHBOURS,
    BandwidthCurve,
    ShapeTable,
    _idw,
    streaming_kernels,
)
from sim.units import DTYPE_BYTES


def rms_max(errors: Iterable[float]) -> tuple[float | None, float | None]:
    """(RMS, max |e|) of relative errors; (None, None) when there are none (JSON has no NaN)."""
    e = np.asarray(list(errors), dtype=float)
    if e.size == 0:
        return None, None
    return float(np.sqrt(np.mean(e**2))), float(np.max(np.abs(e)))


def closed_form_coeffs(op: str, p: int) -> tuple[float, float]:
    """(a, b) with T = a·α + b·N/B for ``op`` over ``p`` ranks and N bytes (nccl-tests size)."""
    if op == "all_reduce":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return float(p - 1), (p - 1) / p
    if op in ("broadcast", "reduce"):
        return float(p - 1), 1.0
    if op == "send_recv":
        return 1.0, 1.0
    raise ValueError(f"no closed form for collective {op!r}")


CLOSED_FORM_TEXT = {
    "all_reduce": "ring: T = 2(p-1)·α + 2(p-1)/p · N/B",
    "all_gather": "ring: T = (p-1)·α + (p-1)/p · N/B",
    "reduce_scatter": "ring: T = (p-1)·α + (p-1)/p · N/B",
    "broadcast": "pipelined chain: T = (p-1)·α + N/B",
    "reduce": "pipelined chain: T = (p-1)·α + N/B",
    "send_recv": "point to point: T = α + N/B",
}


def predict_time_s(op: str, p: int, size_bytes: float, alpha_s: float, bandwidth_Bps: float | None) -> float:
    a, b = closed_form_coeffs(op, p)
    return a * alpha_s + (b * size_bytes / bandwidth_Bps if bandwidth_Bps else 0.0)


def _solve_alpha_beta(a: np.ndarray, bn: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Least squares of relative error for t ≈ a·α + bn·x (x = 1/B), with α ≥ 0 and x ≥ 0."""
    design = np.column_stack([a / t, bn / t])
    (alpha, x), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if alpha < 0:  # latency negligible at these sizes: bandwidth term only
        u = bn / t
        alpha, x = 0.0, float(u.sum() / (u @ u))
    if x < 0:  # bandwidth term negligible: latency only
        u = a / t
        alpha, x = float(u.sum() / (u @ u)), 0.0
    return float(alpha), float(x)


@dataclass(frozen=True)
class AlphaBetaFit:
    """An α–β fit and its quality (relative errors of time; LOO = leave-one-out prediction)."""

    alpha_s: float
    bandwidth_Bps: float | None  # None: no bandwidth term could be fitted
    rel_rms: float
    rel_max: float
    loo_rel_rms: float | None  # None with fewer than 3 points
    loo_rel_max: float | None
    n_points: int

    def as_dict(self) -> dict:
        return asdict(self)


def fit_alpha_beta(op: str, p: int, sizes_bytes: Iterable[float], times_s: Iterable[float]) -> AlphaBetaFit:
    """Fit α and B of ``op``'s closed form to measured (size, time) points."""
    n = np.asarray(list(sizes_bytes), dtype=float)
    t = np.asarray(list(times_s), dtype=float)
    if len(n) < 2:
        raise ValueError(f"{op} p={p}: need at least 2 points to fit α and B, got {len(n)}")
    ca, cb = closed_form_coeffs(op, p)
    a, bn = np.full_like(n, ca), cb * n

    def rel_errors(alpha: float, x: float, idx: slice = slice(None)) -> np.ndarray:
        return (a[idx] * alpha + bn[idx] * x - t[idx]) / t[idx]

    alpha, x = _solve_alpha_beta(a, bn, t)
    err = rel_errors(alpha, x)
    loo = []
    if len(n) >= 3:
        for i in range(len(n)):
            keep = np.arange(len(n)) != i
            al, xl = _solve_alpha_beta(a[keep], bn[keep], t[keep])
            loo.append(float(rel_errors(al, xl, slice(i, i + 1))[0]))
    rel_rms, rel_max = rms_max(err)
    assert rel_rms is not None and rel_max is not None  # at least 2 points, checked above
    loo_rms, loo_max = rms_max(loo)
    return AlphaBetaFit(
        alpha_s=alpha,
        bandwidth_Bps=1.0 / x if x > 0 else None,
        rel_rms=rel_rms,
        rel_max=rel_max,
        loo_rel_rms=loo_rms,
        loo_rel_max=loo_max,
        n_points=len(n),
    )


def fit_collectives(measurements: list[dict]) -> list[dict]:
    """One α–β fit per (op, scope, group size) of the collective section's measurements."""
    groups: dict[tuple[str, str, int], list[dict]] = {}
    for m in measurements:
        groups.setdefault((m["op"], m["scope"], m["group_size"]), []).append(m)
    fits = []
    for (op, scope, p), ms in sorted(groups.items()):
        if len(ms) < 2:
            continue
        fit = fit_alpha_beta(op, p, [m["size_bytes"] for m in ms], [m["time_s"] for m in ms])
        fits.append(
            {
                "op": op,
                "scope": scope,
                "group_size": p,
                "model": CLOSED_FORM_TEXT[op],
                **fit.as_dict(),
                "size_range_bytes": [min(m["size_bytes"] for m in ms), max(m["size_bytes"] for m in ms)],
            }
        )
    return fits


# --------------------------------------------------------------------------------------------- GEMM


def gemm_tables(measurements: list[dict]) -> dict[str, dict]:
    """Per dtype: measured (m, n, k, FLOP/s) points, ranges, best throughput, leave-one-out errors."""
    by_dtype: dict[str, list[dict]] = {}
    for m in measurements:
        by_dtype.setdefault(m["dtype"], []).append(m)
    tables = {}
    for dtype, ms in sorted(by_dtype.items()):
        points = [[m["m"], m["n"], m["k"], m["flops_per_s"]] for m in ms]
        min_time_s = min(m["time_s"] for m in ms)
        table = {
            "points": points,
            "elem_bytes": DTYPE_BYTES.get(dtype, 2),
            "min_time_s": min_time_s,
            "max_flops_per_s": max(p[3] for p in points),
            "range": {ax: [min(m[ax] for m in ms), max(m[ax] for m in ms)] for ax in ("m", "n", "k")},
            "interpolation": "inverse-distance weighting of log FLOP/s over the 4 nearest shapes in log2(m,n,k); "
            "shapeless ops: over (log2 FLOPs, 2·log2 intensity)",
        }
        table.update(_gemm_loo(points, min_time_s, table["elem_bytes"]))
        tables[dtype] = table
    return tables


def _gemm_loo(points: list[list[float]], min_time_s: float, elem_bytes: float) -> dict:
    """Leave-one-out relative time error of both interpolations (by shape; by FLOPs and intensity)."""
    if len(points) < 2:
        return {"loo_rel_rms": None, "loo_rel_max": None, "loo_intensity_rel_rms": None}
    st = ShapeTable(points, min_time_s, elem_bytes)
    errs, errs_fi = [], []
    for i, (m, n, k, tput) in enumerate(points):
        pred, _ = st.flops_per_s(m, n, k, exclude=i)
        errs.append(tput / pred - 1.0)  # time_pred / time_true − 1
        flops, nbytes = 2.0 * m * n * k, elem_bytes * (m * k + k * n + m * n)
        pred_fi, _ = st.flops_per_s_by_intensity(flops, nbytes, exclude=i)
        errs_fi.append(tput / pred_fi - 1.0)
    loo_rms, loo_max = rms_max(errs)
    return {"loo_rel_rms": loo_rms, "loo_rel_max": loo_max, "loo_intensity_rel_rms": rms_max(errs_fi)[0]}


# --------------------------------------------------------------------------------------------- memory


def membw_table(measurements: list[dict]) -> dict:
    """Per kernel (all dtypes pooled: bandwidth is per byte): sorted (bytes_moved, bytes/s) and LOO error.
    A kernel family (sim.workload.ops.MEMORY_FAMILIES) is a curve like the streaming kernels; the peak is the streaming
    kernels' (the device's achieved bandwidth), which a norm or dropout does not set."""
    kernels: dict[str, dict[float, list[float]]] = {}
    for m in measurements:
        kernels.setdefault(m["kernel"], {}).setdefault(float(m["bytes_moved"]), []).append(m["bytes_per_s"])
    curves = {}
    for name, by_size in sorted(kernels.items()):
        sizes = sorted(by_size)
        curves[name] = {
            "bytes_moved": sizes,
            "bytes_per_s": [
                float(np.exp(np.mean(np.log(by_size[s])))) for s in sizes
            ],  # geometric mean of dtypes
        }
    if not curves:
        return {}
    errs = []
    for c in curves.values():  # interior points predicted from their neighbours
        x, y = np.log(c["bytes_moved"]), np.log(c["bytes_per_s"])
        for i in range(1, len(x) - 1):
            pred = np.interp(x[i], np.delete(x, i), np.delete(y, i))
            errs.append(math.exp(y[i] - pred) - 1.0)
    loo_rms, loo_max = rms_max(errs)
    best = max(max(curves[name]["bytes_per_s"]) for name in streaming_kernels(curves))
    return {
        "kernels": curves,
        "max_bytes_per_s": best,
        "interpolation": "log-log linear in bytes moved per kernel; a streaming op at the median over the "
        "streaming kernels, a kernel family's op at its family's curve",
        "loo_rel_rms": loo_rms,
        "loo_rel_max": loo_max,
    }
