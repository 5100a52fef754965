"""Run a scenario end to end: build, simulate, summarise; and write the result folder.

``simulate`` is pure (no files); ``write_results`` is the explicit step that writes them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim import memory as mem
from sim.budget import auto_symmetric, progress_on_stderr
from sim.build import JobInfo, build_job, cost_model_for, topology_for
from sim.engine.algorithms import comm_config_for, server_nodes
from sim.engine.collective_workload import CollectiveResult, run_collectives
from sim.engine.executor import TrainingExecutor
from sim.engine.timeline import Timeline
from sim.engine.variability import Variability, percentiles
from sim.engine.world import World
from sim.metrics import simulated_peak_memory, training_summary
from sim.parallel.layout import Layout
from sim.run.goodput import reliability_summary
from sim.scenario.load import scenario_from_dict
from sim.scenario.schema import CollectiveModel, Scenario
from sim.summary import Summary

if TYPE_CHECKING:
    from sim.cost.base import CostModel
    from sim.hardware.topology import Topology
    from sim.outputs.run_files import ChartWorker


@dataclass
class RunResult:
    summary: Summary
    timeline: Timeline
    scenario: Scenario
    stats: dict = field(default_factory=dict)
    info: JobInfo | None = None


def simulate(scenario: Scenario, calibration: str | Path | None = None, progress: bool = False) -> RunResult:
    """Simulate ``scenario`` and return its summary and timeline (nothing is written); ``progress``
    reports on stderr every few seconds while it runs."""
    t_wall = time.perf_counter()
    cost = cost_model_for(scenario, calibration)
    topo = _topology(scenario, cost)
    world = World(topo)
    world.comm = comm_config_for(scenario, topo)
    with progress_on_stderr(world, progress):
        if scenario.is_collective:
            result = _collective(scenario, world)
        else:
            result = _training(scenario, world, cost)
    result.stats.update({
        "wall_s": time.perf_counter() - t_wall,
        "transfers": world.network.transfers,
        "flow_events": world.network.flow_events,
        "rate_updates": world.network.rate_updates,
        "compute_events": world.compute_events,
        "collectives": world.collectives_run,
        "spans": len(world.timeline.spans),
    })
    report = cost.report()
    used_profile = None
    if getattr(cost, "name", "") == "calibrated":
        used_profile = {k: report.get(k) for k in ("profile", "device", "extrapolated_ops",
                                                   "first_extrapolated_op", "fallbacks")}
    result.summary = replace(result.summary, collective_algorithms=world.algorithm_counts or None,
                             cost_model=report, calibration=used_profile)
    return result


def _topology(scenario: Scenario, cost: CostModel) -> Topology:
    """The cluster's topology, plus one node per dedicated parameter server (after the GPUs' nodes)."""
    extra = server_nodes(scenario)
    if not extra:
        return topology_for(scenario, cost)
    c = scenario.cluster
    bigger = scenario.model_copy(update={"cluster": c.model_copy(update={"nodes": c.nodes + extra})})
    return topology_for(bigger, cost)


def _collective(scenario: Scenario, world: World) -> RunResult:
    m = scenario.model
    assert isinstance(m, CollectiveModel)
    gpus = list(range(m.ranks))
    res: list[CollectiveResult] = run_collectives(world, m.op, m.algorithm, gpus, list(m.size_bytes),
                                                  channels=m.channels, iterations=m.iterations,
                                                  protocol=m.protocol)
    total = sum(r.time_s for r in res)
    one = len(res) == 1
    summary = Summary(
        name=scenario.name,
        workload="collective",
        op=m.op,
        algorithm=m.algorithm,
        num_gpus=m.ranks,
        step_time_s=total,
        samples_per_s=0.0,
        global_batch=0,
        compute_s=0.0,
        exposed_comm_s=total,
        bubble_fraction=0.0,
        pipeline_utilisation=0.0,
        time_s=res[0].time_s if one else [r.time_s for r in res],
        algbw_GBps=res[0].algbw_GBps if one else [r.algbw_GBps for r in res],
        busbw_GBps=res[0].busbw_GBps if one else [r.busbw_GBps for r in res],
        collectives=[r.as_dict() for r in res],
    )
    world.timeline.gpus[:] = gpus if len(gpus) <= 4096 else gpus[:1]
    for g in world.timeline.gpus:
        world.timeline.labels[g] = f"gpu{g} n{world.topology.node_of(g)}"
        world.timeline.stage_of[g] = 0
    world.timeline.end_s = world.env.now
    return RunResult(summary, world.timeline, scenario)


def _training(scenario: Scenario, world: World, cost: CostModel) -> RunResult:
    par, tr = scenario.require_training()
    job, info = build_job(scenario, cost)
    symmetric = auto_symmetric(scenario)  # the one rule, shared with the work estimate (sim.budget)
    ex = TrainingExecutor(world, job, symmetric, dict(scenario.cluster.fixed_stragglers),
                          variability=_variability(scenario, symmetric))
    ex.run()
    world.timeline.end_s = world.env.now
    gpu = scenario.gpu
    peak_dtype = tr.precision
    timed = training_summary(
        world.timeline, ex.step_end_s, name=scenario.name, workload=scenario.model.kind,
        num_gpus=scenario.total_gpus, global_batch=tr.global_batch, tokens_per_sample=info.tokens_per_sample,
        peak_flops=gpu.peak_flops(peak_dtype) if peak_dtype in gpu.peak_tflops or peak_dtype == "tf32" else 0.0,
        model_flops=info.model_flops_per_step, hardware_flops=info.hardware_flops_per_step,
        single_gpu_time_s=info.single_gpu_time_s, microbatches=scenario.microbatches)
    parallel: dict[str, Any] = {"data": par.data, "tensor": par.tensor, "pipeline": par.pipeline,
                                "schedule": par.schedule, "virtual_stages": par.virtual_stages, "zero": par.zero}
    if par.pipeline > 1:  # as resolved for the stack and schedule (sim.workload.kernels.p2p_blocks)
        parallel["overlap_p2p_comm"] = not job.blocking_p2p
    if par.schedule == "interleaved-1f1b" and par.virtual_stages > 1:  # micro-batches through each chunk together
        parallel["microbatch_group_size"] = par.microbatch_group_size or par.pipeline
    if par.ep > 1:
        parallel["expert"] = par.ep
    if par.cp > 1:
        parallel["context"] = par.cp
        parallel["context_attention"] = par.context_attention or "ring"
    summary = replace(timed, microbatches=scenario.microbatches, symmetry="on" if symmetric else "off",
                      parallel=parallel)
    if ex.variability is not None and ex.variability.speed_sigma > 0:
        summary = replace(summary, gpu_speed_spread=ex.variability.speed_sigma,
                          slowest_gpu_factor=ex.variability.slowest_factor())
    summary = _with_cost(_with_memory(summary, scenario, info, world.timeline), scenario)
    if scenario.reliability is not None:  # run-level failures and checkpoints (never enters the engine)
        summary = replace(summary, reliability=reliability_summary(scenario, summary, info.params_total))
    if (ex.variability is not None and ex.variability.varies_by_step) or len(ex.step_end_s) > 1:
        assert timed.step_times_s is not None
        p = percentiles(timed.step_times_s)
        summary = replace(summary, step_time_p50_s=p["step_time_p50_s"], step_time_p90_s=p["step_time_p90_s"],
                          step_time_p99_s=p["step_time_p99_s"], step_time_min_s=p["step_time_min_s"],
                          step_time_max_s=p["step_time_max_s"], step_time_std_s=p["step_time_std_s"],
                          step_time_cv=p["step_time_cv"])
    if info.loss_scale:
        summary = replace(summary, loss_scale=info.loss_scale,
                          skipped_steps=sum(1 for r in info.loss_scale if r["skipped"]))
    return RunResult(summary, world.timeline, scenario, info=info)


def _variability(scenario: Scenario, symmetric: bool) -> Variability | None:
    """Each GPU's own speed, seeded jitter and random stragglers for the executor, or None (identical GPUs,
    every step alike)."""
    c = scenario.cluster
    rs = c.random_stragglers
    par, _ = scenario.require_training()
    layout = Layout(par.data * par.cp, par.tensor, par.pipeline, par.ep, par.cp, par.order)
    # One GPU waits for nobody: it runs at the cost model's (the median GPU's) pace.
    spread = c.gpu_speed_spread if layout.world_size > 1 else 0.0
    if c.jitter is None and rs is None and spread <= 0:
        return None
    return Variability(seed=scenario.simulation.seed, layout=layout,
                       symmetric=symmetric, jitter_sigma=c.jitter.sigma if c.jitter else 0.0,
                       straggler_probability=rs.probability if rs else 0.0,
                       straggler_slowdown=rs.slowdown if rs else 1.0, speed_sigma=spread)


def _with_memory(summary: Summary, scenario: Scenario, info: JobInfo, timeline: Timeline) -> Summary:
    """``summary`` plus its memory figures: the worst stage's breakdown, every stage, and whether it fits."""
    cap = scenario.gpu.memory_bytes
    stages = info.memory_by_stage
    sim_peak = simulated_peak_memory(timeline)
    for g, peak in sim_peak.items():
        s = timeline.stage_of.get(g, 0)
        if s < len(stages):
            stages[s]["simulated_peak"] = max(stages[s].get("simulated_peak", 0.0), peak)
    worst = max(stages, key=lambda d: d["peak"])
    keys = ("weights", "gradients", "optimizer", "activations", "buffers", "peak")
    memory_bytes = {k: worst[k] for k in keys}
    memory_bytes["stage"] = worst["stage"]
    fits = mem.fits(worst["peak"], cap)
    over_bytes, fixes = None, None
    if not fits:
        par, tr = scenario.require_training()
        layers = getattr(scenario.model, "layers", 0)
        n_layers = layers if isinstance(layers, int) else len(layers)
        b = mem.MemoryBreakdown(**{k: worst[k] for k in keys[:-1]})
        over_bytes = worst["peak"] - cap
        fixes = mem.suggest_fixes(b, cap, zero_stage=par.zero, dp=par.data, checkpointing=tr.checkpointing.kind,
                                  pp=par.pipeline, layers=n_layers)
    return replace(summary, memory_bytes=memory_bytes, memory_by_stage=stages, gpu_memory_bytes=cap,
                   fits_in_memory=fits, memory_over_bytes=over_bytes, memory_fixes=fixes)


