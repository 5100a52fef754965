"""Megatron's asynchronous backward of column-parallel linears (kernel sets megatron-lm-2022 and
transformer-engine): the ops and collectives a layer's backward holds, the kernel sets and schedules that
run it, the executor's exact time for a block whose collective runs beside its compute, and the plan
screen pricing that block the same way."""

from __future__ import annotations

import pytest

from sim.engine.executor import TrainingExecutor
from sim.engine.job import Block, ChunkWork, LayerWork, TrainingJob
from sim.engine.timeline import COMM_DP, COMM_TP, INTERFERENCE
from sim.training import step_work as sw
from sim.workload import transformer as tf
from sim.workload.kernels import KERNEL_SETS
from tests.helpers import world

GPT3 = tf.TransformerDims(layers=96, hidden=12288, heads=96, ffn_hidden=4 * 12288, vocab=51200, seq_len=2048)


def _ops(lo: tf.LayerOps) -> list:
    return [op for s in lo.backward_input for op in s.ops] + list(lo.backward_weight)


@pytest.mark.parametrize("sp", [False, True])
def test_backward_runs_each_column_parallel_wgrad_beside_its_collective(sp: bool) -> None:
    kw = dict(micro_batch=1, tp=8, sequence_parallel=sp, dtype="bf16")
    plain, over = tf.layer_ops(GPT3, **kw), tf.layer_ops(GPT3, **kw, tp_backward_overlap=True)
    # The same kernels, the weight gradients moved into the backward in autograd's order.
    assert sorted(op.name for op in _ops(plain)) == sorted(op.name for op in _ops(over))
    assert sum(op.flops for op in _ops(plain)) == pytest.approx(sum(op.flops for op in _ops(over)), rel=1e-15)
    assert over.backward_weight == ()
    n_bytes = 2048 * 12288 * 2  # b·s·h in bf16
    beside = [(s.comm, [op.name for op in s.ops]) for s in over.backward_input if s.overlap]
    if sp:  # re-gather the norm output during dgrad, reduce-scatter dgrad's output during wgrad
        assert beside == [("all_gather", ["mlp_up.dgrad"]), ("reduce_scatter", ["mlp_up.wgrad"]),
                          ("all_gather", ["qkv.dgrad"]), ("reduce_scatter", ["qkv.wgrad"])]
    else:
        assert beside == [("all_reduce", ["mlp_up.wgrad"]), ("all_reduce", ["qkv.wgrad"])]
    assert all(s.comm_bytes == n_bytes for s in over.backward_input if s.comm)
    # Every collective of the plain backward is still there; SP adds the two re-gathers.
    comms = lambda lo: sorted(s.comm for s in lo.backward_input if s.comm)  # noqa: E731
    assert comms(over) == sorted(comms(plain) + (["all_gather"] * 2 if sp else []))
    # A row-parallel linear's weight gradient follows its input gradient, no collective between them.
    names = [op.name for s in over.backward_input for op in s.ops]
    assert names.index("mlp_down.wgrad") == names.index("mlp_down.dgrad") + 1
    assert names.index("attn_out.wgrad") == names.index("attn_out.dgrad") + 1
    # Without TP there is nothing to overlap.
    assert tf.layer_ops(GPT3, micro_batch=1, tp=1, sequence_parallel=False, dtype="bf16",
                        tp_backward_overlap=True).backward_weight != ()


def test_which_stacks_and_schedules_overlap() -> None:
    on = {name for name, ks in KERNEL_SETS.items() if ks.tp_backward_overlap}
    assert on == {"megatron-lm-2022", "transformer-engine"}
    ks = KERNEL_SETS["transformer-engine"]
    assert sw.tp_backward_overlap(ks, 8, "1f1b") and sw.tp_backward_overlap(ks, 8, "interleaved-1f1b")
    assert not sw.tp_backward_overlap(ks, 1, "1f1b")
    assert not sw.tp_backward_overlap(ks, 8, "zb-h1")  # W runs on its own there
    assert not sw.tp_backward_overlap(KERNEL_SETS["megatron-lm-2021"], 8, "1f1b")


