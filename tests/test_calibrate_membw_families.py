"""The memory section's kernel families (norm, softmax, dropout and their backwards): bytes counted as the
simulator counts them, a curve per family in the profile, skips instead of crashes, and which sweeps
measure them at which sizes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from calibrate.config import MEMBW_FAMILIES, MEMBW_KERNELS, MEMBW_STREAMING, make_config, tiny_config
from calibrate.fit import membw_table
from calibrate.report import format_report, memory_skips
from sim.units import KiB, MiB

FP32_BYTES = 4
WIDTH = {"norm": 4096, "norm.bwd": 4096, "softmax": 2048, "softmax.bwd": 2048, "dropout": 4096}
# A tiny sweep: one pass, rotation over 2 MiB so a point sets up in milliseconds.
CONFIG = replace(
    tiny_config(),
    membw_kernels=MEMBW_FAMILIES,
    membw_sizes_bytes=(16 * KiB, 64 * KiB),
    timing=replace(tiny_config().timing, passes=1, rotate_bytes=2 * MiB),
)


def expected_bytes(kernel: str, size_bytes: int, e: int) -> tuple[int, int]:
    """(rows, bytes moved) from the simulator's formulas, written out independently of calibrate.membw."""
    width = WIDTH[kernel]
    rows = max(1, size_bytes // (width * e))
    n = rows * width
    return rows, {
        "norm": 2 * n * e + 2 * rows * 4,
        "norm.bwd": 3 * n * e + 2 * rows * 4,
        "softmax": 2 * n * e,
        "softmax.bwd": 3 * n * e,
        "dropout": (2 * e + 1) * n,
    }[kernel]


def _curves(names: tuple[str, ...]) -> list[dict]:
    return [
        {
            "kernel": k,
            "bytes_moved": s,
            "bytes_per_s": (2e10 if k in MEMBW_STREAMING else 5e9) * s / (s + 1e6),
        }
        for k in names
        for s in (1e5, 1e6, 1e7)
    ]


def test_membw_table_has_a_curve_per_family_and_takes_the_peak_from_streaming_kernels():
    table = membw_table(_curves(MEMBW_KERNELS))
    assert set(table["kernels"]) == set(MEMBW_KERNELS)
    for family in MEMBW_FAMILIES:
        curve = table["kernels"][family]
        assert curve["bytes_moved"] == [1e5, 1e6, 1e7] and len(curve["bytes_per_s"]) == 3
    assert table["max_bytes_per_s"] == pytest.approx(2e10 * 1e7 / (1e7 + 1e6))  # copy's peak, not a family's
    assert membw_table(_curves(MEMBW_FAMILIES))["max_bytes_per_s"] > 0  # families alone still have a peak


def test_gpu_sweeps_measure_every_family_at_the_full_ladder_and_cpu_quick_at_one_size():
    for quick in (False, True):
        gpu = make_config("cuda", quick)
        assert set(MEMBW_FAMILIES) <= set(gpu.membw_kernels) and not gpu.membw_skipped
        assert all(gpu.membw_sizes_for(f) == gpu.membw_sizes_bytes for f in MEMBW_FAMILIES)
    full = make_config("cpu", False)
    assert set(MEMBW_FAMILIES) <= set(full.membw_kernels) and not full.membw_skipped
    quick = make_config("cpu", True)
    assert set(MEMBW_FAMILIES) <= set(quick.membw_kernels)
    assert all(quick.membw_sizes_for(f) == (MiB,) for f in MEMBW_FAMILIES)
    assert quick.membw_sizes_for("copy") == quick.membw_sizes_bytes
    left_out = {(s["kernel"], s["size_bytes"]) for s in quick.membw_skipped}
    assert left_out == {(f, s) for f in MEMBW_FAMILIES for s in quick.membw_sizes_bytes if s != MiB}
    (line,) = memory_skips(list(quick.membw_skipped))  # one reason, one line naming every family
    assert all(f in line for f in MEMBW_FAMILIES) and "64 KiB fp32" in line and "1 MiB only" in line


def test_report_names_skipped_points_and_families_without_a_curve():
    ms = _curves(MEMBW_STREAMING + ("norm",))
    profile = {
        "schema_version": 1,
        "metadata": {"cpu_model": "test cpu"},
        "run": {"device": "cpu", "sweep": "quick"},
        "sections": {
            "memory": {
                "status": "done",
                "measurements": ms,
                "skipped": [
                    {
                        "kernel": "dropout",
                        "dtype": "bf16",
                        "size_bytes": 4 * MiB,
                        "reason": "not implemented for 'BFloat16'",
                    },
                ],
            }
        },
        "fits": {"memory": membw_table(ms)},
    }
    text = format_report(profile)
    assert "softmax.bwd" not in text.split("without a curve")[0]  # no row for an unmeasured family
    assert "not measured: dropout at 4 MiB bf16: not implemented for 'BFloat16'" in text
    assert "without a curve (priced from the fallback): norm.bwd, softmax, softmax.bwd, dropout" in text


torch = pytest.importorskip("torch")

from calibrate.membw import family_bytes, measure_kernel, run_membw  # noqa: E402
from calibrate.timing import PointFailed, clear_pools  # noqa: E402


@pytest.mark.parametrize("kernel", MEMBW_FAMILIES)
@pytest.mark.parametrize("size_bytes", [64 * KiB, 1000])
def test_each_family_moves_the_simulators_bytes(kernel: str, size_bytes: int):
    try:
        m = measure_kernel(kernel, size_bytes, "fp32", "cpu", CONFIG)
    finally:
        clear_pools()
    rows, nbytes = expected_bytes(kernel, size_bytes, FP32_BYTES)
    assert m["kernel"] == kernel and m["rows"] == rows and m["width"] == WIDTH[kernel]
    assert m["bytes_moved"] == nbytes == family_bytes(kernel, rows, WIDTH[kernel], FP32_BYTES)
    assert m["time_s"] > 0 and m["bytes_per_s"] == pytest.approx(nbytes / m["time_s"])


@pytest.mark.parametrize("kernel", ["norm", "dropout"])
def test_family_outputs_are_reused_not_grown(kernel: str):
    """Op-allocated outputs are kept per set and every set is called at set-up, so timed calls reuse
    memory already faulted in: after set-up, rounds over the sets fault in (almost) nothing new."""
    resource = pytest.importorskip("resource")
    from calibrate.membw import _family_call

    try:
        call, n_sets, nbytes = _family_call(kernel, 64 * KiB, "fp32", "cpu", CONFIG)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for i in range(4 * n_sets):
            call(i % n_sets)
        faulted_bytes = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * resource.getpagesize()
    finally:
        clear_pools()
    # Growing would fault in all 4 rounds' outputs (4 · n_sets · nbytes). What is left is the process's
    # other page faults: RUSAGE_SELF counts every thread and the interpreter, and inside a full test session
    # under load that reached 160 pages (0.31 of one round here). One round's worth keeps a 4x margin below
    # growth.
    assert n_sets > 1 and faulted_bytes < n_sets * nbytes


def test_a_bf16_family_point_measures_or_is_skipped():
    section = run_membw("cpu", replace(CONFIG, membw_dtypes=("bf16",), membw_sizes_bytes=(16 * KiB,)))
    done = {m["kernel"] for m in section["measurements"]} | {s["kernel"] for s in section["skipped"]}
    assert done == set(MEMBW_FAMILIES)
    e = 2
    for m in section["measurements"]:
        assert m["bytes_moved"] == expected_bytes(m["kernel"], 16 * KiB, e)[1]


def test_sweep_fits_a_curve_per_family():
    section = run_membw("cpu", CONFIG)
    assert not section["skipped"]
    curves = membw_table(section["measurements"])["kernels"]
    assert set(curves) == set(MEMBW_FAMILIES)
    assert all(len(c["bytes_moved"]) == 2 for c in curves.values())


class _OtherWorkerFine:
    """A lockstep whose other worker set the point up: only this worker's error counts."""

    workers = 1

    def check(self, error: Exception | None) -> None:
        if error is not None:
            raise PointFailed(str(error))

    def agree(self, inner: int) -> int:
        return inner

    def barrier(self) -> None:
        pass

    def all_undisturbed(self, undisturbed: bool) -> bool:
        return undisturbed

    def slowest(self, median_s: float, min_s: float, max_s: float) -> tuple[float, float, float]:
        return median_s, min_s, max_s


@pytest.mark.parametrize("lockstep", [None, _OtherWorkerFine()], ids=["alone", "lockstep"])
def test_an_op_the_device_lacks_becomes_a_skip(monkeypatch, lockstep):
    """An unsupported op fails at set-up (each set is called once there), so lockstep workers skip it
    together instead of one failing mid-timing."""

    def unsupported(*args: object) -> None:
        raise RuntimeError("\"softmax_lastdim_kernel_impl\" not implemented for 'BFloat16'")

    monkeypatch.setattr(torch, "_softmax", unsupported)
    config = replace(CONFIG, membw_kernels=("copy", "softmax", "softmax.bwd"), membw_sizes_bytes=(16 * KiB,))
    section = run_membw("cpu", config, lockstep)
    assert [m["kernel"] for m in section["measurements"]] == ["copy"]
    assert [s["kernel"] for s in section["skipped"]] == ["softmax", "softmax.bwd"]
    assert all("not implemented" in s["reason"] for s in section["skipped"])
