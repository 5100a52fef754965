# Over 500 lines on purpose: a layer's forward and backward ops, with their fusion notes, read best side by side.
"""Decoder-only transformer as per-GPU ops, laid out the way Megatron-LM runs it.

One layer for one micro-batch becomes segments: ops on the compute stream, then (optionally) one
tensor-parallel collective the next segment waits for. Backward is split into the input-gradient part
(B, with its collectives) and the weight-gradient GEMMs (W), so zero-bubble schedules can move W.

Fusion choices (each Op is priced as one kernel):
- attention core: FlashAttention-style single ATTENTION op (QK^T, scale, causal mask, softmax, attention
  dropout, AV). FLOPs 4bs²h/t, causal masking NOT halved (matches reference.md 24bsh² + 4bs²h);
  backward counted as 2x forward. Bytes are Q, K, V in and O out (plus fp32 log-sum-exp), not s².
- QKV is one GEMM; SwiGLU gate and up are one GEMM of width 2·ffn/t (Megatron ``linear_fc1``).
- GEMM biases are folded into the following elementwise op: bias+GeLU, bias+dropout+residual-add
  (Megatron ``bias_dropout_add_fused``); SwiGLU is one op reading gate and up.
- Norm backward includes the residual-gradient add. Norm weight gradients come out of that kernel.
- fp8: GEMMs run in fp8; attention, elementwise ops and TP collectives stay in bf16 (Transformer Engine).
  Each fp8 GEMM's 16-bit input (the activation forward, the output gradient backward) first goes through
  Transformer Engine's fused cast_transpose kernel (transformer_engine/common/transpose/cast_transpose.cu):
  read 2 bytes, write the fp8 copy and its transpose (1 + 1), amax fused; weight-gradient GEMMs reuse the
  transposed copies. The weights are cast the same way (``fp8_weight_cast``): once per step where the caller
  tells Transformer Engine which micro-batch is the first (``KernelSet.fp8_weight_cache``), else in every
  forward.

Sequence parallelism (Korthikanti et al. 2022): the norm and dropout regions work on s/t tokens; each
Megatron all-reduce becomes a reduce-scatter, and each identity-forward/all-reduce-backward ``f`` becomes an
all-gather forward / reduce-scatter backward. The code bases that overlap their backward collectives
(``tp_backward_overlap``: Megatron-LM from 2022, Transformer Engine) keep the norm output sharded and
re-gather it during the input-gradient GEMM for the weight-gradient GEMM: with them, SP moves two more
all-gathers per layer than plain TP, each beside a GEMM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sim.errors import ScenarioError
from sim.units import DTYPE_BYTES, storage_dtype
from sim.workload.attention import (  # is_attention_core: re-exported for build and the plan screen
    flash_attention_op,
    is_attention_core,  # noqa: F401
    standard_attention,
)
from sim.workload.kernels import CE_KERNELS
from sim.workload.ops import (
    DROPOUT,
    GEMM,
    NORM,
    NORM_BWD,
    PERSISTENT_NORM,
    PERSISTENT_NORM_BWD,
    Op,
    elementwise,
    gemm,
)

MLP_KINDS = ("gelu", "swiglu", "squared_relu")
NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_KINDS = ("learned", "rope", "alibi")
CHECKPOINTING_KINDS = ("none", "selective", "full")

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"

_FP32_BYTES = 4
_TOKEN_ID_BYTES = 8  # int64 token ids / labels
_MASK_BYTES = 1  # dropout mask, one byte per element
# Rough arithmetic per element for memory-bound ops (the cost model prices them by bytes).
_NORM_FWD_FLOPS_PER_ELEM = 8.0
_NORM_BWD_FLOPS_PER_ELEM = 16.0
_ACT_FWD_FLOPS_PER_ELEM = 8.0
_ACT_BWD_FLOPS_PER_ELEM = 16.0


@dataclass(frozen=True)
class TransformerDims:
    """Shape of a decoder-only transformer.

    kv_heads: None means multi-head attention (kv_heads = heads); fewer gives GQA/MQA.
    mlp: "gelu" or "squared_relu" (two h×ffn matrices) or "swiglu" (three). bias/norm/position/tied_embeddings describe
    the parameter layout (GPT-3: biases, LayerNorm, learned positions, tied; Llama: none, RMSNorm, RoPE, untied).
    """

    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    kv_heads: int | None = None
    mlp: str = "gelu"
    bias: bool = True
    norm: str = "layernorm"
    position: str = "learned"
    tied_embeddings: bool = True
    dropout: float = 0.1  # hidden and attention dropout probability (Megatron's default 0.1; Llama: 0)

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ScenarioError(f"must be a positive integer, got {value!r}", field=f"model.{name}")
        if self.hidden % self.heads:
            raise ScenarioError(
                f"hidden {self.hidden} is not divisible by heads {self.heads}; pick heads dividing hidden",
                field="model.heads",
            )
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            raise ScenarioError(
                f"kv_heads {self.kv_heads} must be >= 1 and divide heads {self.heads}", field="model.kv_heads"
            )
        for name, allowed in (("mlp", MLP_KINDS), ("norm", NORM_KINDS), ("position", POSITION_KINDS)):
            if getattr(self, name) not in allowed:
                raise ScenarioError(
                    f"{getattr(self, name)!r} is not one of {', '.join(allowed)}", field=f"model.{name}"
                )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def n_kv_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def kv_dim(self) -> int:
        """Width of the K (or V) projection output."""
        return self.n_kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2


@dataclass(frozen=True)
class Segment:
    """Ops run in order on the compute stream, then an optional TP collective the next segment waits for.

    comm_bytes is the full unsharded collective size N (for AG/RS: the gathered size). ``overlap``: the
    collective is issued when the ops start and runs beside them (Megatron's asynchronous backward
    collectives); the segment ends when both have.
    """

    ops: tuple[Op, ...]
    comm: str | None = None
    comm_bytes: float = 0.0
    overlap: bool = False
    ctas: int | None = None  # SMs an overlapped collective's kernel holds; None: NCCL's (sim.hardware.nccl)


@dataclass(frozen=True)
class LayerOps:
    """Forward, input-gradient backward (B) and weight-gradient backward (W) of one unit of work."""

    forward: tuple[Segment, ...]
    backward_input: tuple[Segment, ...]
    backward_weight: tuple[Op, ...]

    @property
    def forward_flops(self) -> float:
        return sum(op.flops for seg in self.forward for op in seg.ops)

    @property
    def backward_input_flops(self) -> float:
        return sum(op.flops for seg in self.backward_input for op in seg.ops)

    @property
    def backward_weight_flops(self) -> float:
        return sum(op.flops for op in self.backward_weight)


# ---------------------------------------------------------------------------------------------- parameters


def _norm_params(d: TransformerDims) -> int:
    return 2 * d.hidden if d.norm == "layernorm" else d.hidden


def _matmul_weights_per_layer(d: TransformerDims) -> int:
    """Weights that take part in the layer's GEMMs (what drives 2·tokens·weights FLOPs)."""
    h = d.hidden
    return h * (h + 2 * d.kv_dim) + h * h + d.mlp_matrices * h * d.ffn_hidden


def layer_params(d: TransformerDims) -> int:
    """Weights + biases + norms of one layer, unsharded (GPT-style MHA, ffn 4h: 12h² + 13h)."""
    h = d.hidden
    params = _matmul_weights_per_layer(d) + 2 * _norm_params(d)
    if d.bias:
        up_width = 2 * d.ffn_hidden if d.mlp == "swiglu" else d.ffn_hidden
        params += (h + 2 * d.kv_dim) + h + up_width + h
    return params


