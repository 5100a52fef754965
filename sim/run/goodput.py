"""A scenario's reliability section applied to its simulated step: the ``reliability`` summary block.

Joins the run-level model (``sim.run.reliability``) to what the step simulation measured: the
failure-free time to train (steps × simulated step time), the model-state bytes a checkpoint saves
(weights + optimizer states, as ``sim.memory`` counts them) and the job's size (GPUs, nodes, links).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from sim import memory as mem
from sim.errors import ScenarioError
from sim.hardware.links import INTRA_PRESETS
from sim.run import reliability as rel
from sim.training.step_work import optimizer_state_bytes
from sim.units import GB

if TYPE_CHECKING:
    from sim.scenario.schema import Scenario
    from sim.summary import Summary

# Device→host snapshot bandwidth for async checkpoints when none is given: one PCIe 4.0 x16 link at the
# efficiency of the pcie4 link preset (31.5 GB/s per direction × 0.8; see sim/hardware/links.py).
_PCIE = INTRA_PRESETS["pcie4"]
DEFAULT_SNAPSHOT_BPS = (_PCIE.bandwidth_GBps or 0.0) * GB * _PCIE.efficiency
# Beyond (restart + interval) / MTBF of this, a segment's expected retries, e^x, are astronomically many.
MAX_EXPOSURE = 30.0
# The Monte-Carlo samples every failure; above this many per run it is skipped (the closed form stays).
MAX_MC_FAILURES = 200_000


def checkpoint_bytes(scenario: Scenario, params_total: float) -> float:
    """Bytes one checkpoint writes: the weights and optimizer states of the whole model (not gradients)."""
    _, tr = scenario.require_training()
    st = mem.model_state_bytes(params_total, zero_stage=0, dp=1, precision=tr.precision,
                               optimizer="sgd" if tr.optimizer == "sgd" else "adam",
                               state_bytes=optimizer_state_bytes(tr.optimizer_state_dtype))
    return st["weights"] + st["optimizer"]


def auto_interval_steps(optimum_s: float, step_s: float, work_s: float) -> int:
    """The Daly optimum in whole steps, at most the run's own length: an optimum beyond the run (rare
    failures; infinite when they never come) means one checkpoint, at the end, and an interval of the run's
    length says that without rounding an astronomically large (or infinite) step count."""
    run_steps = max(1, math.ceil(work_s / step_s - 1e-9))
    steps = optimum_s / step_s
    return round(steps) if steps < run_steps else run_steps  # NaN (0 × ∞) compares False: the run too


def plan_for(scenario: Scenario, summary: Summary, params_total: float) -> tuple[rel.Plan, dict[str, Any]]:
    """The run to evaluate (checkpoint interval resolved) and the figures that went into it."""
    r, c = scenario.reliability, scenario.cluster
    assert r is not None  # only runs with a reliability section get here
    step = summary.step_time_s
    work = summary.time_to_train_s
    assert work is not None  # the schema requires tokens or train_steps with reliability
    links = c.nodes * c.nics_per_node if c.nodes > 1 else 0
    mtbf = rel.job_mtbf_s(gpus=c.total_gpus, gpu_mtbf_hours=r.gpu_mtbf_hours, nodes=c.nodes,
                          node_mtbf_hours=r.node_mtbf_hours, links=links, link_mtbf_hours=r.link_mtbf_hours)
    size = checkpoint_bytes(scenario, params_total)
    write_s = size / (r.checkpoint.write_GBps * GB)
    if r.checkpoint.async_:
        snap_Bps = r.checkpoint.snapshot_GBps * GB if r.checkpoint.snapshot_GBps else DEFAULT_SNAPSHOT_BPS
        block_s, lag_s = size / c.total_gpus / snap_Bps, write_s
    else:
        block_s, lag_s = write_s, 0.0
    optimum = rel.daly_interval_s(block_s, mtbf)
    # Whole steps between checkpoints; async needs the previous write done before the next snapshot.
    floor_steps = max(1, math.ceil(lag_s / step - 1e-9))
    if r.checkpoint.interval == "auto":
        steps = max(floor_steps, auto_interval_steps(optimum, step, work))
    else:
        steps = r.checkpoint.interval
    plan = rel.Plan(work_s=work, mtbf_s=mtbf, interval_s=steps * step, checkpoint_s=block_s,
                    restart_s=r.restart_s, durable_lag_s=lag_s)
    exposure = (r.restart_s + plan.interval_s + block_s + lag_s) / mtbf
    if exposure > MAX_EXPOSURE:
        raise ScenarioError(
            f"job MTBF {mtbf:.4g} s — {exposure:.3g}× shorter than a restart, a checkpoint interval and a "
            f"checkpoint ({r.restart_s:.4g} + {plan.interval_s:.4g} + {block_s + lag_s:.4g} s): the run would "
            "practically never finish; raise the MTBFs, shorten restart_s or the checkpoint interval, or raise "
            "checkpoint.write_GBps", "reliability")
    facts = {
        "job_mtbf_s": mtbf,
        "job_mtbf_hours": mtbf / rel.HOUR_S,
        "failure_components": {"gpus": c.total_gpus, "nodes": c.nodes if r.node_mtbf_hours else 0,
                               "links": links if r.link_mtbf_hours else 0},
        "checkpoint_bytes": size,
        "checkpoint_write_s": write_s,
        "checkpoint_blocking_s": block_s,
        "async": r.checkpoint.async_,
        "optimal_interval_s": optimum,
        "young_interval_s": rel.young_interval_s(block_s, mtbf),
        "interval_steps": steps,
        "interval_s": steps * step,
        "interval_auto": r.checkpoint.interval == "auto",
        "restart_s": r.restart_s,
        "failure_free_s": work,
    }
    return plan, facts


def reliability_summary(scenario: Scenario, summary: Summary, params_total: float) -> dict[str, Any]:
    """The ``reliability`` block of summary.json: closed forms, Monte-Carlo, effective cost, chart curve."""
    plan, out = plan_for(scenario, summary, params_total)
    price = scenario.gpu.price_per_gpu_hour * scenario.total_gpus / rel.HOUR_S  # USD per wall second
    closed = rel.expected(plan)
    out["closed_form"] = closed.as_dict()
    out["expected_time_to_train_days"] = closed.wall_s / 86400
    out["goodput"] = closed.goodput
    out["effective_cost_usd"] = closed.wall_s * price
    out["failure_free_cost_usd"] = plan.work_s * price
    assert scenario.reliability is not None
    trials = scenario.reliability.monte_carlo_trials
    if trials and closed.failures * trials > MAX_MC_FAILURES * 10:
        out["monte_carlo"] = {"skipped": f"{closed.failures:.3g} failures per run × {trials} runs is too many "
                                         "to sample; the closed form is exact for this model"}
    elif trials:
        mc = rel.monte_carlo(plan, trials, scenario.simulation.seed)
        mc["effective_cost_usd"] = mc["wall_s"] * price
        out["monte_carlo"] = mc
    out["curve"] = [{"interval_s": x, "goodput": g} for x, g in rel.goodput_curve(plan)]
    return out