def _with_cost(summary: Summary, scenario: Scenario) -> Summary:
    """``summary`` plus its price and energy figures, per step and (given the run's length) for the whole run."""
    gpu = scenario.gpu
    n = scenario.total_gpus
    step = summary.step_time_s
    _, tr = scenario.require_training()
    assert summary.tokens_per_s is not None
    per_step_usd = n * gpu.price_per_gpu_hour * step / 3600
    # Tokens only mean something for language models; other workloads count samples.
    tokens_per_step = summary.tokens_per_s * step if scenario.model.kind == "transformer" else 0.0
    per_1M_tokens_usd = per_step_usd * 1e6 / tokens_per_step if tokens_per_step > 0 else None
    kWh_per_step = n * gpu.power_W * step / 3.6e6
    steps_total: float | None = None
    if tr.train_steps:
        steps_total = tr.train_steps
    elif tr.tokens and tokens_per_step > 0:
        steps_total = tr.tokens / tokens_per_step
    summary = replace(summary, cost_per_step_usd=per_step_usd, cost_per_1M_tokens_usd=per_1M_tokens_usd,
                      energy_kWh_per_step=kWh_per_step)
    if steps_total:
        summary = replace(summary, time_to_train_s=steps_total * step, time_to_train_days=steps_total * step / 86400,
                          cost_to_train_usd=steps_total * per_step_usd,
                          energy_to_train_MWh=steps_total * kWh_per_step / 1e3)
    return summary


