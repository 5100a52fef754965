"""Hostile inputs end as one line and exit 2, never a traceback or a hang; work is bounded up front."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import simpy

from sim.budget import DEFAULT_MAX_EVENTS, estimate_work
from sim.cli import main
from sim.engine.network import Network
from sim.errors import ScenarioError
from sim.scenario.load import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SEED = str(ROOT / "scenarios" / "seed-pipeline.yaml")
PROFILE = ROOT / "calibrate" / "profiles" / "cpu-amd-epyc.json"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}


def _fails_in_one_line(argv: list[str], capsys, needle: str) -> str:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and needle in err, err
    return lines[0]


# ---- scenario files --------------------------------------------------------------------------------


def test_scenario_must_be_a_regular_file(tmp_path, capsys) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.yaml"
    os.symlink(tmp_path / "loop2.yaml", loop)
    os.symlink(loop, tmp_path / "loop2.yaml")
    out = str(tmp_path / "out")
    t0 = time.perf_counter()
    _fails_in_one_line(["run", str(fifo), "--out", out], capsys, "pipe (FIFO)")  # does not block
    _fails_in_one_line(["run", "/dev/zero", "--out", out], capsys, "a device")  # does not read 5 GB
    assert time.perf_counter() - t0 < 5
    _fails_in_one_line(["run", str(loop), "--out", out], capsys, "loop of symbolic links")


# ---- ranges that keep results finite ----------------------------------------------------------------


@pytest.mark.parametrize(
    "setting, needle",
    [
        ("model.forward_ms=1e308", "model.forward_ms"),
        ("cluster.stragglers={1: 1e300}", "cluster.stragglers"),
        ("cluster.inter_node={bandwidth_GBps: 1e-6}", "bandwidth"),
        ("cluster.intra_node={bandwidth_Gbps: 1e-300}", "bandwidth"),
        ("cluster.gpu.peak_tflops.bf16=1e-300", "peak_tflops"),
        ("parallel.bucket_MB=1e-300", "bucket_MB"),
        ("cluster.nics_per_node=1000000000", "nics_per_node"),
    ],
)
def test_out_of_range_values_are_one_line(setting, needle, tmp_path, capsys) -> None:
    _fails_in_one_line(["run", SEED, "--set", setting, "--out", str(tmp_path / "o")], capsys, needle)


def test_collective_of_a_million_tebibytes_finishes_at_link_speed(tmp_path, capsys) -> None:
    """1e6 TiB used to stall the clock in float residue; now it ends at once with the ring's bus bandwidth
    (nvlink3: 300 GB/s × its preset efficiency: the NCCL-tests busbw of a large ring)."""
    from sim.hardware.links import INTRA_PRESETS

    expect_GBps = INTRA_PRESETS["nvlink3"].bandwidth_Bps / 1e9
    nccl = str(ROOT / "scenarios" / "nccl-allreduce-8xa100.yaml")
    t0 = time.perf_counter()
    assert main(["run", nccl, "--set", "model.size_bytes=1000000TiB", "--json", "--no-charts",
                 "--out", str(tmp_path / "o")]) == 0
    assert time.perf_counter() - t0 < 10
    (row,) = json.loads(capsys.readouterr().out)["collectives"]
    assert row["size_bytes"] == 2**40 * 10**6 and row["busbw_GBps"] == pytest.approx(expect_GBps, rel=1e-6)
    _fails_in_one_line(["run", nccl, "--set", "model.size_bytes=[1, 2e30]", "--out", str(tmp_path / "o")],
                       capsys, "size_bytes")


def test_time_to_train_stays_readable(tmp_path, capsys) -> None:
    gpt = str(ROOT / "scenarios" / "gpt3-1.3b-16xa100.yaml")
    _fails_in_one_line(["run", gpt, "--set", "training.tokens=1e300", "--out", str(tmp_path / "o")], capsys,
                       "training.tokens")


def test_python_warnings_are_one_plain_line(capsys, monkeypatch) -> None:
    import warnings

    import sim.cli as cli

    def warns(args) -> int:
        warnings.warn("something odd\nwith detail", RuntimeWarning, stacklevel=1)
        return 0

    monkeypatch.setattr(cli, "cmd_schema", warns)
    assert cli.main(["schema"]) == 0
    assert capsys.readouterr().err == "dtsim: warning: something odd\n"


# ---- the network always makes progress --------------------------------------------------------------


def _drain(cap_Bps: float, start_s: float, sizes: list[float]) -> tuple[int, float, list[float]]:
    env = simpy.Environment(initial_time=start_s)
    net = Network(env, np.array([cap_Bps, cap_Bps * 0.7]))
    done: list[float] = []

    class Owner:
        def transfer_done(self, tag: int) -> None:
            done.append(env.now)

    for i, size in enumerate(sizes):
        net.transfer([((i % 2,), 1.0)], size, 1e-6, Owner(), i)
    steps = 0
    while env.peek() < float("inf") and steps < 10_000:
        env.step()
        steps += 1
    return steps, env.now, done


@pytest.mark.parametrize("start_s", [0.0, 34722.402, 1e9])
@pytest.mark.parametrize("cap_Bps", [1e3, 3.7, 1e-3])
def test_slow_links_late_in_a_run_still_finish(cap_Bps, start_s) -> None:
    """A slow link at a late clock used to leave float residue that re-armed a zero-length wake-up forever
    (1 kB/s at t = 34722.402 s never finished). Every wake-up now completes a flow."""
    sizes = [1e6, 3.3e5, 7e5 + 0.1]
    steps, _, done = _drain(cap_Bps, start_s, sizes)
    assert len(done) == 3 and steps < 50
    # Max-min sharing: link 0 carries flows 0 and 2 (fair halves), link 1 flow 1 at 0.7×capacity.
    t1 = 1e-6 + 3.3e5 / (0.7 * cap_Bps)
    t2 = 1e-6 + 2 * (7e5 + 0.1) / cap_Bps
    t0 = t2 + (1e6 - (7e5 + 0.1)) / cap_Bps
    assert sorted(done) == pytest.approx(sorted([start_s + t0, start_s + t1, start_s + t2]), rel=1e-9)


def test_a_transfer_beyond_the_horizon_is_one_error() -> None:
    with pytest.raises(ScenarioError, match="give the links"):
        _drain(1e-9, 0.0, [1e6])


# ---- bounded work -----------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["training.global_batch=1000000", "simulation.steps=1000000"])
def test_huge_work_is_refused_up_front_with_the_flag(setting, tmp_path, capsys) -> None:
    t0 = time.perf_counter()
    line = _fails_in_one_line(["run", SEED, "--set", setting, "--out", str(tmp_path / "o")], capsys, "--max-events")
    assert time.perf_counter() - t0 < 5 and "events" in line
    assert not (tmp_path / "o").exists()


def test_many_gpus_and_sizes_are_refused(tmp_path, capsys) -> None:
    nccl = str(ROOT / "scenarios" / "nccl-allreduce-8xa100.yaml")
    sizes = "[" + ",".join(str(1024 + 2 * i) for i in range(50_000)) + "]"
    _fails_in_one_line(["run", nccl, "--set", f"model.size_bytes={sizes}", "--out", str(tmp_path / "o")],
                       capsys, "--max-events")
    resnet = str(ROOT / "scenarios" / "resnet50-dp-1024xa100-hdr.yaml")
    _fails_in_one_line(["run", resnet, "--set", "cluster.nodes=12800", "--set", "parallel.data=102400",
                        "--set", "training.global_batch=26214400", "--out", str(tmp_path / "o")], capsys, "--max-events")


@pytest.mark.parametrize("name", ["seed-pipeline", "gpt3-1.3b-16xa100", "nccl-allreduce-8xa100",
                                  "seed-data-parallel", "seed-checkpointing"])
def test_estimate_is_the_right_order_of_magnitude(name) -> None:
    """The estimate is the order of magnitude of the work the engine really does: transfers, rate
    recomputes (collective steps) and compute blocks, weighted as sim.budget weighs them."""
    from sim.api import simulate
    from sim.budget import EVENTS_PER_STEP, EVENTS_PER_TRANSFER

    sc = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    st = simulate(sc).stats
    actual = EVENTS_PER_TRANSFER * st["transfers"] + EVENTS_PER_STEP * st["rate_updates"] + st["compute_events"]
    est = estimate_work(sc).events
    assert 0.3 * actual <= est <= 5 * actual + 3000, (est, actual)
    assert est < DEFAULT_MAX_EVENTS


def test_max_events_raises_the_budget(tmp_path, capsys) -> None:
    argv = ["run", SEED, "--set", "simulation.steps=5", "--out", str(tmp_path / "o"), "--no-charts"]
    _fails_in_one_line([*argv, "--max-events", "100"], capsys, "--max-events")
    assert main([*argv, "--max-events", "1e5"]) == 0


def test_budget_message_shows_huge_counts_compactly(tmp_path, capsys) -> None:
    """A typo'd layer count is refused by the budget in one line whose counts stay readable: 1e30 layers over
    8 stages is '1.25e+29 layers', not the 30 digits of a float's exact value."""
    argv = ["run", str(ROOT / "scenarios" / "gpt3-175b-1024xa100-hdr.yaml"), "--set",
            "model.layers=" + "1" + "0" * 30, "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "× 1.25e+29 layers ×" in err and "× 96 micro-batches ×" in err, err
    assert not any(len(word) > 12 and word.isdigit() for word in err.split()), err


# ---- calibration profiles ---------------------------------------------------------------------------


def _profile_with(tmp_path: Path, edit) -> Path:
    data = json.loads(PROFILE.read_text())
    edit(data["fits"])
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda f: f["collectives"][1].__setitem__("bandwidth_Bps", 1e-9), "bandwidth_Bps"),
        (lambda f: f["collectives"][1].__setitem__("bandwidth_Bps", -3.0), "bandwidth_Bps"),
        (lambda f: f["collectives"][1].__setitem__("alpha_s", -1), "alpha_s"),
        (lambda f: f["collectives"][1].__setitem__("group_size", "two"), "group_size"),
        (lambda f: f["gemm"]["bf16"].__setitem__("points", []), "points"),
        (lambda f: f["gemm"]["bf16"]["points"][0].__setitem__(3, 0), "points[0]"),
        (lambda f: f["memory"].__setitem__("kernels", "x"), "kernels"),
        # FLOP/s so low (or a shape so large) that a GEMM would take ∞ s, or so high that it takes 0 s
        (lambda f: f["gemm"]["bf16"]["points"][0].__setitem__(3, 1e-300), "points[0]"),
        (lambda f: f["gemm"]["bf16"]["points"][0].__setitem__(3, 1e300), "points[0]"),
        (lambda f: f["gemm"]["bf16"]["points"][0].__setitem__(0, 1e300), "points[0]"),
        (lambda f: f.__setitem__("memory", []), "fits.memory = []"),
    ],
)
def test_corrupt_profile_is_one_line_naming_file_and_field(edit, needle, tmp_path, capsys) -> None:
    p = _profile_with(tmp_path, edit)
    line = _fails_in_one_line(["run", SEED, "--calibration", str(p), "--out", str(tmp_path / "o")], capsys, needle)
    assert str(p) in line and "dtsim calibrate" in line