def embedding_params(d: TransformerDims) -> int:
    """Token embedding (V×h) plus learned position embedding (s×h) if any."""
    params = d.vocab * d.hidden
    if d.position == "learned":
        params += d.seq_len * d.hidden
    return params


def head_params(d: TransformerDims, embedding_params_here: float, virtual_stages_total: int) -> float:
    """Parameters the output projection adds on the last (virtual) stage, given the embedding's share of this
    GPU: none when tied and on the same stage as the embedding; with pipelining the last stage keeps its own
    copy of a tied embedding (Megatron all-reduces the two copies' gradients)."""
    return embedding_params_here if (not d.tied_embeddings or virtual_stages_total > 1) else 0.0


def model_params(d: TransformerDims, tied_embeddings: bool | None = None) -> int:
    """Whole model: layers, embeddings, final norm and (untied) output projection.

    tied_embeddings None uses ``d.tied_embeddings``.
    """
    tied = d.tied_embeddings if tied_embeddings is None else tied_embeddings
    params = d.layers * layer_params(d) + embedding_params(d) + _norm_params(d)
    if not tied:
        params += d.vocab * d.hidden
    return params


# ---------------------------------------------------------------------------------------------- helpers


def _check_parallel(
    d: TransformerDims, micro_batch: int, tp: int, sequence_parallel: bool, dtype: str
) -> None:
    if micro_batch < 1:
        raise ScenarioError(f"must be >= 1, got {micro_batch}", field="training.micro_batch")
    if tp < 1:
        raise ScenarioError(f"must be >= 1, got {tp}", field="parallel.tensor")
    if dtype not in DTYPE_BYTES:
        raise ScenarioError(f"{dtype!r} is not one of {', '.join(DTYPE_BYTES)}", field="training.precision")
    for name, value in (("heads", d.heads), ("kv_heads", d.n_kv_heads), ("ffn_hidden", d.ffn_hidden)):
        if value % tp:
            raise ScenarioError(
                f"model.{name} {value} is not divisible by tp {tp}; choose tp dividing it",
                field="parallel.tensor",
            )
    if sequence_parallel and tp > 1 and (d.seq_len * micro_batch) % tp:
        raise ScenarioError(
            f"sequence parallelism splits {micro_batch}x{d.seq_len} tokens over tp {tp}, which does not divide",
            field="parallel.sequence_parallel",
        )


def _collectives(tp: int, sp: bool) -> tuple[str | None, str | None]:
    """(after a row-parallel block, before a column-parallel block) in the forward pass.

    Megatron ``g`` (all-reduce) after row-parallel and ``f`` (identity) before column-parallel; with SP
    they become reduce-scatter and all-gather. None where no collective is needed.
    """
    if tp == 1:
        return None, None
    return (REDUCE_SCATTER, ALL_GATHER) if sp else (ALL_REDUCE, None)


def _conjugate(comm: str | None, tp: int) -> str | None:
    """Backward collective of a forward one: AR<->identity (f/g), AG<->RS."""
    if tp == 1:
        return None
    return {ALL_REDUCE: None, None: ALL_REDUCE, ALL_GATHER: REDUCE_SCATTER, REDUCE_SCATTER: ALL_GATHER}[comm]


def _seg(ops: tuple[Op, ...], comm: str | None, comm_bytes: float) -> Segment:
    return Segment(ops=ops, comm=comm, comm_bytes=comm_bytes if comm else 0.0)


def _norm_fwd(name: str, tokens: int, h: int, dtype: str, persistent: bool = False) -> Op:
    e = DTYPE_BYTES[dtype]
    moved = 2 * tokens * h * e + 2 * tokens * _FP32_BYTES  # x in, y out, fp32 mean/rstd saved
    return elementwise(name, moved, dtype, flops=_NORM_FWD_FLOPS_PER_ELEM * tokens * h,
                       family=PERSISTENT_NORM if persistent else NORM)


def _norm_bwd(name: str, tokens: int, h: int, dtype: str, residual: bool = True, persistent: bool = False) -> Op:
    e = DTYPE_BYTES[dtype]
    tensors = 4 if residual else 3  # x, dy in, dx out (+ residual gradient added in)
    moved = tensors * tokens * h * e + 2 * tokens * _FP32_BYTES
    return elementwise(name, moved, dtype, flops=_NORM_BWD_FLOPS_PER_ELEM * tokens * h,
                       family=PERSISTENT_NORM_BWD if persistent else NORM_BWD)


def _dropout_add_fwd(name: str, tokens: int, h: int, dtype: str, dropout: bool = True, bias: bool = True,
                     fused: bool = True) -> tuple[Op, ...]:
    """bias + dropout + residual add: branch and residual in, sum and mask out. Without dropout (p = 0
    PyTorch's dropout returns its input and launches nothing) only the adds remain: a streaming kernel.
    Unfused (``fused`` False: Megatron's eager ``bias_dropout_add``) each step is its own kernel: the bias
    add (branch in and out), the dropout (in, out and mask) and the residual add (two in, one out)."""
    e = DTYPE_BYTES[dtype]
    n = tokens * h
    if fused:
        if not dropout:
            return (elementwise(name, n * 3 * e, dtype, flops=2.0 * n),)
        return (elementwise(name, n * (3 * e + _MASK_BYTES), dtype, flops=3.0 * n, family=DROPOUT),)
    ops = [elementwise(f"{name}.bias", 2 * n * e, dtype, flops=float(n))] if bias else []
    if dropout:
        ops.append(elementwise(f"{name}.dropout", n * (2 * e + _MASK_BYTES), dtype, flops=2.0 * n, family=DROPOUT))
    ops.append(elementwise(f"{name}.residual", 3 * n * e, dtype, flops=float(n)))
    return tuple(ops)


def _dropout_add_bwd(name: str, tokens: int, h: int, dtype: str, dropout: bool = True, bias: bool = True) -> Op:
    """Gradient and mask in, branch gradient out (the residual path passes the gradient through): a
    streaming kernel, since only the forward draws random numbers (torch's native_dropout_backward
    multiplies by the stored mask). Without dropout the branch gradient is the incoming one: nothing runs
    but the bias gradient's reduction (reading the gradient once), and with no bias nothing at all (an op
    that moves no bytes)."""
    e = DTYPE_BYTES[dtype]
    if not dropout:
        return elementwise(name, tokens * h * e if bias else 0.0, dtype, flops=float(tokens * h) if bias else 0.0)
    return elementwise(name, tokens * h * (2 * e + _MASK_BYTES), dtype, flops=1.0 * tokens * h)


# Tensors of ``width`` elements per token an activation's kernels read and write, forward and backward.
# swiglu: gate and up in, out (backward: dy, gate, up in; dgate, dup out); gelu: in, out (dy, x in; dx out).
# squared_relu (Nemotron): ``torch.pow(F.relu(x), 2)`` under ``jit_fuser`` (torch.compile, else TorchScript:
# NeMo's nemo/collections/nlp/modules/common/megatron/utils.py and Megatron-LM's
# megatron/training/activations.py, 2024), so one fused kernel each way moving what GeLU's does.
_ACT_FWD_TENSORS = {"gelu": 2, "swiglu": 3, "squared_relu": 2}
_ACT_BWD_TENSORS = {"gelu": 3, "swiglu": 5, "squared_relu": 3}


def _activation_fwd(kind: str, tokens: int, width: int, dtype: str) -> Op:
    e = DTYPE_BYTES[dtype]
    tensors = _ACT_FWD_TENSORS[kind]
    return elementwise(
        f"mlp_{kind}", tensors * tokens * width * e, dtype, flops=_ACT_FWD_FLOPS_PER_ELEM * tokens * width
    )


