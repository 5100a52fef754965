"""Training simulations against the seeds' worked numericals and the schedules' closed forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import analytic as an
from sim.api import simulate
from sim.engine.executor import TrainingExecutor
from sim.engine.job import Block, ChunkWork, LayerWork, TrainingJob
from sim.engine.timeline import COMM_DP, COMM_TP
from sim.errors import SimulationError
from sim.hardware.nccl import base_latency_s
from sim.outputs.writers import summary_json
from sim.scenario.load import load_scenario, scenario_from_dict
from sim.schedules.actions import Action
from tests.helpers import world

SCEN = Path(__file__).resolve().parent.parent / "scenarios"


def run(name: str, *overrides: str):
    return simulate(load_scenario(SCEN / f"{name}.yaml", list(overrides)))


def test_seed_pipeline_bubble_numerical() -> None:
    s = run("seed-pipeline").summary
    assert s["step_time_s"] == pytest.approx(0.110, rel=1e-9)
    assert s["speedup"] == pytest.approx(8 * 4 / 11, rel=1e-9)  # ≈ 2.91
    assert round(s["speedup"], 2) == 2.91
    assert s["pipeline_utilisation"] == pytest.approx(8 / 11, rel=1e-9)  # ≈ 72.7 %
    assert s["bubble_fraction"] == pytest.approx(3 / 11, rel=1e-9)


def test_seed_pipeline_s6_m18() -> None:
    s = run("seed-pipeline-s6-m18").summary
    assert s["step_time_s"] == pytest.approx(an.pipeline_time(6, 18, 0.005), rel=1e-9)
    assert s["step_time_s"] == pytest.approx(0.115, rel=1e-9)
    assert s["pipeline_utilisation"] == pytest.approx(18 / 23, rel=1e-9)


def test_seed_data_parallel_straggler_sets_step_time() -> None:
    r = run("seed-data-parallel")
    s = r.summary
    assert s["global_batch"] == an.global_batch(16, 24) == 384
    sc = r.scenario
    link = sc.cluster.intra_node
    grads = 25_000_000 * 4
    # NCCL's ring with the Simple protocol: its launch latency, then 2(p-1) hops (sim.hardware.nccl).
    t_ar = base_latency_s("ring", "Simple") + an.ring_all_reduce_time(16, grads, link.latency_s, link.bandwidth_Bps)
    assert s["collective_algorithms"] == {"dp:all_reduce": {"ring": 1}}
    compute = [0.120 * (1.5 if g == 3 else 1.0) for g in range(16)]
    assert s["step_time_s"] == pytest.approx(an.dp_step_time(compute, t_ar), rel=1e-9)
    # Without the straggler every worker finishes at 120 ms.
    s2 = run("seed-data-parallel", "cluster.stragglers={}").summary
    assert s2["step_time_s"] == pytest.approx(0.120 + t_ar, rel=1e-9)


def test_seed_checkpointing_memory() -> None:
    """48 layers × 20 MB: 960 MB stored in full, 8 checkpoints ≈ 160 MB (simulated counter track)."""
    for ck, expect in (("{every: 6}", 160e6), ("none", 960e6)):
        r = run("seed-checkpointing", f"training.checkpointing={ck}")
        st = r.summary["memory_by_stage"][0]
        static = st["weights"] + st["gradients"] + st["optimizer"] + st["buffers"]
        assert st["simulated_peak"] - static == pytest.approx(expect, rel=1e-9)
    # Checkpointing trades memory for recompute time.
    t_ck = run("seed-checkpointing").summary["step_time_s"]
    t_none = run("seed-checkpointing", "training.checkpointing=none").summary["step_time_s"]
    assert t_ck > t_none


def _uniform_job(p: int, m: int, schedule: str, tf: float, tb: float, v: int = 1) -> TrainingJob:
    lw = LayerWork("L", (Block("f", tf),), (Block("b", tb),), ())
    return TrainingJob(dp=1, tp=1, pp=p, virtual_stages=v, microbatches=m, schedule=schedule,
                       chunks=[ChunkWork((lw,)) for _ in range(p * v)], static_bytes=[0.0] * p)


def _bubble(job: TrainingJob) -> tuple[float, TrainingExecutor]:
    w = world(1, job.pp)
    ex = TrainingExecutor(w, job, symmetric=False)
    ex.run()
    step = ex.step_end_s[-1]
    busy = job.microbatches * job.virtual_stages * sum(b.dur_s for b in job.chunks[0].layers[0].forward
                                                       + job.chunks[0].layers[0].backward)
    return 1 - busy / step, ex


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(4, 8), (4, 4), (8, 32), (2, 3)])
def test_bubble_matches_closed_form(schedule: str, p: int, m: int) -> None:
    b, _ = _bubble(_uniform_job(p, m, schedule, 0.01, 0.02))
    assert b == pytest.approx(an.bubble_fraction(p, m), rel=1e-9)


@pytest.mark.parametrize("v", [2, 4])
def test_interleaving_reduces_bubble_by_v(v: int) -> None:
    p, m = 4, 8
    b, _ = _bubble(_uniform_job(p, m, "interleaved-1f1b", 0.01 / v, 0.02 / v, v))
    assert b == pytest.approx(an.bubble_fraction(p, m, v), rel=1e-9)
    assert b < an.bubble_fraction(p, m)


def test_in_flight_activations_1f1b_vs_gpipe() -> None:
    """1F1B's first stage holds at most p micro-batches of activations; GPipe holds all m."""
    p, m = 4, 12
    for schedule, expect in (("1f1b", p), ("gpipe", m)):
        job = _uniform_job(p, m, schedule, 0.01, 0.02)
        job.chunks = [ChunkWork((LayerWork("L", (Block("f", 0.01),), (Block("b", 0.02),), (),
                                           activation_bytes=1.0),)) for _ in range(p)]
        _, ex = _bubble(job)
        peak0 = max(c.value for c in ex.world.timeline.counters if c.gpu == 0)
        assert peak0 == expect


