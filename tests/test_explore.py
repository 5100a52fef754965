"""compare and sweep: grids, fit-data, infeasible points kept with their reason, CSVs, charts, executors."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import yaml
from helpers import synthetic

from sim.cli import main
from sim.errors import ScenarioError
from sim.explore.runner import INVALID, NO_FIT, OK, run_jobs, simulate_point
from sim.explore.sweep import expand, parse_grid, split_values

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write(tmp_path: Path, data: dict, name: str | None = None) -> Path:
    p = tmp_path / f"{name or data['name']}.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# ---- grid parsing -----------------------------------------------------------------------------------
def test_split_values_keeps_brackets_and_quotes_together():
    assert split_values("1,2, 4") == ["1", "2", "4"]
    assert split_values("[1, 2],{kind: full, every: 2},'a,b'") == [
        "[1, 2]",
        "{kind: full, every: 2}",
        "'a,b'",
    ]


@pytest.mark.parametrize("item", ["parallel.tensor", "parallel.tensor=", "=1,2", "parallel.tensor=1,,2"])
def test_parse_grid_rejects_malformed_items(item):
    with pytest.raises(ScenarioError, match="KEY=V1,V2"):
        parse_grid([item])


def test_parse_grid_rejects_repeated_keys_and_empty_grids():
    with pytest.raises(ScenarioError, match="two --grid"):
        parse_grid(["parallel.tensor=1", "parallel.tensor=2"])
    with pytest.raises(ScenarioError, match="at least one"):
        parse_grid([])


def test_expand_is_the_cartesian_product_and_fits_data():
    grid = parse_grid(["parallel.pipeline=1,2,3,4", "parallel.schedule=1f1b,gpipe"])
    points = expand(synthetic(), [], grid)
    assert len(points) == 8
    by = {(p.values["parallel.pipeline"], p.values["parallel.schedule"]): p for p in points}
    p2 = by[("2", "1f1b")]
    assert p2.scenario["parallel"]["data"] == 2 and "data=2" in p2.notes[0]
    assert by[("1", "gpipe")].scenario["parallel"]["data"] == 4
    bad = by[("3", "1f1b")]  # 4 GPUs cannot be split into 3 stages: invalid, with the rule in the reason
    assert bad.scenario is None and "must equal the GPU count" in bad.reason


def test_expand_without_fit_data_keeps_data_and_marks_points_invalid():
    points = expand(synthetic(), [], parse_grid(["parallel.pipeline=2,4"]), fit_data=False)
    assert points[0].scenario is None and "data×tensor×pipeline" in points[0].reason
    assert points[1].scenario is not None


def test_expand_never_changes_a_data_degree_the_user_set():
    points = expand(synthetic(), ["parallel.data=1"], parse_grid(["parallel.pipeline=2,4"]))
    assert points[0].scenario is None and not points[0].notes


def test_expand_reports_an_unknown_grid_key_as_the_users_mistake():
    with pytest.raises(ScenarioError, match="unknown key"):
        expand(synthetic(), [], parse_grid(["parallel.tensr=1,2"]))


# ---- running points ---------------------------------------------------------------------------------
def test_simulate_point_returns_status_not_exceptions():
    ok = simulate_point(synthetic())
    assert ok["status"] == OK and ok["summary"]["step_time_s"] > 0
    bad = simulate_point(synthetic(parallel__data=3))
    assert bad["status"] == INVALID and "GPU count" in bad["reason"] and "summary" not in bad
    big = simulate_point(synthetic(model__params_per_layer=4_000_000_000, parallel__pipeline=4))
    assert big["status"] == NO_FIT and "does not fit in memory" in big["reason"] and "GB" in big["reason"]


def test_worker_processes_return_results_in_order():
    jobs = [(synthetic(f"p{k}", model__forward_ms=k + 1), None) for k in range(3)]
    pooled = run_jobs(jobs, workers=2, progress=False)
    inline = run_jobs(jobs, workers=1, progress=False)
    assert [r["summary"]["name"] for r in pooled] == ["p0", "p1", "p2"]
    assert [r["summary"]["step_time_s"] for r in pooled] == [r["summary"]["step_time_s"] for r in inline]


def test_unknown_executor_and_bad_worker_count_are_user_errors():
    with pytest.raises(ScenarioError, match="executor"):
        run_jobs([(synthetic(), None)], executor="slurm")
    with pytest.raises(ScenarioError, match="workers"):
        run_jobs([(synthetic(), None)], workers=0)


def test_ray_missing_is_a_one_line_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray → ImportError
    with pytest.raises(ScenarioError, match="pip install ray") as exc:
        run_jobs([(synthetic(), None)], executor="ray", progress=False)
    assert "\n" not in str(exc.value)


def test_unreachable_ray_address_fails_fast_in_one_line():
    pytest.importorskip("ray", reason="ray is not installed (pip install ray)")
    with pytest.raises(ScenarioError, match="cannot reach Ray") as exc:
        run_jobs([(synthetic(), None)], executor="ray", address="127.0.0.1:1", progress=False)
    assert "\n" not in str(exc.value)


@pytest.mark.slow
def test_ray_executor_matches_local_processes():
    pytest.importorskip("ray", reason="ray is not installed (pip install ray)")
    from sim.explore.ray_executor import run_on_ray

    jobs = [(synthetic("r0"), None), (synthetic("r1", parallel__data=3), None)]
    got = run_on_ray(simulate_point, jobs, num_cpus=1, progress=False)
    local = run_jobs(jobs, workers=1, progress=False)
    assert [r["status"] for r in got] == [OK, INVALID]
    assert got[0]["summary"]["step_time_s"] == local[0]["summary"]["step_time_s"]
    assert got[1]["reason"] == local[1]["reason"]


# ---- CLI ----------------------------------------------------------------------------------------------
def test_sweep_cli_lists_infeasible_points_with_reasons(tmp_path, capsys):
    base = write(tmp_path, synthetic("base"))
    out = tmp_path / "sw"
    rc = main(
        [
            "sweep",
            str(base),
            "--grid",
            "parallel.pipeline=1,2,3,4",
            "--grid",
            "model.params_per_layer=1000,4000000000",
            "--out",
            str(out),
            "--workers",
            "2",
            "--no-progress",
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    rows = read_csv(out / "sweep.csv")
    assert len(rows) == 8
    status = {(r["parallel.pipeline"], r["model.params_per_layer"]): r for r in rows}
    assert status[("4", "1000")]["status"] == "ok" and float(status[("4", "1000")]["tokens_per_s"]) > 0
    assert status[("3", "1000")]["status"] == "invalid" and "GPU count" in status[("3", "1000")]["reason"]
    assert status[("1", "4000000000")]["status"] == "no-fit"
    assert "does not fit" in status[("1", "4000000000")]["reason"]
    assert status[("2", "1000")]["data"] == "2" and "fit" in status[("2", "1000")]["notes"]
    assert "infeasible points:" in text and "pipeline=3" in text and "8 points: 3 feasible" in text
    assert (out / "sweep.png").read_bytes()[:8] == PNG_SIGNATURE and (out / "sweep.svg").exists()
    assert (out / "report.html").exists()


def test_sweep_cli_with_no_valid_point_exits_2(tmp_path, capsys):
    base = write(tmp_path, synthetic("base"))
    rc = main(
        [
            "sweep",
            str(base),
            "--grid",
            "parallel.pipeline=3",
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
            "--no-charts",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no point of the sweep" in err[0]


def test_compare_cli_prints_side_by_side_and_writes_csv_and_chart(tmp_path, capsys):
    a = write(tmp_path, synthetic("gpipe-4", parallel__schedule="gpipe"))
    b = write(tmp_path, synthetic("dp-4", parallel__data=4, parallel__pipeline=1))
    out = tmp_path / "cmp"
    rc = main(
        ["compare", str(a), str(b), "--set", "training.global_batch=32", "--out", str(out), "--no-progress"]
    )
    text = capsys.readouterr().out
    assert rc == 0
    header = text.splitlines()[0]
    assert "gpipe-4" in header and "dp-4" in header
    for label in (
        "step time",
        "tokens/s",
        "bubble",
        "exposed comm",
        "peak memory",
        "cost / step",
    ):
        assert label in text
    rows = read_csv(out / "compare.csv")
    assert [r["label"] for r in rows] == ["gpipe-4", "dp-4"]
    assert (
        float(rows[0]["bubble_fraction"]) == pytest.approx(3 / 35)
        and float(rows[1]["bubble_fraction"]) < 1e-9
    )
    assert all(float(r["cost_per_step_usd"]) > 0 for r in rows)
    assert all(r["cost_per_1M_tokens_usd"] in ("", "None") for r in rows)  # synthetic: no tokens
    assert (out / "compare.png").read_bytes()[:8] == PNG_SIGNATURE and (out / "report.html").exists()


def test_compare_cli_bad_file_is_one_line_exit_2(tmp_path, capsys):
    a = write(tmp_path, synthetic("a"))
    rc = main(["compare", str(a), str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "missing.yaml" in err[0]


def test_address_without_ray_executor_is_rejected(tmp_path, capsys):
    a = write(tmp_path, synthetic("a"))
    rc = main(["compare", str(a), str(a), "--address", "auto", "--out", str(tmp_path / "o")])
    assert rc == 2 and "--executor ray" in capsys.readouterr().err


def test_compare_duplicate_names_get_distinct_labels(tmp_path, capsys):
    a = write(tmp_path, synthetic("same"))
    rc = main(["compare", str(a), str(a), "--out", str(tmp_path / "o"), "--no-charts", "--no-progress"])
    assert rc == 0
    assert [r["label"] for r in read_csv(tmp_path / "o" / "compare.csv")] == ["same", "same#2"]


def test_fit_data_follows_the_cluster_size():
    points = expand(synthetic(), [], parse_grid(["cluster.nodes=1,2"]))
    assert [p.scenario["parallel"]["data"] for p in points] == [1, 2]
