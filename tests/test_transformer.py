"""Transformer ops against the closed forms of reference.md (24bsh² + 4bs²h, backward = 2x forward, …)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.errors import ScenarioError
from sim.workload.ops import ATTENTION, ELEMENTWISE, GEMM
from sim.workload.transformer import (
    LayerOps,
    TransformerDims,
    embedding_ops,
    embedding_params,
    hardware_flops_per_iteration,
    head_ops,
    layer_ops,
    layer_params,
    model_flops_per_iteration,
    model_params,
)

GPT = TransformerDims(layers=4, hidden=1024, heads=16, ffn_hidden=4096, vocab=51200, seq_len=512)
LLAMA_LIKE = TransformerDims(
    layers=2,
    hidden=1024,
    heads=16,
    ffn_hidden=2816,
    vocab=32000,
    seq_len=256,
    kv_heads=4,
    mlp="swiglu",
    bias=False,
    norm="rmsnorm",
    position="rope",
    tied_embeddings=False,
)


def _ops(ops: LayerOps, part: str):
    if part == "backward_weight":
        return list(ops.backward_weight)
    return [op for seg in getattr(ops, part) for op in seg.ops]


def _comms(segments) -> list[str | None]:
    return [seg.comm for seg in segments]


def _by_name(ops: LayerOps):
    return {
        op.name: op for part in ("forward", "backward_input", "backward_weight") for op in _ops(ops, part)
    }


# ------------------------------------------------------------------------------------------- parameters


def test_gpt_layer_params_is_12h2_plus_13h():
    h = GPT.hidden
    assert layer_params(GPT) == 12 * h * h + 13 * h


def test_gpt_model_params_adds_embeddings_and_final_norm():
    h, v, s = GPT.hidden, GPT.vocab, GPT.seq_len
    assert embedding_params(GPT) == v * h + s * h
    assert model_params(GPT) == GPT.layers * (12 * h * h + 13 * h) + v * h + s * h + 2 * h
    assert model_params(GPT, tied_embeddings=False) == model_params(GPT) + v * h


def test_llama2_7b_layer_params_published():
    # Llama-2-7B: 4h² attention + 3·h·ffn SwiGLU + two RMSNorms = 202,383,360 per layer.
    d = TransformerDims(
        layers=32, hidden=4096, heads=32, ffn_hidden=11008, vocab=32000, seq_len=4096, mlp="swiglu", bias=False,
        norm="rmsnorm", position="rope",
    )  # fmt: skip
    assert layer_params(d) == 202_383_360


def test_gqa_shrinks_kv_projection():
    h, kv_dim, ffn = LLAMA_LIKE.hidden, 4 * 64, LLAMA_LIKE.ffn_hidden
    assert layer_params(LLAMA_LIKE) == h * (h + 2 * kv_dim) + h * h + 3 * h * ffn + 2 * h


# ------------------------------------------------------------------------------------------------ FLOPs


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("b", [1, 3])
def test_forward_flops_times_tp_match_24bsh2_plus_4bs2h(tp, sp, b):
    s, h = GPT.seq_len, GPT.hidden
    ops = layer_ops(GPT, micro_batch=b, tp=tp, sequence_parallel=sp, dtype="bf16")
    matmul = sum(op.flops for op in _ops(ops, "forward") if op.kind in (GEMM, ATTENTION))
    assert matmul * tp == pytest.approx(24 * b * s * h * h + 4 * b * s * s * h, rel=1e-12)


@pytest.mark.parametrize("d", [GPT, LLAMA_LIKE])
@pytest.mark.parametrize("tp", [1, 4])
def test_backward_is_twice_forward(d, tp):
    ops = layer_ops(d, micro_batch=2, tp=tp, sequence_parallel=False, dtype="bf16")
    fwd = sum(op.flops for op in _ops(ops, "forward") if op.kind in (GEMM, ATTENTION))
    b_in = sum(op.flops for op in _ops(ops, "backward_input") if op.kind in (GEMM, ATTENTION))
    w = sum(op.flops for op in ops.backward_weight)
    assert b_in + w == pytest.approx(2 * fwd, rel=1e-12)
    # W is the weight-gradient GEMMs: the forward GEMM FLOPs exactly.
    fwd_gemm = sum(op.flops for op in _ops(ops, "forward") if op.kind == GEMM)
    assert w == pytest.approx(fwd_gemm, rel=1e-12)


def test_attention_core_flops_4bs2h_over_t_and_backward_double():
    b, s, h, t = 2, GPT.seq_len, GPT.hidden, 4
    ops = layer_ops(GPT, micro_batch=b, tp=t, sequence_parallel=False, dtype="bf16")
    fwd = [op for op in _ops(ops, "forward") if op.kind == ATTENTION]
    bwd = [op for op in _ops(ops, "backward_input") if op.kind == ATTENTION]
    assert len(fwd) == 1 and fwd[0].flops == pytest.approx(4 * b * s * s * h / t)
    assert len(bwd) == 1 and bwd[0].flops == pytest.approx(8 * b * s * s * h / t)


def test_gqa_and_swiglu_forward_flops():
    b, s, h, ffn, kv_dim, t = 1, LLAMA_LIKE.seq_len, LLAMA_LIKE.hidden, LLAMA_LIKE.ffn_hidden, 256, 2
    ops = layer_ops(LLAMA_LIKE, micro_batch=b, tp=t, sequence_parallel=False, dtype="bf16")
    matmul = sum(op.flops for op in _ops(ops, "forward") if op.kind in (GEMM, ATTENTION))
    expected = 2 * b * s * (h * (h + 2 * kv_dim) + h * h + 3 * h * ffn) + 4 * b * s * s * h
    assert matmul * t == pytest.approx(expected, rel=1e-12)


# ----------------------------------------------------------------------------------------- GEMM shapes


def test_per_gpu_gemm_shapes_column_and_row_split():
    b, s, h, t = 2, GPT.seq_len, GPT.hidden, 4
    ops = _by_name(layer_ops(GPT, micro_batch=b, tp=t, sequence_parallel=False, dtype="bf16"))
    assert (ops["qkv"].m, ops["qkv"].n, ops["qkv"].k) == (b * s, 3 * h // t, h)  # column: n split
    assert (ops["attn_out"].m, ops["attn_out"].n, ops["attn_out"].k) == (b * s, h, h // t)  # row: k split
    assert (ops["mlp_up"].m, ops["mlp_up"].n, ops["mlp_up"].k) == (b * s, 4 * h // t, h)
    assert (ops["mlp_down"].m, ops["mlp_down"].n, ops["mlp_down"].k) == (b * s, h, 4 * h // t)
    # dX = dY Wᵀ and dW = Xᵀ dY
    assert (ops["mlp_up.dgrad"].m, ops["mlp_up.dgrad"].n, ops["mlp_up.dgrad"].k) == (b * s, h, 4 * h // t)
    assert (ops["mlp_up.wgrad"].m, ops["mlp_up.wgrad"].n, ops["mlp_up.wgrad"].k) == (h, 4 * h // t, b * s)


def test_swiglu_gate_and_up_fused_and_gqa_qkv_width():
    h, ffn, t = LLAMA_LIKE.hidden, LLAMA_LIKE.ffn_hidden, 4
    ops = _by_name(layer_ops(LLAMA_LIKE, micro_batch=1, tp=t, sequence_parallel=False, dtype="bf16"))
    assert ops["mlp_gate_up"].n == 2 * ffn // t
    assert ops["qkv"].n == (h + 2 * 4 * 64) // t


def test_gemm_bytes_scale_with_dtype():
    bf16 = _by_name(layer_ops(GPT, micro_batch=1, tp=1, sequence_parallel=False, dtype="bf16"))
    fp32 = _by_name(layer_ops(GPT, micro_batch=1, tp=1, sequence_parallel=False, dtype="fp32"))
    m, n, k = bf16["qkv"].m, bf16["qkv"].n, bf16["qkv"].k
    assert bf16["qkv"].bytes == 2 * (m * k + k * n + m * n)
    assert fp32["qkv"].bytes == 2 * bf16["qkv"].bytes


# ----------------------------------------------------------------------------------------- collectives


def test_megatron_two_all_reduces_forward_and_backward():
    b, s, h = 2, GPT.seq_len, GPT.hidden
    ops = layer_ops(GPT, micro_batch=b, tp=4, sequence_parallel=False, dtype="bf16")
    assert _comms(ops.forward) == ["all_reduce", "all_reduce", None]
    assert _comms(ops.backward_input) == ["all_reduce", "all_reduce", None]
    for seg in (*ops.forward, *ops.backward_input):
        assert seg.comm_bytes == (b * s * h * 2 if seg.comm else 0.0)


def test_sequence_parallel_turns_all_reduce_into_rs_and_ag():
    b, s, h = 1, GPT.seq_len, GPT.hidden
    ops = layer_ops(GPT, micro_batch=b, tp=4, sequence_parallel=True, dtype="bf16")
    assert _comms(ops.forward) == ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter", None]
    assert _comms(ops.backward_input) == [
        "all_gather",
        "reduce_scatter",
        "all_gather",
        "reduce_scatter",
        None,
    ]
    assert all(seg.comm_bytes == b * s * h * 2 for seg in ops.forward if seg.comm)
    # The all-gather segments hold only the sequence-sharded norm (no GEMMs).
    for seg in ops.forward:
        if seg.comm == "all_gather":
            assert all(op.kind == ELEMENTWISE for op in seg.ops)


def test_sequence_parallel_shrinks_norm_and_dropout_by_t():
    t = 4
    plain = _by_name(layer_ops(GPT, micro_batch=1, tp=t, sequence_parallel=False, dtype="bf16"))
    sp = _by_name(layer_ops(GPT, micro_batch=1, tp=t, sequence_parallel=True, dtype="bf16"))
    for name in (
        "norm1",
        "norm2",
        "attn_dropout_add",
        "mlp_dropout_add",
        "norm1.bwd",
        "attn_dropout_add.bwd",
    ):
        assert sp[name].bytes == pytest.approx(plain[name].bytes / t)
    assert sp["mlp_gelu"].bytes == plain["mlp_gelu"].bytes  # the MLP interior is full-sequence


def test_tp1_has_no_collectives():
    ops = layer_ops(GPT, micro_batch=1, tp=1, sequence_parallel=True, dtype="bf16")
    assert all(seg.comm is None and seg.comm_bytes == 0 for seg in (*ops.forward, *ops.backward_input))


def test_fp8_keeps_collectives_in_bf16():
    b, s, h = 1, GPT.seq_len, GPT.hidden
    ops = layer_ops(GPT, micro_batch=b, tp=2, sequence_parallel=False, dtype="fp8")
    assert ops.forward[0].comm_bytes == b * s * h * 2
    assert _by_name(ops)["qkv"].dtype == "fp8"


# --------------------------------------------------------------------------------------- embedding, head


def test_head_logits_flops_and_cross_entropy_all_reduces():
    b, s, h, v, t = 2, GPT.seq_len, GPT.hidden, GPT.vocab, 4
    ops = head_ops(GPT, micro_batch=b, tp=t, sequence_parallel=False, dtype="bf16")
    logits = _by_name(ops)["logits"]
    assert logits.flops * t == pytest.approx(2 * b * s * h * v)
    small = [seg.comm_bytes for seg in ops.forward if seg.comm == "all_reduce"]
    assert small == [b * s * 4, 2 * b * s * 4]  # the max; the target logit and the exp-sum, packed (fused loss)
    eager = head_ops(GPT, micro_batch=b, tp=t, sequence_parallel=False, dtype="bf16", fused_ce=False)
    assert [seg.comm_bytes for seg in eager.forward if seg.comm == "all_reduce"] == [b * s * 4] * 3
    assert _comms(ops.backward_input) == ["all_reduce", None]
    assert ops.backward_input[0].comm_bytes == b * s * h * 2
    assert ops.backward_weight[0].flops == pytest.approx(logits.flops)
    assert ops.backward_input_flops >= logits.flops  # dgrad GEMM plus the softmax gradient


def test_head_with_sp_gathers_before_logits_and_pads_vocab():
    t = 3
    d = TransformerDims(layers=1, hidden=96, heads=3, ffn_hidden=384, vocab=100, seq_len=12)
    ops = head_ops(d, micro_batch=1, tp=t, sequence_parallel=True, dtype="bf16")
    assert ops.forward[0].comm == "all_gather"
    assert _comms(ops.backward_input)[0] == "reduce_scatter"
    assert _by_name(ops)["logits"].n == 34  # ceil(100 / 3): vocabulary padded to a multiple of tp


def test_embedding_collectives():
    b, s, h = 1, GPT.seq_len, GPT.hidden
    plain = embedding_ops(GPT, micro_batch=b, tp=4, sequence_parallel=False, dtype="bf16")
    assert _comms(plain.forward) == ["all_reduce", None] and _comms(plain.backward_input) == [None]
    sp = embedding_ops(GPT, micro_batch=b, tp=4, sequence_parallel=True, dtype="bf16")
    assert _comms(sp.forward) == ["reduce_scatter", None] and _comms(sp.backward_input) == ["all_gather"]
    assert sp.forward[0].comm_bytes == b * s * h * 2
    assert (
        plain.forward_flops
        < 1e-3 * layer_ops(GPT, micro_batch=b, tp=4, sequence_parallel=False, dtype="bf16").forward_flops
    )


def test_embedding_gradient_is_dense_as_torch_builds_it():
    """torch's embedding backward zero-fills the whole (vocabulary shard × h) gradient, then per token
    reads the 16-bit gradient, writes and reads an fp32 partial sum, and writes the row: by hand for the
    vocabulary shard ceil(V/4) and the learned position table (s × h, all tokens without SP)."""
    b, s, h, t = 2, GPT.seq_len, GPT.hidden, 4
    ops = embedding_ops(GPT, micro_batch=b, tp=t, sequence_parallel=False, dtype="bf16")
    (wgrad,) = ops.backward_weight
    vocab_shard = -(-GPT.vocab // t)
    per_token = 2 + 4 + 4 + 2
    assert wgrad.bytes == vocab_shard * h * 2 + b * s * h * per_token + s * h * 2 + b * s * h * per_token


# ---------------------------------------------------------------------------------------- per iteration


GPT3_175B = TransformerDims(layers=96, hidden=12288, heads=96, ffn_hidden=49152, vocab=50257, seq_len=2048)


def test_model_flops_match_korthikanti_closed_form():
    B, L, s, h, V = 1536, 96, 2048, 12288, 50257
    expected = 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert model_flops_per_iteration(GPT3_175B, B) == pytest.approx(expected, rel=1e-12)


def test_model_flops_close_to_6_n_tokens():
    # Kaplan et al.: training FLOPs ≈ 6 · parameters · tokens (attention and embedding terms aside).
    B = 512
    approx = 6 * model_params(GPT3_175B) * B * GPT3_175B.seq_len
    assert model_flops_per_iteration(GPT3_175B, B) == pytest.approx(approx, rel=0.04)


def test_model_flops_equal_sum_of_layer_ops():
    B = 8
    per_layer = layer_ops(GPT, micro_batch=B, tp=1, sequence_parallel=False, dtype="bf16")
    head = head_ops(GPT, micro_batch=B, tp=1, sequence_parallel=False, dtype="bf16")

    def matmul(ops: LayerOps) -> float:
        parts = ("forward", "backward_input", "backward_weight")
        return sum(op.flops for p in parts for op in _ops(ops, p) if op.kind in (GEMM, ATTENTION))

    total = GPT.layers * matmul(per_layer) + matmul(head)
    assert model_flops_per_iteration(GPT, B) == pytest.approx(total, rel=1e-12)


def test_hardware_flops_with_recompute():
    B, L, s, h, V = 64, 96, 2048, 12288, 50257
    full = 96 * B * L * s * h * h * (1 + s / (6 * h) + V / (16 * h * L))
    assert hardware_flops_per_iteration(GPT3_175B, B, "full") == pytest.approx(full, rel=1e-12)
    model = model_flops_per_iteration(GPT3_175B, B)
    assert hardware_flops_per_iteration(GPT3_175B, B, "none") == model
    assert hardware_flops_per_iteration(GPT3_175B, B, "selective") == pytest.approx(
        model + 4 * B * s * s * h * L
    )


# ---------------------------------------------------------------------------------------------- errors


def test_invalid_dims_and_parallelism_raise_scenario_error():
    with pytest.raises(ScenarioError):
        TransformerDims(layers=1, hidden=100, heads=3, ffn_hidden=400, vocab=10, seq_len=8)
    with pytest.raises(ScenarioError):
        TransformerDims(layers=1, hidden=96, heads=4, ffn_hidden=384, vocab=10, seq_len=8, mlp="relu")
    with pytest.raises(ScenarioError):
        layer_ops(GPT, micro_batch=1, tp=3, sequence_parallel=False, dtype="bf16")
    with pytest.raises(ScenarioError):
        layer_ops(LLAMA_LIKE, micro_batch=1, tp=8, sequence_parallel=False, dtype="bf16")  # 4 kv heads
    with pytest.raises(ScenarioError):
        layer_ops(GPT, micro_batch=1, tp=2, sequence_parallel=False, dtype="int4")
    with pytest.raises(ScenarioError):
        hardware_flops_per_iteration(GPT, 1, "sometimes")


def test_squared_relu_mlp_is_two_gemms_and_one_compiled_kernel_each_way():
    """Nemotron's relu(x)²: the same two GEMMs as GeLU's MLP and, compiled by jit_fuser, one activation
    kernel each way: b·s·ffn/t elements in and out forward (2 tensors × 2 bytes), dy and x in, dx out
    backward (3 × 2)."""
    t, b = 2, 2
    sq = _by_name(layer_ops(replace(GPT, mlp="squared_relu", bias=False), micro_batch=b, tp=t,
                            sequence_parallel=True, dtype="bf16"))
    ge = _by_name(layer_ops(replace(GPT, bias=False), micro_batch=b, tp=t, sequence_parallel=True, dtype="bf16"))
    elems = b * GPT.seq_len * GPT.ffn_hidden // t
    assert sq["mlp_squared_relu"].bytes == 2 * elems * 2 and sq["mlp_squared_relu.bwd"].bytes == 3 * elems * 2
    for name in ("mlp_up", "mlp_down", "mlp_up.dgrad", "mlp_down.dgrad"):
        assert (sq[name].m, sq[name].n, sq[name].k) == (ge[name].m, ge[name].n, ge[name].k)


def test_fp8_leaves_the_output_layer_in_bf16():
    """Megatron-Core's output layer is a plain ColumnParallelLinear, outside Transformer Engine's
    fp8_autocast: under precision fp8 its logits GEMM and their gradients run in bf16 (the storage
    dtype) with the same shapes, while the layers' GEMMs run in fp8."""
    from sim.workload.transformer import head_ops

    kw = dict(micro_batch=2, tp=2, sequence_parallel=True)
    h8 = _by_name(head_ops(GPT, **kw, dtype="fp8"))
    h16 = _by_name(head_ops(GPT, **kw, dtype="bf16"))
    for name in ("logits", "logits.dgrad", "logits.wgrad"):
        assert h8[name].dtype == "bf16" and (h8[name].m, h8[name].n, h8[name].k) == (
            h16[name].m, h16[name].n, h16[name].k)
    layer = _by_name(layer_ops(GPT, **kw, dtype="fp8"))
    assert layer["qkv"].dtype == "fp8" and layer["mlp_down.dgrad"].dtype == "fp8"