def test_deadlock_names_waiting_gpus() -> None:
    job = _uniform_job(2, 2, "1f1b", 0.01, 0.02)
    w = world(1, 2)
    ex = TrainingExecutor(w, job, symmetric=False)
    ex.schedule[0] = [Action("F", 0), Action("B", 0), Action("B", 1)]  # stage 0 never sends mb 1
    with pytest.raises(SimulationError, match=r"deadlock.*gpu1 waits for activation of F1"):
        ex.run()


TINY = {
    "name": "tiny-gpt",
    # Identical GPUs: the symmetry tests check the reduction is exact (each GPU's own speed makes the
    # representative stand for its stage's slowest GPU instead: tests/test_variability.py).
    "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "A100-80GB", "inter_node": "hdr", "gpu_speed_spread": 0.0},
    "model": {"kind": "transformer", "layers": 8, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 1024},
    "parallel": {"data": 4, "tensor": 2, "pipeline": 2, "schedule": "1f1b"},
    "training": {"global_batch": 32, "micro_batch": 2, "precision": "bf16"},
}


def _tiny(**over) -> dict:
    import copy

    d = copy.deepcopy(TINY)
    for k, v in over.items():
        sec, key = k.split("__")
        d.setdefault(sec, {})[key] = v
    return d


@pytest.mark.parametrize("nics", [8, 2, 1])
@pytest.mark.parametrize("dp,tp,pp", [(4, 2, 2), (2, 2, 4), (8, 1, 2), (2, 4, 2)])
def test_symmetric_and_full_simulation_agree(nics: int, dp: int, tp: int, pp: int) -> None:
    """One GPU per stage (with mirrored traffic where links are shared) = every GPU simulated. Rings
    (every rank finishes together); other algorithms: tests/test_algorithms.py."""
    over = dict(cluster__nics_per_node=nics, parallel__data=dp, parallel__tensor=tp, parallel__pipeline=pp,
                training__global_batch=dp * 2 * 4, parallel__dp_algorithm="ring")
    full = simulate(scenario_from_dict(_tiny(simulation__symmetry="off", **over))).summary
    sym = simulate(scenario_from_dict(_tiny(simulation__symmetry="on", **over))).summary
    assert sym["collective_algorithms"] == full["collective_algorithms"]
    # Exact where every bandwidth-bound collective is a ring (all ranks finish together); the tuner may
    # pick a tree for a TP group, whose ranks finish at different times (2 %, tests/test_algorithms.py).
    rings = all(label.startswith("ring") for kind, labels in full["collective_algorithms"].items()
                if kind.split(":")[0] in ("tp", "dp") for label in labels if not label.endswith("/LL"))
    assert sym["step_time_s"] == pytest.approx(full["step_time_s"], rel=1e-9 if rings else 0.02)
    assert sym["exposed_comm_s"] == pytest.approx(full["exposed_comm_s"], rel=1e-6 if rings else 0.05)


