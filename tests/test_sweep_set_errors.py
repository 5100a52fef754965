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


def test_a_set_whose_layout_the_fit_repairs_is_not_blamed(tmp_path, capsys) -> None:
    """cluster.nodes=2 leaves data 1 × pipeline 4 ≠ 8 GPUs in the base, but every point refits data to 2:
    the points' real error (global batch 8 by data 2 × micro-batch 3) is reported, not the layout's."""
    args = _sweep(tmp_path, "--set", "cluster.nodes=2", "--grid", "training.micro_batch=3,5")
    assert main(args) == 2
    line = _one_line(capsys.readouterr().err)
    assert "no point of the sweep" in line and "must be a multiple of data×micro_batch = 2×3" in line, line
    assert "must equal the GPU count" not in line, line
    assert not (tmp_path / "s").exists()


def test_without_fit_data_the_sets_layout_is_still_blamed(tmp_path, capsys) -> None:
    """--no-fit-data: the points keep data 1 too, so the layout is the --set's mistake."""
    args = _sweep(tmp_path, "--set", "cluster.nodes=2", "--grid", "training.micro_batch=3,5", "--no-fit-data")
    assert main(args) == 2
    line = _one_line(capsys.readouterr().err)
    assert "must equal the GPU count" in line and "--set cluster.nodes=2" in line, line
    assert "no point of the sweep" not in line, line
