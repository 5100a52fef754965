"""Real measurements on this machine: the --quick CLI path end to end, the collective watchdog, and the
calibrated cost model on the resulting profile. GPU variants are marked ``gpu`` and skip without CUDA."""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from calibrate.cli import main  # noqa: E402
from calibrate.collectives import CalibrationError, format_table, run_local  # noqa: E402
from calibrate.config import tiny_config  # noqa: E402
from calibrate.fit import predict_time_s  # noqa: E402
from calibrate.profile import finished_sections, load_profile  # noqa: E402
from calibrate.run import CalibrationOptions, run_calibration  # noqa: E402
from sim.cost.base import INTER_NODE, INTRA_NODE  # noqa: E402
from sim.cost.calibrated import CalibratedCostModel  # noqa: E402
from sim.workload.ops import ATTENTION, Op, elementwise, fixed, gemm  # noqa: E402

QUICK_LIMIT_S = 120.0
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class StubRoofline:
    """Stands in for the datasheet roofline: a recognisable constant."""

    name = "stub-roofline"

    def op_time_s(self, op: Op) -> float:
        return 123.0

    def link_params(self, scope: str, group_size: int):
        return None

    def report(self) -> dict:
        return {}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """`dtsim calibrate --device cpu --quick` for real, timed (the shipped profile is made the same way)."""
    out = tmp_path_factory.mktemp("quick") / "cpu.json"
    t0 = time.perf_counter()
    rc = main(["--device", "cpu", "--quick", "--out", str(out)])
    return rc, out, time.perf_counter() - t0


