"""Memory-bound kernel families (Op.family): each priced at its own achieved bandwidth, against the
published figures the A100 reference profile cites; which stack runs which norm kernel; dropout 0."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sim.cost.calibrated import CalibratedCostModel
from sim.cost.profile import PROFILE_KIND, SCHEMA_VERSION, BandwidthCurve
from sim.cost.roofline import RooflineCostModel
from sim.hardware.gpu import GPU_PRESETS
from sim.training.step_work import ops_time_s
from sim.workload import transformer as tf
from sim.workload.attention import standard_attention
from sim.workload.hf_config import read_hf_config
from sim.workload.kernels import KERNEL_SETS, persistent_norm
from sim.workload.ops import (
    DROPOUT,
    NORM,
    NORM_BWD,
    PERSISTENT_NORM,
    PERSISTENT_NORM_BWD,
    SOFTMAX,
    SOFTMAX_BWD,
    STREAM,
    elementwise,
)

A100 = GPU_PRESETS["A100-80GB"]
GPT3 = tf.TransformerDims(layers=96, hidden=12288, heads=96, ffn_hidden=4 * 12288, vocab=51200, seq_len=2048)
MB = 2**20


@pytest.mark.parametrize(("family", "published_Bps"), [
    (NORM, 895.8e9), (NORM_BWD, 572.2e9),  # apex affine LayerNorm, NVIDIA/apex PR #1037
    (PERSISTENT_NORM, 1258.0e9), (PERSISTENT_NORM_BWD, 1163.4e9),  # apex contrib FastLayerNorm, same PR
    (SOFTMAX, 1275e9), (SOFTMAX_BWD, 1275e9),  # one-pass row softmax at N = 2048 (Triton tutorial 02)
    (DROPOUT, 953e9),  # torch dropout at 1e9 elements (FlagGems PR #85)
    (STREAM, 0.85 * 2039e9),  # copies and adds: STREAM-class
])
def test_a100_families_run_at_their_published_bandwidth(family: str, published_Bps: float) -> None:
    """A 256 MiB op of each family takes bytes / the published GB/s (+ the launch), to the rounding of
    the profile's three-digit fractions."""
    cost = RooflineCostModel(A100)
    op = elementwise("x", 256 * MB, "bf16", family=family)
    assert cost.op_time_s(op) - A100.kernel_launch_s == pytest.approx(256 * MB / published_Bps, rel=2e-3)


def test_a_gpu_without_family_figures_streams_every_family() -> None:
    b200 = RooflineCostModel(GPU_PRESETS["B200"])
    t = {f: b200.op_time_s(elementwise("x", 64 * MB, "bf16", family=f)) for f in (STREAM, NORM_BWD, DROPOUT)}
    assert t[NORM_BWD] == t[STREAM] == t[DROPOUT]


@pytest.mark.parametrize(("gpu", "hbm_GBps"), [("H100-SXM", 3350), ("H200", 4800)])
def test_hopper_dropout_draws_random_numbers_at_the_a100s_rate_scaled_by_integer_throughput(gpu, hbm_GBps) -> None:
    """No public Hopper dropout figure: the A100's 953 GB/s (RNG-bound) scaled by SMs × boost clock
    (132 × 1980 / 108 × 1410 MHz) gives 1635 GB/s on both Hopper parts, whatever their HBM."""
    by_hand_Bps = 953e9 / 2039e9 * (132 * 1980) / (108 * 1410) * 2039e9
    cost = RooflineCostModel(GPU_PRESETS[gpu])
    t = cost.op_time_s(elementwise("x", 256 * MB, "bf16", family=DROPOUT)) - GPU_PRESETS[gpu].kernel_launch_s
    assert 256 * MB / t == pytest.approx(by_hand_Bps, rel=3e-3)  # the profiles round to three digits
    assert 256 * MB / t / (hbm_GBps * 1e9) < 0.5  # well below the 0.88 a copy streams at


def test_only_a_dropouts_forward_draws_random_numbers() -> None:
    """The backward of bias-dropout-add multiplies the gradient by the stored mask: a streaming kernel of
    gradient and mask in, gradient out, not the RNG-bound forward's rate."""
    fwd = tf._dropout_add_fwd("add", 2048, 12288, "bf16")[0]
    bwd = tf._dropout_add_bwd("add.bwd", 2048, 12288, "bf16")
    assert fwd.family == DROPOUT and bwd.family == STREAM
    assert bwd.bytes == 2048 * 12288 * (2 + 2 + 1)
    cost = RooflineCostModel(A100)
    assert cost.op_time_s(bwd) - A100.kernel_launch_s == pytest.approx(bwd.bytes / (0.85 * 2039e9), rel=2e-3)
    fwd_ops, bwd_ops = standard_attention(GPT3, 1, 8, "bf16", dropout_kernel=True)
    names = {op.name: op.family for op in (*fwd_ops, *bwd_ops)}
    assert names["attention.dropout"] == DROPOUT and names["attention.dropout.bwd"] == STREAM


