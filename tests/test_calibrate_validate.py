"""`dtsim validate`: the scenario it builds is the simulator's, the real jobs run and are watched, bad
arguments are one line and exit 2."""

from __future__ import annotations

import json

import pytest

from calibrate.fit import predict_time_s
from calibrate.profile import new_profile, record_section, save_profile
from calibrate.validate import ValidationJob, _format, jobs_for, main, scenario_for, simulate_job

SIZES = [2**i for i in range(10, 25, 2)]


def _profile(tmp_path, device: str = "cpu"):
    """A small synthetic profile (fits only need consistent numbers)."""
    p = new_profile(
        {"device_name": "test-cpu", "device_count": 2},
        {"device": device, "sweep": "tiny", "world_size": 2, "threads_per_device": 1},
    )
    gemm = [
        {"dtype": "fp32", "m": s, "n": s, "k": s, "flops_per_s": 5e10, "time_s": 2 * s**3 / 5e10}
        for s in (16, 64, 256, 1024)
    ]
    record_section(p, "gemm", {"measurements": gemm}, 1.0)
    mem = [
        {
            "kernel": "copy",
            "dtype": "fp32",
            "size_bytes": s,
            "bytes_moved": 2 * s,
            "bytes_per_s": 2e10,
            "time_s": 2 * s / 2e10,
        }
        for s in SIZES
    ]
    record_section(p, "memory", {"measurements": mem}, 1.0)
    coll = [
        {
            "op": op,
            "scope": "intra_node",
            "group_size": 2,
            "ranks": [0, 1],
            "size_bytes": s,
            "time_s": predict_time_s(op, 2, s, 50e-6, 2e9),
        }
        for op in ("all_reduce", "send_recv")
        for s in SIZES
    ]
    record_section(p, "collectives", {"status": "done", "measurements": coll}, 1.0)
    path = tmp_path / "profile.json"
    save_profile(p, path)
    return p, path


def test_scenario_is_the_same_job_and_simulates(tmp_path):
    profile, path = _profile(tmp_path)
    job = ValidationJob(
        "ddp",
        dp=2,
        pp=1,
        widths=(256, 256, 256),
        micro_batch=8,
        microbatches=1,
        dtype="fp32",
        steps=1,
        warmup=0,
    )
    scenario = scenario_for(job, profile, str(path))
    assert scenario["parallel"]["data"] == 2 and scenario["cluster"]["gpus_per_node"] == 2
    assert [layer["params"] for layer in scenario["model"]["layers"]] == [256 * 256 + 256] * 2
    assert scenario["training"]["global_batch"] == 16
    _, summary = simulate_job(job, profile, str(path))
    assert summary["step_time_s"] > 0
    assert summary["cost_model"]["profile"] == str(path)


def test_jobs_for_respects_world_and_only():
    assert [j.name for j in jobs_for("cpu", 1, True, None, ("single", "ddp", "pipeline"))] == ["single"]
    # A CPU profile describes one device of a fully loaded machine: single runs one copy per device there.
    (single,) = jobs_for("cpu", 2, True, None, ("single",))
    assert single.world == 1 and single.replicas == 2 and single.processes == 2
    assert jobs_for("cuda", 2, True, None, ("single",))[0].processes == 1
    jobs = jobs_for("cpu", 2, True, 3, ("pipeline", "ddp"))
    assert [j.name for j in jobs] == ["pipeline", "ddp"]
    assert all(j.steps == 3 for j in jobs)
    assert jobs[0].global_batch == jobs[1].global_batch // 2  # pipeline: one replica, same micro-batch total


