"""`dtsim plot` rebuilds the Timeline from timeline_meta.json; folders without it are read the old way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main
from sim.outputs.replot import load_result
from sim.outputs.timeline_meta import FILE

ROOT = Path(__file__).resolve().parents[1]
SEED = str(ROOT / "scenarios" / "seed-pipeline.yaml")
# Two data-parallel replicas of a 4-stage pipeline: symmetric mode simulates one GPU per stage, each
# standing for 2 (the Gantt labels say "×2").
SYMMETRIC = ["--set", "cluster.gpus_per_node=8", "--set", "parallel.data=2", "--set", "training.global_batch=16",
             "--set", "model.params_per_layer=1000000", "--set", "simulation.symmetry=on"]


def _run(out: Path, *extra: str) -> None:
    assert main(["run", SEED, *SYMMETRIC, "--out", str(out), *extra]) == 0


def test_meta_holds_stages_multiplicity_and_counters(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    _run(out, "--no-charts")
    meta = json.loads((out / FILE).read_text())
    gpus = meta["gpus"]
    assert len(gpus) == 4  # one simulated GPU per stage
    assert sorted(meta["stage_of"][str(g)] for g in gpus) == [0, 1, 2, 3]
    assert all(meta["represents"][str(g)] == 2 for g in gpus)  # data = 2 replicas each
    assert len(meta["counters"]["t_s"]) == len(meta["counters"]["value"]) > 0


def test_plot_without_trace_redraws_the_same_charts(tmp_path, capsys) -> None:
    """No trace.json: before timeline_meta.json the labels, stages, multiplicities and memory track were lost."""
    out, redraw = tmp_path / "r", tmp_path / "redraw"
    _run(out, "--no-trace")
    assert not (out / "trace.json").exists()
    assert main(["plot", str(out), "--out", str(redraw)]) == 0
    for f in ("gantt.png", "pipeline.png", "memory.png"):
        assert (redraw / f).read_bytes() == (out / f).read_bytes()


def test_folder_without_meta_reads_stages_from_labels(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    _run(out, "--no-charts")
    new, _ = load_result(out)
    (out / FILE).unlink()  # as a folder written before the file existed
    old, _ = load_result(out)
    assert old.stage_of == new.stage_of and set(old.stage_of.values()) == {0, 1, 2, 3}
    assert old.labels == new.labels and old.gpus == new.gpus
    assert [(c.gpu, c.t_s) for c in old.counters] == [(c.gpu, c.t_s) for c in new.counters]
    assert [c.value for c in old.counters] == pytest.approx([c.value for c in new.counters], rel=1e-6)
    assert old.represents == {}  # what the old format could not say


def test_corrupt_meta_is_one_line(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    _run(out, "--no-charts")
    (out / FILE).write_text('{"version": 1, "gpus": [0')
    capsys.readouterr()
    assert main(["plot", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and FILE in err and "corrupt or truncated" in err
