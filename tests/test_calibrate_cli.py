"""`dtsim calibrate` arguments: bad input is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from calibrate.cli import main, slug


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--device", "tpu"], "--device"),
        (["--gpus", "0"], "--gpus"),
        (["--gpus", "two"], "--gpus"),
        (["--only", "gemm,disk"], "--only"),
        (["--out", "profile.txt", "--device", "cpu"], "--out"),
        (["--bogus"], "unrecognized arguments"),
        (["--report", "/nonexistent/profile.json"], "--report"),
        (["--device", "cpu", "--gpus", "1000"], "--gpus"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, needle, capsys):
    if argv[-1] == "1000":
        pytest.importorskip("torch")  # the worker limit is checked once torch has said which device
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err and "Traceback" not in err


def test_cuda_without_gpu_is_a_user_error(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["--device", "cuda", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device" in err and "--device cpu" in err


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "--resume" in capsys.readouterr().out


def test_slug():
    assert slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert slug("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.0GHz") == "intel-xeon-platinum-8480"
    assert slug("AMD EPYC") == "amd-epyc"


def test_a_partial_profile_beside_out_is_never_overwritten(tmp_path, capsys):
    """Re-measuring over p.json saves sections to p.partial.json: one already there (an interrupted run's
    sections, or the user's file) is refused before any measurement, with how to finish it."""
    out, partial = tmp_path / "p.json", tmp_path / "p.partial.json"
    out.write_text("{}")
    partial.write_text('{"my": "notes"}')
    assert main(["--device", "cpu", "--quick", "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "p.partial.json" in err and "--resume" in err
    assert partial.read_text() == '{"my": "notes"}' and out.read_text() == "{}"


def test_a_second_calibration_into_the_same_profile_is_refused(tmp_path, capsys):
    pytest.importorskip("torch")  # the lock is taken once the device is resolved
    from sim.outputs.resultdir import release_lock, take_lock

    out = tmp_path / "p.json"
    held = take_lock(out, "--out")
    try:
        assert main(["--device", "cpu", "--quick", "--out", str(out)]) == 2
    finally:
        release_lock(*held)
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "another dtsim is writing" in err
    assert not out.exists()


def test_an_interrupted_report_plot_leaves_the_last_png(tmp_path, monkeypatch):
    """The fit plot is written through a temporary file: a failure while saving (Ctrl-C) leaves the
    earlier PNG byte for byte, not a truncated one."""
    pytest.importorskip("matplotlib")
    from pathlib import Path

    from matplotlib.figure import Figure

    from calibrate.profile import load_profile
    from calibrate.report import plot_profile

    profile = load_profile(Path(__file__).resolve().parent.parent / "calibrate" / "profiles" / "cpu-amd-epyc.json")
    png = tmp_path / "p.png"
    plot_profile(profile, png)
    before = png.read_bytes()
    def interrupted(self, target, **kwargs):  # Ctrl-C lands while the PNG is half written
        if hasattr(target, "write"):
            target.write(b"\x89PNG half")
        else:
            Path(target).write_bytes(b"\x89PNG half")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", interrupted)
    with pytest.raises(KeyboardInterrupt):
        plot_profile(profile, png)
    assert png.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["p.png"]


@pytest.fixture
def no_resolve(monkeypatch):
    """Fail (never measure) if a command line gets past argument parsing: these must be refused there."""
    import calibrate.cli as cli

    def measured(args):
        raise AssertionError("the bad argument was accepted and the calibration went on to measure")

    monkeypatch.setattr(cli, "_resolve", measured)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--out", ""], "argument --out: got ''; must be a path, not empty"),  # '' is '.': it calibrated into the cwd
        (["--out", "  "], "argument --out: got '  '; must be a path, not empty"),
        (["--report", ""], "argument --report: got ''; must be a path, not empty"),
        (["--out", "~no-such-user-dtsim/p.json"], "no such user"),
        (["--only", "gemm,"], "argument --only: got 'gemm,'; an item of the comma-separated list is empty"),
        (["--only", ",gemm"], "argument --only: got ',gemm'; an item"),
        (["--only", "gemm,,memory"], "argument --only: got 'gemm,,memory'; an item"),
        (["--only", ""], "argument --only: got ''; must name at least one item"),
        (["--gpus", "0"], "(e.g. --gpus 2)"),
    ],
)
def test_empty_paths_and_list_items_are_refused_before_measuring(argv, needle, capsys, no_resolve):
    assert main(["--device", "cpu", "--quick", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err


def test_a_new_out_folder_is_made_before_the_lock_beside_the_profile(tmp_path, capsys, monkeypatch):
    """The lock file goes beside --out: a profile in a folder that does not exist yet (the default
    results/calibration in a fresh checkout, or --out new/p.json) used to be refused with 'cannot create the
    lock file'. The measurement itself is replaced here; the lock is released afterwards."""
    pytest.importorskip("torch")
    import calibrate.run

    seen = []
    monkeypatch.setattr(calibrate.run, "run_calibration", lambda opts, config, argv: seen.append(opts.out))
    out = tmp_path / "new" / "deeper" / "p.json"
    assert main(["--device", "cpu", "--quick", "--out", str(out)]) == 0, capsys.readouterr().err
    assert seen == [out] and out.parent.is_dir() and os.listdir(out.parent) == []
    monkeypatch.chdir(tmp_path)
    assert main(["--device", "cpu", "--quick"]) == 0, capsys.readouterr().err
    assert seen[-1].parent == Path("results") / "calibration" and (tmp_path / "results" / "calibration").is_dir()


def test_resume_of_a_missing_profile_says_it_starts_a_new_one(tmp_path, capsys, monkeypatch):
    """Documented behaviour: --resume with a --out that does not exist starts a new profile. The note saying
    so comes from the CLI, before any measurement (tests/test_calibrate_out_paths.py), not from here."""
    import calibrate.metadata
    from calibrate.config import make_config
    from calibrate.run import CalibrationOptions, _start_profile

    monkeypatch.setattr(calibrate.metadata, "collect_metadata", lambda device, world, argv: {})
    out = tmp_path / "x" / "nope.json"
    profile = _start_profile(CalibrationOptions(device="cpu", world=2, out=out, resume=True),
                             make_config("cpu", True), [])
    assert profile["run"]["device"] == "cpu"
    assert "does not exist yet" not in capsys.readouterr().err  # said once, by the CLI
