"""The attention core of a transformer layer on one GPU's heads: FlashAttention-style (one fused kernel) or
standard (Megatron-LM before flash attention: batched GEMMs and softmax/dropout kernels over the s² scores).

What selective recomputation re-runs is exactly these ops (``is_attention_core``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from sim.units import DTYPE_BYTES
from sim.workload.ops import (
    ATTENTION,
    DROPOUT,
    SOFTMAX,
    SOFTMAX_BWD,
    SOFTMAX_TORCH,
    SOFTMAX_TORCH_BWD,
    Op,
    elementwise,
    gemm,
)

if TYPE_CHECKING:  # transformer.py imports this module
    from sim.workload.transformer import TransformerDims

_FP32_BYTES = 4
_MASK_BYTES = 1  # dropout mask, one byte per element


def flash_attention_op(name: str, d: TransformerDims, b: int, tp: int, dtype: str, backward: bool,
                       kernel: str = "") -> Op:
    """Fused (flash) attention core on this GPU's heads: 4bs²h/t model FLOPs forward, twice that backward;
    causal (decoder-only), so the kernel skips the masked half (the cost model prices that). ``kernel``: the
    FlashAttention generation ("" = the GPU reference profile's own, "v1" = FlashAttention of 2022)."""
    s, heads_t = d.seq_len, d.heads // tp
    e = DTYPE_BYTES[dtype]
    tokens = b * s
    q_o = tokens * (d.hidden // tp)  # Q or O elements
    kv = 2 * tokens * (d.kv_dim // tp)  # K and V elements
    lse = tokens * heads_t * _FP32_BYTES
    fwd_flops = 4.0 * b * s * s * d.head_dim * heads_t
    if backward:  # read Q, K, V, O, dO, LSE; write dQ, dK, dV
        moved, flops = (2 * (q_o + kv) + 2 * q_o) * e + lse, 2.0 * fwd_flops
    else:  # read Q, K, V; write O, LSE
        moved, flops = (2 * q_o + kv) * e + lse, fwd_flops
    # m, n, k describe one head's score matrix (queries × keys × head_dim), batch the (b × heads) count.
    return Op(
        name=name,
        kind=ATTENTION,
        flops=flops,
        bytes=float(moved),
        dtype=dtype,
        m=s,
        n=s,
        k=d.head_dim,
        batch=b * heads_t,
        backward=backward,
        causal=True,
        kernel=kernel,
    )


def standard_attention(d: TransformerDims, b: int, tp: int, dtype: str, dropout_kernel: bool,
                       fused_softmax: bool = True, softmax_in_fp32: bool = True
                       ) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """Unfused attention as Megatron-LM ran it before flash attention: (forward ops, backward ops).

    Forward: scores = QKᵀ (``torch.baddbmm``, one GEMM per head), the fused scale-mask-softmax kernel over
    the b·heads·s² scores, dropout on the probabilities (its own kernel when ``dropout_kernel``), then
    context = probs·V (``torch.bmm``). Backward: dprobs = dctx·Vᵀ and dV = probsᵀ·dctx, dropout and softmax
    backward over s², then dQ = dS·K and dK = dSᵀ·Q. Causal masking does not shrink any of it: the GEMMs
    compute the full s² and the softmax reads and writes it all. FLOPs equal the flash op's (4bs²h/t,
    twice that backward).

    With ALiBi (``d.position == "alibi"``) the scores GEMM adds the bias: BLOOM's Megatron-DeepSpeed
    passes the (b·heads, 1, s) ALiBi tensor as ``torch.baddbmm``'s input with β = 1
    (bigscience-workshop/Megatron-DeepSpeed, megatron/model/transformer.py, ParallelAttention), and
    baddbmm on CUDA first copies that broadcast input into the whole b·heads·s² output
    (aten/src/ATen/native/cuda/Blas.cpp, ``baddbmm_out_cuda_impl``: ``result.copy_(self)`` when β ≠ 0),
    which cuBLAS then reads back as C: the scores are written once more and read once.

    Without the fused kernel (``fused_softmax`` False: the fusion off, or scores outside the kernel's
    limits, ``sim.workload.kernels.fused_softmax_runs``) Megatron's ``forward_torch_softmax`` runs instead
    (megatron/model/fused_softmax.py): with ``softmax_in_fp32`` the 16-bit scores are cast to fp32, scaled
    (``input * scale``: the layer-number coefficient of query-key layer scaling), masked in place
    (``masked_fill_``), softmaxed by torch and cast back — five kernels over the s² scores instead of one,
    and autograd runs the five backwards. Per score element with 16-bit scores: forward 6 + 8 + 8 + 8 + 6 =
    36 bytes, backward 6 + 12 + 8 + 8 + 6 = 40, against the fused kernel's 4 and 6.
    """
    s, heads_t, hd = d.seq_len, d.heads // tp, d.head_dim
    e = DTYPE_BYTES[dtype]
    batch = b * heads_t
    scores = float(batch * s * s)  # elements of the score matrices on this GPU
    qk = gemm("attention.scores", s, s, hd, dtype, batch)
    fwd: list[Op] = []
    if d.position == "alibi":
        fwd.append(elementwise("attention.alibi_bias", e * scores, dtype))
        qk = dataclasses.replace(qk, bytes=qk.bytes + e * scores)
    if fused_softmax:
        softmax: tuple[Op, ...] = (
            elementwise("attention.softmax", 2 * e * scores, dtype, flops=5.0 * scores, family=SOFTMAX),)
        softmax_b: tuple[Op, ...] = (elementwise("attention.softmax.bwd", 3 * e * scores, dtype, flops=4.0 * scores,
                                                 family=SOFTMAX_BWD),)
    else:
        softmax, softmax_b = _torch_softmax(scores, dtype, softmax_in_fp32)
    fwd += [qk, *softmax]
    bwd: list[Op] = [
        gemm("attention.dprobs", s, s, hd, dtype, batch),
        gemm("attention.dv", s, hd, s, dtype, batch),
    ]
    if dropout_kernel:
        fwd.append(elementwise("attention.dropout", (2 * e + _MASK_BYTES) * scores, dtype, flops=2.0 * scores,
                               family=DROPOUT))
        bwd.append(elementwise("attention.dropout.bwd", (2 * e + _MASK_BYTES) * scores, dtype, flops=scores))
    fwd.append(gemm("attention.context", s, hd, s, dtype, batch))
    bwd += [
        *softmax_b,
        gemm("attention.dq", s, hd, s, dtype, batch),
        gemm("attention.dk", s, hd, s, dtype, batch),
    ]
    return tuple(fwd), tuple(bwd)


def _torch_softmax(scores: float, dtype: str, in_fp32: bool) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """Megatron's torch fallback of the scale-mask-softmax over ``scores`` elements: (forward ops, backward
    ops in autograd's order). ``in_fp32`` casts 16-bit scores to fp32 around it (``softmax_in_fp32``);
    the causal mask is a shared s×s tensor that stays in cache and is not counted."""
    e = DTYPE_BYTES[dtype]
    f = _FP32_BYTES if in_fp32 else e  # bytes per element inside the fallback
    cast = f != e
    fwd: list[Op] = []
    bwd: list[Op] = []
    if cast:
        fwd.append(elementwise("attention.scores.float", (e + f) * scores, dtype))
    fwd += [
        elementwise("attention.scale", 2 * f * scores, dtype, flops=scores),
        elementwise("attention.mask_fill", 2 * f * scores, dtype),
        elementwise("attention.softmax", 2 * f * scores, dtype, flops=5.0 * scores, family=SOFTMAX_TORCH),
    ]
    if cast:
        fwd.append(elementwise("attention.probs.to_16bit", (f + e) * scores, dtype))
        bwd.append(elementwise("attention.probs.to_16bit.bwd", (e + f) * scores, dtype))
    bwd += [
        elementwise("attention.softmax.bwd", 3 * f * scores, dtype, flops=4.0 * scores, family=SOFTMAX_TORCH_BWD),
        elementwise("attention.mask_fill.bwd", 2 * f * scores, dtype),
        elementwise("attention.scale.bwd", 2 * f * scores, dtype, flops=scores),
    ]
    if cast:
        bwd.append(elementwise("attention.scores.float.bwd", (f + e) * scores, dtype))
    return tuple(fwd), tuple(bwd)


def is_attention_core(op: Op) -> bool:
    """The ops of the attention core (what selective recomputation re-runs), flash or standard."""
    return op.name == "attention" or op.name.startswith("attention.")