def _one_block_job(work_s: float, n_bytes: float, x: float) -> tuple[float, float, float]:
    """(block's compute start, its end, the overlapped collective's seconds) of one backward block with an
    all-reduce of ``n_bytes`` beside ``work_s`` of compute, on a TP pair (one node, NVLink)."""
    lw = LayerWork("L0", (Block("f", 0.001),),
                   (Block("b", 0.001), Block("w", work_s, "all_reduce", n_bytes, overlap=True)), ())
    job = TrainingJob(dp=1, tp=2, pp=1, virtual_stages=1, microbatches=1, schedule="1f1b",
                      chunks=[ChunkWork((lw,))], static_bytes=[0.0], comm_slowdown=x,
                      optimizer=Block("optimizer step", 0.001))
    ex = TrainingExecutor(world(1, 2), job, symmetric=False)
    ex.run()
    spans = [s for s in ex.world.timeline.spans if s.gpu == 0]
    w = next(s for s in spans if s.name.endswith("L0 w"))
    (ar,) = [s for s in spans if s.category == COMM_TP]
    assert ar.start_s == pytest.approx(w.start_s, abs=1e-12)  # issued with the compute, not after it
    # The block ends when its compute (and the time the collective cost it) and the collective are done:
    # the optimizer step, the next thing on the compute stream, starts then.
    step = next(s for s in spans if s.category == "optimizer")
    assert step.start_s == pytest.approx(max([w.end_s, ar.end_s] + [s.end_s for s in spans
                                                                      if s.category == INTERFERENCE]), rel=1e-12)
    return w.start_s, step.start_s, ar.dur_s


@pytest.mark.parametrize("work_s", [0.020, 0.00005])
def test_overlapped_block_lasts_max_of_comm_and_slowed_compute(work_s: float) -> None:
    """Compute of W beside a collective of C: it runs at 1/(1+x) while the collective is in flight, so the
    block lasts max(C, W + C·x/(1+x)): compute-bound (W ≫ C) and collective-bound (W ≪ C) cases."""
    x = 0.25
    start, end, c = _one_block_job(work_s, 64e6, x)
    assert end - start == pytest.approx(max(c, work_s + c * x / (1 + x)), rel=1e-9)
    assert (end - start > c * 1.01) == (work_s > c)


def test_compute_that_a_collective_outlives_is_slowed_only_while_it_runs() -> None:
    """DDP overlap, layer 1's gradients all-reduced while layer 0 runs two backward blocks: the all-reduce
    is already in flight when the second starts and ends during it. The two together last
    W₁ + W₂ + C·x/(1+x) (each second the collective runs costs x/(1+x) of a second of work), not the
    whole second block at the slow rate."""
    x, w1, w2 = 0.25, 0.002, 0.050
    l0 = LayerWork("L0", (Block("f", 0.01),), (Block("b1", w1), Block("b2", w2)), (), grad_bytes=200e6)
    l1 = LayerWork("L1", (Block("f", 0.01),), (Block("b", 0.05),), (), grad_bytes=200e6)
    job = TrainingJob(dp=2, tp=1, pp=1, virtual_stages=1, microbatches=1, schedule="1f1b",
                      chunks=[ChunkWork((l0, l1))], bucket_bytes=1.0, static_bytes=[0.0], comm_slowdown=x)
    ex = TrainingExecutor(world(2, 1), job, symmetric=False)
    ex.run()
    spans = [s for s in ex.world.timeline.spans if s.gpu == 0]
    dp = sorted((s for s in spans if s.category == COMM_DP), key=lambda s: s.start_s)
    b1 = next(s for s in spans if s.name.endswith("L0 b1"))
    assert dp[0].start_s == pytest.approx(b1.start_s, abs=1e-12)
    c = dp[0].dur_s
    assert w1 < c < w1 + w2  # in flight when b2 starts, over before b2 ends
    b2_end = max(s.end_s for s in spans if s.name.startswith("B0 L0 b2"))
    assert b2_end - b1.start_s == pytest.approx(w1 + w2 + c * x / (1 + x), rel=1e-9)
