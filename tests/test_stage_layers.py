"""Uneven pipeline stages (parallel.stage_layers): partition, validation, timing and memory."""

from __future__ import annotations

import pytest

from sim import memory as mem
from sim.api import simulate
from sim.build import build_job, cost_model_for
from sim.errors import ScenarioError
from sim.parallel.layout import partition_layers, stage_layers_for
from sim.scenario import load_scenario, scenario_from_dict


def test_partition_with_counts():
    assert partition_layers(8, 4, [1, 3, 2, 2]) == [[0], [1, 2, 3], [4, 5], [6, 7]]
    assert partition_layers(3, 3, [0, 3, 0]) == [[], [0, 1, 2], []]
    assert partition_layers(5, 2) == [[0, 1, 2], [3, 4]]  # without counts: balanced, as before
    with pytest.raises(ValueError):
        partition_layers(8, 4, [1, 3, 2, 1])
    assert stage_layers_for([1, 2], 2, 1) == [1, 2] and stage_layers_for([1, 2], 4, 1) is None


def _synthetic(stage_layers, schedule="gpipe", m=6):
    return {
        "name": "uneven", "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "A100-80GB", "gpu_speed_spread": 0.0},
        "model": {"kind": "synthetic", "layers": 8, "forward_ms": 1.0, "backward_ms": 0.0},
        "parallel": {"pipeline": 4, "schedule": schedule, "stage_layers": stage_layers},
        "training": {"global_batch": m},
    }


def test_uneven_gpipe_forward_matches_closed_form():
    """Forward-only GPipe with stage times t_s: the last micro-batch leaves after Σ t_s + (m − 1)·max t_s."""
    counts, m = [1, 3, 2, 2], 6
    s = simulate(scenario_from_dict(_synthetic(counts, m=m))).summary
    expect = (sum(counts) + (m - 1) * max(counts)) * 1e-3
    assert s["step_time_s"] == pytest.approx(expect, rel=1e-9)
    even = simulate(scenario_from_dict(_synthetic(None, m=m))).summary
    assert even["step_time_s"] == pytest.approx((8 + (m - 1) * 2) * 1e-3, rel=1e-9)


@pytest.mark.parametrize("counts, expect", [
    ([2, 2, 2], "needs one entry per model chunk"),
    ([2, 2, 2, 1], "add up to 7"),
    ([2, 0, 3, 3], "stage_layers[1]"),
    ([0, 3, 3, 2], "every chunk needs at least one layer"),  # synthetic: no embedding on the first chunk
])
def test_bad_stage_layers_are_one_line(counts, expect):
    with pytest.raises(ScenarioError) as e:
        scenario_from_dict(_synthetic(counts))
    assert expect in str(e.value) and "\n" not in str(e.value)


def test_transformer_memory_follows_the_layout():
    base = {
        "name": "uneven-tf", "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "A100-80GB", "gpu_speed_spread": 0.0},
        "model": "gpt3-1.3b", "parallel": {"pipeline": 2, "stage_layers": [10, 14]},
        "training": {"global_batch": 4},
    }
    sc = scenario_from_dict(base)
    _, info = build_job(sc, cost_model_for(sc))
    d = sc.model.to_dims()
    from sim.workload import transformer as tf

    layer = tf.layer_params(d)
    emb = tf.embedding_params(d)
    # Stage 0: 10 layers + embedding; stage 1: 14 layers + its copy of the tied head (pipelined).
    w0, w1 = (info.memory_by_stage[i]["weights"] for i in (0, 1))
    assert w0 == pytest.approx(2 * (10 * layer + emb))
    assert w1 == pytest.approx(2 * (14 * layer + emb))
    # The first stage may hold only the embedding (Meta's first chunk).
    zero = scenario_from_dict({**base, "parallel": {"pipeline": 2, "stage_layers": [0, 24]}})
    res = simulate(zero).summary
    assert res["memory_by_stage"][0]["weights"] == pytest.approx(2 * emb)