def _time_limit_s() -> float:
    """The 2-minute budget holds on an idle machine; other jobs sharing the cores stretch it."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return QUICK_LIMIT_S * max(1.0, load / (os.cpu_count() or 1))


def test_quick_cli_run_writes_a_complete_profile(quick):
    rc, out, wall_s = quick
    assert rc == 0
    assert wall_s < _time_limit_s()
    profile = load_profile(out)
    assert finished_sections(profile) == {"gemm", "memory", "collectives"}
    md = profile["metadata"]
    for key in ("cpu_model", "hostname", "date", "torch_version", "command_line", "env", "device_count"):
        assert key in md
    assert md["command_line"].startswith("dtsim calibrate --device cpu --quick")
    assert profile["run"]["threads_per_device"] >= 1  # one CPU "device" = one worker's share of the cores
    for name in ("gemm", "memory"):  # measured by every device's worker at once (a fully loaded machine)
        assert profile["sections"][name]["workers"] == profile["run"]["world_size"] == 2
    # bf16 is measured unless the probe found no fast bf16 path on this CPU (then it is a recorded skip).
    dropped = {s["dtype"] for s in profile["sections"]["gemm"]["skipped"] if "m" not in s}
    assert dropped <= {"bf16"}
    assert set(profile["fits"]["gemm"]) == {"fp32", "bf16"} - dropped
    assert profile["fits"]["memory"]["max_bytes_per_s"] > 0
    coll = profile["sections"]["collectives"]
    assert coll["status"] == "done" and coll["backend"] == "gloo"
    assert {m["op"] for m in coll["measurements"]} == {
        "all_reduce",
        "reduce",
        "broadcast",
        "all_gather",
        "reduce_scatter",
        "send_recv",
    }
    assert max(m["size_bytes"] for m in coll["measurements"]) <= 64 * 2**20
    table = format_table(coll).splitlines()
    assert table[0].startswith("# all_reduce") and "algbw(GB/s)" in table[1] and "busbw(GB/s)" in table[1]


def test_fitted_ring_all_reduce_reproduces_measurements_within_its_error(quick):
    profile = load_profile(quick[1])
    fit = next(
        f for f in profile["fits"]["collectives"] if f["op"] == "all_reduce" and f["scope"] == INTRA_NODE
    )
    points = [
        m
        for m in profile["sections"]["collectives"]["measurements"]
        if m["op"] == "all_reduce" and m["group_size"] == fit["group_size"]
    ]
    errs = [
        predict_time_s("all_reduce", fit["group_size"], m["size_bytes"], fit["alpha_s"], fit["bandwidth_Bps"])
        / m["time_s"]
        - 1
        for m in points
    ]
    assert len(errs) == fit["n_points"] >= 5
    assert max(abs(e) for e in errs) <= fit["rel_max"] + 1e-9
    assert (sum(e * e for e in errs) / len(errs)) ** 0.5 == pytest.approx(fit["rel_rms"], rel=1e-6)
    assert fit["alpha_s"] > 0 and fit["bandwidth_Bps"] > 0


def test_calibrated_cost_model_on_the_profile(quick):
    profile = load_profile(quick[1])
    cm = CalibratedCostModel(quick[1], fallback=StubRoofline())
    point = profile["sections"]["gemm"]["measurements"][-1]
    op = gemm("measured", point["m"], point["n"], point["k"], point["dtype"])
    assert cm.op_time_s(op) == pytest.approx(
        max(point["time_s"], profile["fits"]["gemm"][point["dtype"]]["min_time_s"])
    )
    assert 0 < cm.op_time_s(gemm("between", 300, 300, 300, "fp32")) < 1.0
    assert cm.op_time_s(gemm("fp16", 256, 256, 256, "fp16")) == 123.0  # not measured on CPU → fallback
    assert 0 < cm.op_time_s(elementwise("add", 3 * 2**20, "bf16")) < 0.1
    measured = "bf16" if "bf16" in profile["fits"]["gemm"] else "fp32"  # bf16 skipped on CPUs without it
    assert 0 < cm.op_time_s(Op("attn", ATTENTION, flops=4 * 512 * 512 * 256, bytes=2e6, dtype=measured)) < 1.0
    assert cm.op_time_s(fixed("wait", 0.25)) == 0.25
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        big = cm.op_time_s(gemm("huge", 65536, 65536, 65536, measured))
        cm.op_time_s(gemm("huge2", 65536, 65536, 32768, measured))
    assert big > 1.0 and not caught  # extrapolation is reported, never a raw Python warning
    assert cm.report()["first_extrapolated_op"].startswith("huge ")
    alpha_s, bw_Bps = cm.link_params(INTRA_NODE, 8)  # nearest measured group size (2)
    assert alpha_s > 0 and bw_Bps > 0
    assert cm.link_params(INTER_NODE, 2) is None
    rep = cm.report()
    assert rep["profile"] == str(quick[1]) and rep["device"] == profile["metadata"]["device_name"]
    assert rep["extrapolated_ops"] == 2
    assert any("fp16" in f for f in rep["fallbacks"])


def test_report_prints_fit_quality_and_writes_png(quick, capsys):
    assert main(["--report", str(quick[1])]) == 0
    out = capsys.readouterr().out
    assert "Leave-one-out error per op family" in out and "all_reduce" in out
    png = quick[1].with_suffix(".png")
    assert png.stat().st_size > 10_000


def test_one_device_records_collectives_as_unmeasurable(tmp_path):
    out = tmp_path / "one.json"
    assert main(["--device", "cpu", "--gpus", "1", "--only", "collectives", "--out", str(out)]) == 0
    section = load_profile(out)["sections"]["collectives"]
    assert section["status"] == "unmeasurable" and "at least 2" in section["reason"]
    assert CalibratedCostModel(out, fallback=StubRoofline()).link_params(INTRA_NODE, 2) is None


@pytest.mark.parametrize("fault,needle", [("die", "died"), ("hang", "no progress")])
def test_a_dead_or_hung_worker_ends_the_run_with_an_error(fault, needle):
    cfg = replace(tiny_config().collectives, ops=("all_reduce",), stall_timeout_s=3.0)
    t0 = time.perf_counter()
    with pytest.raises(CalibrationError, match=needle) as err:
        run_local("cpu", 2, cfg, fault=fault)
    assert "\n" not in str(err.value)
    assert time.perf_counter() - t0 < 60


def test_tiny_sweep_resume_keeps_real_sections(tmp_path):
    """Also: on CPU with 2 devices the kernel sections are measured by 2 workers at once."""
    out = tmp_path / "tiny.json"
    opts = CalibrationOptions(device="cpu", world=2, out=out, sections=("gemm",))
    run_calibration(opts, tiny_config(), [])
    first = load_profile(out)["sections"]["gemm"]
    assert first["workers"] == 2 and first["launcher"] == "local" and first["threads_per_worker"] >= 1
    assert "slowest worker" in first["statistic"]
    assert len(first["measurements"]) == len(tiny_config().gemm_shapes) * 2
    assert all("retaken" in m and m["time_s"] > 0 for m in first["measurements"])
    run_calibration(replace(opts, sections=("gemm", "memory"), resume=True), tiny_config(), [])
    profile = load_profile(out)
    assert profile["sections"]["gemm"] == first
    assert finished_sections(profile) == {"gemm", "memory"}


@pytest.mark.gpu
@needs_cuda
def test_tiny_calibration_on_cuda(tmp_path):
    out = tmp_path / "cuda.json"
    world = min(2, torch.cuda.device_count())
    run_calibration(CalibrationOptions(device="cuda", world=world, out=out), tiny_config("cuda"), [])
    profile = load_profile(out)
    assert finished_sections(profile) == {"gemm", "memory", "collectives"}
    assert profile["metadata"]["cuda_version"] and profile["metadata"]["device_name"]
    cm = CalibratedCostModel(out, fallback=StubRoofline())
    assert 0 < cm.op_time_s(gemm("g", 128, 128, 128, "bf16")) < 0.01
    if world > 1:
        assert cm.link_params(INTRA_NODE, world) is not None


@pytest.mark.gpu
@needs_cuda
def test_quick_gemm_on_cuda_includes_tensor_core_dtypes(tmp_path):
    out = tmp_path / "cuda-gemm.json"
    assert main(["--device", "cuda", "--quick", "--only", "gemm", "--out", str(out)]) == 0
    fits = load_profile(out)["fits"]["gemm"]
    assert {"fp32", "tf32", "bf16", "fp16"} <= set(fits)
    assert fits["bf16"]["max_flops_per_s"] > fits["fp32"]["max_flops_per_s"]


def test_interrupted_remeasurement_leaves_the_old_profile_whole(tmp_path, monkeypatch):
    """A fresh run over an existing profile saves its sections beside it (NAME.partial.json) and moves
    the whole new profile over it only at the end: Ctrl-C in the second section leaves the old file
    byte for byte (it used to hold the new first section and had lost the old second one)."""
    import calibrate.run as cal_run
    from calibrate.cli import _kept

    out = tmp_path / "p.json"
    opts = CalibrationOptions(device="cpu", world=1, out=out, sections=("gemm", "memory"))
    run_calibration(opts, tiny_config(), [])
    old = out.read_bytes()
    partial = tmp_path / "p.partial.json"
    assert cal_run.progress_path(opts) == partial
    measure = cal_run._measure

    def interrupted(name, *args, **kwargs):
        if name == "memory":
            raise KeyboardInterrupt
        return measure(name, *args, **kwargs)

    monkeypatch.setattr(cal_run, "_measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_calibration(opts, tiny_config(), [])
    assert out.read_bytes() == old
    assert finished_sections(load_profile(partial)) == {"gemm"}
    assert f"{out} is unchanged" in _kept(out, partial) and str(partial) in _kept(out, partial)
    monkeypatch.setattr(cal_run, "_measure", measure)
    run_calibration(opts, tiny_config(), [])
    assert not partial.exists() and out.read_bytes() != old
    assert finished_sections(load_profile(out)) == {"gemm", "memory"}


def test_sigterm_stops_calibration_like_ctrl_c(tmp_path):
    """SIGTERM mid-run: the one-line interrupt message, exit 143, no traceback, no worker left behind
    (it used to end the process by the signal with no word, leaving its collective workers)."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "p.json"
    p = subprocess.Popen([sys.executable, "-m", "sim", "calibrate", "--device", "cpu", "--quick", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)}, start_new_session=True)
    time.sleep(4.0)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert "interrupted" in err and "Traceback" not in err, err
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout
