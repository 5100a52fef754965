"""`dtsim sweep`: a mistake in a --set value is reported as the --set's (it failed every point, and was
reported as the first grid point's); a grid point's own mistake still names the grid point."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.cli import main

ROOT = Path(__file__).resolve().parent.parent
SEED = str(ROOT / "scenarios" / "seed-pipeline.yaml")  # 4 GPUs: data 1 × pipeline 4


def _sweep(tmp_path: Path, *args: str) -> list[str]:
    return ["sweep", SEED, *args, "--out", str(tmp_path / "s"), "--no-progress", "--no-charts", "--workers", "1"]


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    return lines[0]


@pytest.mark.parametrize(("setting", "names"), [
    ("parallel.zero=9", "parallel.zero: 9 — must be ≤ 3; use a value ≤ 3 (from --set parallel.zero=9)"),
    ("parallel.schedule=nosuch", "parallel.schedule: 'nosuch' — must be one of"),
    # a cross-section rule (global batch 8 by micro-batch 3) names the field it checks and the --set
    ("training.micro_batch=3", "training.global_batch: 8 — must be a multiple of data×micro_batch"),
])
def test_a_bad_set_value_is_reported_as_the_sets(tmp_path, capsys, setting: str, names: str) -> None:
    assert main(_sweep(tmp_path, "--grid", "parallel.pipeline=2,4", "--set", setting)) == 2
    line = _one_line(capsys.readouterr().err)
    assert names in line and f"--set {setting})" in line, line
    assert "--grid" not in line and "no point of the sweep" not in line, line
    assert not (tmp_path / "s").exists()


def test_a_grid_points_error_still_names_the_grid_point(tmp_path, capsys) -> None:
    """pipeline 3 does not divide 4 GPUs: the point's own error, though a (valid) --set is given."""
    assert main(_sweep(tmp_path, "--grid", "parallel.pipeline=3", "--set", "parallel.zero=1")) == 2
    line = _one_line(capsys.readouterr().err)
    assert "no point of the sweep" in line and "(from --grid parallel.pipeline=3)" in line, line
    assert "parallel.zero" not in line, line


def test_a_set_that_only_some_grid_points_break_lists_them(tmp_path, capsys) -> None:
    """data 2 (--set) is wrong with the base pipeline 4 but right with the grid's pipeline 2: the sweep runs,
    and the pipeline-4 point is listed as invalid, not the whole sweep refused."""
    assert main(_sweep(tmp_path, "--grid", "parallel.pipeline=2,4", "--set", "parallel.data=2")) == 0
    out = capsys.readouterr().out
    assert "2 points: 1 feasible" in out and "pipeline=4: invalid" in out, out