def test_llama3_405b_meta_layout_relieves_stage_0():
    """Moving one layer off stage 0 lowers its peak by one layer's model states and the activations of the
    16 micro-batches in flight; stages 1-7 (8 layers, all 16 micro-batches in flight) then bind."""
    sc = load_scenario("scenarios/llama3-405b-16384xh100.yaml")
    even = load_scenario("scenarios/llama3-405b-16384xh100.yaml", ["parallel.stage_layers=null"])
    cost = cost_model_for(sc)
    meta = build_job(sc, cost)[1].memory_by_stage
    flat = build_job(even, cost)[1].memory_by_stage
    m = sc.model
    per_layer_act = mem.activation_bytes_per_layer(seq=m.seq_len, micro_batch=1, hidden=m.hidden, heads=m.heads,
                                                   tp=8, sequence_parallel=True, checkpointing="selective",
                                                   ffn_hidden=m.ffn_hidden, gated_mlp=True, kv_heads=m.kv_heads,
                                                   dropout=False)
    states_per_layer = (flat[0]["weights"] + flat[0]["gradients"] + flat[0]["optimizer"]
                        - meta[0]["weights"] - meta[0]["gradients"] - meta[0]["optimizer"])
    assert flat[0]["peak"] - meta[0]["peak"] == pytest.approx(states_per_layer + 16 * per_layer_act, rel=1e-9)
    assert meta[0]["peak"] < flat[0]["peak"]
    worst = max(meta, key=lambda r: r["peak"])
    assert worst["stage"] == 1 and worst["activations"] == pytest.approx(16 * 8 * per_layer_act, rel=1e-9)


# Layers per stage that DeepSpeed v0.6.4's own ``partition_balanced`` returns (deepspeed/runtime/utils.py,
# run on Megatron-DeepSpeed's GPTModelPipe spec list: 3 specs, the layers, 4 specs, weight 1 per layer).
# Where a stage can take ceil(n/p) layers the cuts fill the first stages (70/12, 30/4); its windowed probe
# sometimes puts the most on the last (16/3, 64/7).
@pytest.mark.parametrize(("layers", "stages", "expect"), [
    (70, 12, [6] * 11 + [4]),
    (30, 4, [8, 8, 8, 6]),
    (105, 35, [3] * 35),
    (16, 3, [5, 5, 6]),
    (64, 7, [9, 9, 9, 9, 9, 9, 10]),
    (70, 16, None),  # DeepSpeed leaves the last two stages without a layer (and the head on stage 13)
])
def test_deepspeed_type_partition_is_what_deepspeed_ran(layers, stages, expect):
    from sim.parallel.layout import deepspeed_type_partition

    assert deepspeed_type_partition(layers, stages) == expect


def _ds_layers(kernels: str) -> list[int]:
    sc = scenario_from_dict({
        "name": "ds-partition", "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "A100-80GB"},
        "model": {"kind": "transformer", "layers": 30, "hidden": 1024, "heads": 16, "seq_len": 512, "vocab": 32000},
        "parallel": {"pipeline": 4, "tensor": 4},
        "training": {"global_batch": 16, "precision": "bf16", "kernels": kernels},
    })
    job, _ = build_job(sc, cost_model_for(sc))
    return [sum(work.name.startswith("L") for work in chunk.layers) for chunk in job.chunks]


def test_megatron_deepspeed_places_layers_as_its_pipeline_engine_did():
    """Without parallel.stage_layers the Megatron-DeepSpeed stack gets DeepSpeed's cuts (30 layers over 4
    stages: 8, 8, 8, 6); Megatron-LM's stacks the balanced split (8, 8, 7, 7)."""
    assert _ds_layers("megatron-deepspeed-2022") == [8, 8, 8, 6]
    assert _ds_layers("megatron-lm-2021") == [8, 8, 7, 7]


