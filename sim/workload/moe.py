"""Mixture-of-experts transformer layers with expert parallelism, as per-GPU ops and collectives.

A MoE layer keeps the dense layer's attention (Megatron TP, optional SP) and replaces its MLP by a router
and ``experts`` expert MLPs, of which each token uses ``top_k`` (Shazeer et al. 2017; Fedus et al. 2021,
Switch; Jiang et al. 2024, Mixtral). Expert parallelism (``ep`` GPUs, carved out of the data-parallel
ranks as in Megatron-Core) gives each GPU ``experts/ep`` whole experts; the tokens travel to them and back:

  router GEMM (h → E) + top-k → all-to-all dispatch over the EP group → expert GEMMs → all-to-all combine.

Each tensor-parallel rank routes its 1/t share of the tokens (the sequence-parallel shard; without SP
it takes its slice of the replicated activations, and an all-gather over TP restores them after the
combine). A GPU receives on average ``tokens·top_k`` routed copies; a capacity factor c pads every
expert's buffer to c× its fair share (Switch), a dropless router gets the real load, whose busiest GPU
carries ``load_imbalance``× the mean. Each all-to-all moves the rank's whole buffer, tokens·top_k·f·h
elements, 1/ep of it to each member (its own share stays): (ep − 1)/ep of the buffer leaves the GPU.

Shared experts (DeepSeek-MoE, Dai et al. 2024), which every token uses, run beside the routed ones as one
tensor-parallel MLP of width shared × ffn_e on all tokens, exactly like the dense layer's MLP (its TP
collectives included), and their gradients are summed over data parallelism with the other dense weights.

Backward mirrors it: the combine's gradient goes back by all-to-all, the expert input gradients return to
the tokens' owners by another; weight gradients of the experts are summed over the GPUs holding the same
experts (the expert-data-parallel group, ``data/ep × tensor`` GPUs), the rest over data parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.memory import mlp_activation_bytes
from sim.units import DTYPE_BYTES, storage_dtype
from sim.workload import transformer as tf
from sim.workload.attention import flash_attention_op
from sim.workload.ops import Op, elementwise, gemm

ALL_TO_ALL_EP = "all_to_all@ep"  # a collective on the expert-parallel group (executor: "op@group")
ALL_GATHER_TP = tf.ALL_GATHER
REDUCE_SCATTER_TP = tf.REDUCE_SCATTER
_FP32 = 4


@dataclass(frozen=True)
class MoESpec:
    """Routed experts of every layer: count, top-k, expert MLP width, capacity factor, imbalance."""

    experts: int
    top_k: int
    ffn_hidden: int  # one expert's MLP width
    capacity_factor: float | None = None  # None: dropless
    load_imbalance: float = 1.0  # dropless: busiest GPU's routed tokens / the mean
    shared: int = 0  # shared experts (every token), a tensor-parallel MLP of width shared × ffn_hidden

    @property
    def load_factor(self) -> float:
        """Routed copies per token on the busiest GPU, over top_k: the capacity factor, or the imbalance."""
        return self.capacity_factor if self.capacity_factor is not None else self.load_imbalance


def expert_params(d: tf.TransformerDims, moe: MoESpec) -> int:
    """Weights of all routed experts of one layer (each an MLP like the dense one, of width ffn_e)."""
    return moe.experts * _mlp_params(d, moe.ffn_hidden)


def _mlp_params(d: tf.TransformerDims, width: int) -> int:
    params = d.mlp_matrices * d.hidden * width
    if d.bias:
        params += (2 * width if d.mlp == "swiglu" else width) + d.hidden
    return params


def dense_params(d: tf.TransformerDims, moe: MoESpec) -> int:
    """The rest of a MoE layer, split by tensor parallelism and summed over data parallelism: attention,
    norms, the router (h × E) and the shared experts."""
    shared = _mlp_params(d, moe.shared * moe.ffn_hidden) if moe.shared else 0
    return tf.layer_params(d) - _mlp_params(d, d.ffn_hidden) + d.hidden * moe.experts + shared


def model_params(d: tf.TransformerDims, moe: MoESpec) -> int:
    return tf.model_params(d) + d.layers * (dense_params(d, moe) + expert_params(d, moe) - tf.layer_params(d))


def active_params(d: tf.TransformerDims, moe: MoESpec) -> int:
    """Parameters one token uses (top_k routed experts, the shared ones): what the FLOPs follow."""
    return model_params(d, moe) - d.layers * expert_params(d, moe) * (moe.experts - moe.top_k) // moe.experts


def dispatch_bytes(d: tf.TransformerDims, moe: MoESpec, *, micro_batch: int, tp: int, dtype: str) -> float:
    """One GPU's all-to-all buffer per layer and direction: its tokens × top_k × load factor × h × bytes."""
    tokens = micro_batch * d.seq_len / tp
    return tokens * moe.top_k * moe.load_factor * d.hidden * DTYPE_BYTES[storage_dtype(dtype)]


