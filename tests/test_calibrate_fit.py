"""Fits without torch: α–β closed forms, GEMM shape interpolation, bandwidth curves."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from calibrate.fit import (
    BandwidthCurve,
    ShapeTable,
    closed_form_coeffs,
    fit_alpha_beta,
    fit_collectives,
    gemm_tables,
    membw_table,
    predict_time_s,
)

SIZES = [2**i for i in range(10, 31, 2)]


def test_closed_forms_match_reference():
    p = 8
    assert closed_form_coeffs("all_reduce", p) == (14.0, pytest.approx(14 / 8))
    assert closed_form_coeffs("all_gather", p) == (7.0, pytest.approx(7 / 8))
    assert closed_form_coeffs("reduce_scatter", p) == (7.0, pytest.approx(7 / 8))
    assert closed_form_coeffs("send_recv", 2) == (1.0, 1.0)
    # reference.md: ring all-reduce T = 2(p−1)(α + N/(pB))
    alpha, bw, n = 5e-6, 100e9, 1e8
    assert predict_time_s("all_reduce", p, n, alpha, bw) == pytest.approx(
        2 * (p - 1) * (alpha + n / (p * bw))
    )


@pytest.mark.parametrize("op,p", [("all_reduce", 2), ("all_reduce", 8), ("all_gather", 4), ("send_recv", 2)])
def test_alpha_beta_fit_recovers_parameters(op, p):
    alpha, bw = 7e-6, 80e9
    times = [predict_time_s(op, p, n, alpha, bw) for n in SIZES]
    fit = fit_alpha_beta(op, p, SIZES, times)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.bandwidth_Bps == pytest.approx(bw, rel=1e-6)
    assert fit.rel_max < 1e-9 and fit.loo_rel_max < 1e-6


def test_noisy_fit_error_bounds_the_data():
    rng = np.random.default_rng(0)
    alpha, bw, p = 20e-6, 10e9, 4
    times = [predict_time_s("all_reduce", p, n, alpha, bw) * rng.uniform(0.9, 1.1) for n in SIZES]
    fit = fit_alpha_beta("all_reduce", p, SIZES, times)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.2)
    assert fit.bandwidth_Bps == pytest.approx(bw, rel=0.2)
    errs = [
        abs(predict_time_s("all_reduce", p, n, fit.alpha_s, fit.bandwidth_Bps) / t - 1)
        for n, t in zip(SIZES, times, strict=True)
    ]
    assert max(errs) == pytest.approx(fit.rel_max)
    assert fit.rel_rms <= fit.rel_max <= 0.15
    assert fit.loo_rel_rms >= fit.rel_rms * 0.99  # held-out points are predicted no better than fitted ones


def test_fit_never_returns_negative_latency():
    times = [n / 5e9 for n in SIZES]  # pure bandwidth
    fit = fit_alpha_beta("send_recv", 2, SIZES, times)
    assert fit.alpha_s >= 0 and fit.bandwidth_Bps == pytest.approx(5e9, rel=1e-6)


def test_fit_collectives_groups_by_op_scope_and_size():
    ms = [
        {
            "op": "all_reduce",
            "scope": "intra_node",
            "group_size": p,
            "size_bytes": n,
            "time_s": predict_time_s("all_reduce", p, n, 1e-5, 1e10),
        }
        for p in (2, 4)
        for n in SIZES
    ]
    fits = fit_collectives(ms)
    assert [(f["op"], f["group_size"]) for f in fits] == [("all_reduce", 2), ("all_reduce", 4)]
    assert all(f["bandwidth_Bps"] == pytest.approx(1e10) for f in fits)


def _gemm_points():
    pts = []
    for m in (64, 256, 1024):
        for n in (64, 256, 1024):
            for k in (64, 256, 1024):
                tput = 1e12 * (1 - np.exp(-(m * n * k) / 2e7))  # throughput grows with size
                pts.append(
                    {
                        "dtype": "bf16",
                        "m": m,
                        "n": n,
                        "k": k,
                        "flops_per_s": tput,
                        "time_s": 2 * m * n * k / tput,
                    }
                )
    return pts


def test_shape_table_interpolates_and_flags_extrapolation():
    table = gemm_tables(_gemm_points())["bf16"]
    st = ShapeTable(table["points"], table["min_time_s"])
    exact, extra = st.flops_per_s(256, 256, 256)
    assert not extra and exact == pytest.approx(1e12 * (1 - np.exp(-(256**3) / 2e7)))
    mid, extra = st.flops_per_s(512, 512, 512)
    assert not extra and st.flops_per_s(256, 256, 256)[0] < mid < st.flops_per_s(1024, 1024, 1024)[0]
    assert st.flops_per_s(4096, 256, 256)[1] and st.flops_per_s(16, 256, 256)[1]
    t_tiny, _ = st.time_s(8, 8, 8)
    assert t_tiny == pytest.approx(table["min_time_s"])  # launch floor
    assert table["loo_rel_rms"] is not None and table["range"]["m"] == [64, 1024]


def test_bandwidth_curve():
    ms = [
        {"kernel": kern, "bytes_moved": s, "bytes_per_s": 1e10 * s / (s + 1e6)}
        for kern in ("copy", "add")
        for s in (1e4, 1e5, 1e6, 1e7, 1e8)
    ]
    table = membw_table(ms)
    curve = BandwidthCurve(table["kernels"])
    bw, extra = curve.bytes_per_s(1e6)
    assert not extra and bw == pytest.approx(5e9)
    assert curve.time_s(1e10)[1] and curve.time_s(1e10)[0] == pytest.approx(1e10 / (1e10 * 1e8 / (1e8 + 1e6)))
    small, extra = curve.time_s(10)
    assert extra and small == pytest.approx(curve.min_time_s)


def test_profile_modules_do_not_import_torch():
    code = (
        "import sys, calibrate.profile, calibrate.fit, calibrate.report, calibrate.config, sim.cost.calibrated;"
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_shapeless_gemm_is_priced_by_flops_and_intensity():
    """A coarse op (FLOPs and bytes, no shape) finds the skinny GEMM it is, not a cube of equal FLOPs."""
    pts = []
    for m in (16, 64, 256, 1024):
        for nk in (256, 1024):
            pts.append([m, nk, nk, 1e11 * m / (m + 128)])  # few rows → low throughput
    st = ShapeTable(pts, 1e-6, elem_bytes=4)
    m, nk = 16, 1024
    flops, nbytes = 2.0 * m * nk * nk, 4.0 * (m * nk + nk * nk + m * nk)
    tput, extra = st.flops_per_s_by_intensity(flops, nbytes)
    assert not extra and tput == pytest.approx(1e11 * 16 / 144)
    side = (flops / 2) ** (1 / 3)
    assert st.flops_per_s(side, side, side)[0] > 2 * tput  # the cube stand-in would be far too fast