def test_a_file_that_is_no_profile_names_the_key_and_the_fix(tmp_path, capsys) -> None:
    other = tmp_path / "list.json"
    other.write_text("[]")
    line = _fails_in_one_line(["run", SEED, "--calibration", str(other), "--out", str(tmp_path / "o")], capsys,
                              "calibration:")
    assert "dtsim calibrate --out" in line
    data = json.loads(PROFILE.read_text())
    data["schema_version"] = "1"
    other.write_text(json.dumps(data))
    _fails_in_one_line(["run", SEED, "--calibration", str(other), "--out", str(tmp_path / "o")], capsys,
                       "whole number 1")


@pytest.mark.parametrize(("setting", "needle"), [('calibration=""', "an empty path"), ("calibration=.", "is not a file")])
def test_calibration_path_that_is_empty_or_a_folder(setting, needle, tmp_path, capsys) -> None:
    _fails_in_one_line(["run", SEED, "--set", setting, "--out", str(tmp_path / "o")], capsys, needle)


@pytest.mark.parametrize("argv", [["run", SEED, "--out", ""], ["run", SEED, "--calibration", ""],
                                  ["plot", ".", "--out", ""], ["validate", "--published", "--out", ""]])
def test_empty_path_options_are_refused(argv, capsys) -> None:
    _fails_in_one_line(argv, capsys, "empty value")


