"""Transformer Engine's userbuffers overlap of tensor-parallel communication (``parallel.tp_comm_overlap``).

Pure data: which GEMMs are split and which collectives run beside them (TE's default methods). Engine: a
collective given its own SM count slows the compute beside it by that share. Simulation: a TP 4 layer's
forward exposes less communication with the overlap, and the layer's FLOPs do not change.
"""

from __future__ import annotations

import pytest

from sim.api import simulate
from sim.engine.executor import TrainingExecutor
from sim.engine.job import Block, ChunkWork, LayerWork, TrainingJob
from sim.engine.timeline import COMM_TP
from sim.hardware.nccl import CommCTAs
from sim.scenario import scenario_from_dict
from sim.workload import transformer as tf
from tests.helpers import world

T = 4
D = tf.TransformerDims(layers=2, hidden=4096, heads=32, ffn_hidden=14336, vocab=1000, seq_len=4096, kv_heads=8,
                       mlp="swiglu", bias=False, norm="rmsnorm", position="rope", dropout=0.0)


def _layer(ub: bool, dtype: str = "bf16") -> tf.LayerOps:
    return tf.layer_ops(D, micro_batch=1, tp=T, sequence_parallel=True, dtype=dtype, tp_backward_overlap=True,
                        tp_comm_overlap=ub)


def _beside(segments, comm: str) -> list[tuple[list[str], float, int | None]]:
    return [([op.name for op in s.ops], s.comm_bytes, s.ctas) for s in segments if s.overlap and s.comm == comm]


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_forward_gathers_stream_beside_their_gemms_and_scatters_are_pipelined(dtype: str) -> None:
    plain, ub = _layer(False, dtype), _layer(True, dtype)
    assert not [s for s in ub.forward if s.comm == tf.ALL_GATHER and not s.overlap]
    gather = T * 4096 * (1 if dtype == "fp8" else 2)  # tokens·h at the gathered element's bytes
    # ring exchange: tp − 1 splits of QKV and of the MLP's first GEMM beside each gather (copy engines: 1 SM)
    assert _beside(ub.forward, tf.ALL_GATHER) == [(["qkv"] * (T - 1), 4096 * gather / T, 1),
                                                  (["mlp_gate_up"] * (T - 1), 4096 * gather / T, 1)]
    # pipeline: 3 of 4 splits of each row-parallel GEMM beside 3/4 of its reduce-scatter (16 SMs), the last
    # quarter of the reduce-scatter after them
    rs = 4096 * 4096 * 2
    assert _beside(ub.forward, tf.REDUCE_SCATTER) == [(["attn_out"] * 3, rs * 3 / 4, 16),
                                                      (["mlp_down"] * 3, rs * 3 / 4, 16)]
    tails = [s for s in ub.forward if s.comm == tf.REDUCE_SCATTER and not s.overlap]
    assert [(s.ops, s.comm_bytes) for s in tails] == [((), rs / 4)] * 2
    # the same arithmetic: the splits add up to the GEMMs they replace
    flops = lambda segs: sum(op.flops for s in segs for op in s.ops)  # noqa: E731
    assert flops(ub.forward) == pytest.approx(flops(plain.forward), rel=1e-12)
    qkv = [op for s in ub.forward for op in s.ops if op.name == "qkv"]
    assert len(qkv) == T and all(op.m == 4096 // T for op in qkv)


def test_backward_gathers_stream_and_bulk_overlaps_hold_16_sms() -> None:
    plain, ub = _layer(False), _layer(True)
    gathers = _beside(ub.backward_input, tf.ALL_GATHER)
    assert gathers[0] == (["mlp_down.dgrad"] * (T - 1), 4096 * 4096 * 2, 1)  # the output gradient, ring exchange
    assert ["attn_out.dgrad"] * (T - 1) in [g[0] for g in gathers]
    bulk = [(names, ctas) for names, _, ctas in gathers + _beside(ub.backward_input, tf.REDUCE_SCATTER)
            if names in (["mlp_gate_up.dgrad"], ["qkv.dgrad"], ["mlp_gate_up.wgrad"], ["qkv.wgrad"])]
    assert sorted(bulk) == sorted([(["mlp_gate_up.dgrad"], 16), (["qkv.dgrad"], 16), (["mlp_gate_up.wgrad"], 16),
                                   (["qkv.wgrad"], 16)])
    assert not [s for s in ub.backward_input if s.comm == tf.ALL_GATHER and not s.overlap]
    # the backward's reduce-scatters were all beside the weight gradients already: none added, none blocking
    rs = lambda lo: [s.comm_bytes for s in lo.backward_input if s.comm == tf.REDUCE_SCATTER]  # noqa: E731
    assert rs(ub) == rs(plain)


def test_without_tensor_parallelism_or_sp_nothing_changes() -> None:
    one = dict(micro_batch=1, tp=1, sequence_parallel=False, dtype="bf16")
    assert tf.layer_ops(D, **one, tp_comm_overlap=True) == tf.layer_ops(D, **one)
    no_sp = dict(micro_batch=1, tp=T, sequence_parallel=False, dtype="bf16")
    assert tf.layer_ops(D, **no_sp, tp_comm_overlap=True) == tf.layer_ops(D, **no_sp)


def test_a_collective_with_its_own_sm_count_slows_compute_by_that_share() -> None:
    """Compute W beside a collective of C that holds ctas of the GPU's SMs: W runs at (1 − s) while the
    collective is in flight, s = ctas / SMs, so the block lasts W + C·s (W ≫ C)."""
    work_s, sms = 0.020, 100

    def run(ctas: int | None) -> tuple[float, float]:
        lw = LayerWork("L0", (Block("f", 0.001),),
                       (Block("w", work_s, "all_gather", 64e6, overlap=True, ctas=ctas),), ())
        job = TrainingJob(dp=1, tp=2, pp=1, virtual_stages=1, microbatches=1, schedule="1f1b",
                          chunks=[ChunkWork((lw,))], static_bytes=[0.0], optimizer=Block("optimizer step", 0.001),
                          nccl=CommCTAs(sm_count=sms, net=16, nvlink=24))
        ex = TrainingExecutor(world(1, 2), job, symmetric=False)
        ex.run()
        spans = [s for s in ex.world.timeline.spans if s.gpu == 0]
        w = next(s for s in spans if s.name.endswith("L0 w"))
        (ag,) = [s for s in spans if s.category == COMM_TP]
        step = next(s for s in spans if s.category == "optimizer")
        return step.start_s - w.start_s, ag.dur_s

    for ctas, share in ((None, 24 / sms), (1, 1 / sms), (16, 16 / sms)):
        took, c = run(ctas)
        assert took == pytest.approx(work_s + c * share, rel=1e-9)


def _scenario(**parallel) -> dict:
    return {
        "name": "ub",
        "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "H100-SXM", "intra_node": "nvlink4",
                    "gpu_speed_spread": 0.0},
        "model": {"kind": "transformer", "layers": 4, "hidden": 4096, "heads": 32, "kv_heads": 8,
                  "ffn_hidden": 14336, "vocab": 32000, "seq_len": 4096, "mlp": "swiglu", "norm": "rmsnorm",
                  "position": "rope", "bias": False, "dropout": 0.0},
        "parallel": {"tensor": T, "sequence_parallel": True, **parallel},
        "training": {"global_batch": 2, "micro_batch": 1, "precision": "bf16", "kernels": "transformer-engine"},
    }


