"""Issue-8 physics, each against a hand calculation: GEMM efficiency by shape, reference profiles,
flash vs standard attention, compute/communication interference, and the work of a Megatron step."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from sim.api import simulate
from sim.build import build_job, cost_model_for
from sim.cost.gemm_model import GemmShapeModel
from sim.cost.roofline import RooflineCostModel
from sim.engine.executor import TrainingExecutor
from sim.engine.job import Block, ChunkWork, LayerWork, TrainingJob
from sim.engine.timeline import (
    CLIP_GRAD,
    COMM_CLIP,
    COMM_DP,
    COMM_EMB,
    COMM_PP,
    DATA,
    FORWARD,
    GRAD_ACCUM,
    INTERFERENCE,
)
from sim.hardware.gpu import GPU_PRESETS
from sim.scenario import scenario_from_dict
from sim.workload import transformer as tf
from sim.workload.ops import ATTENTION, GEMM, Op
from tests.test_training_sim import _tiny, world

A100 = GPU_PRESETS["A100-80GB"]
GPT3 = tf.TransformerDims(layers=96, hidden=12288, heads=96, ffn_hidden=4 * 12288, vocab=51200, seq_len=2048)


def test_gemm_efficiency_is_the_best_tile_by_hand() -> None:
    """(2048, 4608, 12288) on 108 SMs. 256×128 tiles: 8·36 = 288 tiles in 3 waves (288/324 = 0.889).
    128×64 tiles: 16·72 = 1152 tiles in 11 waves (1152/1188 = 0.970) but a smaller tile, fed at
    raw(128, 64)/raw(256, 128) = 0.921 of the large one's rate: 0.893, the best. Times K's 12288/(12288+64)."""
    g = GemmShapeModel(1.0, 108)
    raw = lambda a, b: (a * b / (a + b)) / (a * b / (a + b) + 8.0)  # noqa: E731
    big = 288 / 324
    small = 1152 / 1188 * raw(128, 64) / raw(256, 128)
    assert small > big
    assert g.efficiency(2048, 4608, 12288) == pytest.approx(small * 12288 / (12288 + 64), rel=1e-12)
    assert g.tile_efficiency(64, 64) == pytest.approx(raw(64, 64) / raw(256, 128))
    # Short K (attention's head_dim) and thin outputs reach far less than large square GEMMs.
    assert g.efficiency(2048, 2048, 128) < 0.7 < g.efficiency(8192, 8192, 8192)
    assert g.efficiency(64, 12288, 12288) < g.efficiency(2048, 12288, 12288)


def test_no_gemm_shape_is_priced_above_the_measured_best() -> None:
    """MAMF is the best rate over a sweep of shapes: a longer K than the best shape's (2048 on A100) gains
    nothing, so the K = 8192 weight-gradient GEMM of a 12288-wide layer runs at MAMF × 1305/1410 (K/(K +
    k_overhead) alone would give it ≈ 2 % more), and a ragged shape of long K runs as at the best K, while
    shorter K still loses to pipeline fill."""
    cost = RooflineCostModel(A100)
    g = cost.gemm_model("bf16")
    best = 267.9e12 * 1305 / 1410
    long_k = g.flops_per_s(1536, 4608, 8192)
    assert (8192 / (8192 + 64)) / (2048 / (2048 + 64)) > 1.02  # what the plateau stops
    assert long_k == pytest.approx(best, rel=1e-3)
    assert g.efficiency(1000, 3000, 8192) == pytest.approx(g.efficiency(1000, 3000, 2048), rel=1e-12)
    assert g.efficiency(1000, 3000, 1024) < g.efficiency(1000, 3000, 2048)
    assert g.flops_per_s(6912, 16384, 512) < 0.95 * best
    shapeless = Op(name="coarse", kind="gemm", flops=1e12, dtype="bf16")
    assert cost.gemm_flops_per_s(shapeless) == pytest.approx(best, rel=1e-3)


def test_reference_profile_reproduces_sustained_mamf() -> None:
    """A100: at the MAMF shape the model gives MAMF (267.9 TFLOP/s) × 1305/1410 (sustained clock)."""
    cost = RooflineCostModel(A100)
    ref = cost.reference
    assert ref is not None and ref.gemm_mamf_shape == (6912, 16384, 2048)
    got = cost.gemm_model("bf16").flops_per_s(*ref.gemm_mamf_shape)
    assert got == pytest.approx(267.9e12 * 1305 / 1410, rel=1e-3)
    # An inline GPU without a reference profile uses gemm_efficiency × peak as its ceiling.
    inline = GPU_PRESETS["A100-80GB"].model_copy(update={"name": "my-gpu"})
    assert RooflineCostModel(inline).gemm_model("bf16").ceiling_flops_per_s == pytest.approx(0.8 * 312e12)


def _split(combined_tflops: float, bwd_over_fwd: float) -> tuple[float, float]:
    """Forward and backward FLOP/s of a kernel whose forward + backward benchmark (3.5× the forward's
    FLOPs over both passes) reads ``combined_tflops``, at backward/forward rate ``bwd_over_fwd``."""
    fwd = combined_tflops * 1e12 * (1 + 2.5 / bwd_over_fwd) / 3.5
    return fwd, fwd * bwd_over_fwd


# Published attention figures are a GPU benchmarked alone; a training node holds the sustained clock under
# its power cap, as the reference profiles' GEMM ceilings do: A100 1305 of 1410 MHz (NVIDIA's HPL runs at
# 400 W), H100/H200 MSMF/MAMF 702.9/828.0, B200 1455.7/1732.6 (ml-engineering), as the profiles round them.
SUSTAINED = {"A100-80GB": 0.9255, "H100-SXM": 0.8489, "B200": 0.8402}


def _attention_pair(cost: RooflineCostModel, dims: tf.TransformerDims, tp: int = 8, **kw) -> tuple:
    lo = tf.layer_ops(dims, micro_batch=1, tp=tp, sequence_parallel=False, dtype="bf16", **kw)
    fwd = next(op for s in lo.forward for op in s.ops if op.name == "attention")
    bwd = next(op for s in lo.backward_input for op in s.ops if op.name == "attention.bwd")
    return fwd, bwd


def test_causal_flash_attention_executes_half_the_scores() -> None:
    """A100, FlashAttention-2, s = 2048, head_dim 128: the README's forward + backward figure reads 155
    TFLOP/s with the causal mask; split at backward/forward 0.833. The kernel executes half the scores
    forward and 2.5/2 of the model FLOPs backward, and both passes together run at the figure's 155 × the
    A100's sustained clock ratio (a training node is power-capped; the figure is one GPU alone)."""
    cost = RooflineCostModel(A100)
    fwd, bwd = _attention_pair(cost, GPT3)
    r_f, r_b = (r * SUSTAINED["A100-80GB"] for r in _split(155, 0.833))
    assert cost.op_time_s(fwd) == pytest.approx(fwd.flops / 2 / r_f + A100.kernel_launch_s, rel=1e-9)
    assert cost.op_time_s(bwd) == pytest.approx(bwd.flops * 1.25 / 2 / r_b + A100.kernel_launch_s, rel=1e-9)
    executed = fwd.flops / 2 + bwd.flops * 1.25 / 2
    kernel_s = cost.op_time_s(fwd) + cost.op_time_s(bwd) - 2 * A100.kernel_launch_s
    assert executed == pytest.approx(3.5 * fwd.flops / 2)
    assert executed / kernel_s == pytest.approx(155e12 * 0.9255, rel=1e-9)


def test_attention_curves_interpolate_in_log_length_and_head_size() -> None:
    """H100, FlashAttention (2022) forward + backward, causal: head_dim 128 reads 108 at s = 2k and 126
    TFLOP/s at 4k, head_dim 64 136 and 138. s = 2896 (2^11.5) sits half-way in log s; head_dim 96
    half-way between the two head sizes; past 16k the rate stays at 16k's (137); at s = 256 it is 512's
    (98) × (256/512)/(512/768) (s/(s + 256) against its value at 512)."""
    from sim.cost.reference import reference_profile

    curves = reference_profile("H100-SXM").flash_by_kernel["v1"].curves
    assert curves is not None and curves.passes == "fwd+bwd"

    def combined(s: int, hd: int) -> float:
        f = curves.tflops(s, hd, False, 256.0)
        b = curves.tflops(s, hd, True, 256.0)
        return 3.5 / (1 / f + 2.5 / b)

    assert combined(2048, 128) == pytest.approx(108, rel=1e-9)
    assert combined(2896, 128) == pytest.approx(108 + (126 - 108) * math.log(2896 / 2048) / math.log(2), rel=1e-9)
    assert combined(4096, 96) == pytest.approx((126 + 138) / 2, rel=1e-9)
    assert combined(65536, 128) == pytest.approx(137, rel=1e-9)
    assert combined(256, 128) == pytest.approx(98 * (256 / 512) / (512 / 768), rel=1e-9)