def test_tp_traffic_per_layer_matches_megatron_formula() -> None:
    """2 all-reduces forward + 2 backward per layer per micro-batch, each of b·s·h 16-bit values."""
    r = simulate(scenario_from_dict(_tiny(simulation__symmetry="off")))
    b, s, h = 2, 1024, 1024
    g0 = [sp for sp in r.timeline.spans if sp.gpu == 0 and sp.category == COMM_TP and " L0 " in sp.name
          and sp.args.get("microbatch") == 0 and sp.args.get("step") == 0]
    assert len(g0) == 4
    assert sum(sp.args["bytes"] for sp in g0) == 4 * b * s * h * 2


def test_gradient_sync_overlaps_backward() -> None:
    # Megatron buckets (and so overlaps) only the first stage's gradients; the last stage reduces its own
    # whole after its backward either way. So the overlap shows on stage 0: its exposed communication
    # shrinks, and so does the step, which stage 0's last backward and reduction end.
    from sim.metrics import breakdown_by_gpu

    def run_it(overlap: bool):
        kw = {"parallel__overlap_grad_sync": overlap, **({"parallel__bucket_MB": 5} if overlap else {})}
        r = simulate(scenario_from_dict(_tiny(**kw)))
        stage0 = next(g for g in r.timeline.gpus if r.timeline.stage_of[g] == 0)
        per_gpu = breakdown_by_gpu(r.timeline, [stage0], 0.0, r.summary["step_time_s"])
        return r, per_gpu[stage0]["exposed_comm_s"]

    (over, over_exposed), (no, no_exposed) = run_it(True), run_it(False)
    dp_spans = [sp for sp in over.timeline.spans if sp.category == COMM_DP and sp.gpu == 0]
    assert len(dp_spans) > 1 and sum(sp.dur_s for sp in dp_spans) > 0  # several buckets
    assert over_exposed < no_exposed
    assert over.summary["step_time_s"] < no.summary["step_time_s"]


def test_same_seed_gives_byte_identical_summary() -> None:
    a = summary_json(run("seed-data-parallel").summary)
    b = summary_json(run("seed-data-parallel").summary)
    assert a == b
    d = _tiny(training__loss_scaling={"kind": "dynamic", "overflow_probability": 0.3}, simulation__steps=4)
    x = summary_json(simulate(scenario_from_dict(d)).summary)
    y = summary_json(simulate(scenario_from_dict(d)).summary)
    assert x == y


def test_out_of_memory_still_simulates_and_says_how_to_fit() -> None:
    r = run("llama2-70b-64xh100-ndr", "parallel.zero=0", "parallel.sequence_parallel=false",
            "parallel.schedule=gpipe", "parallel.virtual_stages=1", "training.global_batch=64")
    s = r.summary
    assert s["step_time_s"] > 0
    assert s["fits_in_memory"] is False
    assert s["memory_over_bytes"] == pytest.approx(s["memory_bytes"]["peak"] - s["gpu_memory_bytes"])
    assert s["memory_fixes"]
    # GPipe keeps all m micro-batches: 1F1B with the same batch needs less activation memory.
    s1 = run("llama2-70b-64xh100-ndr", "parallel.zero=0", "parallel.sequence_parallel=false",
             "parallel.schedule=1f1b", "parallel.virtual_stages=1", "training.global_batch=64").summary
    assert s1["memory_bytes"]["activations"] < s["memory_bytes"]["activations"]


def test_full_recompute_hfu_is_four_thirds_of_mfu() -> None:
    """Full recompute adds one forward pass to the three of forward + backward (logits excepted)."""
    from sim.workload.transformer import (
        TransformerDims,
        hardware_flops_per_iteration,
        model_flops_per_iteration,
    )

    s = simulate(scenario_from_dict(_tiny(training__checkpointing="full"))).summary
    d = TransformerDims(layers=8, hidden=1024, heads=16, ffn_hidden=4096, vocab=32000, seq_len=1024)
    ratio = hardware_flops_per_iteration(d, 32, "full") / model_flops_per_iteration(d, 32)
    assert s["hfu"] / s["mfu"] == pytest.approx(ratio, rel=1e-9)
    assert 1.25 < ratio < 4 / 3
    none = simulate(scenario_from_dict(_tiny())).summary
    assert s["step_time_s"] > none["step_time_s"]  # recompute costs time
    assert s["memory_bytes"]["activations"] < none["memory_bytes"]["activations"]