def layer_ops(d: tf.TransformerDims, moe: MoESpec, *, micro_batch: int, tp: int, ep: int,
              sequence_parallel: bool, dtype: str, flash_kernel: str = "",
              persistent_norm: bool = False, fp8_recipe: str = "delayed",
              qkv_copies: str = "none") -> tf.LayerOps:
    """Per-GPU ops of one MoE layer for one micro-batch (segments end in TP or EP collectives);
    ``persistent_norm``, ``d.dropout`` and, in fp8, the casts of the GEMM inputs (``fp8_recipe``) as in
    ``sim.workload.transformer.layer_ops`` (``qkv_copies``: the copies around the attention).
    The router is a plain linear outside Transformer Engine (Megatron-Core's TopKRouter:
    ``torch.nn.functional.linear``), so it stays 16-bit under fp8."""
    sp = sequence_parallel and tp > 1
    b, h, t = micro_batch, d.hidden, tp
    act = storage_dtype(dtype)
    e = DTYPE_BYTES[act]
    tokens = b * d.seq_len
    local = tokens // t if sp else tokens
    mine = tokens // t  # tokens this GPU routes
    comm_bytes = float(tokens * h * e)
    after_row, before_col = tf._collectives(t, sp)
    a2a = dispatch_bytes(d, moe, micro_batch=b, tp=t, dtype=dtype)
    routed = mine * moe.top_k * moe.load_factor  # token copies this GPU's experts compute
    local_experts = moe.experts // ep
    per_expert = max(1, round(routed / local_experts))

    qkv = gemm("qkv", tokens, (h + 2 * d.kv_dim) // t, h, dtype)
    attn_out = gemm("attn_out", tokens, h, h // t, dtype)
    router_dtype = storage_dtype(dtype) if dtype == "fp8" else dtype
    router = gemm("router", mine, moe.experts, h, router_dtype)
    topk = elementwise("router_topk", mine * moe.experts * (e + _FP32) + mine * moe.top_k * 8, act,
                          flops=4.0 * mine * moe.experts)
    up_w = (2 if d.mlp == "swiglu" else 1) * moe.ffn_hidden
    up = gemm("expert_up", per_expert, up_w, h, dtype, batch=local_experts)
    down = gemm("expert_down", per_expert, h, moe.ffn_hidden, dtype, batch=local_experts)
    # Permute tokens into expert order before the dispatch and back after the combine (read + write).
    permute = elementwise("moe_permute", 2 * routed * h * e, act)
    unpermute = elementwise("moe_unpermute", 2 * routed * h * e + mine * moe.top_k * _FP32, act,
                            flops=2.0 * routed * h)

    pn, drop = persistent_norm, d.dropout > 0
    norm1 = tf._norm_fwd("norm1", local, h, act, pn)
    core = flash_attention_op("attention", d, b, t, act, backward=False, kernel=flash_kernel)
    rope = tf.rope_ops(d, tokens, t, act)
    copies, copies_b = tf.qkv_layout_copies(d, tokens, t, act, qkv_copies)
    rotate: tuple[Op, ...] = ((rope[0],) if rope is not None else ()) + copies
    rotate_b: tuple[Op, ...] = ((rope[1],) if rope is not None else ()) + copies_b
    add1 = tf._dropout_add_fwd("attn_dropout_add", local, h, act, drop)
    norm2 = tf._norm_fwd("norm2", local, h, act, pn)
    mlp_act = tf._activation_fwd(d.mlp, per_expert * local_experts, moe.ffn_hidden, act)
    add2 = tf._dropout_add_fwd("mlp_dropout_add", local, h, act, drop)
    seg = tf._seg
    regather = t > 1 and not sp  # restore the TP-replicated activations after the combine
    shared_fwd: tuple[tf.Segment, ...] = ()
    shared_bwd: tuple[tf.Segment, ...] = ()
    shared_w: tuple = ()
    if moe.shared:  # a tensor-parallel MLP on all tokens, as the dense layer's (Megatron's shared expert)
        sw = moe.shared * moe.ffn_hidden // t
        s_up = gemm("shared_up", tokens, (2 if d.mlp == "swiglu" else 1) * sw, h, dtype)
        s_down = gemm("shared_down", tokens, h, sw, dtype)
        s_act = tf._activation_fwd(d.mlp, tokens, sw, act)
        s_act_b = tf._activation_bwd(d.mlp, tokens, sw, act)
        if sp:  # gather the sequence shards in, reduce-scatter the partial sums out
            shared_fwd = (seg((), before_col, comm_bytes), seg((s_up, s_act, s_down), after_row, comm_bytes))
            shared_bwd = (seg((), tf._conjugate(after_row, t), comm_bytes),
                          seg((tf._dgrad(s_down), s_act_b, tf._dgrad(s_up)), tf._conjugate(before_col, t),
                              comm_bytes))
        else:
            shared_fwd = (seg((s_up, s_act, s_down), after_row, comm_bytes),)
            shared_bwd = (seg((tf._dgrad(s_down), s_act_b, tf._dgrad(s_up)), tf._conjugate(before_col, t),
                              comm_bytes),)
        shared_w = (tf._wgrad(s_down), tf._wgrad(s_up))
    attention = ((seg((norm1,), before_col, comm_bytes), seg((qkv, *rotate, core, attn_out), after_row, comm_bytes))
                 if sp else (seg((norm1, qkv, *rotate, core, attn_out), after_row, comm_bytes),))
    forward = (
        *attention,
        seg((*add1, norm2, router, topk), None, 0.0),
        *shared_fwd,
        seg((permute,), ALL_TO_ALL_EP if ep > 1 else None, a2a),  # dispatch
        seg((up, mlp_act, down), ALL_TO_ALL_EP if ep > 1 else None, a2a),  # combine
        *((seg((unpermute,), ALL_GATHER_TP, comm_bytes),) if regather else (seg((unpermute,), None, 0.0),)),
        seg(add2, None, 0.0),
    )

    add2_b = tf._dropout_add_bwd("mlp_dropout_add.bwd", local, h, act, drop, d.bias)
    unpermute_b = elementwise("moe_unpermute.bwd", 2 * routed * h * e, act)
    act_b = tf._activation_bwd(d.mlp, per_expert * local_experts, moe.ffn_hidden, act)
    permute_b = elementwise("moe_permute.bwd", 2 * routed * h * e, act, flops=float(routed * h))
    router_b = gemm("router.dgrad", mine, h, moe.experts, router_dtype)
    norm2_b = tf._norm_bwd("norm2.bwd", local, h, act, persistent=pn)
    add1_b = tf._dropout_add_bwd("attn_dropout_add.bwd", local, h, act, drop, d.bias)
    core_b = flash_attention_op("attention.bwd", d, b, t, act, backward=True, kernel=flash_kernel)
    norm1_b = tf._norm_bwd("norm1.bwd", local, h, act, persistent=pn)
    grad_col = tf._conjugate(before_col, t)  # RS with SP, AR without
    ep_comm = ALL_TO_ALL_EP if ep > 1 else None
    attn_grads = (tf._dgrad(attn_out), core_b, *rotate_b, tf._dgrad(qkv))
    head = ((seg((add2_b,), REDUCE_SCATTER_TP, comm_bytes), seg((unpermute_b,), ep_comm, a2a)) if regather
            else (seg((add2_b,), None, 0.0), seg((unpermute_b,), ep_comm, a2a)))
    experts_b = seg((tf._dgrad(down), act_b, tf._dgrad(up)), ep_comm, a2a)
    tail: tuple[tf.Segment, ...]
    if sp:
        tail = (seg((permute_b, router_b, norm2_b, add1_b), tf._conjugate(after_row, t), comm_bytes),
                seg(attn_grads, grad_col, comm_bytes), seg((norm1_b,), None, 0.0))
    else:
        tail = (seg((permute_b, router_b, norm2_b, add1_b, *attn_grads), grad_col, comm_bytes),
                seg((norm1_b,), None, 0.0))
    backward_input = (*head, experts_b, *shared_bwd, *tail)
    backward_weight = (tf._wgrad(down), tf._wgrad(up), *shared_w, tf._wgrad(router), tf._wgrad(attn_out),
                       tf._wgrad(qkv))
    if dtype == "fp8":
        forward, backward_input, backward_weight = tf.fp8_layer(forward, backward_input, backward_weight,
                                                                fp8_recipe, sp_tp=t if sp else 1)
    return tf.LayerOps(forward=forward, backward_input=backward_input, backward_weight=backward_weight)


def model_flops_per_iteration(d: tf.TransformerDims, moe: MoESpec, global_batch: int) -> float:
    """3 × forward FLOPs of the active model: attention, router, top_k experts per token, logits."""
    dense = tf.model_flops_per_iteration(d, global_batch)
    s = d.seq_len
    dense_mlp = d.mlp_matrices * d.hidden * d.ffn_hidden
    moe_mlp = (moe.top_k + moe.shared) * d.mlp_matrices * d.hidden * moe.ffn_hidden + d.hidden * moe.experts
    return dense + 3.0 * global_batch * d.layers * 2.0 * s * (moe_mlp - dense_mlp)


def activation_bytes_per_layer(d: tf.TransformerDims, moe: MoESpec, *, dense_bytes: float, micro_batch: int,
                               tp: int, sequence_parallel: bool, bytes_per_elem: int) -> float:
    """A MoE layer keeps the dense layer's attention activations (Korthikanti et al.'s formula, given as
    ``dense_bytes``) minus its MLP share (``sim.memory.mlp_activation_bytes``: 19·sbh/t with SP, 3sbh + 16sbh/t
    without, for ffn = 4h with dropout), plus
    what the experts keep: the routed tokens' inputs, up-projection outputs and activation outputs, and the
    router's fp32 probabilities."""
    sp = sequence_parallel and tp > 1
    mlp_dense = mlp_activation_bytes(seq=d.seq_len, micro_batch=micro_batch, hidden=d.hidden, tp=tp,
                                     sequence_parallel=sp, bytes_per_elem=bytes_per_elem,
                                     ffn_hidden=d.ffn_hidden, gated_mlp=d.mlp == "swiglu", dropout=d.dropout > 0)
    mine = micro_batch * d.seq_len / tp
    routed = mine * moe.top_k * moe.load_factor
    up_w = (2 if d.mlp == "swiglu" else 1) * moe.ffn_hidden
    experts = routed * (d.hidden + up_w + moe.ffn_hidden) * bytes_per_elem + mine * moe.experts * _FP32
    if moe.shared:  # input (gathered), up outputs and activation output of the shared MLP (1/t of its width)
        sw = moe.shared * moe.ffn_hidden
        experts += micro_batch * d.seq_len * (d.hidden + (up_w // moe.ffn_hidden + 1) * sw / tp) * bytes_per_elem
    return dense_bytes - mlp_dense + experts