def test_out_under_a_folder_that_takes_no_files_names_both(tmp_path, capsys) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: /proc takes no new files for anyone
            locked = Path("/proc")
        target = locked / "x"
        line = _fails_in_one_line(["run", SEED, "--out", str(target), "--no-charts"], capsys, "cannot be made")
        assert repr(str(target)) in line and repr(str(locked)) in line
        # validate --published checks its --out before simulating any case
        t0 = time.perf_counter()
        _fails_in_one_line(["validate", "--published", "--case", "llama3-8b-8xh100-nemo", "--out",
                            str(target / "t.json")], capsys, "cannot be made")
        assert time.perf_counter() - t0 < 2.0
    finally:
        (tmp_path / "locked").chmod(0o700)


def test_conflicting_trace_flags_are_one_line(tmp_path, capsys) -> None:
    _fails_in_one_line(["run", SEED, "--trace-gz", "--no-trace", "--out", str(tmp_path / "o")], capsys, "--trace-gz")


def test_sweep_grid_errors_name_the_grid(tmp_path, capsys) -> None:
    _fails_in_one_line(["sweep", SEED, "--grid", "nosuch.x=1,2", "--out", str(tmp_path / "s")], capsys, "--grid nosuch.x")
    _fails_in_one_line(["sweep", SEED, "--grid", "parallel.pipeline=a,b", "--out", str(tmp_path / "s")], capsys,
                       "(from --grid parallel.pipeline=a)")


