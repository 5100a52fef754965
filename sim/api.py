"""Run a scenario end to end: build, simulate, summarise; and write the result folder.

``simulate`` is pure (no files); ``write_results`` is the explicit step that writes them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from sim.build import JobInfo, build_job, cost_model_for, topology_for
from sim.engine.algorithms import comm_config_for, server_nodes
from sim.engine.collective_workload import CollectiveResult, run_collectives
from sim.engine.executor import TrainingExecutor
from sim.engine.timeline import Timeline
from sim.engine.world import World
from sim.metrics import simulated_peak_memory, training_summary

SYMMETRY_AUTO_MIN_GPUS = 16  # below this, auto simulates every GPU (cheap, and every row in the charts)


@dataclass
class RunResult:
    summary: dict
    timeline: Timeline
    scenario: object
    stats: dict = field(default_factory=dict)
    info: JobInfo | None = None


def _use_symmetry(scenario) -> bool:
    mode = scenario.simulation.symmetry
    if mode == "on":
        return True
    if mode == "off":
        return False
    if scenario.cluster.fixed_stragglers:
        return False  # a straggler breaks the symmetry (random ones are reduced per stage: see variability)
    return scenario.total_gpus >= SYMMETRY_AUTO_MIN_GPUS


def simulate(scenario, calibration: str | Path | None = None, progress: bool = False) -> RunResult:
    """Simulate ``scenario`` and return its summary and timeline (nothing is written); ``progress``
    reports on stderr every few seconds while it runs."""
    from sim.budget import progress_on_stderr

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
    if world.algorithm_counts:
        result.summary["collective_algorithms"] = world.algorithm_counts
    report = cost.report()
    result.summary["cost_model"] = report
    if getattr(cost, "name", "") == "calibrated":
        result.summary["calibration"] = {k: report.get(k) for k in ("profile", "device", "extrapolated_ops",
                                                                    "first_extrapolated_op", "fallbacks")}
    return result


def _topology(scenario, cost):
    """The cluster's topology, plus one node per dedicated parameter server (after the GPUs' nodes)."""
    extra = server_nodes(scenario)
    if not extra:
        return topology_for(scenario, cost)
    c = scenario.cluster
    bigger = scenario.model_copy(update={"cluster": c.model_copy(update={"nodes": c.nodes + extra})})
    return topology_for(bigger, cost)


def _collective(scenario, world: World) -> RunResult:
    m = scenario.model
    gpus = list(range(m.ranks))
    res: list[CollectiveResult] = run_collectives(world, m.op, m.algorithm, gpus, list(m.size_bytes),
                                                  channels=m.channels, iterations=m.iterations,
                                                  protocol=m.protocol)
    total = sum(r.time_s for r in res)
    one = len(res) == 1
    summary = {
        "name": scenario.name,
        "workload": "collective",
        "op": m.op,
        "algorithm": m.algorithm,
        "num_gpus": m.ranks,
        "step_time_s": total,
        "samples_per_s": 0.0,
        "global_batch": 0,
        "compute_s": 0.0,
        "exposed_comm_s": total,
        "bubble_fraction": 0.0,
        "pipeline_utilisation": 0.0,
        "time_s": res[0].time_s if one else [r.time_s for r in res],
        "algbw_GBps": res[0].algbw_GBps if one else [r.algbw_GBps for r in res],
        "busbw_GBps": res[0].busbw_GBps if one else [r.busbw_GBps for r in res],
        "collectives": [r.as_dict() for r in res],
    }
    world.timeline.gpus[:] = gpus if len(gpus) <= 4096 else gpus[:1]
    for g in world.timeline.gpus:
        world.timeline.labels[g] = f"gpu{g} n{world.topology.node_of(g)}"
        world.timeline.stage_of[g] = 0
    world.timeline.end_s = world.env.now
    return RunResult(summary, world.timeline, scenario)


def _training(scenario, world: World, cost) -> RunResult:
    job, info = build_job(scenario, cost)
    symmetric = _use_symmetry(scenario)
    ex = TrainingExecutor(world, job, symmetric, dict(scenario.cluster.fixed_stragglers),
                          variability=_variability(scenario, symmetric))
    ex.run()
    world.timeline.end_s = world.env.now
    tr = scenario.training
    gpu = scenario.gpu
    peak_dtype = tr.precision
    summary = training_summary(
        world.timeline, ex.step_end_s, name=scenario.name, num_gpus=scenario.total_gpus,
        global_batch=tr.global_batch, tokens_per_sample=info.tokens_per_sample,
        peak_flops=gpu.peak_flops(peak_dtype) if peak_dtype in gpu.peak_tflops or peak_dtype == "tf32" else 0.0,
        model_flops=info.model_flops_per_step, hardware_flops=info.hardware_flops_per_step,
        single_gpu_time_s=info.single_gpu_time_s)
    summary["workload"] = scenario.model.kind
    summary["microbatches"] = scenario.microbatches
    summary["symmetry"] = "on" if symmetric else "off"
    par = scenario.parallel
    summary["parallel"] = {"data": par.data, "tensor": par.tensor, "pipeline": par.pipeline,
                           "schedule": par.schedule, "virtual_stages": par.virtual_stages, "zero": par.zero}
    if par.ep > 1:
        summary["parallel"]["expert"] = par.ep
    if par.cp > 1:
        summary["parallel"]["context"] = par.cp
        summary["parallel"]["context_attention"] = par.context_attention or "ring"
    _memory_summary(summary, scenario, info, world.timeline)
    _cost_summary(summary, scenario)
    if scenario.reliability is not None:  # run-level failures and checkpoints (never enters the engine)
        from sim.run.goodput import reliability_summary

        summary["reliability"] = reliability_summary(scenario, summary, info.params_total)
    if ex.variability is not None or len(ex.step_end_s) > 1:
        from sim.engine.variability import percentiles

        summary.update(percentiles(summary["step_times_s"]))
    if info.loss_scale:
        summary["loss_scale"] = info.loss_scale
        summary["skipped_steps"] = sum(1 for r in info.loss_scale if r["skipped"])
    return RunResult(summary, world.timeline, scenario, info=info)


def _variability(scenario, symmetric: bool):
    """Seeded jitter and random stragglers for the executor, or None (every step identical)."""
    c = scenario.cluster
    rs = c.random_stragglers
    if c.jitter is None and rs is None:
        return None
    from sim.engine.variability import Variability
    from sim.parallel.layout import Layout

    par = scenario.parallel
    return Variability(seed=scenario.simulation.seed,
                       layout=Layout(par.data * par.cp, par.tensor, par.pipeline, par.ep, par.cp),
                       symmetric=symmetric, jitter_sigma=c.jitter.sigma if c.jitter else 0.0,
                       straggler_probability=rs.probability if rs else 0.0,
                       straggler_slowdown=rs.slowdown if rs else 1.0)


def _memory_summary(summary: dict, scenario, info: JobInfo, timeline: Timeline) -> None:
    from sim import memory as mem

    cap = scenario.gpu.memory_bytes
    stages = info.memory_by_stage
    sim_peak = simulated_peak_memory(timeline)
    for g, peak in sim_peak.items():
        s = timeline.stage_of.get(g, 0)
        if s < len(stages):
            stages[s]["simulated_peak"] = max(stages[s].get("simulated_peak", 0.0), peak)
    worst = max(stages, key=lambda d: d["peak"])
    keys = ("weights", "gradients", "optimizer", "activations", "buffers", "peak")
    summary["memory_bytes"] = {k: worst[k] for k in keys}
    summary["memory_bytes"]["stage"] = worst["stage"]
    summary["memory_by_stage"] = stages
    summary["gpu_memory_bytes"] = cap
    fits = mem.fits(worst["peak"], cap)
    summary["fits_in_memory"] = fits
    if not fits:
        par, tr = scenario.parallel, scenario.training
        layers = getattr(scenario.model, "layers", 0)
        n_layers = layers if isinstance(layers, int) else len(layers)
        b = mem.MemoryBreakdown(**{k: worst[k] for k in keys[:-1]})
        summary["memory_over_bytes"] = worst["peak"] - cap
        summary["memory_fixes"] = mem.suggest_fixes(b, cap, zero_stage=par.zero, dp=par.data,
                                                    checkpointing=tr.checkpointing.kind, pp=par.pipeline,
                                                    layers=n_layers)


def _cost_summary(summary: dict, scenario) -> None:
    gpu = scenario.gpu
    n = scenario.total_gpus
    step = summary["step_time_s"]
    tr = scenario.training
    summary["cost_per_step_usd"] = n * gpu.price_per_gpu_hour * step / 3600
    # Tokens only mean something for language models; other workloads count samples.
    tokens_per_step = summary["tokens_per_s"] * step if scenario.model.kind == "transformer" else 0.0
    if tokens_per_step > 0:
        summary["cost_per_1M_tokens_usd"] = summary["cost_per_step_usd"] * 1e6 / tokens_per_step
    summary["energy_kWh_per_step"] = n * gpu.power_W * step / 3.6e6
    steps_total = None
    if tr.train_steps:
        steps_total = tr.train_steps
    elif tr.tokens and tokens_per_step > 0:
        steps_total = tr.tokens / tokens_per_step
    if steps_total:
        summary["time_to_train_s"] = steps_total * step
        summary["time_to_train_days"] = steps_total * step / 86400
        summary["cost_to_train_usd"] = steps_total * summary["cost_per_step_usd"]
        summary["energy_to_train_MWh"] = steps_total * summary["energy_kWh_per_step"] / 1e3


def write_results(result: RunResult, out_dir: Path, charts: bool = True, trace: bool = True,
                  trace_gz: bool = False) -> list[Path]:
    """Write the result folder: summary.json, timeline.csv, trace.json (or trace.json.gz), resolved.yaml
    (+ charts); see ``sim.outputs.run_files``."""
    from sim.outputs.run_files import write_run_files

    return write_run_files(result, out_dir, charts=charts, trace=trace, trace_gz=trace_gz)


def bubble_sweep(scenario, microbatches: list[int]) -> list[tuple[int, float]]:
    """Simulate ``scenario`` again with m micro-batches per replica for each m (changing the global
    batch) and return (m, simulated bubble fraction) points for the bubble-vs-m chart."""
    from sim.scenario.load import scenario_from_dict

    par, tr = scenario.parallel, scenario.training
    points = []
    for m in microbatches:
        d = scenario.resolved()
        d["training"]["global_batch"] = m * par.data * tr.micro_batch
        d["simulation"]["steps"] = 1
        points.append((m, simulate(scenario_from_dict(d)).summary["bubble_fraction"]))
    return points


def run_scenario_dict(scenario: dict, calibration: str | Path | None = None) -> dict:
    """Convenience for scripts (and ``dtsim validate``): a scenario mapping in, its summary out."""
    from sim.scenario.load import scenario_from_dict

    return simulate(scenario_from_dict(scenario), calibration).summary