def test_dynamic_loss_scaling_skips_updates_on_overflow() -> None:
    d = _tiny(training__precision="fp16", simulation__steps=3,
              training__loss_scaling={"kind": "dynamic", "init_scale": 1024, "overflow_steps": [1]})
    r = simulate(scenario_from_dict(d))
    s = r.summary
    assert [x["scale"] for x in s["loss_scale"]] == [1024, 1024, 512]
    assert s["skipped_steps"] == 1
    opt = [sp for sp in r.timeline.spans if sp.gpu == 0 and sp.name.strip() == "optimizer step"]
    assert sorted(sp.args["step"] for sp in opt) == [0, 2]  # no update in the overflow step
    times = s["step_times_s"]
    assert times[1] < times[0]


def test_bubble_sweep_points_follow_closed_form_for_ideal_stages() -> None:
    from sim.api import bubble_sweep

    sc = load_scenario(SCEN / "seed-pipeline.yaml")
    for m, b in bubble_sweep(sc, [1, 2, 4, 8, 16]):
        assert b == pytest.approx(an.bubble_fraction(4, m), rel=1e-9)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 12), (8, 24)])
@pytest.mark.parametrize("tf,tb,tw", [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 1.5, 0.5)])
def test_zero_bubble_schedules_match_their_closed_forms(p: int, m: int, tf: float, tb: float, tw: float) -> None:
    def step(schedule: str) -> float:
        lw = LayerWork("L", (Block("f", tf),), (Block("b", tb),), (Block("w", tw),))
        job = TrainingJob(dp=1, tp=1, pp=p, virtual_stages=1, microbatches=m, schedule=schedule,
                          chunks=[ChunkWork((lw,)) for _ in range(p)], static_bytes=[0.0] * p)
        ex = TrainingExecutor(world(1, p), job, symmetric=False)
        ex.run()
        return ex.step_end_s[0] - m * (tf + tb + tw)

    assert step("1f1b") == pytest.approx(an.one_f_one_b_bubble_time(p, tf, tb, tw))
    assert step("zb-h1") == pytest.approx(an.zb_h1_bubble_time(p, tf, tb, tw))
    if tf + tb > 2 * tw:
        assert step("zb-h2") == pytest.approx(an.zb_h2_bubble_time(p, tf, tb, tw))


def test_zero_communication_volume_matches_rajbhandari() -> None:
    """Per step and GPU, data-parallel traffic (ring: all-reduce moves 2N(p-1)/p, RS and AG N(p-1)/p):
    ZeRO-1/2 equal plain DDP (2Ψ), ZeRO-3 moves 1.5× (3Ψ), read back from the timeline's bytes.
    fp16, as in the paper: gradients and weights of one size (bf16 Megatron reduces fp32 gradients)."""
    def traffic(zero: int) -> float:
        r = simulate(scenario_from_dict(_tiny(parallel__zero=zero, parallel__pipeline=1, parallel__data=8,
                                              training__global_batch=16, training__precision="fp16",
                                              simulation__symmetry="off")))
        factor = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}
        return sum(sp.args["bytes"] * factor[sp.args["op"]] for sp in r.timeline.spans
                   if sp.gpu == 0 and sp.category == COMM_DP)

    base = traffic(0)
    assert traffic(1) == pytest.approx(base, rel=1e-9)
    assert traffic(2) == pytest.approx(base, rel=1e-9)
    assert traffic(3) == pytest.approx(1.5 * base, rel=1e-9)


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("ckpt", ["none", "selective", "full"])
def test_simulated_activation_memory_is_korthikanti_table2(sp: bool, ckpt: str) -> None:
    """With standard attention, the memory track's per-micro-batch step on the middle stage equals
    Korthikanti et al. (2022) Table 2 for that layer count, TP and SP case."""
    s, b, h, a, t = 1024, 2, 1024, 16, 2
    d = _tiny(parallel__sequence_parallel=sp, training__checkpointing=ckpt, simulation__symmetry="off",
              parallel__data=2, parallel__tensor=2, parallel__pipeline=4, training__global_batch=16)
    d["model"]["attention"] = "standard"
    r = simulate(scenario_from_dict(d))
    per_layer = {
        ("none", False): s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
        ("none", True): s * b * h * (34 / t + 5 * a * s / (h * t)),
        ("selective", False): s * b * h * (10 + 24 / t),
        ("selective", True): s * b * h * 34 / t,
        ("full", False): 2 * s * b * h,
        ("full", True): 2 * s * b * h / t,
    }[(ckpt, sp)]
    gpu = r.timeline.gpus[1 * 2 * 2]  # a stage-1 GPU: two transformer layers, no embedding or head
    values = sorted({c.value for c in r.timeline.counters if c.gpu == gpu})
    steps = {round(y - x) for x, y in zip(values, values[1:], strict=False)}
    assert round(2 * per_layer) in steps


