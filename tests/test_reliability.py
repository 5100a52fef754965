"""Failures, checkpoints and goodput: Young/Daly closed forms, the Monte-Carlo against them, the summary."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sim.api import simulate, write_results
from sim.run import reliability as rel
from sim.scenario import scenario_from_dict


def test_job_mtbf_adds_component_rates():
    # 16,384 GPUs at 50,000 h each: one failure every 50000/16384 h; nodes and links add their rates.
    assert rel.job_mtbf_s(gpus=16384, gpu_mtbf_hours=50000) == pytest.approx(50000 / 16384 * 3600)
    m = rel.job_mtbf_s(gpus=8, gpu_mtbf_hours=800, nodes=1, node_mtbf_hours=200, links=8, link_mtbf_hours=1600)
    assert m == pytest.approx(3600 / (8 / 800 + 1 / 200 + 8 / 1600))


def test_young_and_daly_intervals_hand_values():
    d, m = 60.0, 3 * 3600.0
    assert rel.young_interval_s(d, m) == pytest.approx(math.sqrt(2 * 60 * 10800))
    x = d / (2 * m)
    daly = math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d
    assert rel.daly_interval_s(d, m) == pytest.approx(daly)
    assert rel.daly_interval_s(3 * m, m) == m  # δ ≥ 2M: checkpoint every MTBF


@pytest.mark.parametrize("delta, mtbf", [(20.0, 11000.0), (300.0, 3600.0 * 5), (5.0, 600.0)])
def test_daly_optimum_minimises_the_expected_wall_time(delta, mtbf):
    """The wall time per unit of work, e^{R/M}·M(e^{(τ+δ)/M} − 1)/τ, is least at Daly's τ (to < 0.5 %)."""
    taus = np.geomspace(delta / 50, mtbf * 5, 200001)
    cost = mtbf * np.expm1((taus + delta) / mtbf) / taus
    best = taus[np.argmin(cost)]
    assert rel.daly_interval_s(delta, mtbf) == pytest.approx(best, rel=5e-3)
    # Young's first-order form is close when δ ≪ M.
    if delta / mtbf < 0.005:
        assert rel.young_interval_s(delta, mtbf) == pytest.approx(best, rel=0.03)


def test_goodput_without_failures_is_checkpoint_overhead_only():
    plan = rel.Plan(work_s=1000.0, mtbf_s=1e15, interval_s=100.0, checkpoint_s=5.0, restart_s=600.0)
    out = rel.expected(plan)
    assert out.wall_s == pytest.approx(1000 + 10 * 5, rel=1e-9)
    assert out.goodput == pytest.approx(1000 / 1050, rel=1e-9)
    assert out.lost_work_s == pytest.approx(0.0, abs=1e-6)


def test_closed_form_goodput_matches_daly_formula():
    work, m, tau, d, r = 100 * 3600.0, 4 * 3600.0, 1200.0, 30.0, 300.0
    out = rel.expected(rel.Plan(work, m, tau, d, r))
    daly_wall = m * math.exp(r / m) * (math.exp((tau + d) / m) - 1) * work / tau  # Daly 2006, eq. 20
    assert out.wall_s == pytest.approx(daly_wall, rel=1e-12)
    assert out.goodput == pytest.approx(work / daly_wall, rel=1e-12)
    # The breakdown adds up: work + checkpoints + restarts + lost work = wall.
    assert out.failures == pytest.approx(daly_wall / m)
    total = work + out.checkpoint_overhead_s + out.restart_s + out.lost_work_s
    assert total == pytest.approx(out.wall_s, rel=1e-12)


def test_monte_carlo_mean_within_its_confidence_interval_of_the_closed_form():
    """A long run (30 days at a 3-hour job MTBF, ~250 failures a run): the sampled mean time to train lies
    within its own 95 % confidence interval of Daly's expectation."""
    m = rel.job_mtbf_s(gpus=16384, gpu_mtbf_hours=50000)
    d = 20.0
    plan = rel.Plan(30 * 86400.0, m, rel.daly_interval_s(d, m), d, 600.0)
    closed = rel.expected(plan)
    mc = rel.monte_carlo(plan, trials=300, seed=0)
    assert mc["failures"] > 200
    assert abs(mc["wall_s"] - closed.wall_s) <= mc["wall_ci95_s"]
    assert mc["wall_ci95_s"] < 0.002 * closed.wall_s  # and the interval is tight
    assert mc["failures"] == pytest.approx(closed.failures, rel=0.02)
    assert mc["restart_s"] == pytest.approx(closed.restart_s, rel=0.02)
    # Seeded: the same seed gives the same runs.
    assert rel.monte_carlo(plan, trials=20, seed=3) == rel.monte_carlo(plan, trials=20, seed=3)


def test_async_checkpoint_beats_sync_when_the_snapshot_is_short():
    m = rel.job_mtbf_s(gpus=4096, gpu_mtbf_hours=50000)
    write, snap = 120.0, 2.0
    work = 10 * 86400.0
    sync = rel.Plan(work, m, rel.daly_interval_s(write, m), write, 600.0)
    tau = max(rel.daly_interval_s(snap, m), write)
    asyn = rel.Plan(work, m, tau, snap, 600.0, durable_lag_s=write)
    assert rel.expected(asyn).goodput > rel.expected(sync).goodput
    # The async closed form is first order in δ_w/M: the exact Monte-Carlo agrees to 0.5 %.
    mc = rel.monte_carlo(asyn, trials=200, seed=0)
    assert mc["wall_s"] == pytest.approx(rel.expected(asyn).wall_s, rel=5e-3)