@pytest.mark.parametrize(("content", "needle"), [("", "is empty"), ("name: x\n", "no top-level cases")])
def test_published_cases_file_that_is_empty_or_not_a_case_set(content, needle, tmp_path, capsys) -> None:
    f = tmp_path / "cases.yaml"
    f.write_text(content)
    _fails_in_one_line(["validate", "--published", "--cases", str(f)], capsys, needle)
    _fails_in_one_line(["validate", "--published", "--cases", str(tmp_path)], capsys, "is not a file")
    _fails_in_one_line(["validate", "--published", "--list", "--set", "nosuch=1"], capsys, "--list runs no case")


def test_profile_that_is_a_device_is_named_as_such(capsys) -> None:
    from calibrate.cli import main as calibrate_main

    assert calibrate_main(["--report", "/dev/zero"]) == 2
    assert "a device" in capsys.readouterr().err


def test_profile_with_nan_or_bad_bytes(tmp_path, capsys) -> None:
    p = tmp_path / "nan.json"
    p.write_text(PROFILE.read_text().replace('"alpha_s": 0.00045761263685501293', '"alpha_s": NaN', 1))
    _fails_in_one_line(["run", SEED, "--calibration", str(p), "--out", str(tmp_path / "o")], capsys, "NaN")
    p.write_bytes(b"\xff\xfe{")
    _fails_in_one_line(["run", SEED, "--calibration", str(p), "--out", str(tmp_path / "o")], capsys, "not valid JSON")


def test_calibrated_run_prints_no_python_warnings(tmp_path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "sim", "run", "scenarios/gpt3-1.3b-16xa100.yaml", "--calibration", str(PROFILE),
         "--no-charts", "--out", str(tmp_path / "o")],
        capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "Warning" not in p.stderr and ".py:" not in p.stderr
    assert p.stderr.count("\n") <= 1 and "extrapolated" in p.stderr