def test_flash_attention_3_forward_from_its_forward_figure() -> None:
    """H100's latest kernel is priced from FlashAttention-3's forward figure (causal, head_dim 128: 602
    TFLOP/s at s = 8k), its backward at 0.8 of that rate."""
    cost = RooflineCostModel(GPU_PRESETS["H100-SXM"])
    dims = tf.TransformerDims(layers=2, hidden=8192, heads=64, ffn_hidden=28672, vocab=128256, seq_len=8192)
    fwd, bwd = _attention_pair(cost, dims)
    launch = GPU_PRESETS["H100-SXM"].kernel_launch_s
    r = 602e12 * SUSTAINED["H100-SXM"]
    assert cost.op_time_s(fwd) == pytest.approx(fwd.flops / 2 / r + launch, rel=1e-9)
    assert cost.op_time_s(bwd) == pytest.approx(bwd.flops * 1.25 / 2 / (0.8 * r) + launch, rel=1e-9)


def test_standard_attention_is_slower_than_flash_for_gpt3_layers() -> None:
    """s = 2048, GPT-3 175B layer on TP 8: the unfused bmm + softmax + dropout path costs more time,
    the same FLOPs, and its softmax moves the b·heads·s² scores (2 bytes in, 2 out)."""
    cost = RooflineCostModel(A100)

    def layer(attention: str) -> tuple[float, float]:
        lo = tf.layer_ops(GPT3, micro_batch=1, tp=8, sequence_parallel=False, dtype="bf16",
                          attention=attention, attention_dropout_kernel=True)
        ops = [op for s in lo.forward + lo.backward_input for op in s.ops] + list(lo.backward_weight)
        matmul = sum(op.flops for op in ops if op.kind in (GEMM, ATTENTION))
        return sum(cost.op_time_s(op) for op in ops), matmul

    (t_flash, f_flash), (t_std, f_std) = layer("flash"), layer("standard")
    assert t_std > t_flash * 1.02
    assert f_std == pytest.approx(f_flash, rel=1e-12)
    lo = tf.layer_ops(GPT3, micro_batch=1, tp=8, sequence_parallel=False, dtype="bf16", attention="standard")
    softmax = next(op for s in lo.forward for op in s.ops if op.name == "attention.softmax")
    assert softmax.bytes == 2 * 2 * (96 // 8) * 2048 * 2048


def test_alibi_under_standard_attention_writes_and_reads_the_scores_once_more() -> None:
    """BLOOM's ALiBi enters as baddbmm's broadcast input with beta = 1: the bias is copied into the whole
    b·heads·s² output (2 bytes each) and cuBLAS reads it back as C, so the forward moves 2 + 2 bytes per
    score more than with learned positions; the FLOPs do not change and flash attention is unaffected."""
    import dataclasses

    cost = RooflineCostModel(A100)
    alibi = dataclasses.replace(GPT3, position="alibi")

    def fwd(d):
        lo = tf.layer_ops(d, micro_batch=1, tp=8, sequence_parallel=False, dtype="bf16", attention="standard",
                          attention_dropout_kernel=True)
        return {op.name: op for s in lo.forward for op in s.ops}

    plain, biased = fwd(GPT3), fwd(alibi)
    scores = (96 // 8) * 2048 * 2048
    assert biased["attention.alibi_bias"].bytes == 2 * scores
    assert biased["attention.scores"].bytes - plain["attention.scores"].bytes == 2 * scores
    assert biased["attention.scores"].flops == plain["attention.scores"].flops
    assert set(biased) - set(plain) == {"attention.alibi_bias"}
    extra = sum(cost.op_time_s(op) for op in biased.values()) - sum(cost.op_time_s(op) for op in plain.values())
    assert extra >= 2 * scores / cost.memory_Bps()
    assert tf.embedding_params(alibi) == GPT3.vocab * GPT3.hidden  # no position table
    flash = [tf.layer_ops(d, micro_batch=1, tp=8, sequence_parallel=False, dtype="bf16", attention="flash")
             for d in (GPT3, alibi)]
    assert flash[0].forward == flash[1].forward


def test_compute_overlapping_a_collective_slows_by_the_sms_it_loses() -> None:
    """Two layers, DDP overlap: layer 1's gradients are all-reduced while layer 0's backward runs. With
    slowdown x, that backward does C/(1+x) of work during the all-reduce's C seconds, the rest at full
    speed: its span lasts C + B − C/(1+x)."""
    x, b_s = 0.25, 0.050
    lw = [LayerWork(f"L{i}", (Block("f", 0.01),), (Block("b", b_s),), (), grad_bytes=200e6) for i in range(2)]
    job = TrainingJob(dp=2, tp=1, pp=1, virtual_stages=1, microbatches=1, schedule="1f1b",
                      chunks=[ChunkWork(tuple(lw))], bucket_bytes=1.0, static_bytes=[0.0], comm_slowdown=x)
    ex = TrainingExecutor(world(2, 1), job, symmetric=False)
    ex.run()
    spans = [s for s in ex.world.timeline.spans if s.gpu == 0]
    dp = [s for s in spans if s.category == COMM_DP]
    c = dp[0].dur_s
    assert 0 < c < b_s
    b0 = next(s for s in spans if s.name.endswith("L0 b"))
    assert b0.start_s == pytest.approx(dp[0].start_s, abs=1e-12)
    assert b0.dur_s == pytest.approx(b_s, rel=1e-12)  # the work itself, then the time lost beside it
    lost = next(s for s in spans if s.category == INTERFERENCE)
    assert lost.start_s == pytest.approx(b0.end_s, rel=1e-12)
    assert b0.dur_s + lost.dur_s == pytest.approx(c + b_s - c / (1 + x), rel=1e-9)


def _megatron(**over):
    base = dict(training__kernels="megatron-lm-2021", parallel__data=2, parallel__tensor=2, parallel__pipeline=4,
                training__global_batch=16, simulation__symmetry="off")
    base.update(over)
    return scenario_from_dict(_tiny(**base))


def test_megatron_2021_step_puts_every_piece_of_work_on_the_timeline() -> None:
    sc = _megatron()
    r = simulate(sc)
    cats = {s.category for s in r.timeline.spans}
    for cat in (GRAD_ACCUM, CLIP_GRAD, COMM_CLIP, COMM_EMB, DATA, COMM_DP):
        assert cat in cats, cat
    # No overlap in 2021: the gradient all-reduce of a GPU starts after its last backward work.
    for g in r.timeline.gpus:
        mine = [s for s in r.timeline.spans if s.gpu == g]
        last_bwd = max(s.end_s for s in mine if s.category == GRAD_ACCUM)
        first_dp = min(s.start_s for s in mine if s.category == COMM_DP)
        assert first_dp >= last_bwd - 1e-12
    # Tied embeddings: first and last stage all-reduce V/t × h fp32 word-embedding gradients.
    emb = [s for s in r.timeline.spans if s.category == COMM_EMB]
    assert {r.timeline.stage_of[s.gpu] for s in emb} == {0, 3}
    assert emb[0].args["bytes"] == math.ceil(32000 / 2) * 1024 * 4


def _accumulation_by_hand(sc) -> tuple[float, float, float, object, object]:
    """(seconds of the grad-accumulation block of a stage-1 layer, that layer's parameters per TP rank,
    the reference memory bandwidth, the job, its info) for ``sc``."""
    cost = cost_model_for(sc)
    job, info = build_job(sc, cost)
    d = sc.model
    layer_params = tf.layer_params(tf.TransformerDims(layers=d.layers, hidden=d.hidden, heads=d.heads,
                                                      ffn_hidden=d.ffn_hidden, vocab=d.vocab,
                                                      seq_len=d.seq_len)) / 2
    acc = next(b for b in job.chunks[1].layers[0].weight if b.category == GRAD_ACCUM)
    return acc.dur_s, layer_params, sc.gpu.memory_bw_Bps * cost.reference.memory_fraction, job, info


def test_megatron_step_work_by_hand() -> None:
    """Grad accumulation moves 2 + 4 + 4 bytes per layer parameter per micro-batch; the optimizer step
    28 (Adam) + 6 (copy to bf16) + 4 (zero main_grad) bytes per parameter; at the reference bandwidth."""
    sc = _megatron()
    acc_s, layer_params, bw, job, info = _accumulation_by_hand(sc)
    assert acc_s == pytest.approx(layer_params * 10 / bw + sc.gpu.kernel_launch_s, rel=1e-9)
    params = max(x["weights"] for x in info.memory_by_stage) / 2  # bf16 weights: 2 bytes each
    expect = params * (28 + 6 + 4) / bw + 3 * sc.gpu.kernel_launch_s
    assert job.optimizer.dur_s == pytest.approx(expect, rel=1e-9)
    assert job.grad_elem_bytes == 4


def test_megatron_fp16_step_copies_its_16bit_grads_to_fp32_first() -> None:
    """fp16 keeps 16-bit main gradients (2 bytes zeroed): the step adds their copy to fp32 (2 + 4 bytes
    per parameter) before Adam, and the norm reads the fp32 copies (4 bytes, not 2)."""
    sc = _megatron(training__precision="fp16", training__loss_scaling="dynamic")
    cost = cost_model_for(sc)
    job, info = build_job(sc, cost)
    bw = sc.gpu.memory_bw_Bps * cost.reference.memory_fraction
    params = max(x["weights"] for x in info.memory_by_stage) / 2
    assert job.grad_elem_bytes == 2
    assert job.optimizer.dur_s == pytest.approx(params * (6 + 28 + 6 + 2) / bw + 4 * sc.gpu.kernel_launch_s,
                                                rel=1e-9)
    assert job.clip.dur_s == pytest.approx(params * 4 / bw + sc.gpu.kernel_launch_s, rel=1e-9)


def test_sharded_optimizer_takes_the_norm_of_its_shard() -> None:
    """With ZeRO-1 (Megatron's distributed optimizer) each rank's norm pass reads the fp32 gradients of the
    shard it updates, params / data × 4 bytes, while the whole main-grad buffer is still zeroed."""
    sc = _megatron(parallel__zero=1)
    cost = cost_model_for(sc)
    job, info = build_job(sc, cost)
    bw = sc.gpu.memory_bw_Bps * cost.reference.memory_fraction
    params = max(x["weights"] for x in info.memory_by_stage) / 2
    assert job.clip.dur_s == pytest.approx(params / 2 * 4 / bw + sc.gpu.kernel_launch_s, rel=1e-9)
    assert job.optimizer.dur_s == pytest.approx(params / 2 * (28 + 6) / bw + params * 4 / bw
                                                + 3 * sc.gpu.kernel_launch_s, rel=1e-9)


def test_bf16_grad_reduce_and_optimizer_state_by_hand() -> None:
    """training.grad_reduce_dtype bf16 (Megatron-Core's --grad-reduce-in-bf16, apex's grad_sync_dtype) and
    optimizer_state_dtype bf16 (apex DistributedFusedAdam's dtype): 2-byte main gradients (accumulated:
    2 + 2 + 2 bytes per parameter; zeroed: 2; reduced over DP: half the bytes), copied to fp32 before Adam
    (2 + 4), Adam over bf16 master, m and v (reads 3·2 + 4, writes 3·2), the copy to the model (2 + 2); in
    memory 2 bytes of gradient and 3·2 of optimizer state per parameter instead of 4 and 12."""
    base = _megatron()
    sc = _megatron(training__grad_reduce_dtype="bf16", training__optimizer_state_dtype="bf16")
    acc_s, layer_params, bw, job, info = _accumulation_by_hand(sc)
    assert acc_s == pytest.approx(layer_params * 6 / bw + sc.gpu.kernel_launch_s, rel=1e-9)
    params = max(x["weights"] for x in info.memory_by_stage) / 2
    expect = params * ((2 + 4) + (6 + 4 + 6) + (2 + 2) + 2) / bw + 4 * sc.gpu.kernel_launch_s
    assert job.optimizer.dur_s == pytest.approx(expect, rel=1e-9)
    assert job.grad_elem_bytes == 2
    bjob, binfo = build_job(base, cost_model_for(base))
    assert job.bucket_bytes == pytest.approx(bjob.bucket_bytes / 2)
    for mine, theirs in zip(info.memory_by_stage, binfo.memory_by_stage, strict=True):
        assert mine["gradients"] == pytest.approx(theirs["gradients"] / 2)
        assert mine["optimizer"] == pytest.approx(theirs["optimizer"] / 2)
        assert mine["weights"] == pytest.approx(theirs["weights"])
    # Each switch alone: the gradient dtype leaves the state alone and the state dtype the gradients.
    g_only = _megatron(training__grad_reduce_dtype="bf16")
    _, ginfo = build_job(g_only, cost_model_for(g_only))
    assert ginfo.memory_by_stage[0]["optimizer"] == pytest.approx(binfo.memory_by_stage[0]["optimizer"])
    s_only = _megatron(training__optimizer_state_dtype="bf16")
    sjob, sinfo = build_job(s_only, cost_model_for(s_only))
    assert sjob.grad_elem_bytes == 4
    assert sinfo.memory_by_stage[0]["gradients"] == pytest.approx(binfo.memory_by_stage[0]["gradients"])
    assert simulate(sc).summary["step_time_s"] < simulate(base).summary["step_time_s"]


def test_deepspeed_bf16_accumulation_goes_through_an_fp32_temporary() -> None:
    """DeepSpeed's BF16_Optimizer.update_hp_grads adds ``lp.grad.to(fp32)``: the cast reads 2 and writes 4
    bytes per parameter, the add reads the temporary and the accumulator and writes the accumulator
    (12): 18 bytes and two kernels, against Megatron's 10 and one."""
    sc = _megatron(training__kernels="megatron-deepspeed-2022", training__precision="bf16")
    acc_s, layer_params, bw, _, _ = _accumulation_by_hand(sc)
    assert acc_s == pytest.approx(layer_params * 18 / bw + 2 * sc.gpu.kernel_launch_s, rel=1e-9)


def test_gradient_accumulation_fusion_removes_the_pass() -> None:
    fused = _megatron(training__kernels="megatron-lm-2022")
    job, _ = build_job(fused, cost_model_for(fused))
    layer = job.chunks[1].layers[0]
    assert not any(b.category == GRAD_ACCUM for b in layer.weight)
    slow = simulate(_megatron()).summary["step_time_s"]
    assert simulate(fused).summary["step_time_s"] < slow


def test_gradient_accumulation_switch_overrides_the_kernel_set() -> None:
    """``training.fusion.gradient_accumulation: false`` under Transformer Engine (whose wgrad GEMMs accumulate
    in place) adds PyTorch's separate pass, fp32 accumulator += bf16 gradient: 2 + 4 read, 4 written per layer
    parameter per micro-batch, at the reference bandwidth, on the timeline as grad_accum spans; ``true``
    under Megatron-LM 2021 (which had no fusion) removes it."""
    sc = _megatron(training__kernels="transformer-engine", training__fusion={"gradient_accumulation": False})
    acc_s, layer_params, bw, _, _ = _accumulation_by_hand(sc)
    assert acc_s == pytest.approx(layer_params * 10 / bw + sc.gpu.kernel_launch_s, rel=1e-9)
    spans = [s for s in simulate(sc).timeline.spans if s.category == GRAD_ACCUM and s.name.startswith("B")]
    micro = sc.training.global_batch // (sc.parallel.data * sc.training.micro_batch)
    assert micro > 1
    assert len({(s.gpu, s.args.get("microbatch")) for s in spans if s.gpu == 0}) == micro
    fused = _megatron(training__kernels="megatron-lm-2021", training__fusion={"gradient_accumulation": True})
    job, _ = build_job(fused, cost_model_for(fused))
    assert not any(b.category == GRAD_ACCUM for b in job.chunks[1].layers[0].weight)


def test_fp8_gemms_pay_their_casts_and_reach_the_fp8_sustained_share() -> None:
    """Transformer Engine fp8 (delayed scaling): a GEMM input its norm produces (QKV's) is quantized by
    the norm kernel itself, which writes 1 byte per element instead of 2, and transposed for the weight
    gradient (1 + 1); any other fp8 GEMM input (the output projection's) is cast_transposed (2 + 1 + 1).
    fp8 GEMMs reach 73.4/80.3-ish of bf16's share of peak on H100 (H200's measured MAMF shares)."""
    d = tf.TransformerDims(layers=2, hidden=4096, heads=32, ffn_hidden=14336, vocab=1000, seq_len=4096,
                           kv_heads=8, mlp="swiglu", bias=False, norm="rmsnorm", position="rope")
    kw = dict(micro_batch=1, tp=2, sequence_parallel=False)
    lo = tf.layer_ops(d, **kw, dtype="fp8")
    bf = tf.layer_ops(d, **kw, dtype="bf16")
    tokens = 4096
    names = [op.name for op in lo.forward[0].ops]
    assert names[:4] == ["fp8 cast_transpose", "norm1", "fp8 transpose", "qkv"]
    cast, norm, transpose = lo.forward[0].ops[:3]
    assert cast.bytes == tokens * (4096 // 2) * 4  # the output projection's input, tokens × h/t
    assert bf.forward[0].ops[0].name == "norm1"
    assert norm.bytes == bf.forward[0].ops[0].bytes - tokens * 4096 * (2 - 1)
    assert transpose.bytes == tokens * 4096 * 2
    h100 = RooflineCostModel(GPU_PRESETS["H100-SXM"])
    mamf_shape = (6144, 17920, 2816)  # the best shape, and any longer K (the model's K plateau)
    # fp8 sustains what the power-saturated sweep measured against bf16 on the same die (H200 MSMF: fp8 1288.7,
    # bf16 708.5 TFLOP/s; the boost-burst MAMF ratio, 1491.9 / 841.9, would be 2.6 % higher)
    for shape in (mamf_shape, (8192, 8448, 20480)):
        ratio = h100.gemm_model("fp8").flops_per_s(*shape) / h100.gemm_model("bf16").flops_per_s(*shape)
        assert ratio == pytest.approx(1288.7 / 708.5, rel=1e-3)
    # A tile's fixed cost counts twice the K elements in fp8 (same epilogue, mainloop twice as fast), so
    # short K loses more: at K = 512 fp8 keeps less of its best-shape rate than bf16 does.
    short = (6144, 17920, 512)
    fp8, bf16 = h100.gemm_model("fp8"), h100.gemm_model("bf16")
    assert fp8.k_overhead == pytest.approx(2 * bf16.k_overhead, rel=1e-3) and bf16.k_overhead == 256
    assert fp8.flops_per_s(*short) / fp8.flops_per_s(*mamf_shape) < bf16.flops_per_s(*short) / bf16.flops_per_s(*mamf_shape)


def test_fp8_current_scaling_reads_each_input_once_more_for_its_amax() -> None:
    """Float8CurrentScaling needs each input's amax before its scale, so nothing fuses into the norm:
    every segment with fp8 GEMMs starts with an amax pass (2 bytes per input element) and the
    cast_transpose of all its GEMM inputs (4 bytes), the norm keeps its 16-bit output, and no separate
    transpose runs. DelayedScaling has no amax pass."""
    d = tf.TransformerDims(layers=2, hidden=4096, heads=32, ffn_hidden=14336, vocab=1000, seq_len=4096,
                           kv_heads=8, mlp="swiglu", bias=False, norm="rmsnorm", position="rope", dropout=0.0)
    kw = dict(micro_batch=1, tp=2, sequence_parallel=False, dtype="fp8")
    delayed = tf.layer_ops(d, **kw)
    current = tf.layer_ops(d, **kw, fp8_recipe="current")
    bf = tf.layer_ops(d, micro_batch=1, tp=2, sequence_parallel=False, dtype="bf16")
    assert not [op for s in (*delayed.forward, *delayed.backward_input) for op in s.ops if op.name == "fp8 amax"]
    for segs_c, segs_b in ((current.forward, bf.forward), (current.backward_input, bf.backward_input)):
        for sc, sb in zip(segs_c, segs_b, strict=True):
            fp8_inputs = sum(op.m * op.k * op.batch for op in sc.ops
                             if op.kind == GEMM and not op.name.endswith(".wgrad"))
            if not fp8_inputs:
                assert [op.name for op in sc.ops] == [op.name for op in sb.ops]
                continue
            amax, cast = sc.ops[0], sc.ops[1]
            assert amax.name == "fp8 amax" and cast.name == "fp8 cast_transpose"
            assert cast.bytes == fp8_inputs * 4 and amax.bytes == fp8_inputs * 2
            assert [op.bytes for op in sc.ops[2:] if op.kind != GEMM] == [op.bytes for op in sb.ops if op.kind != GEMM]
    assert current.forward[0].ops[1].bytes == 4096 * (4096 + 4096 // 2) * 4


def test_zero3_without_overlap_waits_for_each_reduce_scatter() -> None:
    """overlap_grad_sync: false with ZeRO-3: no backward compute runs while gradients are reduce-scattered."""
    from sim.engine.timeline import COMPUTE_CATEGORIES

    def overlapped(flag: bool) -> float:
        sc = scenario_from_dict(_tiny(parallel__zero=3, parallel__pipeline=1, parallel__data=8, parallel__tensor=2,
                                      parallel__overlap_grad_sync=flag, training__global_batch=16,
                                      simulation__symmetry="off"))
        spans = [s for s in simulate(sc).timeline.spans if s.gpu == 0]
        rs = [(s.start_s, s.end_s) for s in spans if s.category == COMM_DP and s.args.get("op") == "reduce_scatter"]
        comp = [(s.start_s, s.end_s) for s in spans if s.category in COMPUTE_CATEGORIES]
        return sum(max(0.0, min(b, d) - max(a, c)) for a, b in rs for c, d in comp)

    assert overlapped(True) > 0
    assert overlapped(False) == 0


def test_zero2_reduce_scatters_every_micro_batch_and_zero1_once() -> None:
    """ZeRO-2 holds only its gradient shard, so it cannot accumulate whole gradients over micro-batches:
    each micro-batch's are reduce-scattered (DeepSpeed's partition_gradients path). Per step a GPU then
    reduce-scatters m × its layers' gradient bytes; ZeRO-1 reduce-scatters them once."""
    m = 4  # 8 samples per replica in micro-batches of 2
    dp, tp = 8, 2

    def scattered(zero: int) -> tuple[float, float]:
        sc = scenario_from_dict(_tiny(parallel__zero=zero, parallel__pipeline=1, parallel__data=dp,
                                      parallel__tensor=tp, training__global_batch=dp * 8,
                                      simulation__symmetry="off"))
        assert sc.microbatches == m
        job, _ = build_job(sc, cost_model_for(sc))
        layer_grads = sum(lw.grad_bytes for lw in job.chunks[0].layers)
        spans = simulate(sc).timeline.spans
        sent = sum(s.args["bytes"] for s in spans
                   if s.gpu == 0 and s.category == COMM_DP and s.args.get("op") == "reduce_scatter")
        return sent, layer_grads

    z2, grads = scattered(2)
    z1, grads1 = scattered(1)
    assert grads == grads1 > 0
    assert z2 == pytest.approx(m * grads, rel=1e-12)
    assert z1 == pytest.approx(grads, rel=1e-12)


def test_one_gpu_speedup_is_one_and_compression_runs_on_synthetic_models() -> None:
    one = {"name": "one", "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": "A100-80GB"}, "model": "gpt3-1.3b",
           "parallel": {"data": 1}, "training": {"global_batch": 4}}
    s = simulate(scenario_from_dict(one)).summary
    assert s["speedup"] == pytest.approx(1.0, rel=1e-9)
    synth = {"name": "syn", "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "A100-80GB"},
             "model": {"kind": "synthetic", "layers": 2, "forward_ms": 1, "params_per_layer": 1000000},
             "parallel": {"data": 4}, "training": {"global_batch": 4, "gradient_compression": {"kind": "topk",
                                                                                             "ratio": 0.01}}}
    assert simulate(scenario_from_dict(synth)).summary["step_time_s"] > 0.003


def test_memory_track_holds_the_recompute_workspace() -> None:
    """Full checkpointing: while a layer is recomputed its activations (every × the full layer's) are live."""
    from sim.engine.timeline import RECOMPUTE

    sc = scenario_from_dict(_tiny(training__checkpointing="full", parallel__pipeline=1, parallel__data=4,
                                  parallel__tensor=4, training__global_batch=8, simulation__symmetry="off"))
    r = simulate(sc)
    job, _ = build_job(sc, cost_model_for(sc))
    ws = job.chunks[0].layers[1].workspace_bytes
    assert ws > 0
    first = min((s for s in r.timeline.spans if s.gpu == 0 and s.category == RECOMPUTE), key=lambda s: s.start_s)
    samples = [c for c in r.timeline.counters if c.gpu == 0]
    at = [i for i, c in enumerate(samples) if c.t_s == first.start_s]
    # At that instant the head's backward also releases its logits and their gradient: among the steps
    # of the track there, one is the workspace's allocation.
    steps = [samples[i].value - samples[i - 1].value for i in at]
    assert any(d == pytest.approx(ws, rel=1e-9) for d in steps), steps


def test_small_kernels_are_bound_by_host_dispatch() -> None:
    """A block of many tiny kernels takes n × host dispatch time, not the sum of their device times."""
    from sim.training.step_work import ops_time_s as _ops_time_s
    from sim.workload.ops import elementwise

    cost = RooflineCostModel(A100)
    tiny = [elementwise(f"k{i}", 1024.0, "bf16") for i in range(10)]
    device = sum(cost.op_time_s(op) for op in tiny)
    assert device < 10 * 6e-6
    assert _ops_time_s(cost, tiny, 6e-6) == pytest.approx(10 * 6e-6, rel=1e-12)
    big = [elementwise("big", 1e9, "bf16")]
    assert _ops_time_s(cost, big, 6e-6) == pytest.approx(cost.op_time_s(big[0]), rel=1e-12)


def test_deepspeed_pipeline_all_reduces_fp32_grads_under_zero1_and_partitions_p2p() -> None:
    """DeepSpeed's pipeline engine with bf16 and ZeRO-1 all-reduces the full fp32 gradients (Megatron's
    distributed optimizer reduce-scatters them), then all-gathers the 16-bit parameters; its p2p sends
    1/t of each activation per TP rank and all-gathers it on arrival."""

    def dp_ops(kernels: str) -> dict[str, float]:
        sc = _megatron(training__kernels=kernels, parallel__zero=1, training__precision="bf16")
        ops: dict[str, float] = {}
        for s in simulate(sc).timeline.spans:
            if s.gpu == 0 and s.category == COMM_DP:
                ops[s.args["op"]] = ops.get(s.args["op"], 0.0) + s.args["bytes"]
        return ops

    sc = _megatron(training__kernels="megatron-deepspeed-2022", parallel__zero=1, training__precision="bf16")
    job, info = build_job(sc, cost_model_for(sc))
    grads = sum(lw.grad_bytes for c in range(job.virtual_stages) for lw in job.chunk_of(0, c).layers)
    ds, mg = dp_ops("megatron-deepspeed-2022"), dp_ops("megatron-lm-2021")
    assert ds["all_reduce"] == pytest.approx(grads) and "reduce_scatter" not in ds
    assert mg["reduce_scatter"] == pytest.approx(grads) and "all_reduce" not in mg
    assert ds["all_gather"] == pytest.approx(mg["all_gather"])  # the same parameter gather after the step
    activation = sc.training.micro_batch * sc.model.seq_len * sc.model.hidden * 2
    assert job.chunks[0].send_bytes == pytest.approx(activation / 2)
    assert job.gather_bytes == pytest.approx(activation)


@pytest.mark.parametrize("kernels, copies, backward_gathers", [
    ("megatron-lm-2021", 2.0, 1),  # list all_gather: PyTorch copies the flat result out (read + write)
    ("megatron-lm-2022", 0.0, 1),  # _all_gather_base straight into the buffer
    ("megatron-deepspeed-2022", 5.0 + 2.0 / 2, 2),  # PartitionedTensor.full(): zeros, slice, copy-out, clone
])
def test_p2p_rebuild_copies_and_count_follow_the_code_base(kernels, copies, backward_gathers) -> None:
    """After the TP all-gather of a scattered p2p tensor the receiver copies what its code base copies
    (bytes by hand from each implementation, in full tensors: t = 2 here), and DeepSpeed's backward rebuilds
    its own partitioned output as well as the received gradient: stage 0 (which only receives gradients)
    gathers ``backward_gathers`` times per micro-batch, the last stage (only activations) once."""
    from sim.workload.ops import elementwise

    sc = _megatron(training__kernels=kernels, training__precision="bf16")
    cost = cost_model_for(sc)
    job, _ = build_job(sc, cost)
    activation = sc.training.micro_batch * sc.model.seq_len * sc.model.hidden * 2
    assert job.gather_bytes == pytest.approx(activation)
    if copies:
        assert job.gather_copy is not None
        assert job.gather_copy.dur_s == pytest.approx(cost.op_time_s(elementwise("x", copies * activation, "bf16")))
    else:
        assert job.gather_copy is None
    r = simulate(sc)
    m = sc.microbatches
    first, last = (next(g for g in r.timeline.gpus if r.timeline.stage_of[g] == s) for s in (0, 3))
    for g, expected in ((first, backward_gathers * m), (last, m)):
        gathers = [x for x in r.timeline.spans if x.gpu == g and x.category == COMM_PP and x.stream != "p2p"]
        assert len(gathers) == expected
        copied = [x for x in r.timeline.spans if x.gpu == g and x.name.endswith("p2p gather copies")]
        assert len(copied) == (expected if copies else 0)


def test_deepspeed_zero1_all_reduces_fp16_grads_too() -> None:
    """With fp16 DeepSpeed's ZeRO-1 optimizer reduces the gradients itself (stage 1 has no contiguous
    gradients, so allreduce_bucket runs with rank None): a full all-reduce of the 16-bit gradients."""
    sc = _megatron(training__kernels="megatron-deepspeed-2022", parallel__zero=1, training__precision="fp16")
    job, _ = build_job(sc, cost_model_for(sc))
    grads = sum(lw.grad_bytes for c in range(job.virtual_stages) for lw in job.chunk_of(0, c).layers)
    assert job.grad_elem_bytes == 2
    ops: dict[str, float] = {}
    for s in simulate(sc).timeline.spans:
        if s.gpu == 0 and s.category == COMM_DP:
            ops[s.args["op"]] = ops.get(s.args["op"], 0.0) + s.args["bytes"]
    assert ops["all_reduce"] == pytest.approx(grads) and "reduce_scatter" not in ops


def test_megatron_core_buckets_only_the_first_stage_first_chunk() -> None:
    """Megatron-Core's default bucket is max(40 M, 1 M × data) parameters; pipeline stages after the first
    (and model chunks after the first) reduce each chunk's gradients in one piece once its last backward
    is done, while the first stage's first chunk streams bucket after bucket."""
    from sim.training.step_work import grad_bucket_bytes

    assert grad_bucket_bytes(None, transformer=True, data=64, grad_elem_bytes=4) == 64e6 * 4
    assert grad_bucket_bytes(None, transformer=True, data=8, grad_elem_bytes=4) == 40e6 * 4
    assert grad_bucket_bytes(None, transformer=False, data=8, grad_elem_bytes=2) == 25e6  # PyTorch DDP
    assert grad_bucket_bytes(3.0, transformer=True, data=8, grad_elem_bytes=4) == 3e6

    sc = scenario_from_dict(_tiny(parallel__data=2, parallel__tensor=4, parallel__pipeline=2,
                                  parallel__schedule="interleaved-1f1b", parallel__virtual_stages=2,
                                  parallel__bucket_MB=0.001, parallel__overlap_grad_sync=True,
                                  training__global_batch=8, simulation__symmetry="off"))
    job, _ = build_job(sc, cost_model_for(sc))
    r = simulate(sc)
    for stage in (0, 1):
        g = next(g for g in r.timeline.gpus if r.timeline.stage_of[g] == stage)
        syncs = [s.args["bytes"] for s in r.timeline.spans if s.gpu == g and s.category == COMM_DP]
        chunk_grads = [sum(lw.grad_bytes for lw in job.chunk_of(stage, c).layers) for c in range(2)]
        if stage == 0:  # chunk 0 bucket by bucket (1 kB: one layer each), chunk 1 whole
            assert len(syncs) == len(job.chunk_of(0, 0).layers) + 1
            assert chunk_grads[1] in [pytest.approx(x) for x in syncs]
        else:  # one collective per chunk
            assert sorted(syncs) == pytest.approx(sorted(chunk_grads))
        assert sum(syncs) == pytest.approx(sum(chunk_grads))


def test_flash_attention_v1_priced_from_its_own_public_figures() -> None:
    """training.flash_attention v1 (FlashAttention of 2022, its Triton port) on the A100: the README
    figure's causal head_dim 128 bar at s = 2048 reads 69 TFLOP/s forward + backward, split at
    backward/forward 0.625 (FlashAttention reaching 25-40 %: forward at the top, backward at the bottom);
    FlashAttention-2's forward is more than 1.7× faster. ``v2`` on the A100 is its latest kernel."""
    cost = RooflineCostModel(A100)
    fwd, bwd = _attention_pair(cost, GPT3, flash_kernel="v1")
    r_f, r_b = (r * SUSTAINED["A100-80GB"] for r in _split(69, 0.625))
    assert cost.op_time_s(fwd) == pytest.approx(fwd.flops / 2 / r_f + A100.kernel_launch_s, rel=1e-9)
    assert cost.op_time_s(bwd) == pytest.approx(bwd.flops * 1.25 / 2 / r_b + A100.kernel_launch_s, rel=1e-9)
    fwd2, _ = _attention_pair(cost, GPT3)
    assert cost.op_time_s(fwd) > 1.7 * cost.op_time_s(fwd2)
    fwd_v2, _ = _attention_pair(cost, GPT3, flash_kernel="v2")
    assert cost.op_time_s(fwd_v2) == cost.op_time_s(fwd2)


def test_flash_attention_v1_without_public_figures_is_one_clear_line(tmp_path, capsys) -> None:
    from sim.cli import main

    sc = _tiny(cluster__gpu="B200", training__flash_attention="v1")
    path = tmp_path / "b200-v1.yaml"
    import yaml

    path.write_text(yaml.safe_dump(sc))
    assert main(["run", str(path), "--no-charts", "--no-trace", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "training.flash_attention" in err and "Traceback" not in err, err
    assert "B200" in err and "latest" in err


def test_concurrent_collectives_hold_their_own_sms() -> None:
    """Two overlapped collectives on different groups run their own NCCL kernels, each with its CTAs: the
    shares add. 100 SMs; the TP pair inside a node holds 20 (``nvlink``), the DP pair across two nodes 30
    (``net``). TP in flight over [0.1, 0.5] s and DP over [0.3, 0.9] s: 1 s of compute from t = 0 runs at
    1, 0.8, 0.5, 0.7 and again 1 of its speed, so by 0.9 s 0.1 + 0.16 + 0.1 + 0.28 = 0.64 s of it is done
    and it ends at 0.9 + 0.36 = 1.26 s."""
    from sim.hardware.nccl import CommCTAs

    lw = (LayerWork("L0", (Block("f", 0.01),), (Block("b", 0.01),), ()),)
    job = TrainingJob(dp=2, tp=2, pp=1, virtual_stages=1, microbatches=1, schedule="1f1b",
                      chunks=[ChunkWork(lw)], static_bytes=[0.0], nccl=CommCTAs(100, net=30, nvlink=20))
    ex = TrainingExecutor(world(2, 2), job, symmetric=False)
    env, ended = ex.env, []

    def collective(kind: str, start: float, stop: float):
        yield env.timeout(start)
        share = ex._comm_begin(0, kind, "all_reduce", 64e6)
        yield env.timeout(stop - start)
        ex._comm_end(0, share)

    def compute():
        yield from ex._compute(0, 1.0)
        ended.append(env.now)

    for proc in (collective("tp", 0.1, 0.5), collective("dp", 0.3, 0.9), compute()):
        env.process(proc)
    env.run()
    assert ended == [pytest.approx(1.26, rel=1e-12)]


def test_nccl_ctas_follow_where_the_ranks_are() -> None:
    """The SMs a collective holds on an A100 and an H100, as NCCL's channel counts give them (GPU presets,
    sources there): inside a node 24; NVLS 16 (H100); rings through the NICs with 8 GPUs a node 16; one GPU
    a node 2 (A100) or 4 (H100); a pipeline send to another node NCCL_NCHANNELS_PER_NET_PEER = 2."""
    from sim.hardware.gpu import GPU_PRESETS

    a100, h100 = GPU_PRESETS["A100-80GB"].nccl_ctas(), GPU_PRESETS["H100-SXM"].nccl_ctas()
    assert a100.of(1, 8, "ring") == 24 and h100.of(1, 8, "ring") == 24
    assert h100.of(1, 8, "nvls") == 16 and a100.of(1, 8, "nvls") == 24  # no NVLS on A100: its rings
    assert a100.of(4, 8, "ring") == 16 and h100.of(4, 8, "tree") == 16
    assert a100.of(16, 1, "ring") == 2 and h100.of(16, 1, "ring") == 4
    assert a100.of(2, 1, "direct") == 2
    assert a100.share(1, 8, "ring") == pytest.approx(24 / 108)  # compute beside it: 84/108 of its speed


def test_transformer_engine_attention_is_the_kernel_te_selects() -> None:
    """Under kernels transformer-engine, `latest` is what TE's get_attention_backend picks: cuDNN's fused
    attention on Hopper (cudnn-frontend's H200 results, causal head_dim 128 at s = 8k: forward 644,
    backward 541 TFLOP/s, the backward its own figure); another stack's `latest` on the same GPU is
    FlashAttention-3 (602 forward at 8k); on the A100, with no TE fit, TE runs the profile's own kernel."""
    from sim.training import step_work as sw
    from sim.workload.kernels import KERNEL_SETS

    dims = tf.TransformerDims(layers=2, hidden=8192, heads=64, ffn_hidden=28672, vocab=128256, seq_len=8192)
    te, mlm = KERNEL_SETS["transformer-engine"], KERNEL_SETS["megatron-lm-2022"]
    assert sw.flash_kernel("latest", te) == "te" and sw.flash_kernel("latest", mlm) == ""
    assert sw.flash_kernel("v1", te) == "v1"
    h100 = RooflineCostModel(GPU_PRESETS["H100-SXM"])
    launch = GPU_PRESETS["H100-SXM"].kernel_launch_s
    fwd, bwd = _attention_pair(h100, dims, flash_kernel=sw.flash_kernel("latest", te))
    k = SUSTAINED["H100-SXM"]
    assert h100.op_time_s(fwd) == pytest.approx(fwd.flops / 2 / (644e12 * k) + launch, rel=1e-9)
    assert h100.op_time_s(bwd) == pytest.approx(bwd.flops * 1.25 / 2 / (541e12 * k) + launch, rel=1e-9)
    fwd3, _ = _attention_pair(h100, dims, flash_kernel=sw.flash_kernel("latest", mlm))
    assert h100.op_time_s(fwd3) == pytest.approx(fwd3.flops / 2 / (602e12 * k) + launch, rel=1e-9)
    a100 = RooflineCostModel(A100)
    fwd_te, _ = _attention_pair(a100, GPT3, flash_kernel="te")
    fwd_own, _ = _attention_pair(a100, GPT3)
    assert a100.op_time_s(fwd_te) == a100.op_time_s(fwd_own)


def test_te_2024_attention_is_cudnn_9_1s_published_figure() -> None:
    """training.flash_attention te-2024: cuDNN 9.1's H200 figures of May 2024 (cudnn-frontend
    benchmark_results.csv, causal, head_dim 128): s = 8k forward 572.9, backward 463.5 TFLOP/s, both below
    the 2026 cuDNN 9.19 figures of `latest` under TE (644 / 541). Below its shortest length (4k: 542.3)
    the rate falls as s/(s + 1162): at 2k, 542.3 · (2048/3210) / (4096/5258) = 444.1 TFLOP/s, under
    9.19's 484. The A100 profile has no such figures: one clear line naming the field."""
    from sim.errors import ScenarioError
    from sim.training import step_work as sw
    from sim.workload.kernels import KERNEL_SETS

    te = KERNEL_SETS["transformer-engine"]
    assert sw.flash_kernel("te-2024", te) == "te-2024"
    h100 = RooflineCostModel(GPU_PRESETS["H100-SXM"])
    launch = GPU_PRESETS["H100-SXM"].kernel_launch_s
    dims = tf.TransformerDims(layers=2, hidden=8192, heads=64, ffn_hidden=28672, vocab=128256, seq_len=8192)
    fwd, bwd = _attention_pair(h100, dims, flash_kernel="te-2024")
    k = SUSTAINED["H100-SXM"]
    assert h100.op_time_s(fwd) == pytest.approx(fwd.flops / 2 / (572.9e12 * k) + launch, rel=1e-9)
    assert h100.op_time_s(bwd) == pytest.approx(bwd.flops * 1.25 / 2 / (463.5e12 * k) + launch, rel=1e-9)
    latest_fwd, latest_bwd = _attention_pair(h100, dims, flash_kernel="te")
    assert h100.op_time_s(fwd) > h100.op_time_s(latest_fwd) and h100.op_time_s(bwd) > h100.op_time_s(latest_bwd)
    short = replace(dims, seq_len=2048)
    fwd2, _ = _attention_pair(h100, short, flash_kernel="te-2024")
    rate = 542.3e12 * (2048 / (2048 + 1162)) / (4096 / (4096 + 1162))
    assert rate == pytest.approx(444.1e12, rel=1e-3)
    assert h100.op_time_s(fwd2) == pytest.approx(fwd2.flops / 2 / (rate * k) + launch, rel=1e-9)
    a100 = RooflineCostModel(A100)
    fwd_a, _ = _attention_pair(a100, GPT3, flash_kernel="te-2024")
    with pytest.raises(ScenarioError) as err:
        a100.op_time_s(fwd_a)
    assert err.value.field == "training.flash_attention" and "te-2024" in str(err.value)


def test_attention_curves_refuse_inconsistent_tables() -> None:
    """A curve needs increasing lengths, one positive value per length, and a way to price the backward
    (its own rows beside forward rows of the same head sizes, or a backward/forward ratio)."""
    from sim.cost.reference import AttentionCurves

    seq, row = (1024, 2048), (100.0, 120.0)
    AttentionCurves("fwd", seq, {128: row}, bwd_tflops_by_head_dim={128: row})  # well formed
    bad = [
        dict(passes="fwd", seq_len=(2048, 1024), tflops_by_head_dim={128: row}, bwd_over_fwd=0.8),
        dict(passes="fwd", seq_len=seq, tflops_by_head_dim={128: (100.0,)}, bwd_over_fwd=0.8),
        dict(passes="fwd", seq_len=seq, tflops_by_head_dim={128: row}),
        dict(passes="fwd+bwd", seq_len=seq, tflops_by_head_dim={128: row}, bwd_tflops_by_head_dim={128: row}),
        dict(passes="fwd", seq_len=seq, tflops_by_head_dim={128: row}, bwd_tflops_by_head_dim={64: row}),
        dict(passes="both", seq_len=seq, tflops_by_head_dim={128: row}, bwd_over_fwd=0.8),
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            AttentionCurves(**kw)


def test_overlapped_param_gather_moves_the_update_into_the_next_forward() -> None:
    """ZeRO-1 on two GPUs, two layers of 20 MB parameters each. After the optimizer step the update is
    gathered at once (40 MB, exposed: g2 seconds). With overlap_param_gather, a step gathers the previous
    step's update layer by layer, both dispatched back to back at its start: layer 0's 20 MB first
    (exposed: g1 seconds, before the first forward), layer 1's while layer 0's forward runs (hidden: 20 ms
    of forward against a gather of ~1 ms), none after the optimizer. So the step is shorter by exactly
    g2 − g1."""
    def run(overlap: bool):
        lw = [LayerWork(f"L{i}", (Block("f", 0.02),), (Block("b", 0.04),), (), grad_bytes=40e6,
                        param_bytes=20e6) for i in range(2)]
        job = TrainingJob(dp=2, tp=1, pp=1, virtual_stages=1, microbatches=2, schedule="1f1b",
                          chunks=[ChunkWork(tuple(lw))], zero=1, static_bytes=[0.0],
                          overlap_param_gather=overlap)
        ex = TrainingExecutor(world(2, 1), job, symmetric=False)
        ex.run()
        spans = [s for s in ex.world.timeline.spans if s.gpu == 0]
        gathers = [s for s in spans if s.name == "all_gather params"]
        return ex.step_end_s[0], gathers, spans

    end_after, g_after, _ = run(False)
    end_over, g_over, spans = run(True)
    assert len(g_after) == 1 and g_after[0].args["bytes"] == 40e6
    assert [g.args["bytes"] for g in g_over] == [20e6, 20e6]  # one per layer, once per step
    g1, g2 = g_over[0].dur_s, g_after[0].dur_s
    first_f = min(s.start_s for s in spans if s.category == FORWARD)
    assert g_over[0].start_s == 0.0 and first_f == pytest.approx(g1, abs=1e-12)
    assert g_over[1].end_s < first_f + 0.02  # layer 1's gather hidden under layer 0's forward
    assert end_over == pytest.approx(end_after - g2 + g1, rel=1e-9)


def test_overlap_param_gather_needs_a_sharded_optimizer(tmp_path, capsys) -> None:
    import yaml

    from sim.cli import main

    path = tmp_path / "z0.yaml"
    path.write_text(yaml.safe_dump(_tiny(parallel__overlap_param_gather=True, parallel__zero=0)))
    assert main(["run", str(path), "--no-charts", "--no-trace", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "overlap_param_gather" in err and "zero: 1" in err, err
    assert "Traceback" not in err
    ok = simulate(scenario_from_dict(_tiny(parallel__overlap_param_gather=True, parallel__zero=1))).summary
    assert ok["step_time_s"] > 0


def test_overlapped_param_gather_runs_a_model_chunk_ahead() -> None:
    """Interleaved 1F1B, 2 stages × 3 model chunks of one layer: as Megatron's schedule dispatches them,
    the first two chunks' gathers are queued at the step's start and chunk k+1's when chunk k's first
    forward begins, so on stage 0 chunk 2's gather starts no earlier than chunk 1's first forward."""
    lw = lambda n: LayerWork(n, (Block("f", 0.01),), (Block("b", 0.02),), (), grad_bytes=8e6,  # noqa: E731
                             param_bytes=4e6)
    chunks = [ChunkWork((lw(f"L{v}"),)) for v in range(6)]
    job = TrainingJob(dp=2, tp=1, pp=2, virtual_stages=3, microbatches=4, schedule="interleaved-1f1b",
                      chunks=chunks, zero=1, static_bytes=[0.0, 0.0], overlap_param_gather=True)
    ex = TrainingExecutor(world(2, 2), job, symmetric=False)
    ex.run()
    g0 = [s for s in ex.world.timeline.spans if s.gpu == 0]
    gathers = sorted(s.start_s for s in g0 if s.name == "all_gather params")
    first_f = {c: min(s.start_s for s in g0 if s.category == FORWARD and s.args.get("chunk") == c) for c in range(3)}
    assert len(gathers) == 3
    assert gathers[0] == 0.0 and gathers[1] == pytest.approx(0.0, abs=0.01)  # chunks 0, 1 back to back
    assert gathers[2] >= first_f[1] - 1e-12
    assert not [s for s in g0 if s.name == "all_gather params" and s.start_s > first_f[2]]


def test_b200_attention_is_cudnns_gb200_figure_at_the_hgx_peak() -> None:
    """B200: cudnn-frontend's GB200 figure (causal, head_dim 128, s = 8k: forward 1574, backward 1332
    TFLOP/s) taken at the same fraction of peak on an HGX B200 (2.25 against the GB200's 2.5 PFLOP/s), at
    the B200's sustained clock."""
    b200 = GPU_PRESETS["B200"]
    cost = RooflineCostModel(b200)
    dims = tf.TransformerDims(layers=2, hidden=8192, heads=64, ffn_hidden=28672, vocab=128256, seq_len=8192)
    fwd, bwd = _attention_pair(cost, dims, flash_kernel="te")
    scale = 2250 / 2500 * SUSTAINED["B200"]
    assert cost.op_time_s(fwd) - b200.kernel_launch_s == pytest.approx(fwd.flops / 2 / (1574e12 * scale), rel=1e-3)
    assert cost.op_time_s(bwd) - b200.kernel_launch_s == pytest.approx(bwd.flops * 1.25 / 2 / (1332e12 * scale),
                                                                       rel=1e-3)


def _fsdp(**over):
    """A 1-node FSDP (ZeRO-3, FULL_SHARD) job under the PyTorch/Composer stack, 2 micro-batches."""
    kw = dict(parallel__zero=3, parallel__pipeline=1, parallel__data=8, parallel__tensor=1, cluster__nodes=1,
              training__global_batch=32, training__kernels="pytorch-fsdp-2023", simulation__symmetry="off")
    return scenario_from_dict(_tiny(**{**kw, **over}))


def test_pytorch_fsdp_step_work_by_hand() -> None:
    """Composer's DecoupledAdamW moves 80 bytes per fp32 shard parameter (no 16-bit copy, nothing to zero);
    FSDP's clip_grad_norm_ reads each fp32 shard gradient and scales it (4 + 8); FSDP's backward copies
    each layer's gradients into the flat gradient (2 + 2 bytes per bf16 element) where Megatron
    accumulates into main_grad; the gradients reduce in bf16."""
    from sim.engine.timeline import FSDP_COPY

    sc = _fsdp()
    cost = cost_model_for(sc)
    job, info = build_job(sc, cost)
    bw = sc.gpu.memory_bw_Bps * cost.reference.memory_fraction
    launch = sc.gpu.kernel_launch_s
    d = sc.model
    dims = tf.TransformerDims(layers=d.layers, hidden=d.hidden, heads=d.heads, ffn_hidden=d.ffn_hidden,
                              vocab=d.vocab, seq_len=d.seq_len)
    params = info.memory_by_stage[0]["weights"] / 4 * 8  # FSDP's fp32 shard: 4 bytes per parameter over dp
    assert params == pytest.approx(tf.model_params(dims), rel=1e-3)
    assert job.optimizer.dur_s == pytest.approx(params / 8 * 80 / bw + launch, rel=1e-9)
    assert job.clip.dur_s == pytest.approx(params / 8 * 12 / bw + launch, rel=1e-9)
    layer = job.chunks[0].layers[1]
    assert layer.name == "L0"
    copy = [b for b in layer.weight if b.category == FSDP_COPY]
    assert len(copy) == 1 and not any(b.category == GRAD_ACCUM for b in layer.weight)
    assert copy[0].dur_s == pytest.approx(tf.layer_params(dims) * 4 / bw + launch, rel=1e-9)
    assert job.grad_elem_bytes == 2 and layer.grad_bytes == tf.layer_params(dims) * 2
    # Its DP-stream kernels: the pre-divide reads and writes the unsharded bf16 gradient; the cast reads
    # the fp32 shard and writes its bf16 copy.
    assert layer.pre_reduce_s == pytest.approx(tf.layer_params(dims) * 2 * 2 / bw + launch, rel=1e-9)
    assert layer.pre_gather_s == pytest.approx(tf.layer_params(dims) / 8 * 6 / bw + launch, rel=1e-9)
    # Memory: FSDP's fp32 shard is the weights and the master at once, its gradients fp32 too (4 + 4 + 8).
    mem0 = info.memory_by_stage[0]
    assert mem0["gradients"] == pytest.approx(params / 8 * 4) and mem0["optimizer"] == pytest.approx(params)


def test_pytorch_fsdp_kernels_are_on_the_timeline() -> None:
    """Every layer's reduce-scatter follows its pre-divide on the DP stream, every all-gather its shard
    cast (two gathers per layer and micro-batch: forward and backward); each is an ``fsdp_copy`` span."""
    from sim.engine.executor import STREAM_DP
    from sim.engine.timeline import FSDP_COPY

    sc = _fsdp()
    r = simulate(sc)
    mine = [s for s in r.timeline.spans if s.gpu == 0]
    dp = sorted((s for s in mine if s.stream == STREAM_DP), key=lambda s: s.start_s)
    pre = [s for s in dp if s.category == FSDP_COPY]
    m = sc.microbatches
    units = 8 + 1  # the layers and the embedding (its tied head holds no parameters of its own)
    assert sum(s.name == "grad predivide" for s in pre) == m * units
    assert sum(s.name == "shard cast" for s in pre) == 2 * m * units
    for a, b in zip(dp, dp[1:], strict=False):  # each pre-kernel runs right before its collective
        if a.category == FSDP_COPY:
            assert b.category == COMM_DP and b.start_s == pytest.approx(a.end_s, abs=1e-12)
            assert b.args["op"] == ("reduce_scatter" if a.name == "grad predivide" else "all_gather")
    assert any(s.category == FSDP_COPY and s.name.endswith("flat grad copy") for s in mine)
    # The same job under Megatron's kernels has none of them.
    other = simulate(_fsdp(training__kernels="transformer-engine"))
    assert not any(s.category == FSDP_COPY for s in other.timeline.spans)


def test_pytorch_fsdp_predivide_stays_without_overlap() -> None:
    """With overlap_grad_sync off the gradients of each backward are reduce-scattered at once, after it:
    the pre-divide still runs before that reduce-scatter, over all of them (the layers' pre-divides summed)."""
    from sim.engine.executor import STREAM_DP
    from sim.engine.timeline import FSDP_COPY

    sc = _fsdp(parallel__overlap_grad_sync=False)
    job, _ = build_job(sc, cost_model_for(sc))
    r = simulate(sc)
    dp = sorted((s for s in r.timeline.spans if s.gpu == 0 and s.stream == STREAM_DP), key=lambda s: s.start_s)
    pre = [s for s in dp if s.category == FSDP_COPY and s.name == "grad predivide"]
    assert len(pre) == sc.microbatches  # one per backward
    total = sum(lw.pre_reduce_s for lw in job.chunks[0].layers)
    assert all(s.end_s - s.start_s == pytest.approx(total, rel=1e-9) for s in pre)
    for a in pre:
        b = dp[dp.index(a) + 1]
        assert b.args["op"] == "reduce_scatter" and b.start_s == pytest.approx(a.end_s, abs=1e-12)


def test_a_preset_given_other_peaks_prices_its_kernels_at_those_peaks() -> None:
    # The reference profile was measured on the preset: a scenario that keeps the name but raises the
    # 16-bit peaks (e.g. --set cluster.gpu.peak_tflops.bf16=400) gets kernels 400/312 as fast, not the
    # preset's (the edited peak used to cancel out of the ceiling, leaving the step unchanged).
    from sim.workload.ops import gemm

    a100 = GPU_PRESETS["A100-80GB"]
    faster = a100.model_copy(update={"peak_tflops": {**a100.peak_tflops, "bf16": 400.0, "fp16": 400.0}})
    base, edited = RooflineCostModel(a100), RooflineCostModel(faster)
    op = gemm("g", 8192, 8192, 8192, "bf16")
    assert edited.gemm_flops_per_s(op) == pytest.approx(base.gemm_flops_per_s(op) * 400 / 312, rel=1e-12)
    fwd, _ = _attention_pair(base, GPT3)
    assert edited.attention_flops_per_s(fwd) == pytest.approx(base.attention_flops_per_s(fwd) * 400 / 312, rel=1e-12)


def test_editing_an_efficiency_the_reference_profile_replaces_warns() -> None:
    a100 = GPU_PRESETS["A100-80GB"]
    with pytest.warns(UserWarning, match="gemm_efficiency of A100-80GB not used"):
        RooflineCostModel(a100.model_copy(update={"gemm_efficiency": 0.9}))
    # Renamed, it has no reference profile: its own efficiency × peak is the GEMM ceiling
    custom = RooflineCostModel(a100.model_copy(update={"name": "A100-custom", "gemm_efficiency": 0.9}))
    assert custom.reference is None
    assert custom.gemm_model("bf16").ceiling_flops_per_s == pytest.approx(0.9 * 312e12)


def _overlapped_gather(hbm_Bps: float, hbm_bytes: float, comm_bytes: float = 400e6):
    """Two TP ranks in one node; one forward block whose all-gather runs beside it. Returns (the
    collective's span, the executor)."""
    blk = Block("f", 0.010, "all_gather", comm_bytes, overlap=True, hbm_bytes=hbm_bytes)
    lw = (LayerWork("L0", (blk,), (Block("b", 0.001),), ()),)
    job = TrainingJob(dp=1, tp=2, pp=1, virtual_stages=1, microbatches=1, schedule="1f1b",
                      chunks=[ChunkWork(lw)], bucket_bytes=1.0, static_bytes=[0.0], hbm_Bps=hbm_Bps)
    ex = TrainingExecutor(world(1, 2), job, symmetric=False)
    ex.run()
    span = next(s for s in ex.world.timeline.spans if s.gpu == 0 and "(overlapped)" in s.name)
    return span, ex


def test_a_collective_beside_memory_bound_compute_shares_hbm() -> None:
    """The other way round: a collective overlapping memory-bound kernels gets its share of HBM. The
    all-gather receives at the test NVLink's 100 GB/s and touches HBM 3 times per byte (300 GB/s); the
    block's kernels stream 1.5 TB/s through an HBM that gives 1.6 TB/s: together 1.8 TB/s, so the gather
    moves its bytes 1.8/1.6 = 1.125× slower — the same span as the gather of 1.125× the bytes alone. A
    block of GEMMs (0.2 TB/s) leaves it alone."""
    hbm = 1.6e12
    slow, ex = _overlapped_gather(hbm, hbm_bytes=1.5e12 * 0.010)
    assert ex._hbm_stretch(0, "tp", "all_gather", ex.job.chunks[0].layers[0].forward[0]) == pytest.approx(1.125)
    assert slow.args["hbm_stretch"] == pytest.approx(1.125)
    assert "slowed by compute's HBM traffic" in slow.name
    same, _ = _overlapped_gather(0.0, 0.0, comm_bytes=400e6 * 1.125)
    assert slow.dur_s == pytest.approx(same.dur_s, rel=1e-9)
    alone, _ = _overlapped_gather(0.0, 0.0)
    gemms, _ = _overlapped_gather(hbm, hbm_bytes=0.2e12 * 0.010)
    assert gemms.dur_s == pytest.approx(alone.dur_s, rel=1e-12) and "hbm_stretch" not in gemms.args
    assert slow.dur_s > alone.dur_s * 1.1