def test_h100_layernorm_at_liger_kernels_published_torch_figures() -> None:
    """Liger-Kernel's benchmark data, torch.nn.LayerNorm on an H100 80GB HBM3, 4096 rows: forward 0.0662 /
    0.1527 / 0.3068 ms at N = 4096 / 8192 / 16384 (x in, y out: 2028 / 1758 / 1750 GB/s, mean 1845), backward
    0.1788 / 0.3337 / 0.6424 ms (x, dy in, dx out: 1126 / 1207 / 1254 GB/s, mean 1196); the H100 streams
    at 0.88 of 3350 GB/s."""
    fwd_GBps = [2 * 4096 * n * 4 / ms / 1e6 for n, ms in ((4096, 0.0662), (8192, 0.1527), (16384, 0.3068))]
    bwd_GBps = [3 * 4096 * n * 4 / ms / 1e6 for n, ms in ((4096, 0.1788), (8192, 0.3337), (16384, 0.6424))]
    h100 = RooflineCostModel(GPU_PRESETS["H100-SXM"])
    launch = GPU_PRESETS["H100-SXM"].kernel_launch_s
    t = {f: h100.op_time_s(elementwise("x", 64 * MB, "bf16", family=f)) - launch for f in (STREAM, NORM, NORM_BWD)}
    assert 64 * MB / t[NORM] / 1e9 == pytest.approx(sum(fwd_GBps) / 3, rel=2e-3)
    assert 64 * MB / t[NORM_BWD] / 1e9 == pytest.approx(sum(bwd_GBps) / 3, rel=2e-3)
    assert 64 * MB / t[STREAM] / 1e9 == pytest.approx(0.88 * 3350, rel=1e-3)


def test_an_op_that_moves_nothing_costs_nothing_and_launches_nothing() -> None:
    cost = RooflineCostModel(A100)
    nothing = elementwise("no-op", 0.0, "bf16")
    assert cost.op_time_s(nothing) == 0.0
    # Host dispatch counts launched kernels only: two real ops and a no-op at 1 ms of host time each.
    ops = [elementwise("a", 1.0, "bf16"), elementwise("b", 1.0, "bf16"), nothing]
    assert ops_time_s(cost, ops, host_s=1e-3) == pytest.approx(2e-3)


def test_norm_kernel_of_each_stack() -> None:
    """Megatron 2021 and Megatron-DeepSpeed: apex's affine kernels; Megatron 2022: the persistent kernel
    for the hidden sizes in its list (12288 is, 12000 is not); Transformer Engine: its own, any size."""
    ks = KERNEL_SETS
    assert not persistent_norm(ks["megatron-lm-2021"], "auto", 12288)
    assert not persistent_norm(ks["megatron-deepspeed-2022"], "auto", 20480)
    assert persistent_norm(ks["megatron-lm-2022"], "auto", 12288)
    assert not persistent_norm(ks["megatron-lm-2022"], "auto", 12000)
    assert persistent_norm(ks["transformer-engine"], "auto", 12000)
    assert not persistent_norm(ks["transformer-engine"], "framework", 4096)  # PyTorch eager under TE's set
    assert persistent_norm(ks["megatron-lm-2021"], "persistent", 4096)


def test_layer_norms_carry_the_family_of_their_kernel() -> None:
    kw = dict(micro_batch=1, tp=8, sequence_parallel=False, dtype="bf16", attention="standard",
              attention_dropout_kernel=True)
    for persistent, fwd, bwd in ((False, NORM, NORM_BWD), (True, PERSISTENT_NORM, PERSISTENT_NORM_BWD)):
        lo = tf.layer_ops(GPT3, **kw, persistent_norm=persistent)
        ops = {op.name: op for seg in (*lo.forward, *lo.backward_input) for op in seg.ops}
        assert ops["norm1"].family == ops["norm2"].family == fwd
        assert ops["norm1.bwd"].family == ops["norm2.bwd"].family == bwd
        assert ops["attention.softmax"].family == SOFTMAX and ops["attention.softmax.bwd"].family == SOFTMAX_BWD
        assert ops["attention.dropout"].family == ops["attn_dropout_add"].family == DROPOUT