@pytest.mark.parametrize("zero,tp,dp,pp", [(1, 2, 4, 2), (1, 2, 8, 1), (1, 2, 2, 4), (2, 2, 2, 4), (1, 4, 2, 2)])
def test_symmetric_matches_full_when_every_collective_is_a_ring(zero: int, tp: int, dp: int, pp: int,
                                                                 monkeypatch) -> None:
    """Sequence parallelism (TP all-gather/reduce-scatter, ring all-reduces for the loss) and ZeRO-1 (DP
    reduce-scatter/all-gather) leave only rings: symmetric mode then skips the peers' groups it adds for
    trees, and still equals the run with every GPU simulated."""
    from sim.engine import symmetry

    seen: list[set[str]] = []
    init = symmetry.Symmetry.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        seen.append(self.ring_only)

    monkeypatch.setattr(symmetry.Symmetry, "__init__", spy)
    over = dict(parallel__data=dp, parallel__tensor=tp, parallel__pipeline=pp, parallel__zero=zero,
                parallel__sequence_parallel=True, training__global_batch=dp * 2 * 4)
    full = simulate(scenario_from_dict(_tiny(simulation__symmetry="off", **over)))
    sym = simulate(scenario_from_dict(_tiny(simulation__symmetry="on", **over)))
    # The rule applied in the symmetric run (ZeRO-2's per-micro-batch reduce-scatters keep DP's peers).
    assert seen[-1] == ({"tp", "dp"} if zero == 1 else {"tp"})
    if tp == 4:  # the tuner runs the cross-entropy's 8 kB sums as trees (LL): latency-bound, still exempt
        assert "tree/LL" in full.summary["collective_algorithms"]["tp:all_reduce"]
    assert sym.summary["step_time_s"] == pytest.approx(full.summary["step_time_s"], rel=1e-8)
    # Each representative GPU waits for the same communication as in the full run. (The 4-byte
    # gradient-norm all-reduce (ZeRO) runs as a tree, whose ranks finish apart: 2e-4 of the exposed
    # communication, as before this rule, not in the step time. Ring ranks also finish their collectives
    # apart, so the SMs NCCL holds beside compute differ by microseconds between data-parallel ranks: the
    # summary's busiest GPU may be another rank in the full run; hence GPU by GPU.)
    from sim.metrics import breakdown_by_gpu

    step = full.summary["step_time_s"]
    reps = list(sym.timeline.gpus)
    mine, theirs = breakdown_by_gpu(sym.timeline, reps, 0.0, step), breakdown_by_gpu(full.timeline, reps, 0.0, step)
    for g in reps:
        assert mine[g]["exposed_comm_s"] == pytest.approx(theirs[g]["exposed_comm_s"], rel=1e-3), g
        assert mine[g]["compute_s"] == pytest.approx(theirs[g]["compute_s"], rel=1e-6), g


@pytest.mark.parametrize("kernels,zero,nics,dp,tp,pp,steps", [
    ("megatron-lm-2021", 0, 8, 4, 2, 2, 1), ("megatron-lm-2021", 0, 2, 8, 2, 1, 1),
    ("megatron-deepspeed-2022", 1, 1, 2, 4, 2, 1), ("megatron-deepspeed-2022", 1, 1, 4, 4, 1, 1),
    # several steps: only with DP as rings (the tuner's choice for the whole gradients; ZeRO-1's all-gather)
    ("megatron-lm-2022", 1, 1, 2, 4, 2, 2), ("megatron-lm-2022", 1, 2, 8, 2, 1, 2),
    ("megatron-lm-2021", 0, 2, 8, 2, 1, 3), ("megatron-deepspeed-2022", 1, 1, 2, 4, 2, 2)])