def test_plan_screen_prices_the_deepspeed_cuts():
    """The planner's screen reads the same cuts as the simulation (its per-stage layer counts)."""
    from sim.explore.estimate import Candidate, Estimator

    sc = scenario_from_dict({
        "name": "ds-partition", "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "A100-80GB"},
        "model": {"kind": "transformer", "layers": 30, "hidden": 1024, "heads": 16, "seq_len": 512, "vocab": 32000},
        "parallel": {"pipeline": 4, "tensor": 4},
        "training": {"global_batch": 16, "precision": "bf16", "kernels": "megatron-deepspeed-2022"},
    })
    est = Estimator(sc)
    cand = Candidate(data=1, tensor=4, pipeline=4, micro_batch=1, schedule="1f1b", virtual_stages=1, zero=0,
                     checkpointing="none", sequence_parallel=False)
    assert est._stage_layers(cand) == [8, 8, 8, 6]


def test_a_deepspeed_cut_that_empties_stages_is_noted():
    """70 layers over 16 stages: DeepSpeed fills 14 stages with 5 and leaves two empty; dtsim says so and
    simulates the balanced split."""
    from sim.training.step_work import stack_notes

    base = {
        "name": "ds-empty", "cluster": {"nodes": 16, "gpus_per_node": 8, "gpu": "A100-80GB"},
        "model": {"kind": "transformer", "layers": 70, "hidden": 1024, "heads": 16, "seq_len": 512, "vocab": 32000},
        "parallel": {"pipeline": 16, "tensor": 8},
        "training": {"global_batch": 32, "precision": "bf16", "kernels": "megatron-deepspeed-2022"},
    }
    sc = scenario_from_dict(base)
    notes = stack_notes(sc)
    assert len(notes) == 1 and notes[0].startswith("parallel.pipeline: 16 — DeepSpeed's partition of 70 layers")
    job, _ = build_job(sc, cost_model_for(sc))
    assert [sum(w.name.startswith("L") for w in c.layers) for c in job.chunks] == [5] * 6 + [4] * 10
    even = scenario_from_dict({**base, "parallel": {"pipeline": 14, "tensor": 8}, "cluster": {**base["cluster"], "nodes": 14}})
    assert stack_notes(even) == []


def test_end_chunks_may_hold_only_embedding_and_head():
    """Meta's Llama 3 pipeline: one layer per model chunk, the first chunk only the embedding and the last only
    the head, so a transformer may have two layers fewer than model chunks when stage_layers says where they
    go (without it, too few layers stays a one-line error). Timing: the 2-stage × 2-chunk pipeline of 2
    layers runs the same layer work as 2 stages of 1 layer (no layer is lost or duplicated)."""
    base = {
        "name": "end-chunks", "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "A100-80GB", "gpu_speed_spread": 0.0},
        "model": {"kind": "transformer", "layers": 2, "hidden": 1024, "heads": 16, "seq_len": 512, "vocab": 32000},
        "parallel": {"pipeline": 2, "schedule": "interleaved-1f1b", "virtual_stages": 2, "stage_layers": [0, 1, 1, 0]},
        "training": {"global_batch": 4},
    }
    sc = scenario_from_dict(base)
    job, info = build_job(sc, cost_model_for(sc))
    layers_per_chunk = [sum(w.name.startswith("L") for w in chunk.layers) for chunk in job.chunks]
    assert sorted(layers_per_chunk) == [0, 0, 1, 1]
    assert simulate(sc).summary["step_time_s"] > 0
    with pytest.raises(ScenarioError) as e:
        scenario_from_dict({**base, "parallel": {**base["parallel"], "stage_layers": None}})
    assert "fewer than pipeline×virtual_stages" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ScenarioError) as e:
        scenario_from_dict({**base, "parallel": {**base["parallel"], "stage_layers": [1, 0, 1, 0]}})
    assert "stage_layers[1]" in str(e.value)