def test_gpt3_layer_pays_for_its_framework_norms_by_hand() -> None:
    """GPT-3 layer, TP 8, micro-batch 1, bf16: norm1 moves 2·2048·12288·2 + 2·2048·4 bytes; at apex's
    896 GB/s that is 112.4 µs, against 58.1 µs at the streaming 1733 GB/s."""
    cost = RooflineCostModel(A100)
    lo = tf.layer_ops(GPT3, micro_batch=1, tp=8, sequence_parallel=False, dtype="bf16", attention="standard")
    norm1 = next(op for seg in lo.forward for op in seg.ops if op.name == "norm1")
    moved = 2 * 2048 * 12288 * 2 + 2 * 2048 * 4
    assert norm1.bytes == moved
    assert cost.op_time_s(norm1) - A100.kernel_launch_s == pytest.approx(moved / 895.8e9, rel=2e-3)
    assert cost.op_time_s(norm1) - A100.kernel_launch_s == pytest.approx(112.4e-6, rel=1e-3)
    streamed = cost.op_time_s(replace(norm1, family=STREAM)) - A100.kernel_launch_s
    assert streamed == pytest.approx(58.1e-6, rel=1e-3)


def test_without_dropout_no_dropout_kernel_runs() -> None:
    """dropout 0: the attention's dropout kernels are gone, the dropout-adds are plain adds (3 tensors, no
    mask, streaming), and without biases their backward moves nothing."""
    d = tf.TransformerDims(layers=2, hidden=1024, heads=8, ffn_hidden=4096, vocab=1000, seq_len=512,
                           bias=False, dropout=0.0)
    lo = tf.layer_ops(d, micro_batch=1, tp=1, sequence_parallel=False, dtype="bf16", attention="standard",
                      attention_dropout_kernel=True)
    ops = {op.name: op for seg in (*lo.forward, *lo.backward_input) for op in seg.ops}
    assert "attention.dropout" not in ops and "attention.dropout.bwd" not in ops
    fwd, _ = standard_attention(d, 1, 1, "bf16", True)  # with dropout the kernel set's dropout kernel runs
    assert [op.name for op in fwd if "dropout" in op.name] == ["attention.dropout"]
    assert ops["attn_dropout_add"].bytes == 512 * 1024 * 3 * 2 and ops["attn_dropout_add"].family == STREAM
    assert ops["mlp_dropout_add.bwd"].bytes == 0.0
    biased = tf.layer_ops(tf.TransformerDims(**{**d.__dict__, "bias": True}), micro_batch=1, tp=1,
                          sequence_parallel=False, dtype="bf16")
    b_ops = {op.name: op for seg in biased.backward_input for op in seg.ops}
    assert b_ops["mlp_dropout_add.bwd"].bytes == 512 * 1024 * 2  # the bias gradient reads the gradient once
    emb = tf.embedding_ops(d, micro_batch=1, tp=1, sequence_parallel=False, dtype="bf16")
    assert emb.forward[1].ops[0].bytes == 512 * 1024 * 3 * 2  # learned positions: the add alone


def test_hf_configs_give_their_dropout(tmp_path) -> None:
    llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 512, "num_attention_heads": 8,
             "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 256}
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 512, "n_head": 8, "vocab_size": 1000, "n_positions": 256}
    for name, cfg, expected in (("llama", llama, 0.0), ("gpt2", gpt2, 0.1),
                                ("gpt2-nodrop", {**gpt2, "resid_pdrop": 0.0, "attn_pdrop": 0.0,
                                                 "embd_pdrop": 0.0}, 0.0)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(cfg))
        assert read_hf_config(path)["dropout"] == expected, name


def test_a_profile_prices_a_family_by_its_own_curve_or_falls_back(tmp_path) -> None:
    curve = lambda bps: {"bytes_moved": [1e6, 1e9], "bytes_per_s": [bps, bps]}  # noqa: E731
    bw = BandwidthCurve({"copy": curve(1.8e12), "add": curve(1.6e12), "norm.bwd": curve(0.5e12)})
    assert bw.bytes_per_s(1e8)[0] == pytest.approx(1.7e12)  # streaming: the median of copy and add
    assert bw.bytes_per_s(1e8, NORM_BWD)[0] == pytest.approx(0.5e12)
    assert bw.has(NORM_BWD) and bw.has(STREAM) and not bw.has(SOFTMAX)

    profile = {"schema_version": SCHEMA_VERSION, "kind": PROFILE_KIND, "metadata": {"device": "cuda"}, "run": {},
               "sections": {}, "fits": {"memory": {"kernels": {"copy": curve(1.8e12), "norm.bwd": curve(0.5e12)}}}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    fallback = RooflineCostModel(A100)
    cal = CalibratedCostModel(path, fallback)
    assert cal.op_time_s(elementwise("n", 1e8, "bf16", family=NORM_BWD)) == pytest.approx(1e8 / 0.5e12)
    softmax = elementwise("s", 1e8, "bf16", family=SOFTMAX)
    assert cal.op_time_s(softmax) == fallback.op_time_s(softmax)
    assert any("softmax" in reason for reason in cal.report()["fallbacks"])
