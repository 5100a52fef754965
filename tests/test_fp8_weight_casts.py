"""fp8 weights: Transformer Engine casts each GEMM weight to fp8 (with its transpose) before using it.

Megatron-Core marks a model chunk's first micro-batch of the step, so TE casts once per step and reuses the
copies for the step's other micro-batches; code calling TE's modules without that flag casts in every
forward. Hand counts for a Llama-2-7B-shaped layer on one GPU (h 4096, FFN 11008,
32 heads, no GQA): QKV 4096 × 12288, output projection 4096 × 4096, gate+up 4096 × 22016, down 11008 ×
4096 weight elements; the cast reads 2 bytes and writes 1 + 1 per element (current scaling reads 2 more
for the amax).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.api import simulate
from sim.build import cost_model_for
from sim.engine.timeline import FORWARD, WEIGHT_CAST
from sim.scenario.load import load_scenario
from sim.training import step_work as sw
from sim.workload import transformer as tf
from sim.workload.kernels import KERNEL_SETS

H, FFN = 4096, 11008
WEIGHTS = H * 3 * H + H * H + H * 2 * FFN + FFN * H  # qkv, attn_out, gate+up, down


def _dims(layers: int = 32) -> tf.TransformerDims:
    return tf.TransformerDims(layers=layers, hidden=H, heads=32, ffn_hidden=FFN, vocab=32000, seq_len=4096,
                              mlp="swiglu", bias=False, norm="rmsnorm", position="rope", dropout=0.0)


def _ops(dtype: str = "fp8", tp: int = 1) -> tf.LayerOps:
    return tf.layer_ops(_dims(), micro_batch=1, tp=tp, sequence_parallel=False, dtype=dtype)


def test_the_weight_elements_are_every_fp8_gemm_weight_once() -> None:
    assert tf.fp8_weight_elems(_ops().forward) == WEIGHTS
    assert tf.fp8_weight_elems(_ops(tp=2).forward) == WEIGHTS // 2  # each TP rank casts its shard
    assert tf.fp8_weight_elems(_ops(dtype="bf16").forward) == 0
    assert tf.fp8_weight_cast(WEIGHTS, "delayed").bytes == WEIGHTS * 4
    assert tf.fp8_weight_cast(WEIGHTS, "current").bytes == WEIGHTS * 6


def test_megatron_core_casts_once_per_step_and_leaves_the_forward_alone() -> None:
    te = KERNEL_SETS["transformer-engine"]
    lo = _ops()
    f8 = sw.fp8_weight_casts(lo, te, "fp8", "delayed")
    assert f8.layer == lo  # the forward itself is unchanged
    assert [op.bytes for op in f8.per_step] == [WEIGHTS * 4]
    assert sw.fp8_weight_casts(_ops(dtype="bf16"), te, "bf16", "delayed") == sw.Fp8Weights(_ops(dtype="bf16"))


def test_without_the_first_micro_batch_flag_every_forward_casts() -> None:
    plain = replace(KERNEL_SETS["transformer-engine"], fp8_weight_cache=False)
    lo = _ops()
    f8 = sw.fp8_weight_casts(lo, plain, "fp8", "delayed")
    assert f8.per_step == ()
    first = f8.layer.forward[0].ops[0]
    assert first.name == "fp8 weight cast_transpose" and first.bytes == WEIGHTS * 4
    assert f8.layer.forward[0].ops[1:] == lo.forward[0].ops


@pytest.fixture(scope="module")
def llama7b():
    return load_scenario("scenarios/published/llama2-7b-8xh100-nemo2407.yaml")


def test_the_simulation_casts_each_layer_once_per_step(llama7b) -> None:
    """Two steps of 16 micro-batches (identical GPUs): one weight_cast span per layer per step, on the first
    micro-batch, as long as the cost model prices the cast, right before that layer's forward."""
    sc = llama7b.model_copy(update={"simulation": llama7b.simulation.model_copy(update={"steps": 2}),
                                    "cluster": llama7b.cluster.model_copy(update={"gpu_speed_spread": 0.0})})
    cost = cost_model_for(sc)
    layers = sc.model.layers
    cast_s = cost.op_time_s(tf.fp8_weight_cast(WEIGHTS, "delayed"))
    res = simulate(sc)
    spans = [s for s in res.timeline.spans if s.gpu == 0 and s.category == WEIGHT_CAST]
    assert len(spans) == 2 * layers
    assert {s.args["microbatch"] for s in spans} == {0}
    assert sum(s.dur_s for s in spans) == pytest.approx(2 * layers * cast_s, rel=1e-6)
    for step in (0, 1):  # each cast runs right before its layer's first forward of the step
        casts = [s for s in spans if s.args["step"] == step]
        forwards = [s for s in res.timeline.spans if s.gpu == 0 and s.category == FORWARD
                    and s.args.get("step") == step and s.args.get("microbatch") == 0 and " L" in s.name]
        assert len(casts) == layers
        for cast in casts:
            layer = cast.name.split()[1]
            own = [f for f in forwards if f.name.split()[1] == layer]
            begin = min(f.start_s for f in own)
            between = [x for x in res.timeline.spans if x.gpu == 0 and x.stream == "compute"
                       and cast.start_s <= x.start_s < begin]
            # the cast, and the time overlapped gradient or parameter collectives took from it
            assert between[0] is cast and all(x.name == f"{cast.name} (slowed by comm)" for x in between[1:])
            assert begin == pytest.approx(between[-1].end_s)


def test_the_plan_screen_prices_the_casts_once_per_step(llama7b) -> None:
    """The planner's closed form prices the same cast per layer once per step (on identical GPUs); none
    in bf16."""
    from sim.explore.estimate import Estimator

    sc = llama7b.model_copy(update={"cluster": llama7b.cluster.model_copy(update={"gpu_speed_spread": 0.0})})
    cast_s = cost_model_for(sc).op_time_s(tf.fp8_weight_cast(WEIGHTS, "delayed"))
    est = Estimator(sc)
    fp8 = est._layer_times(1, 1, False, "none", "1f1b")
    assert fp8.weight_cast == pytest.approx(cast_s, rel=1e-9)
    bf16 = sc.model_copy(update={"training": sc.training.model_copy(update={"precision": "bf16"})})
    assert Estimator(bf16)._layer_times(1, 1, False, "none", "1f1b").weight_cast == 0.0
