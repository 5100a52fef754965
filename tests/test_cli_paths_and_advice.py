"""Paths and advice the CLI gets wrong easily: a '~USER' that does not exist, names too long for the file
system, a closed stdout, the budget advice of commands without --max-events, and plan's reason when every
candidate fails for the same cause."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sim.cli import main

ROOT = Path(__file__).resolve().parent.parent
SEED = str(ROOT / "scenarios" / "seed-pipeline.yaml")
SMALL = str(ROOT / "scenarios" / "gpt3-1.3b-16xa100.yaml")


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    return lines[0]


def test_out_under_an_unknown_users_home_is_one_line(tmp_path, capsys) -> None:
    assert main(["run", SEED, "--out", "~no-such-user-dtsim/x", "--no-charts"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--out" in line and "~no-such-user-dtsim" in line


def test_a_scenario_under_an_unknown_users_home_is_one_line(capsys) -> None:
    assert main(["run", "~no-such-user-dtsim/x.yaml"]) == 2
    assert "~USER" in _one_line(capsys.readouterr().err)


def test_a_calibration_under_an_unknown_users_home_names_its_field(tmp_path, capsys) -> None:
    """In the scenario (its `calibration` key) and as --calibration: one line naming the field, not a
    generic '~USER' line (the key) nor advice to calibrate into that same impossible path (the option)."""
    assert main(["run", SEED, "--set", "calibration=~no-such-user-dtsim/p.json", "--out", str(tmp_path / "a")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("dtsim: error: calibration: '~no-such-user-dtsim/p.json' — starts with") and "in full" in line
    assert main(["run", SEED, "--calibration", "~no-such-user-dtsim/p.json", "--out", str(tmp_path / "b")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "calibration" in line and "no such user" in line and "dtsim calibrate" not in line, line


def test_a_calibration_under_the_users_home_is_found(tmp_path, capsys, monkeypatch) -> None:
    """'~/p.json' quoted (or from a scenario file) reaches dtsim unexpanded: it is the user's home."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "p.json").write_bytes((ROOT / "calibrate" / "profiles" / "cpu-amd-epyc.json").read_bytes())
    assert main(["run", SEED, "--calibration", "~/p.json", "--out", str(tmp_path / "a"), "--no-charts"]) == 0, \
        capsys.readouterr().err
    assert main(["run", SEED, "--set", "calibration=~/p.json", "--out", str(tmp_path / "b"), "--no-charts"]) == 0, \
        capsys.readouterr().err


def test_a_folder_name_too_long_for_the_file_system_names_out(tmp_path, capsys) -> None:
    out = tmp_path / ("y" * 250)  # fits NAME_MAX alone; the staging folder's name beside it would not
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--out" in line and "shorter" in line and "free space" not in line
    assert os.listdir(tmp_path) == []


def test_closed_stdout_is_not_a_crash(tmp_path) -> None:
    cmd = f"{sys.executable} -m sim run {SEED} --out {tmp_path / 'r'} --no-charts >&-"
    p = subprocess.run(cmd, shell=True, capture_output=False, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and "internal error" not in p.stderr, p.stderr
    assert (tmp_path / "r" / "summary.json").exists()


def test_compare_with_one_file_says_what_it_got(capsys) -> None:
    assert main(["compare", SEED]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "got 1 scenario file" in line and "two or more" in line


def test_budget_advice_of_compare_points_at_a_command_that_has_the_flag(tmp_path, capsys) -> None:
    """compare has no --max-events: the advice names dtsim run, which has (it named --max-events, which
    compare then refused as an unrecognised argument)."""
    assert main(["compare", SEED, SEED, "--set", "simulation.steps=1000000000", "--out", str(tmp_path / "c")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "dtsim run --max-events" in line


def test_plan_names_the_cause_when_every_candidate_fails_for_it(tmp_path, capsys) -> None:
    """Every candidate over the event budget: the error says so (it said "no candidate fits in memory …;
    try more GPUs", which would not help)."""
    assert main(["plan", SMALL, "--set", "simulation.steps=1000000000", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no candidate simulates: budget:" in err and "more GPUs" not in err and "fits in memory" not in err


def test_sweep_refuses_a_set_of_a_grid_key_and_both_fit_flags(tmp_path, capsys) -> None:
    """--set of a key the grid also sets was dropped unseen; --fit-data with --no-fit-data: the last won."""
    out = str(tmp_path / "s")
    assert main(["sweep", SMALL, "--grid", "parallel.tensor=1,2", "--set", "parallel.tensor=4", "--out", out]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--set parallel.tensor=4" in line and "--grid" in line
    assert main(["sweep", SMALL, "--grid", "parallel.tensor=1,2", "--fit-data", "--no-fit-data", "--out", out]) == 2
    assert "not allowed with" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "s").exists()


def test_bubble_sweep_without_a_pipeline_says_why_there_is_no_chart(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["run", str(ROOT / "scenarios" / "resnet50-dp-1xa100.yaml"), "--bubble-sweep", "--no-charts",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "--bubble-sweep" in err and "parallel.pipeline 1" in err and not list(out.glob("bubble_vs_m*"))