def test_rotary_positions_run_one_fused_rope_kernel_each_way():
    """position rope: a fused kernel rotates Q and K in place after the QKV GEMM, reading and writing
    b·s·(h + kv_dim)/t elements (2 bytes each, in and out), and its backward before QKV's input
    gradient; learned positions run none."""
    t, b = 2, 2
    llama = replace(GPT, kv_heads=4, mlp="swiglu", bias=False, norm="rmsnorm", position="rope")
    lo = layer_ops(llama, micro_batch=b, tp=t, sequence_parallel=True, dtype="bf16")
    ops = _by_name(lo)
    n = b * GPT.seq_len * (GPT.hidden + llama.kv_dim) // t
    assert ops["rope"].bytes == 2 * n * 2 and ops["rope.bwd"].bytes == 2 * n * 2
    fwd = [op.name for s in lo.forward for op in s.ops]
    bwd = [op.name for s in lo.backward_input for op in s.ops]
    assert fwd[fwd.index("qkv") + 1] == "rope" and bwd[bwd.index("qkv.dgrad") - 1] == "rope.bwd"
    assert "rope" not in _by_name(layer_ops(GPT, micro_batch=b, tp=t, sequence_parallel=True, dtype="bf16"))


def test_qkv_layout_copies_around_te_attention():
    """Megatron-Core + Transformer Engine around the fused attention, per GPU (tp 2, 4096 tokens, bf16):
    GQA copies Q in its reshape (read + write), RoPE leaves V a strided view that TE copies, and backward
    concatenates dQ, dK, dV; MHA without RoPE (GPT-3) hands TE interleaved views and copies nothing."""
    from sim.workload.transformer import qkv_layout_copies

    tokens, t, e = 4096, 2, 2
    llama = TransformerDims(layers=1, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
                            seq_len=4096, position="rope")
    q, kv = tokens * 4096 // t, tokens * 1024 // t
    fwd, bwd = qkv_layout_copies(llama, tokens, t, "bf16")
    assert [op.bytes for op in fwd] == [2 * q * e, 2 * kv * e]
    assert [op.bytes for op in bwd] == [2 * (q + 2 * kv) * e]
    mha_rope = TransformerDims(layers=1, hidden=4096, heads=32, ffn_hidden=11008, vocab=32000, seq_len=4096,
                               position="rope")
    fwd, bwd = qkv_layout_copies(mha_rope, tokens, t, "bf16")
    assert [op.name for op in fwd] == ["value contiguous copy"] and bwd[0].bytes == 2 * 3 * q * e
    assert qkv_layout_copies(GPT, tokens, t, "bf16") == ((), ())
    # in the layer: only where the kernel set runs TE's attention
    kw = dict(micro_batch=1, tp=t, sequence_parallel=False, dtype="bf16")
    names = [op.name for s in layer_ops(llama, **kw, qkv_copies="megatron-te").forward for op in s.ops]
    assert names.index("rope") < names.index("value contiguous copy") < names.index("attention")
    assert "value contiguous copy" not in [op.name for s in layer_ops(llama, **kw).forward for op in s.ops]