def test_overlap_hides_forward_tp_communication_in_the_simulation() -> None:
    off = simulate(scenario_from_dict(_scenario())).summary
    on = simulate(scenario_from_dict(_scenario(tp_comm_overlap=True))).summary
    lt_off, lt_on = off["layer_time_s"], on["layer_time_s"]
    exposed = lambda lt: lt["forward_s"] - lt["forward_compute_s"]  # noqa: E731
    # Without the overlap the forward waits for its two all-gathers and two reduce-scatters whole; with it
    # only for the last quarter of each reduce-scatter and any gather longer than its GEMM's splits.
    assert exposed(lt_off) == pytest.approx(lt_off["tp_comm_forward_s"], rel=0.02)
    assert exposed(lt_on) < 0.5 * exposed(lt_off)
    assert on["step_time_s"] < off["step_time_s"]
    flops = lambda s: s["hardware_tflops_per_gpu"] * s["step_time_s"]  # noqa: E731 - the step's work per GPU
    assert flops(on) == pytest.approx(flops(off), rel=1e-9)


def test_tensor_one_makes_the_switch_inert() -> None:
    base = _scenario()
    base["parallel"] = {"tensor": 1, "data": 4}
    base["training"] = {**base["training"], "global_batch": 4}
    with_ub = {**base, "parallel": {**base["parallel"], "tp_comm_overlap": True}}
    a = simulate(scenario_from_dict(base)).summary["step_time_s"]
    b = simulate(scenario_from_dict(with_ub)).summary["step_time_s"]
    assert a == b