def test_tp_collectives_are_reused_when_dp_waits_for_the_backward(kernels: str, zero: int, nics: int, dp: int,
                                                                   tp: int, pp: int, steps: int,
                                                                   monkeypatch) -> None:
    """Tensor groups narrower than a node share NVLink ports with the data-parallel hops between them. When
    every DP collective waits for the end of the backward pass (Megatron-LM 2021 and Megatron-DeepSpeed:
    no overlapped reduction, ZeRO ≤ 1) the two never run together, so the symmetric run simulates each TP
    collective once and reuses it, and still equals the run with every GPU simulated."""
    from sim.engine import symmetry

    seen: list[tuple] = []
    init = symmetry.Symmetry.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        seen.append((self.apart, self.cacheable))

    monkeypatch.setattr(symmetry.Symmetry, "__init__", spy)
    over = dict(cluster__nics_per_node=nics, parallel__data=dp, parallel__tensor=tp, parallel__pipeline=pp,
                parallel__sequence_parallel=False, parallel__zero=zero,
                training__global_batch=dp * 2 * 4, training__kernels=kernels, simulation__steps=steps)
    full = simulate(scenario_from_dict(_tiny(simulation__symmetry="off", **over))).summary
    sym = simulate(scenario_from_dict(_tiny(simulation__symmetry="on", **over))).summary
    apart, cacheable = seen[-1]
    assert apart == {frozenset(("tp", "dp"))} and "tp" in cacheable
    assert sym["collective_algorithms"] == full["collective_algorithms"]
    assert sym["step_time_s"] == pytest.approx(full["step_time_s"], rel=1e-9)


@pytest.mark.parametrize("steps,apart", [(1, True), (2, False)])
def test_a_tree_reduction_keeps_tp_and_dp_together_across_steps(steps: int, apart: bool, monkeypatch) -> None:
    """A data-parallel tree lets a rank start its next step while its links still carry the others' data:
    with several steps the kinds are not apart unless the tuner runs the reduction as a ring."""
    from sim.engine import symmetry

    seen: list[frozenset] = []
    init = symmetry.Symmetry.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        seen.append(self.apart)

    monkeypatch.setattr(symmetry.Symmetry, "__init__", spy)
    simulate(scenario_from_dict(_tiny(parallel__data=4, parallel__tensor=2, parallel__pipeline=2,
                                      parallel__dp_algorithm="tree", parallel__sequence_parallel=False,
                                      training__kernels="megatron-lm-2021", simulation__steps=steps,
                                      simulation__symmetry="on")))
    assert (seen[-1] == {frozenset(("tp", "dp"))}) is apart


def test_overlapped_gradient_reduction_keeps_tp_and_dp_together() -> None:
    """Reduction during the backward pass (Megatron-Core's overlap_grad_reduce, the default kernel set) runs
    beside the TP collectives: no pair of kinds is apart."""
    from sim.engine.executor import TrainingExecutor

    seen: list[frozenset] = []
    orig = TrainingExecutor._apart_kinds

    def spy(self):
        seen.append(orig(self))
        return seen[-1]

    TrainingExecutor._apart_kinds = spy  # type: ignore[method-assign]
    try:
        simulate(scenario_from_dict(_tiny(parallel__data=4, parallel__tensor=2, parallel__pipeline=2)))
    finally:
        TrainingExecutor._apart_kinds = orig  # type: ignore[method-assign]
    assert seen == [frozenset()]


def test_cross_stage_all_reduce_waits_as_idle_not_as_communication() -> None:
    # The gradient-norm all-reduce spans every pipeline stage: stages that finish first wait for the last
    # in it. That wait is pipeline idle time; only the all-reduce itself is communication. So turning
    # the clip off barely moves the idle (bubble) share — it moved by 5.7 points when the wait counted as
    # exposed communication — and every clip span starts when the last stage of its group arrived, so
    # it lasts what a 4-byte all-reduce takes (before, the first stage's spans lasted its whole wait).
    from pathlib import Path

    from sim.engine.timeline import COMM_CLIP
    from sim.scenario.load import load_scenario

    base = Path(__file__).resolve().parent.parent / "scenarios" / "gpt3-1.3b-16xa100.yaml"
    on = simulate(load_scenario(base, ["training.grad_clip=1.0"]))
    off = simulate(load_scenario(base, ["training.grad_clip=null"]))
    assert abs(on.summary["bubble_fraction"] - off.summary["bubble_fraction"]) < 0.005
    clip = [sp for sp in on.timeline.spans if sp.category == COMM_CLIP]
    par = on.scenario.parallel
    assert len(clip) == len(on.timeline.gpus)
    assert len({round(sp.start_s, 12) for sp in clip}) <= par.data * par.tensor  # one start per group
    assert max(sp.dur_s for sp in clip) < 1e-4  # a 4-byte all-reduce: latency only