RUN = {
    "name": "rel-run",
    "cluster": {"nodes": 2, "gpus_per_node": 4, "gpu": "A100-80GB"},
    "model": {"kind": "synthetic", "layers": 4, "forward_ms": 10, "params_per_layer": 250_000_000},
    "parallel": {"data": 8},
    "training": {"global_batch": 8, "train_steps": 2_000_000, "precision": "bf16"},
    "reliability": {"gpu_mtbf_hours": 2000, "node_mtbf_hours": 10000, "link_mtbf_hours": 20000,
                    "checkpoint": {"interval": "auto", "write_GBps": 1.0}, "restart_s": 300,
                    "monte_carlo_trials": 100},
}


def test_scenario_reliability_summary_and_chart(tmp_path):
    res = simulate(scenario_from_dict(RUN))
    s, r = res.summary, res.summary["reliability"]
    # Checkpoint = weights (2 B) + fp32 master, m, v (12 B) per parameter, written at 1 GB/s.
    params = 4 * 250e6
    assert r["checkpoint_bytes"] == pytest.approx(params * 14)
    assert r["checkpoint_blocking_s"] == pytest.approx(params * 14 / 1e9)
    assert r["job_mtbf_s"] == pytest.approx(3600 / (8 / 2000 + 2 / 10000 + 8 / 20000))
    assert r["failure_free_s"] == pytest.approx(2_000_000 * s["step_time_s"])
    # auto: the Daly optimum rounded to whole steps.
    assert r["interval_steps"] == round(r["optimal_interval_s"] / s["step_time_s"])
    assert r["goodput"] < 1 and r["expected_time_to_train_days"] > s["time_to_train_days"]
    assert r["effective_cost_usd"] == pytest.approx(s["cost_to_train_usd"] / r["goodput"], rel=1e-9)
    mc = r["monte_carlo"]
    assert abs(mc["wall_s"] - r["closed_form"]["wall_s"]) <= 3 * mc["wall_ci95_s"]
    # The curve peaks next to the optimum.
    best = max(r["curve"], key=lambda p: p["goodput"])
    assert best["interval_s"] == pytest.approx(r["optimal_interval_s"], rel=0.1)
    paths = write_results(res, tmp_path)
    assert (tmp_path / "goodput.png") in paths
    assert json.loads((tmp_path / "summary.json").read_text())["reliability"]["interval_steps"] == r["interval_steps"]


def test_fixed_interval_and_no_reliability_section():
    d = json.loads(json.dumps(RUN))
    d["reliability"]["checkpoint"]["interval"] = 1000
    d["reliability"]["monte_carlo_trials"] = 0
    r = simulate(scenario_from_dict(d)).summary["reliability"]
    assert r["interval_steps"] == 1000 and "monte_carlo" not in r
    del d["reliability"]
    sc = scenario_from_dict(d)
    assert "reliability" not in simulate(sc).summary
    assert "reliability" not in sc.resolved()  # absent sections stay absent in resolved.yaml


def test_async_key_round_trips():
    d = json.loads(json.dumps(RUN))
    d["reliability"]["checkpoint"]["async"] = True
    sc = scenario_from_dict(d)
    assert sc.reliability.checkpoint.async_ is True
    back = sc.resolved()
    assert back["reliability"]["checkpoint"]["async"] is True
    assert scenario_from_dict(back) == sc


def test_hopeless_mtbf_is_one_line_and_huge_runs_skip_the_monte_carlo():
    from sim.errors import ScenarioError

    d = json.loads(json.dumps(RUN))
    d["reliability"]["gpu_mtbf_hours"] = 0.001  # 8 GPUs: a failure every 0.45 s, restarts take 300 s
    with pytest.raises(ScenarioError, match="never finish"):
        simulate(scenario_from_dict(d))
    d["reliability"]["gpu_mtbf_hours"] = 5.0  # ~12,000 failures a run × 300 runs: closed form only
    d["reliability"]["node_mtbf_hours"] = d["reliability"]["link_mtbf_hours"] = None
    d["reliability"]["monte_carlo_trials"] = 300
    d["training"]["train_steps"] = 200_000_000
    r = simulate(scenario_from_dict(d)).summary["reliability"]
    assert "skipped" in r["monte_carlo"] and r["goodput"] < 1


def test_cli_run_prints_goodput_and_writes_the_chart(tmp_path):
    import subprocess
    import sys

    import yaml

    path = tmp_path / "rel.yaml"
    path.write_text(yaml.safe_dump(RUN))
    out = subprocess.run([sys.executable, "-m", "sim", "run", str(path), "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, check=True).stdout
    assert "with failures" in out and "goodput" in out and "checkpoints" in out
    assert (tmp_path / "r" / "goodput.png").is_file() and (tmp_path / "r" / "goodput.svg").is_file()