@pytest.mark.parametrize(
    "argv,needle",
    [
        ([], "--profile"),
        (["--profile", "/nonexistent.json"], "--profile"),
        (["--profile", "{p}", "--only", "ddp,zero"], "--only"),
        (["--profile", "{p}", "--tolerance", "-1"], "--tolerance"),
        (["--profile", "{p}", "--device", "cuda"], "--device"),
    ],
)
def test_bad_arguments(tmp_path, capsys, argv, needle):
    _, path = _profile(tmp_path)
    assert main([a.format(p=path) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_real_jobs_run_and_are_compared(tmp_path, capsys):
    pytest.importorskip("torch")
    _, path = _profile(tmp_path)
    out = tmp_path / "val"
    rc = main(
        ["--profile", str(path), "--quick", "--steps", "2", "--only", "pipeline,ddp", "--out", str(out)]
    )
    assert rc in (0, 1)  # pass or fail depends on this machine; the run itself must complete
    result = json.loads((out / "validate.json").read_text())
    assert [j["job"] for j in result["jobs"]] == ["pipeline", "ddp"]
    for job in result["jobs"]:
        assert len(job["measured"]["samples_s"]) == 2 and job["simulated_s"] > 0
        assert job["other_load_cores"] is None or job["other_load_cores"] >= 0
        assert job["passed"] == (abs(job["rel_error"]) <= result["tolerance"])
    assert "pipeline" in capsys.readouterr().out


def test_table_names_copies_statistic_and_other_load():
    measured = {"median_s": 0.2, "min_s": 0.19, "max_s": 0.3}
    rows = [
        {"job": "single", "devices": 1, "replicas": 2, "measured": measured, "simulated_s": 0.21},
        {"job": "ddp", "devices": 2, "replicas": 1, "measured": measured, "simulated_s": 0.25},
    ]
    for row, load in zip(rows, (0.0, 0.8), strict=True):
        row.update(rel_error=row["simulated_s"] / 0.2 - 1, passed=True, other_load_cores=load)
    table = _format(rows, 0.25)
    assert "1 x2" in table and "median over steps" in table and "0.80 cores" in table
    assert "other load: other processes used CPU during ddp (0.80 cores)" in table


@pytest.mark.gpu
def test_validate_on_cuda(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from calibrate.config import tiny_config
    from calibrate.run import CalibrationOptions, run_calibration

    world = min(2, torch.cuda.device_count())
    path = tmp_path / "cuda.json"
    run_calibration(CalibrationOptions(device="cuda", world=world, out=path), tiny_config("cuda"), [])
    out = tmp_path / "val"
    rc = main(["--profile", str(path), "--quick", "--steps", "3", "--out", str(out)])
    assert rc in (0, 1)
    result = json.loads((out / "validate.json").read_text())
    assert result["jobs"][0]["job"] == "single" and result["jobs"][0]["simulated_s"] > 0


def test_noise_band_and_verdict_by_hand():
    from calibrate.validate import noise_band, verdict

    # quartiles of 1..8 (exclusive method): 2.25 and 6.75 → half-IQR 2.25 over the median 4.5 = 0.5
    assert noise_band([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(0.5)
    assert noise_band([0.9, 1.1]) == pytest.approx(0.1)  # two steps: half the range over the median
    assert verdict(-0.20, 0.05, 0.30) == "pass"
    assert verdict(-0.33, 0.05, 0.30) == "noisy"  # 3 points over, inside a 5-point noise band
    assert verdict(-0.46, 0.05, 0.30) == "FAIL"


def test_noisy_jobs_are_rerun_and_the_quietest_kept(monkeypatch):
    import calibrate.validate as v

    runs = iter([
        {"step_times_s": [1.0, 1.6], "other_load_cores": 0.9},  # busy and spread: rerun
        {"step_times_s": [1.0, 1.02], "other_load_cores": 0.0},  # quiet: kept, no third try
        {"step_times_s": [9.0, 9.0], "other_load_cores": 0.0},
    ])
    monkeypatch.setattr(v, "run_real", lambda *a, **k: next(runs))
    monkeypatch.setattr(v, "background_load", lambda seconds=0: 0.0)
    job = v.ValidationJob("single", 1, 1, (8, 8), 4, 1, "fp32", 2, 1)
    got = v._measure_quietly(job, "cpu", 1, 10.0)
    assert got["tries"] == 2 and got["real"]["step_times_s"] == [1.0, 1.02]
    assert got["band"] == pytest.approx(0.01 / 1.01)


def test_a_validate_json_of_the_users_own_is_never_overwritten(tmp_path, capsys):
    """--out/validate.json is replaced only when dtsim validate wrote it; the user's own file by that name
    is refused before any measurement, and an earlier run's result is accepted."""
    from calibrate.validate import _check_not_foreign

    _, path = _profile(tmp_path)
    out = tmp_path / "val"
    out.mkdir()
    (out / "validate.json").write_text('{"mine": 1}')
    assert main(["--profile", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "validate.json" in err and "--out" in err
    assert (out / "validate.json").read_text() == '{"mine": 1}'
    (out / "validate.json").write_text(json.dumps({"command_line": "dtsim validate --profile p.json", "jobs": []}))
    _check_not_foreign(out / "validate.json")  # ours: no error


@pytest.fixture
def no_measuring(monkeypatch):
    """Fail (never measure) if a bad command line gets as far as the real jobs: it must be refused first."""
    import calibrate.validate as v

    def measured(*args, **kwargs):
        raise AssertionError("the bad argument was accepted and a real job started")

    monkeypatch.setattr(v, "run_real", measured)
    monkeypatch.setattr(v, "background_load", measured)
    monkeypatch.setattr(v, "_memory_bytes", lambda device: 16 * 10**9, raising=False)  # same verdicts everywhere


@pytest.mark.parametrize(
    "argv,needle",
    [
        # --timeout: a finite number of seconds > 0 (inf crashed the workers; <= 0 gave up at once)
        (["--timeout", "inf"], "argument --timeout: got 'inf'; must be a number of seconds > 0"),
        (["--timeout", "nan"], "argument --timeout: got 'nan'"),
        (["--timeout", "0"], "argument --timeout: got '0'"),
        (["--timeout", "-5"], "argument --timeout: got '-5'"),
        (["--timeout", "1e300"], "argument --timeout: got '1e300'"),
        # --gpus on cpu: as many worker processes as dtsim calibrate allows (100000 started them all)
        (["--gpus", "100000"], "--gpus: 100000 worker processes asked; must be <= 64 on cpu"),
        (["--gpus", "65"], "must be <= 64 on cpu"),
        # a count's example names the option given, not --gpus
        (["--steps", "0"], "argument --steps: got '0'; must be a whole number >= 1 and <= 1000000 (e.g. --steps 10)"),
        (["--steps", "-1"], "(e.g. --steps 10)"),
        (["--steps", "abc"], "(e.g. --steps 10)"),
        (["--micro-batch", "0"], "argument --micro-batch: got '0'; must be a whole number >= 1 and <= 1000000000 "
                                 "(e.g. --micro-batch 64)"),
        (["--micro-batch", "abc"], "(e.g. --micro-batch 64)"),
        (["--micro-batch", "10000000000"], "(e.g. --micro-batch 64)"),
        # --widths: checked up front and named, never a model field of the scenario built from it
        (["--widths", "10000000000,10000000000"], "argument --widths: got '10000000000,10000000000'; layer 1 would "
                                                   "have more than 1e+15 parameters"),
        (["--widths", "1024,1024,"], "argument --widths: got '1024,1024,'; an item of the comma-separated list is "
                                     "empty"),
        (["--widths", "1024,,1024"], "an item of the comma-separated list is empty"),
        (["--widths", "1000,1000"], "--widths: --widths 1000,1000 gives 1 layer, and the pipeline job"),
        (["--widths", "100000,100000,100000"], "--widths: with --widths 100000,100000,100000 the single job needs at "
                                               "least 640 GB"),
        (["--micro-batch", "100000000"], "--micro-batch: with --micro-batch 100000000 the single job needs"),
        # comma lists: an empty item is a typo, not something to drop
        (["--only", "ddp,"], "argument --only: got 'ddp,'; an item of the comma-separated list is empty"),
        (["--only", ",ddp"], "an item of the comma-separated list is empty"),
        (["--only", ""], "argument --only: got ''; must name at least one item"),
        # paths: an empty one is '.', not what was meant
        (["--out", ""], "argument --out: got ''; must be a path, not empty"),
        (["--tolerance", "nan"], "(e.g. --tolerance 0.25 for 25%)"),
    ],
)
def test_bad_values_are_one_line_before_any_measurement(tmp_path, capsys, no_measuring, argv, needle):
    _, path = _profile(tmp_path)
    assert main(["--profile", str(path), "--quick", "--out", str(tmp_path / "val"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err
    assert "e.g. --gpus" not in err or argv[0] == "--gpus"
    assert not (tmp_path / "val").exists()


def test_every_job_is_simulated_before_any_is_measured(tmp_path, capsys, no_measuring, monkeypatch):
    """A scenario the simulator refuses for the last job stops the command before the first job runs for
    real (it used to be found after minutes of measuring the jobs before it)."""
    import calibrate.validate as v

    real_simulate = v.simulate_job

    def refuse_pipeline(job, profile, path):
        if job.name == "pipeline":
            raise v.ScenarioError("refused for the test", "parallel.pipeline")
        return real_simulate(job, profile, path)

    monkeypatch.setattr(v, "simulate_job", refuse_pipeline)
    _, path = _profile(tmp_path)
    assert main(["--profile", str(path), "--quick", "--out", str(tmp_path / "val")]) == 2
    assert "refused for the test" in capsys.readouterr().err


def test_memory_lower_bound_by_hand():
    """16 bytes per fp32 parameter (weight, gradient, two Adam states) plus one micro-batch's layer inputs;
    on cpu every worker's share, on cuda the fullest GPU."""
    from calibrate.validate import _least_bytes

    (single,) = jobs_for("cpu", 2, True, None, ("single",), (100, 10), 8)
    assert _least_bytes(single, "cpu") == 2 * (16 * (100 * 10 + 10) + 4 * 8 * 100)
    (pipe,) = jobs_for("cuda", 2, True, None, ("pipeline",), (100, 10, 10), 8)
    stage0 = 16 * (100 * 10 + 10) + 4 * 2 * 100  # micro-batch 8 // 4 micro-batches
    assert _least_bytes(pipe, "cuda") == stage0