def _activation_bwd(kind: str, tokens: int, width: int, dtype: str) -> Op:
    e = DTYPE_BYTES[dtype]
    tensors = _ACT_BWD_TENSORS[kind]
    return elementwise(
        f"mlp_{kind}.bwd", tensors * tokens * width * e, dtype, flops=_ACT_BWD_FLOPS_PER_ELEM * tokens * width
    )


def _dgrad(op: Op) -> Op:
    """Input gradient of Y[m,n] = X[m,k] W[k,n]: dX[m,k] = dY[m,n] W^T[n,k], as many times as the
    forward ran (``batch``: a GPU's local experts, each with its own weights)."""
    return gemm(f"{op.name}.dgrad", op.m, op.k, op.n, op.dtype, batch=op.batch)


def _wgrad(op: Op) -> Op:
    """Weight gradient of Y[m,n] = X[m,k] W[k,n]: dW[k,n] = X^T[k,m] dY[m,n], once per forward GEMM."""
    return gemm(f"{op.name}.wgrad", op.k, op.n, op.m, op.dtype, batch=op.batch)


# ---------------------------------------------------------------------------------------------- ops


def rope_ops(d: TransformerDims, tokens: int, tp: int, act: str) -> tuple[Op, Op] | None:
    """Rotary positions (``model.position: rope``): one fused kernel rotates this GPU's Q and K in place
    after the QKV GEMM, reading and writing them (Transformer Engine's / Apex's fused RoPE, Megatron-Core's
    apply_rope_fusion), and one more in the backward before the QKV input gradient; None otherwise."""
    if d.position != "rope":
        return None
    rotated = tokens * (d.hidden + d.kv_dim) // tp
    nbytes = 2 * rotated * DTYPE_BYTES[act]
    return (elementwise("rope", nbytes, act, flops=3.0 * rotated),
            elementwise("rope.bwd", nbytes, act, flops=3.0 * rotated))


QKV_COPIES = ("none", "megatron-te", "split-cat")  # KernelSet.qkv_copies


def qkv_layout_copies(d: TransformerDims, tokens: int, tp: int, act: str,
                      style: str = "megatron-te") -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """The copies the attention's Q, K and V handling makes around the attention kernels (forward,
    backward); ``style`` is the code base's (``KernelSet.qkv_copies``).

    "split-cat" (a model that splits the QKV GEMM output into Q, K and V views: Megatron-LM's
    ``split_tensor_along_last_dim`` of 2021-22, also under Megatron-DeepSpeed, llm-foundry's MPT
    ``qkv.chunk(3, dim=2)``): nothing forward; backward the attention returns dQ, dK and dV as separate
    tensors and the split's backward ``torch.cat``s them into the QKV output's gradient (read and write
    once). Megatron-Core without Transformer Engine's attention does the same.

    "megatron-te": Megatron-Core's SelfAttention and Transformer Engine's DotProductAttention, from this
    GPU's share of the QKV GEMM's interleaved output
    [s, b, groups, (heads/groups + 2) · head_dim] (megatron/core/transformer/attention.py, core_r0.8.0
    through core_v0.15.0):

    - with GQA, ``query.reshape(..., -1, head_dim)`` of the query slice cannot be a view: a copy of Q;
    - with RoPE, the fused rotary kernel returns new Q and K while V stays a strided view of the QKV
      output, a layout Transformer Engine's ``get_qkv_layout`` does not take (TE 1.8 to 2.x: "not_supported"
      → ``x.contiguous()`` for q, k and v), so V is copied;
    - backward, ``SplitAlongDim`` (TE) returns the QKV gradient as a view only when dQ, dK and dV are
      adjacent views of one buffer, as the fused attention writes them for the interleaved layouts; after
      RoPE or the GQA reshape they are separate tensors and it ``torch.cat``s them (Megatron-Core's own
      ``fused_single_qkv_rope``, off by default, exists to "avoid concatenating ROPE dgrads").

    Each copy reads and writes its tensor once. Multi-head attention without RoPE (GPT-3) hands TE the
    three interleaved views ("sbh3d") and copies nothing."""
    if style not in QKV_COPIES:
        raise ValueError(f"unknown qkv copies style {style!r}")
    if style == "none":
        return (), ()
    e = DTYPE_BYTES[act]
    q, kv = tokens * d.hidden // tp, tokens * d.kv_dim // tp
    cat = (elementwise("qkv grad cat", 2 * (q + 2 * kv) * e, act),)
    if style == "split-cat":
        return (), cat
    gqa, rope = d.kv_dim < d.hidden, d.position == "rope"
    fwd: list[Op] = []
    if gqa:
        fwd.append(elementwise("query reshape copy", 2 * q * e, act))
    if rope:
        fwd.append(elementwise("value contiguous copy", 2 * kv * e, act))
    return tuple(fwd), cat if gqa or rope else ()