def test_calibrate_only_never_drops_sections(tmp_path, capsys) -> None:
    from calibrate.cli import main as calibrate_main

    full = tmp_path / "full.json"
    full.write_text(PROFILE.read_text())
    before = full.read_bytes()
    assert calibrate_main(["--device", "cpu", "--quick", "--only", "memory", "--out", str(full)]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert full.read_bytes() == before
    for bad in ("/dev/null", str(full / "x.json")):
        assert calibrate_main(["--device", "cpu", "--out", bad]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


# ---- plot on broken result folders ------------------------------------------------------------------


@pytest.mark.parametrize("victim", ["summary.json", "timeline.csv", "timeline_meta.json", "trace.json"])
def test_plot_on_truncated_files_is_one_line(victim, tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    capsys.readouterr()
    if victim == "trace.json":
        (out / "timeline_meta.json").unlink()  # a folder from before timeline_meta.json reads the trace
    text = (out / victim).read_bytes()
    (out / victim).write_bytes(text[: len(text) // 2])
    line = _fails_in_one_line(["plot", str(out)], capsys, victim)
    assert "corrupt or truncated" in line


@pytest.mark.parametrize(("content", "needle"), [
    ("header", "no spans"), ("", "header lacks"), ("garbage\n", "header lacks"), ("dir", "is not a file")])
def test_plot_on_an_empty_or_foreign_timeline_is_one_line(content, needle, tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts", "--no-trace"]) == 0
    capsys.readouterr()
    csv_p = out / "timeline.csv"
    header = csv_p.read_text().splitlines()[0] + "\n"
    csv_p.unlink()
    if content == "dir":
        csv_p.mkdir()
    else:
        csv_p.write_text(header if content == "header" else content)
    _fails_in_one_line(["plot", str(out)], capsys, needle)


def test_a_step_that_takes_no_time_is_one_line_and_a_sweep_lists_it(tmp_path, capsys) -> None:
    zero = tmp_path / "zero.yaml"
    zero.write_text("name: zero\ncluster: {nodes: 1, gpus_per_node: 1, gpu: A100}\n"
                    "model: {kind: synthetic, layers: 1, forward_ms: 0, backward_ms: 0}\n"
                    "parallel: {data: 1}\ntraining: {global_batch: 1, micro_batch: 1}\n")
    _fails_in_one_line(["run", str(zero), "--out", str(tmp_path / "r"), "--no-charts"], capsys, "model.forward_ms")
    assert main(["sweep", SEED, "--grid", "model.forward_ms=0,10", "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "1 feasible" in out and "1 invalid" in out and "nothing to time" in out


def test_trace_counter_is_named_in_its_unit_and_plot_reads_it_back(tmp_path, capsys) -> None:
    from sim.metrics import simulated_peak_memory
    from sim.outputs.replot import load_result

    out = tmp_path / "r"
    assert main(["run", str(ROOT / "scenarios" / "gpt3-1.3b-16xa100.yaml"), "--out", str(out), "--no-charts"]) == 0
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and {e["name"] for e in counters} == {"memory_GB"}
    assert all(set(e["args"]) == {"GB"} and e["args"]["GB"] < 200 for e in counters)  # GB, not bytes
    summary = json.loads((out / "summary.json").read_text())
    tl, _ = load_result(out)
    peak = max(simulated_peak_memory(tl).values())
    assert peak == pytest.approx(max(s["simulated_peak"] for s in summary["memory_by_stage"]), rel=1e-9)


# ---- stdout: closed pipes and full disks ------------------------------------------------------------


def test_closed_pipe_exits_quietly() -> None:
    p = subprocess.Popen([sys.executable, "-m", "sim", "schema"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=ROOT, env=ENV)
    p.stdout.read(10)
    p.stdout.close()
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0 and err == b"", err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_disk_on_stdout_is_one_line() -> None:
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "sim", "schema"], stdout=full, stderr=subprocess.PIPE,
                           text=True, cwd=ROOT, env=ENV, timeout=60)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "No space left" in p.stderr


# ---- plan at absurd GPU counts ----------------------------------------------------------------------


def test_divisors_by_factorising() -> None:
    from sim.explore.search import divisors

    for n in (1, 2, 12, 97, 360, 1024, 4096 * 3):
        assert divisors(n) == [k for k in range(1, n + 1) if n % k == 0]
    t0 = time.perf_counter()
    ds = divisors(8_000_000_000_000)  # 2^15 · 5^12
    assert len(ds) == 16 * 13 and ds[-1] == 8_000_000_000_000 and time.perf_counter() - t0 < 1


def test_plan_at_huge_gpu_counts_is_quick_and_does_not_say_try_more(tmp_path, capsys) -> None:
    gpt = str(ROOT / "scenarios" / "gpt3-175b-1024xa100-hdr.yaml")
    for gpus in ("8000000000000", "1000000"):
        t0 = time.perf_counter()
        assert main(["plan", gpt, "--gpus", gpus, "--no-progress", "--out", str(tmp_path / "p")]) == 2
        err = capsys.readouterr().err
        assert time.perf_counter() - t0 < 20
        assert "try more GPUs" not in err and len(err.strip().splitlines()) == 1, err


def test_an_internal_error_is_one_line_and_the_traceback_is_on_request(monkeypatch, capsys) -> None:
    import sim.cli as cli

    def boom(args):
        raise RuntimeError("unexpected state\nsecond line")

    monkeypatch.setattr(cli, "cmd_run", boom)  # build_parser binds `run` to cmd_run when main calls it
    monkeypatch.delenv("DTSIM_TRACEBACK", raising=False)
    assert cli.main(["run", SEED]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: RuntimeError: unexpected state" in err
    monkeypatch.setenv("DTSIM_TRACEBACK", "1")
    with pytest.raises(RuntimeError):
        cli.main(["run", SEED])


# ---- found by fuzzing the command line (each was an internal error, a wrong message or a lost file) ----


@pytest.mark.parametrize("out", [".", "./", "/"])
def test_out_that_names_no_folder_is_one_line(out, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _fails_in_one_line(["run", SEED, "--out", out, "--no-charts"], capsys, "not a folder name")


GPU = ("cluster.gpu={name: g, peak_tflops: {fp32: 19.5, bf16: 312}, memory_GB: 80, "
       "memory_bandwidth_GBps: 2039}")


@pytest.mark.parametrize(
    "setting, needle",
    [
        ("cluster.gpu.power_W=.inf", "finite"),
        ("cluster.gpu.price_per_gpu_hour=.inf", "finite"),
        ("cluster.gpu.memory_GB=true", "cluster.gpu.memory_GB"),  # no bool taken as 1 GB
        ("cluster.gpu.sm_count=true", "whole number"),
        ("cluster.gpu.peak_tflops={bogus: 5, bf16: 312}", "'bogus' is not a dtype"),
        ("cluster.gpu.peak_tflops={}", "at least one dtype"),
        ("cluster.inter_node={bandwidth_Gbps: 200, efficiency: true}", "efficiency"),
        ("simulation.seed=-1", "simulation.seed"),
        ("model.experts=100000", "model.experts"),
    ],
)
def test_hardware_and_seed_values_are_checked(setting, needle, tmp_path, capsys) -> None:
    argv = ["run", SEED, "--set", GPU, "--set", setting, "--out", str(tmp_path / "o"), "--no-charts"]
    if setting.startswith("model.experts"):
        argv = ["run", str(ROOT / "scenarios" / "mixtral-8x7b-32xh100-ep8.yaml"), "--set", setting,
                "--out", str(tmp_path / "o"), "--no-charts"]
    _fails_in_one_line(argv, capsys, needle)


def test_reliability_with_failures_rarer_than_the_run_is_no_failure(tmp_path, capsys) -> None:
    """An MTBF so long that the optimal checkpoint interval exceeds the run: one segment, goodput 100 %
    (it divided by a zero wall time)."""
    from sim.run.reliability import segments

    assert segments(100.0, 1e20) == (0, 100.0)
    assert segments(300.0, 100.0) == (3, 0.0)
    scen = str(ROOT / "scenarios" / "llama3-405b-16384xh100.yaml")
    summary = tmp_path / "s.json"
    assert main(["run", scen, "--set", "reliability.gpu_mtbf_hours=1e30", "--json", "--no-charts", "--no-trace",
                 "--out", str(tmp_path / "o")]) == 0
    summary.write_text(capsys.readouterr().out)
    rel = json.loads(summary.read_text())["reliability"]
    assert rel["goodput"] == pytest.approx(1.0, abs=1e-5)  # one checkpoint over the whole run, no failure


@pytest.mark.parametrize("line2, needle", [
    ("0,compute,F0 L0 fwd,forward,nan,0.01,nan,0,", "start_s nan"),
    ("0,compute,F0 L0 fwd,forward,0.0,inf,inf,0,", "dur_s inf"),
    ("0,compute,F0 L0 fwd,forward,0.0,-1,-1,0,", "dur_s -1"),
])
def test_plot_refuses_times_that_are_not_finite(line2, needle, tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts", "--no-trace"]) == 0
    capsys.readouterr()
    csv_p = out / "timeline.csv"
    lines = csv_p.read_text().splitlines()
    csv_p.write_text("\n".join([lines[0], line2, *lines[2:]]) + "\n")
    _fails_in_one_line(["plot", str(out), "--out", str(tmp_path / "p")], capsys, needle)


@pytest.mark.parametrize("key, value", [
    ("step_time_s", "x"), ("bubble_fraction", []), ("gpu_memory_bytes", {}), ("memory_by_stage", "x"),
    ("memory_by_stage", [1]), ("parallel", "x"), ("parallel", {"pipeline": [2]}), ("parallel", {"pipeline": "x"}),
    ("fits_in_memory", 3)])
def test_plot_refuses_a_summary_with_wrong_types(key, value, tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts", "--no-trace"]) == 0
    capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    summary[key] = value
    (out / "summary.json").write_text(json.dumps(summary))
    _fails_in_one_line(["plot", str(out), "--out", str(tmp_path / "p")], capsys, "summary.json")


def test_plot_reads_a_null_layout_as_absent(tmp_path, capsys) -> None:
    """null is "absent" for every summary key the charts read; parallel: null once raised AttributeError."""
    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts", "--no-trace"]) == 0
    capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    summary["parallel"] = None
    (out / "summary.json").write_text(json.dumps(summary))
    assert main(["plot", str(out), "--out", str(tmp_path / "p")]) == 0
    captured = capsys.readouterr()
    assert "Error" not in captured.err
    assert not (tmp_path / "p" / "pipeline.png").exists()  # no pipeline depth read ⇒ no bubble chart
    assert any((tmp_path / "p").glob("*.png"))


def test_profile_sections_are_checked_and_an_empty_one_still_reports(tmp_path, capsys) -> None:
    from calibrate.cli import main as calibrate_main

    data = json.loads(PROFILE.read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**data, "sections": {"gemm": "x"}}))
    assert calibrate_main(["--report", str(bad), "--out", str(tmp_path / "r.png")]) == 2
    err = capsys.readouterr().err
    assert "sections.gemm" in err and len(err.strip().splitlines()) == 1
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({**data, "sections": {}}))  # the fits stay, their measurements are gone
    assert calibrate_main(["--report", str(empty), "--out", str(tmp_path / "r.png")]) == 0
    assert (tmp_path / "r.png").stat().st_size > 0
    capsys.readouterr()
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{bad")
    assert calibrate_main(["--device", "cpu", "--quick", "--out", str(corrupt)]) == 2
    err = capsys.readouterr().err
    assert "--force" in err and corrupt.read_text() == "{bad"


def test_collective_fit_names_the_missing_key(tmp_path, capsys) -> None:
    p = _profile_with(tmp_path, lambda f: f["collectives"][1].pop("scope"))
    _fails_in_one_line(["run", SEED, "--calibration", str(p), "--out", str(tmp_path / "o")], capsys,
                       "collectives[1].scope")


def test_plan_micro_batch_bound_beyond_the_batch_costs_nothing(tmp_path, capsys) -> None:
    t0 = time.perf_counter()
    assert main(["plan", str(ROOT / "scenarios" / "gpt3-1.3b-16xa100.yaml"), "--max-micro-batch", "100000000",
                 "--out", str(tmp_path / "p")]) == 0
    assert time.perf_counter() - t0 < 60  # it walked every micro-batch up to 10⁸ (minutes)


def test_hf_config_folder_without_config_json(tmp_path, capsys) -> None:
    (tmp_path / "model").mkdir()
    scen = tmp_path / "s.yaml"
    scen.write_text("name: hf\ncluster: {nodes: 1, gpus_per_node: 8, gpu: A100-80GB}\n"
                    f"model: {{kind: transformer, hf_config: {tmp_path / 'model'}, seq_len: 2048}}\n"
                    "parallel: {data: 8}\ntraining: {global_batch: 8, micro_batch: 1}\n")
    _fails_in_one_line(["run", str(scen), "--out", str(tmp_path / "o")], capsys, "no config.json")