def test_split_qkv_gradients_are_concatenated_in_the_backward():
    """Megatron-LM 2021-22 and llm-foundry split the QKV output into views; the attention hands back dQ,
    dK, dV apart and the split's backward concatenates them: 2 × 3 × tokens × h/t × 2 bytes for MHA."""
    from sim.workload.kernels import KERNEL_SETS
    from sim.workload.transformer import qkv_layout_copies

    tokens, t = 2048, 8
    fwd, bwd = qkv_layout_copies(GPT, tokens, t, "bf16", "split-cat")
    assert fwd == () and [op.bytes for op in bwd] == [2 * 3 * tokens * GPT.hidden // t * 2]
    assert qkv_layout_copies(GPT, tokens, t, "bf16", "none") == ((), ())
    assert {k: ks.qkv_copies for k, ks in KERNEL_SETS.items()} == {
        "megatron-lm-2021": "split-cat", "megatron-lm-2022": "split-cat", "megatron-deepspeed-2022": "split-cat",
        "transformer-engine": "megatron-te", "pytorch-fsdp-2023": "split-cat"}
    kw = dict(micro_batch=1, tp=t, sequence_parallel=False, dtype="bf16")
    standard = layer_ops(GPT, **kw, attention="standard", qkv_copies="megatron-te")
    assert "qkv grad cat" in [op.name for s in standard.backward_input for op in s.ops]