def layer_ops(
    d: TransformerDims, *, micro_batch: int, tp: int, sequence_parallel: bool, dtype: str,
    attention: str = "flash", attention_dropout_kernel: bool = False, tp_backward_overlap: bool = False,
    flash_kernel: str = "", persistent_norm: bool = False, fp8_recipe: str = "delayed",
    bias_gelu_fusion: bool = True, bias_dropout_fusion: bool = True, fused_softmax: bool = True,
    softmax_in_fp32: bool = True, tp_comm_overlap: bool = False, qkv_copies: str = "none",
) -> LayerOps:
    """Per-GPU ops of one transformer layer for one micro-batch under Megatron TP (and optional SP).

    ``attention``: "flash" (one fused kernel, of generation ``flash_kernel``: see ``Op.kernel``) or
    "standard" (batched GEMMs, softmax and, with
    ``attention_dropout_kernel``, a dropout kernel over the scores: see ``sim.workload.attention.standard_attention``).

    Forward (no SP): [norm1, QKV, attention, out-proj] → AR; [dropout-add1, norm2, MLP up, act, MLP down] → AR;
    [dropout-add2]. With SP: [norm1] → AG; [QKV, attention, out-proj] → RS; [dropout-add1, norm2] → AG;
    [MLP up, act, MLP down] → RS; [dropout-add2]. tp = 1 keeps the segments with no collectives.

    ``tp_backward_overlap`` (Megatron-LM from 2022, Transformer Engine; tp > 1): each column-parallel
    linear (QKV, MLP up) computes its weight gradient inside its own backward, while the all-reduce of
    its input gradient (with SP: the reduce-scatter) runs beside it; with SP it also re-gathers its
    sequence-parallel input (the norm output, kept 1/t) during its input-gradient GEMM. Megatron-LM's
    ``ColumnParallelLinearWithAsyncAllreduce`` / ``ColumnParallelLinearWithSequenceParallelism``
    (megatron/mpu/layers.py, 2022), later ``LinearWithGradAccumulationAndAsyncCommunication``; Transformer
    Engine's ``Linear`` backward does the same. The weight-gradient GEMMs then sit in the backward, in the
    order autograd runs them (each row-parallel linear's right after its input gradient), and
    ``backward_weight`` is empty: for schedules that run W on its own (zero-bubble), build without it.

    ``persistent_norm``: the norms run a persistent kernel (the row in registers: apex contrib's
    FastLayerNorm, Transformer Engine's), which reaches more bandwidth than a framework's (``Op.family``).
    ``d.dropout`` = 0 drops the dropout kernels (PyTorch launches nothing for p = 0). ``fp8_recipe``: the
    scaling of fp8 GEMM inputs (see ``_with_fp8_casts``).

    ``tp_comm_overlap`` (with SP, tp > 1): Transformer Engine's userbuffers overlap (``_userbuffers``).
    ``qkv_copies``: the code base's copies of Q, K, V and their gradients around the attention
    (``qkv_layout_copies``; Megatron-Core's and Transformer Engine's only around the fused attention).

    Megatron's fusions (``sim.workload.kernels.KernelSet``): ``bias_gelu_fusion`` False adds the MLP bias
    in its own kernel before the GeLU (``F.gelu(x + bias)``, megatron/model/transformer.py ParallelMLP);
    ``bias_dropout_fusion`` False runs ``bias_dropout_add`` eagerly: ``x + bias``, dropout, then
    ``residual + out``, three kernels where the fused one is one; ``fused_softmax`` False (with
    ``softmax_in_fp32``) prices standard attention's torch softmax path
    (``sim.workload.attention.standard_attention``). Their backwards move what the fused kernels' do
    (autograd passes the gradient through the adds), so only the forward and its recompute change.
    """
    _check_parallel(d, micro_batch, tp, sequence_parallel, dtype)
    sp = sequence_parallel and tp > 1
    b, h, t = micro_batch, d.hidden, tp
    act = storage_dtype(dtype)
    tokens = b * d.seq_len
    local = tokens // t if sp else tokens  # tokens seen by norm / dropout regions
    ffn_t = d.ffn_hidden // t
    comm_bytes = float(tokens * h * DTYPE_BYTES[act])
    after_row, before_col = _collectives(t, sp)

    qkv = gemm("qkv", tokens, (h + 2 * d.kv_dim) // t, h, dtype)
    attn_out = gemm("attn_out", tokens, h, h // t, dtype)
    up_name = "mlp_gate_up" if d.mlp == "swiglu" else "mlp_up"
    up = gemm(up_name, tokens, (2 if d.mlp == "swiglu" else 1) * ffn_t, h, dtype)
    down = gemm("mlp_down", tokens, h, ffn_t, dtype)

    if attention not in ("flash", "standard"):
        raise ScenarioError(f"{attention!r} is not one of flash, standard", field="model.attention")
    pn, drop = persistent_norm, d.dropout > 0
    norm1 = _norm_fwd("norm1", local, h, act, pn)
    if attention == "flash":
        core: tuple[Op, ...] = (flash_attention_op("attention", d, b, t, act, backward=False, kernel=flash_kernel),)
        core_b: tuple[Op, ...] = (flash_attention_op("attention.bwd", d, b, t, act, backward=True,
                                                     kernel=flash_kernel),)
    else:
        core, core_b = standard_attention(d, b, t, act, attention_dropout_kernel and drop, fused_softmax,
                                          softmax_in_fp32)
    rope = rope_ops(d, tokens, t, act)
    rotate, rotate_b = ((rope[0],), (rope[1],)) if rope is not None else ((), ())
    style = "split-cat" if qkv_copies == "megatron-te" and attention != "flash" else qkv_copies
    copies, copies_b = qkv_layout_copies(d, tokens, t, act, style)
    core, core_b = (*rotate, *copies, *core), (*core_b, *rotate_b, *copies_b)
    add1 = _dropout_add_fwd("attn_dropout_add", local, h, act, drop, d.bias, bias_dropout_fusion)
    norm2 = _norm_fwd("norm2", local, h, act, pn)
    mlp_act: tuple[Op, ...] = (_activation_fwd(d.mlp, tokens, ffn_t, act),)
    if d.bias and d.mlp == "gelu" and not bias_gelu_fusion:
        mlp_act = (elementwise("mlp_bias_add", 2 * tokens * ffn_t * DTYPE_BYTES[act], act,
                               flops=float(tokens * ffn_t)), *mlp_act)
    add2 = _dropout_add_fwd("mlp_dropout_add", local, h, act, drop, d.bias, bias_dropout_fusion)

    forward: tuple[Segment, ...]
    backward_input: tuple[Segment, ...]
    if sp:
        forward = (
            _seg((norm1,), before_col, comm_bytes),
            _seg((qkv, *core, attn_out), after_row, comm_bytes),
            _seg((*add1, norm2), before_col, comm_bytes),
            _seg((up, *mlp_act, down), after_row, comm_bytes),
            _seg(add2, None, 0.0),
        )
    else:
        forward = (
            _seg((norm1, qkv, *core, attn_out), after_row, comm_bytes),
            _seg((*add1, norm2, up, *mlp_act, down), after_row, comm_bytes),
            _seg(add2, None, 0.0),
        )

    add2_b = _dropout_add_bwd("mlp_dropout_add.bwd", local, h, act, drop, d.bias)
    act_b = _activation_bwd(d.mlp, tokens, ffn_t, act)
    norm2_b = _norm_bwd("norm2.bwd", local, h, act, persistent=pn)
    add1_b = _dropout_add_bwd("attn_dropout_add.bwd", local, h, act, drop, d.bias)
    norm1_b = _norm_bwd("norm1.bwd", local, h, act, persistent=pn)
    grad_row = _conjugate(after_row, t)  # AG with SP, identity without
    grad_col = _conjugate(before_col, t)  # RS with SP, AR without
    mlp_grads = (_dgrad(down), act_b, _dgrad(up))
    attn_grads = (_dgrad(attn_out), *core_b, _dgrad(qkv))
    if sp:
        backward_input = (
            _seg((add2_b,), grad_row, comm_bytes),
            _seg(mlp_grads, grad_col, comm_bytes),
            _seg((norm2_b, add1_b), grad_row, comm_bytes),
            _seg(attn_grads, grad_col, comm_bytes),
            _seg((norm1_b,), None, 0.0),
        )
    else:
        backward_input = (
            _seg((add2_b, *mlp_grads), grad_col, comm_bytes),
            _seg((norm2_b, add1_b, *attn_grads), grad_col, comm_bytes),
            _seg((norm1_b,), None, 0.0),
        )
    backward_weight: tuple[Op, ...] = (_wgrad(down), _wgrad(up), _wgrad(attn_out), _wgrad(qkv))
    if tp_backward_overlap and t > 1:
        backward_input = _overlapped_backward(
            sp, comm_bytes, grad_row,
            mlp=(add2_b, _dgrad(down), _wgrad(down), act_b), up=up,
            attn=(norm2_b, add1_b, _dgrad(attn_out), _wgrad(attn_out), *core_b), qkv=qkv, last=(norm1_b,))
        backward_weight = ()
    if dtype == "fp8":
        forward, backward_input, backward_weight = fp8_layer(forward, backward_input, backward_weight,
                                                             fp8_recipe, sp_tp=t if sp else 1)
    if tp_comm_overlap and sp:
        forward = _userbuffers(forward, t, forward=True)
        backward_input = _userbuffers(backward_input, t, forward=False)
    return LayerOps(forward=forward, backward_input=backward_input, backward_weight=backward_weight)


# Transformer Engine's userbuffers defaults (transformer_engine/pytorch/module/base.py, initialize_ub,
# get_default_config, TE 2.x): the all-gathers before a GEMM (qkv_fprop, fc1_fprop, proj_dgrad,
# fc2_dgrad) run "ring_exchange" on copy engines (use_ce, num_sm 1) in tp splits; the forward
# reduce-scatters after the row-parallel GEMMs (proj_fprop, fc2_fprop) run "pipeline": 4 GEMM splits, each
# split's reduce-scatter on 16 SMs beside the next split (set_sm_margin: the GEMM keeps the other SMs);
# the backward's bulk overlaps (qkv/fc1 dgrad and wgrad) on 16 SMs.
UB_RING_CTAS = 1
UB_PIPELINE_CTAS = 16
UB_PIPELINE_SPLITS = 4
UB_BULK_CTAS = 16


def _splits(op: Op, n: int) -> tuple[Op, ...]:
    """GEMM ``op`` (m rows) as ``n`` GEMMs of m/n rows, as userbuffers' split GEMMs run it: each split
    reads the whole weight again and gets the shape efficiency of its own size."""
    part = gemm(op.name, op.m // n, op.n, op.k, op.dtype, batch=op.batch)
    return (part,) * n


def _userbuffers(segments: tuple[Segment, ...], tp: int, forward: bool) -> tuple[Segment, ...]:
    """A sequence-parallel layer's segments with TP communication overlapped as userbuffers overlap it.

    - ring exchange: a blocking all-gather and the GEMM that consumes it (the next segment's first GEMM)
      become that GEMM in ``tp`` splits: the first tp − 1 beside the gather (each split computes on the
      chunk that has arrived while the next one moves), the last after it, so the segment takes
      max((tp − 1)/tp · GEMM, gather) + GEMM/tp instead of gather + GEMM;
    - pipeline (forward only): a row-parallel GEMM and its blocking reduce-scatter become 4 splits, the
      first alone, the other 3 beside the reduce-scatter of 3/4 of the output, then the last quarter's
      reduce-scatter: GEMM/4 + max(3/4 · GEMM, 3/4 · RS) + RS/4;
    - bulk: the backward's overlapped collectives (``_overlapped_backward``) hold userbuffers' 16 SMs
      instead of NCCL's CTAs."""
    out: list[Segment] = []
    i = 0
    while i < len(segments):
        seg = segments[i]
        nxt = segments[i + 1] if i + 1 < len(segments) else None
        first = next((j for j, op in enumerate(nxt.ops) if op.kind == GEMM), None) if nxt is not None else None
        if seg.comm == ALL_GATHER and not seg.overlap and nxt is not None and first is not None \
                and nxt.ops[first].m % tp == 0:
            parts = _splits(nxt.ops[first], tp)
            rest = nxt.ops[:first] + nxt.ops[first + 1:]  # casts of later GEMMs' inputs, the transposes
            if seg.ops:
                out.append(replace(seg, comm=None, comm_bytes=0.0))
            out.append(Segment(parts[:-1], ALL_GATHER, seg.comm_bytes, overlap=True, ctas=UB_RING_CTAS))
            seg, i = replace(nxt, ops=(parts[-1], *rest)), i + 1  # it may end in a reduce-scatter too
        n = UB_PIPELINE_SPLITS
        if (forward and seg.comm == REDUCE_SCATTER and not seg.overlap and seg.ops
                and seg.ops[-1].kind == GEMM and seg.ops[-1].m % n == 0):
            parts = _splits(seg.ops[-1], n)
            out.append(replace(seg, ops=(*seg.ops[:-1], parts[0]), comm=None, comm_bytes=0.0))
            out.append(Segment(parts[1:], REDUCE_SCATTER, seg.comm_bytes * (n - 1) / n, overlap=True,
                               ctas=UB_PIPELINE_CTAS))
            out.append(Segment((), REDUCE_SCATTER, seg.comm_bytes / n))
        elif seg.overlap and seg.comm and seg.ctas is None:
            out.append(replace(seg, ctas=UB_BULK_CTAS))
        else:
            out.append(seg)
        i += 1
    return tuple(out)


def _overlapped_backward(sp: bool, comm_bytes: float, grad_row: str | None, *, mlp: tuple[Op, ...], up: Op,
                         attn: tuple[Op, ...], qkv: Op, last: tuple[Op, ...]) -> tuple[Segment, ...]:
    """The backward of a TP layer whose column-parallel linears (``up``, ``qkv``) overlap their collectives
    (see ``layer_ops``). ``mlp`` and ``attn`` hold the ops up to each one's input-gradient GEMM (and with
    SP the MLP's ``mlp`` starts with the dropout-add whose gradient is all-gathered, as without overlap)."""
    if sp:  # re-gather the input during dgrad, then reduce-scatter dgrad's output during wgrad
        def column(before: tuple[Op, ...], lin: Op) -> tuple[Segment, ...]:
            return (_seg(before, None, 0.0), Segment((_dgrad(lin),), ALL_GATHER, comm_bytes, overlap=True),
                    Segment((_wgrad(lin),), REDUCE_SCATTER, comm_bytes, overlap=True))

        add2_b, *mlp_rest = mlp
        norm2_b, add1_b, *attn_rest = attn
        return (_seg((add2_b,), grad_row, comm_bytes), *column(tuple(mlp_rest), up),
                _seg((norm2_b, add1_b), grad_row, comm_bytes), *column(tuple(attn_rest), qkv),
                _seg(last, None, 0.0))
    # all-reduce dgrad's output during wgrad
    return (_seg((*mlp, _dgrad(up)), None, 0.0), Segment((_wgrad(up),), ALL_REDUCE, comm_bytes, overlap=True),
            _seg((*attn, _dgrad(qkv)), None, 0.0), Segment((_wgrad(qkv),), ALL_REDUCE, comm_bytes, overlap=True),
            _seg(last, None, 0.0))


_FP8_CAST_BYTES_PER_ELEM = 2 + 1 + 1  # read bf16, write fp8 and fp8 transposed
_FP8_QUANTIZE_BYTES_PER_ELEM = 2 + 1  # read bf16, write fp8 (row-wise only: an all-gather follows)
_FP8_TRANSPOSE_BYTES_PER_ELEM = 1 + 1  # read fp8, write it transposed (the weight gradient's operand)
_FP8_AMAX_BYTES_PER_ELEM = 2  # current scaling: read the bf16 input once more for its amax
_FP8_OF_STORAGE = DTYPE_BYTES["fp8"] / DTYPE_BYTES[storage_dtype("fp8")]  # 1 of the 2 bytes bf16 moves
_AMAX_BYTES = 4  # one fp32 amax, max-reduced over the TP group (current scaling, sequence parallel)
FP8_RECIPES = ("delayed", "current")  # training.fp8_recipe
# Weight gradients whose inputs are all-gathered under sequence parallelism (dense layers; a MoE layer's
# shared expert): they read a transposed fp8 copy of the gathered input.
_GATHERED_WGRADS = frozenset({"qkv.wgrad", "mlp_up.wgrad", "mlp_gate_up.wgrad", "shared_up.wgrad"})


def _fp8_gemm_input(op: Op) -> bool:
    """An fp8 GEMM whose m×k input is cast here (weight gradients reuse casts made for the other GEMMs)."""
    return op.kind == GEMM and op.dtype == "fp8" and not op.name.endswith(".wgrad")


def _input_elems(op: Op) -> int:
    """Elements of GEMM ``op``'s m×k input (the operand an fp8 cast or transpose handles)."""
    return op.m * op.k * op.batch


def _is_norm(op: Op) -> bool:
    """A forward LayerNorm/RMSNorm kernel (the op a fused norm-and-quantize replaces)."""
    return op.family in (NORM, PERSISTENT_NORM)


def _writing_fp8(norm: Op, elems: int) -> Op:
    """``norm`` writing its ``elems`` outputs in fp8 (1 byte) instead of the 16-bit dtype: Transformer
    Engine's fused norm-and-quantize under delayed scaling, whose scale is known before the kernel runs
    (TE 1.8 ``_LayerNormLinear``: ``ln_out`` uint8 from ``_apply_normalization(..., fp8_out)``; TE 2.x
    ``with_quantized_norm``). Current scaling needs the output's amax first, so it stays unfused."""
    saved = elems * (DTYPE_BYTES[norm.dtype] - DTYPE_BYTES["fp8"])
    return replace(norm, bytes=norm.bytes - saved)


def _fp8_transpose(op: Op) -> Op:
    """The column-wise (transposed) fp8 copy of a gathered input, made where its weight gradient (or,
    for a gathered gradient, its input-gradient GEMM) first needs it: of ``op``'s k×m operand."""
    elems = _input_elems(op)
    return elementwise("fp8 transpose", elems * _FP8_TRANSPOSE_BYTES_PER_ELEM, "fp8", flops=0.0)


def fp8_weight_elems(forward: tuple[Segment, ...]) -> int:
    """Elements of the weights this GPU's fp8 GEMMs of ``forward`` multiply by (k × n of each GEMM, one
    per expert for grouped ones): what Transformer Engine casts to fp8. A GEMM split into pieces (over
    context-parallel chunks or userbuffers' splits) keeps one weight, so each name counts once."""
    weights = {op.name: op.k * op.n * op.batch for seg in forward for op in seg.ops if _fp8_gemm_input(op)}
    return sum(weights.values())


def fp8_weight_cast(elems: int, recipe: str) -> Op:
    """The cast of ``elems`` 16-bit weights to fp8 with the transposed copy the input-gradient GEMM reads
    (Hopper's fp8 GEMMs take only the TN layout): Transformer Engine's ``cast_transpose_`` of the weight
    into its fp8 workspace (TE 1.8 ``get_fp8_workspace(..., with_transpose=True)``), read 2 bytes and
    write 1 + 1; current scaling first reads the weights once more for their amax."""
    per_elem = _FP8_CAST_BYTES_PER_ELEM + (_FP8_AMAX_BYTES_PER_ELEM if recipe == "current" else 0)
    return elementwise("fp8 weight cast_transpose", elems * per_elem, "bf16", flops=float(elems))


def fp8_layer(forward: tuple[Segment, ...], backward_input: tuple[Segment, ...], backward_weight: tuple[Op, ...],
              recipe: str, sp_tp: int) -> tuple[tuple[Segment, ...], tuple[Segment, ...], tuple[Op, ...]]:
    """A layer's ops as Transformer Engine runs them in fp8 (dense and MoE layers alike): the casts of the
    GEMM inputs in forward and backward (``_with_fp8_casts``), and under sequence parallelism
    (``sp_tp`` > 1) the transposed copy of each gathered input before its weight gradient in
    ``backward_weight`` (the W pass of a split backward)."""
    forward = _with_fp8_casts(forward, recipe, sp_tp=sp_tp)
    backward_input = _with_fp8_casts(backward_input, recipe, sp_tp=sp_tp)
    if sp_tp > 1:
        backward_weight = tuple(op for w in backward_weight
                                for op in ((_fp8_transpose(w), w) if w.name in _GATHERED_WGRADS else (w,)))
    return forward, backward_input, backward_weight


def _with_fp8_casts(segments: tuple[Segment, ...], recipe: str = "delayed", sp_tp: int = 1) -> tuple[Segment, ...]:
    """Prefix each segment holding fp8 GEMMs with the cast_transpose of their m×k inputs.

    ``recipe``: Transformer Engine's scaling. ``delayed`` (DelayedScaling, TE's default) scales by the amax
    history of earlier iterations and records this tensor's amax inside the cast kernel; ``current``
    (Float8CurrentScaling) needs the tensor's own amax first: a reduction pass over the input
    (``nvte_compute_amax``), then the scale, then the cast, as TE's current-scaling quantizer and its
    tests (tests/cpp/operator/test_cast_current_scaling.cu) run them.

    ``sp_tp`` > 1 (sequence parallelism over that many TP ranks): the tensors all-gathered before a GEMM
    travel in fp8. Transformer Engine quantizes this rank's shard *before* the gather and gathers the fp8
    bytes: the norm output before QKV and the MLP's first linear (``_LayerNormLinear`` / ``_LayerNormMLP``
    forward, TE 1.8 and 2.x: ``gather_along_first_dim`` of the quantized ``ln_out``, which the backward
    re-gathers) and the output gradient before the row-parallel linears' input gradient
    (``grad_output_preprocess``: ``cast_to_fp8`` then the gather, then ``fp8_transpose``). So the
    all-gather moves 1 byte per element, the cast reads 2 and writes 1 per element of the shard (no
    transposed copy: "all-gather is not supported with FP8 column-wise data"), and the transposed copy
    (read 1, write 1 per gathered element) is made where the weight gradient needs it. Under current
    scaling the shard's amax is max-reduced over the TP group first (``with_amax_reduction``: a blocking
    all-reduce of one float), so every rank scales the gathered tensor alike.

    Under delayed scaling a GEMM input that a norm produces (QKV's, the MLP's first linear's) is quantized
    by the norm kernel itself (``_writing_fp8``): no cast runs, the norm writes 1 byte per element, and the
    column-wise copy the weight gradient needs is a transpose (read 1, write 1) of the fp8 output; with
    sequence parallelism the norm writes the fp8 shard that is gathered."""
    if recipe not in FP8_RECIPES:
        raise ScenarioError(f"{recipe!r} is not one of {', '.join(FP8_RECIPES)}", field="training.fp8_recipe")
    current = recipe == "current"
    out: list[Segment] = []
    gathered_into_next = False  # the segment before ends in a blocking all-gather of a GEMM input
    for seg in segments:
        ops = list(seg.ops)
        pre: list[Op] = []
        first = next((i for i, op in enumerate(ops) if _fp8_gemm_input(op)), None) if gathered_into_next else None
        if first is not None:  # this GEMM's input arrived through the fp8 all-gather that ends ``before``
            g = ops[first]
            shard = _input_elems(g) // sp_tp
            before = out.pop()
            quantize = elementwise("fp8 cast (shard)", shard * _FP8_QUANTIZE_BYTES_PER_ELEM, "bf16", flops=float(shard))
            if current:
                amax = elementwise("fp8 amax (shard)", shard * _FP8_AMAX_BYTES_PER_ELEM, "bf16", flops=float(shard))
                out.append(replace(before, ops=(*before.ops, amax), comm=ALL_REDUCE, comm_bytes=_AMAX_BYTES))
                out.append(replace(before, ops=(quantize,)))
            elif before.ops and _is_norm(before.ops[-1]):  # the norm writes the fp8 shard itself
                out.append(replace(before, ops=(*before.ops[:-1], _writing_fp8(before.ops[-1], shard))))
            else:
                out.append(replace(before, ops=(*before.ops, quantize)))
            if g.name.endswith(".dgrad"):  # a gathered gradient: transposed at once for the weight gradient
                pre.append(_fp8_transpose(g))
        # delayed scaling: a norm right before its GEMM quantizes its own output (GEMM indices)
        by_norm = {i for i in range(1, len(ops)) if not current and i != first
                   and _fp8_gemm_input(ops[i]) and _is_norm(ops[i - 1])}
        for i in by_norm:
            ops[i - 1] = _writing_fp8(ops[i - 1], _input_elems(ops[i]))
        skip = {first, *by_norm}
        elems = sum(_input_elems(op) for i, op in enumerate(ops) if _fp8_gemm_input(op) and i not in skip)
        if elems:
            cast = elementwise("fp8 cast_transpose", elems * _FP8_CAST_BYTES_PER_ELEM, "bf16", flops=float(elems))
            amax_ops = (elementwise("fp8 amax", elems * _FP8_AMAX_BYTES_PER_ELEM, "bf16", flops=float(elems)),
                        ) if current else ()
            pre = [*amax_ops, cast, *pre]
        # the column-wise copy a norm-quantized input's weight gradient reads
        ops = [op2 for i, op in enumerate(ops) for op2 in ((_fp8_transpose(op), op) if i in by_norm else (op,))]
        if sp_tp > 1:
            ops = [op2 for op in ops for op2 in ((_fp8_transpose(op), op) if op.name in _GATHERED_WGRADS else (op,))]
        if seg.comm == ALL_GATHER and sp_tp > 1:
            seg = replace(seg, comm_bytes=seg.comm_bytes * _FP8_OF_STORAGE)  # fp8 bytes, not the activations'
        out.append(replace(seg, ops=(*pre, *ops)))
        gathered_into_next = seg.comm == ALL_GATHER and sp_tp > 1 and not seg.overlap
    return tuple(out)


_EMB_PARTIAL_BYTES = 4 + 4  # an fp32 partial sum per token element, written then read (embedding backward)


def embedding_ops(
    d: TransformerDims, *, micro_batch: int, tp: int, sequence_parallel: bool, dtype: str
) -> LayerOps:
    """Vocab-parallel token lookup (+ learned positions, dropout); its partial rows are summed over TP.

    Forward: [lookup] → AR (RS with SP); [position add + dropout]. Backward: [dropout bwd] → AG with SP;
    W: the dense gradient of this GPU's vocabulary shard (and position table), as torch builds it.
    """
    _check_parallel(d, micro_batch, tp, sequence_parallel, dtype)
    sp = sequence_parallel and tp > 1
    h, t = d.hidden, tp
    act = storage_dtype(dtype)
    e = DTYPE_BYTES[act]
    tokens = micro_batch * d.seq_len
    local = tokens // t if sp else tokens
    comm_bytes = float(tokens * h * e)
    after_row, _ = _collectives(t, sp)
    learned = d.position == "learned"

    lookup = elementwise("embedding_lookup", tokens * _TOKEN_ID_BYTES + 2 * tokens * h * e, act)
    drop = d.dropout > 0
    if drop:  # position add and dropout in one pass
        dropout = elementwise("embedding_dropout", local * h * ((3 if learned else 2) * e + _MASK_BYTES), act,
                              flops=2.0 * local * h, family=DROPOUT)
    else:  # the position add alone (nothing with rotary positions)
        dropout = elementwise("embedding_dropout", local * h * 3 * e if learned else 0.0, act,
                              flops=float(local * h) if learned else 0.0)
    dropout_b = _dropout_add_bwd("embedding_dropout.bwd", local, h, act, drop, bias=False)
    # torch's embedding backward (embedding_dense_backward_cuda → embedding_backward_cuda_kernel,
    # aten/src/ATen/native/cuda/EmbeddingBackwardKernel.cu) returns a dense gradient: ``at::zeros`` of the
    # whole table shard (written once), then per token it reads the incoming gradient, writes and reads
    # back an fp32 partial sum per sorted segment, and writes the summed rows: 2e + 8 bytes per element.
    # The learned position table (s × h) goes through the same kernel.
    wgrad_bytes = (math.ceil(d.vocab / t) * h * e + tokens * h * (2 * e + _EMB_PARTIAL_BYTES)
                   + ((d.seq_len * h * e + local * h * (2 * e + _EMB_PARTIAL_BYTES)) if learned else 0))
    wgrad = elementwise("embedding.wgrad", wgrad_bytes, act, flops=float(tokens * h))
    return LayerOps(
        forward=(_seg((lookup,), after_row, comm_bytes), _seg((dropout,), None, 0.0)),
        backward_input=(_seg((dropout_b,), _conjugate(after_row, t), comm_bytes),),
        backward_weight=(wgrad,),
    )


def head_ops(
    d: TransformerDims, *, micro_batch: int, tp: int, sequence_parallel: bool, dtype: str,
    persistent_norm: bool = False, fused_ce: bool = True, ce_kernel: str = "native",
) -> LayerOps:
    """Final norm, vocab-parallel logits GEMM (2bshV/t) and vocab-parallel cross-entropy.

    Cross-entropy (Megatron ``vocab_parallel_cross_entropy``) needs three all-reduces of b·s fp32 values:
    the max logit, the target logit and the sum of exponentials. The vocabulary is padded to a multiple
    of tp (ceil(V/t) columns per GPU).

    ``fused_ce`` False: the cross-entropy as Megatron-LM and Megatron-DeepSpeed ran it before
    Megatron-Core's loss fusion (June 2024): the GPT model casts the 16-bit logits to fp32 (``output.float()``,
    --fp16-lm-cross-entropy off by default), then ``_VocabParallelCrossEntropy.forward`` (megatron/mpu/
    cross_entropy.py) takes the max (read 4 bytes per logit), subtracts it in place (4 + 4), exponentiates
    in place (4 + 4), sums (4) and divides by the sum in place (4 + 4) to keep the softmax for backward,
    whose ``grad_input.mul_(grad_output)`` reads and writes it once more before autograd casts the gradient
    back to 16 bits: 6 + 4 + 8 + 8 + 4 + 8 = 38 bytes per logit forward, 8 + 6 = 14 backward.

    Fused, ``ce_kernel`` "native" (the default; Megatron-Core's ``cross_entropy_loss_fusion``, megatron/core/fusions/
    fused_cross_entropy.py from core_r0.8.0, June 2024, the same four steps through 2026): four functions
    compiled by ``jit_fuser`` (``torch.compile`` from PyTorch 2.2), each a pass over the logits.
    ``calculate_logits_max`` casts to fp32 and takes the max in one kernel (read 2, write 4);
    ``calculate_predicted_logits`` subtracts the max and exponentiates in place and sums the rows;
    ``calculate_cross_entropy_loss`` divides by the sum in place (4 + 4); backward, ``calculate_gradients``
    subtracts one at each target (a scatter), multiplies by the output gradient in place and casts to bf16.
    Under torch.compile an input mutated in a graph that also reduces over it or scatters into it is
    computed into a fresh logits-sized buffer and copied back (Megatron-Core's own note on in-place
    semantics in the later revision of fused_cross_entropy.py that splits those steps, NVIDIA/Megatron-LM
    0cb4a9c: "a full logits-sized transient allocation plus an extra read/write pass"). So the exponent-sum
    pass moves 4 + 4 and its copy back 4 + 4, and the gradient's scatter first copies the softmax (4 + 4),
    then one kernel reads it (4) and writes the mutated softmax (4) and the 16-bit gradient (2):
    6 + 16 + 8 = 30 bytes per logit forward, 8 + 10 = 18 backward. The target logit and the sum travel in
    one all-reduce (``torch.cat`` of both), the max in another.

    ``ce_kernel`` "xentropy" (with ``fused_ce``): flash-attn's fused CUDA cross-entropy (csrc/xentropy,
    apex's kernel), llm-foundry's default loss: one block per token reads the 16-bit logits twice forward
    (max and sum, then the exponent sum) and writes the loss and log-sum-exp; backward reads them once
    and writes the gradient: 2 + 2 bytes per logit forward, 2 + 2 backward.

    ``ce_kernel`` "te": Transformer Engine's Triton cross-entropy (transformer_engine/pytorch/triton/
    cross_entropy.py, v2.9 of October 2025; Megatron-Core's cross_entropy_fusion_impl "te"): an online
    softmax pass reads the 16-bit logits for each token's max and sum (2), a second kernel reads them again
    and writes the gradient over them in place (2 + 2); backward ``element_mul_kernel`` scales it by the
    per-token output gradient (2 + 2): 6 bytes per logit forward, 4 backward, nothing in fp32. Under tensor
    parallelism the ranks' (max, sum, target logit) per token are all-gathered between the two kernels.
    """
    _check_parallel(d, micro_batch, tp, sequence_parallel, dtype)
    sp = sequence_parallel and tp > 1
    h, t = d.hidden, tp
    act = storage_dtype(dtype)
    e = DTYPE_BYTES[act]
    tokens = micro_batch * d.seq_len
    local = tokens // t if sp else tokens
    v_t = math.ceil(d.vocab / t)
    comm_bytes = float(tokens * h * e)
    small = float(tokens * _FP32_BYTES)
    small_comm = ALL_REDUCE if t > 1 else None
    _, before_col = _collectives(t, sp)

    norm = _norm_fwd("final_norm", local, h, act, persistent_norm)
    # Megatron-Core's output layer is its own ColumnParallelLinear, not a Transformer Engine module
    # (megatron/core/models/gpt/gpt_model.py), so fp8_autocast leaves it in the 16-bit dtype.
    logits = gemm("logits", tokens, v_t, h, act)
    n, f = tokens * v_t, _FP32_BYTES
    ce_target = elementwise("ce_target", tokens * (_TOKEN_ID_BYTES + e + f), act)
    ce_loss = elementwise("ce_loss", 4 * tokens * f, act, flops=4.0 * tokens)
    ce_cast = n * e + (n * f if e != f else 0)  # x.float(): read the 16-bit logits, write fp32 (fp32: no copy)
    ce: tuple[Segment, ...]
    ce_max_ops: tuple[Op, ...]
    ce_bwd: tuple[Op, ...]
    if ce_kernel not in CE_KERNELS:
        raise ValueError(f"unknown cross-entropy kernel {ce_kernel!r}")
    # the collective after the first pass: the max logit all-reduced, or (te) every rank's per-token
    # (max, sum, target logit) all-gathered, 3 fp32 values per token from each of the t ranks
    stat_comm, stat_bytes = small_comm, small
    if fused_ce and ce_kernel == "te":
        stat_comm, stat_bytes = (ALL_GATHER if t > 1 else None), 3.0 * small * t
        ce_max_ops = (elementwise("ce te online_softmax", n * e + tokens * (_TOKEN_ID_BYTES + 3 * f), act,
                                  flops=3.0 * n),)
        ce = (_seg((elementwise("ce te loss+grad", 2 * n * e + tokens * 4 * f, act, flops=3.0 * n),), None, 0.0),)
        ce_bwd = (elementwise("ce te grad scale", 2 * n * e, act, flops=float(n)),)
    elif fused_ce and ce_kernel == "xentropy":
        ce_max_ops = (elementwise("ce xentropy", 2 * n * e + tokens * (_TOKEN_ID_BYTES + 2 * f), act,
                                  flops=5.0 * n),)
        ce = ()  # under tensor parallelism the per-rank log-sum-exps meet in the small all-reduce after it
        ce_bwd = (elementwise("ce xentropy.bwd", 2 * n * e, act, flops=2.0 * n),)
    elif fused_ce:
        ce_max_ops = (elementwise("ce_max", ce_cast + tokens * f, act, flops=float(n)),)
        ce = (
            _seg((ce_target, elementwise("ce_sum_exp", 2 * n * f + tokens * f, act, flops=4.0 * n),
                  elementwise("ce_sum_exp copy-back", 2 * n * f, act)), small_comm, 2 * small),
            _seg((elementwise("ce_div", 2 * n * f, act, flops=float(n)), ce_loss), None, 0.0),
        )
        ce_bwd = (elementwise("ce.bwd scatter copy", 2 * n * f, act),
                  elementwise("ce.bwd", n * (2 * f + e), act, flops=2.0 * n))
    else:
        ce_max_ops = (*((elementwise("logits.float", ce_cast, act),) if e != f else ()),
                      elementwise("ce_max", n * f + tokens * f, act, flops=float(n)))
        ce = (
            _seg((elementwise("ce_sub_max", 2 * n * f, act, flops=float(n)), ce_target), small_comm, small),
            _seg((elementwise("ce_exp", 2 * n * f, act, flops=4.0 * n),
                  elementwise("ce_sum", n * f + tokens * f, act, flops=float(n))), small_comm, small),
            _seg((elementwise("ce_div", 2 * n * f, act, flops=float(n)), ce_loss), None, 0.0),
        )
        ce_bwd = (elementwise("ce.bwd", 2 * n * f, act, flops=float(n)),
                  *((elementwise("logits.float.bwd", n * (f + e), act),) if e != f else ()))
    forward: tuple[Segment, ...]
    if sp:
        forward = (_seg((norm,), before_col, comm_bytes), _seg((logits, *ce_max_ops), stat_comm, stat_bytes), *ce)
    else:
        forward = (_seg((norm, logits, *ce_max_ops), stat_comm, stat_bytes), *ce)

    norm_b = _norm_bwd("final_norm.bwd", local, h, act, residual=False, persistent=persistent_norm)
    backward_input = (
        _seg((*ce_bwd, _dgrad(logits)), _conjugate(before_col, t), comm_bytes),
        _seg((norm_b,), None, 0.0),
    )
    return LayerOps(forward=forward, backward_input=backward_input, backward_weight=(_wgrad(logits),))


def loss_memory_bytes_per_logit(fused_ce: bool, ce_kernel: str, dtype: str) -> tuple[int, int]:
    """Bytes per logit the loss keeps from its forward to its backward, and the extra it holds at its
    peak, by the kernels ``head_ops`` prices. Eager (Megatron's unfused loss): the fp32 softmax is kept (4),
    and the fp32 copy beside the 16-bit logits (forward) or the 16-bit gradient beside the softmax
    (backward) is bounded by 4 more (the 16-bit partner itself is 2). native: the fp32 softmax (4)
    kept; at its peak the torch.compile'd steps hold the fresh logits-sized fp32 buffer and the 16-bit
    logits (forward) or the scatter's copy and the 16-bit gradient (backward): 6 more. te: nothing but the
    16-bit logits, overwritten by their gradient in place (2, no extra). xentropy: the 16-bit logits (2) and
    a new 16-bit gradient (2)."""
    if ce_kernel not in CE_KERNELS:
        raise ValueError(f"unknown cross-entropy kernel {ce_kernel!r}")
    e = DTYPE_BYTES[storage_dtype(dtype)]
    if not fused_ce:
        return _FP32_BYTES, _FP32_BYTES
    if ce_kernel == "native":
        return _FP32_BYTES, _FP32_BYTES + e
    if ce_kernel == "te":
        return e, 0
    return e, e


# ---------------------------------------------------------------------------------------------- FLOPs


def _layer_forward_flops_per_sequence(d: TransformerDims) -> float:
    s = d.seq_len
    return 2.0 * s * _matmul_weights_per_layer(d) + 4.0 * s * s * d.hidden


def model_flops_per_iteration(d: TransformerDims, global_batch: int) -> float:
    """Model FLOPs of one iteration: 3 × (layer GEMMs + attention + logits) forward FLOPs.

    For GPT-style dims (MHA, gelu, ffn = 4h) this is exactly Korthikanti et al.'s
    72·B·L·s·h²(1 + s/(6h) + V/(12hL)); GQA and SwiGLU change the GEMM weight count accordingly.
    """
    per_sequence = d.layers * _layer_forward_flops_per_sequence(d) + 2.0 * d.seq_len * d.hidden * d.vocab
    return 3.0 * global_batch * per_sequence


def hardware_flops_per_iteration(d: TransformerDims, global_batch: int, checkpointing: str = "none") -> float:
    """Model FLOPs plus recomputation: full re-runs every layer's forward (not the logits), selective
    re-runs the attention core forward (Korthikanti: full gives 96·B·L·s·h²(1 + s/(6h) + V/(16hL)))."""
    if checkpointing not in CHECKPOINTING_KINDS:
        raise ScenarioError(
            f"{checkpointing!r} is not one of {', '.join(CHECKPOINTING_KINDS)}",
            field="training.checkpointing",
        )
    flops = model_flops_per_iteration(d, global_batch)
    s = d.seq_len
    if checkpointing == "full":
        flops += global_batch * d.layers * _layer_forward_flops_per_sequence(d)
    elif checkpointing == "selective":
        flops += global_batch * d.layers * 4.0 * s * s * d.hidden
    return flops