def write_results(result: RunResult, out_dir: Path, charts: bool = True, trace: bool = True,
                  trace_gz: bool = False, worker: ChartWorker | None = None) -> list[Path]:
    """Write the result folder: summary.json, timeline.csv, trace.json (or trace.json.gz), resolved.yaml
    (+ charts, drawn by ``worker`` when one was started: ``sim.outputs.run_files.ChartWorker``)."""
    from sim.outputs.run_files import (
        write_run_files,  # lazy: charts pull in matplotlib, simulate() never does
    )

    return write_run_files(result, out_dir, charts=charts, trace=trace, trace_gz=trace_gz, worker=worker)


def bubble_sweep(scenario: Scenario, microbatches: list[int]) -> list[tuple[int, float]]:
    """Simulate ``scenario`` again with m micro-batches per replica for each m (changing the global
    batch) and return (m, simulated bubble fraction) points for the bubble-vs-m chart."""
    par, tr = scenario.require_training()
    points = []
    for m in microbatches:
        d = scenario.resolved()
        d["training"]["global_batch"] = m * par.data * tr.micro_batch
        d["simulation"]["steps"] = 1
        points.append((m, simulate(scenario_from_dict(d)).summary.bubble_fraction))
    return points


def run_scenario_dict(scenario: dict, calibration: str | Path | None = None) -> dict:
    """Convenience for scripts (and ``dtsim validate``): a scenario mapping in, its summary out."""
    return simulate(scenario_from_dict(scenario), calibration).summary.to_dict()
