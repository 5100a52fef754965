"""Context parallelism: a sequence split over ``cp`` GPUs, attention completed by exchanging K/V.

Each GPU of a CP group holds s/cp tokens of every sequence, so every GEMM, norm and activation works on
s/cp tokens and activation memory divides by cp. Attention needs every key and value (causal masking is
balanced by Megatron's 2·cp-chunk zig-zag split, so every GPU does 1/cp of the score work):

- ring (Liu et al. 2023, "Ring Attention"; Megatron-Core's default): cp steps; at each, the GPU computes
  its queries against the K/V block it holds while it passes that block to the next GPU of the ring and
  receives the previous one, so the transfer hides behind the compute. Forward sends the K and V of s/cp
  tokens per step: b·(s/cp)·2·kv_dim/t elements; backward sends K, V and their gradients (twice that).
- all_gather (Llama 3, Dubey et al. 2024 §3.3.2): all-gather the K/V of the whole sequence first, then
  one attention op over it; backward reduce-scatters dK/dV. Not overlapped, but GQA's small K/V keeps it
  cheap.

A layer's ops come from the dense workload built for s/cp tokens; here its attention op (one K/V block)
becomes a ring block the executor repeats cp times, or an all-gather followed by cp× the work.

The ring's bookkeeping kernels run too, as Transformer Engine's ``AttnFuncWithCPAndKVP2P`` (transformer_engine/
pytorch/attention/dot_product_attention/context_parallel.py; Megatron-Core runs context parallelism only
through it) launches them: forward, ``torch.cat`` packs K and V into the send buffer, each step leaves a
partial output and log-sum-exp that ``flash_attn_fwd_out_correction`` (and ``_init`` for step 0) rescale
and sum into the output after the loop (one fused elementwise kernel per step, reading the step's output
and read-modify-writing the sum), with a log-sum-exp merge per step; backward, K and V are copied into the
buffer again and each step's dQ, dK and dV are added (``add_``; step 0 copies) into the accumulators. Under
the causal zig-zag split some steps touch half of these tensors on some ranks; the GPU priced here is the
one that does the full-size work at every step (the forward's last rank), which the others wait for at the
next exchange.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sim.units import DTYPE_BYTES, storage_dtype
from sim.workload import transformer as tf
from sim.workload.ops import ATTENTION, Op, elementwise

RING = "ring@cp"  # executor: run the block cp times, each overlapped with a K/V exchange over the CP group
ALL_GATHER_CP = "all_gather@cp"
REDUCE_SCATTER_CP = "reduce_scatter@cp"
ALGORITHMS = ("ring", "all_gather")


def local_dims(d: tf.TransformerDims, cp: int) -> tf.TransformerDims:
    """The dims one GPU of the CP group works on: s/cp tokens per sequence."""
    return d if cp == 1 else replace(d, seq_len=d.seq_len // cp)


def kv_block_bytes(d: tf.TransformerDims, *, micro_batch: int, tp: int, cp: int, dtype: str) -> float:
    """K and V of one GPU's s/cp tokens (its TP share of the KV heads): one ring step's forward transfer."""
    e = DTYPE_BYTES[storage_dtype(dtype)]
    return micro_batch * (d.seq_len // cp) * 2 * (d.kv_dim // tp) * e


def _scaled(op: Op, factor: int) -> Op:
    """``op`` repeated ``factor`` times as one kernel (the all-gather variant's attention over s keys)."""
    return replace(op, flops=op.flops * factor, bytes=op.bytes * factor, batch=op.batch * factor)


def _split(segments: tuple[tf.Segment, ...], attention_block: Callable[[Op], list[tf.Segment]]) -> tuple[tf.Segment, ...]:
    """Cut every segment holding an attention op into: the ops before, the attention block(s), the ops
    after with the segment's own collective."""
    out: list[tf.Segment] = []
    for seg in segments:
        idx = [i for i, op in enumerate(seg.ops) if op.kind == ATTENTION]
        if not idx:
            out.append(seg)
            continue
        i = idx[0]
        if seg.ops[:i]:
            out.append(tf.Segment(seg.ops[:i]))
        out.extend(attention_block(seg.ops[i]))
        out.append(replace(seg, ops=seg.ops[i + 1:]))
    return tuple(out)


_LSE_BYTES = 4  # the log-sum-exp is fp32


def ring_forward_kernels(attn: Op, *, cp: int, kv_bytes: float) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """Transformer Engine's kernels before and after a forward ring of ``cp`` steps whose attention op (one
    K/V block, for s/cp queries) is ``attn``. ``kv_bytes``: K and V of the s/cp local tokens (one step's
    transfer). Bytes as the module docstring says: a copy moves 2e per element, a rescale-and-add 3e."""
    e = DTYPE_BYTES[attn.dtype]
    q_elems = attn.m * attn.k * attn.batch  # Q (and O) elements of this GPU: b · s/cp · h/t
    lse = attn.m * attn.batch * _LSE_BYTES
    pack = elementwise("cp.kv_pack", 2 * kv_bytes, attn.dtype)  # torch.cat(k, v): read and write both
    out = (elementwise("cp.out_correction", 2 * e * q_elems + lse, attn.dtype),
           *(elementwise("cp.out_correction", 3 * e * q_elems + lse, attn.dtype) for _ in range(cp - 1)),
           *(elementwise("cp.lse_correction", 3 * lse, attn.dtype) for _ in range(cp - 1)))
    return (pack,), out


def ring_backward_kernels(attn: Op, *, cp: int, kv_bytes: float) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """The same before and after a backward ring: K and V copied into the buffer again, then per step dQ,
    dK and dV copied (step 0: 2e per element) or added (3e) into the accumulators."""
    e = DTYPE_BYTES[attn.dtype]
    q_elems = attn.m * attn.k * attn.batch  # dQ elements of this GPU
    kv_half = kv_bytes / 2  # K (or V) of the local tokens, in bytes
    grads = []
    for step in range(cp):
        per = 2 if step == 0 else 3
        grads += [elementwise("cp.dq_correction", per * e * q_elems, attn.dtype),
                  elementwise("cp.dkv_correction", per * kv_half, attn.dtype),
                  elementwise("cp.dkv_correction", per * kv_half, attn.dtype)]
    return (elementwise("cp.kv_pack", 2 * kv_bytes, attn.dtype),), tuple(grads)


def is_ring_bookkeeping(op: Op) -> bool:
    """A kernel of ``ring_forward_kernels``/``ring_backward_kernels`` (the forward's re-run with the attention when it is recomputed)."""
    return op.name.startswith("cp.")


def context_layer_ops(lo: tf.LayerOps, *, cp: int, algorithm: str, kv_bytes: float) -> tf.LayerOps:
    """A layer's ops (built for s/cp tokens) with its attention run across the CP group."""
    if cp == 1:
        return lo
    if algorithm == "ring":
        def fwd(op: Op) -> list[tf.Segment]:
            before, after = ring_forward_kernels(op, cp=cp, kv_bytes=kv_bytes)
            return [tf.Segment(before), tf.Segment((op,), RING, kv_bytes), tf.Segment(after)]

        def bwd(op: Op) -> list[tf.Segment]:
            before, after = ring_backward_kernels(op, cp=cp, kv_bytes=kv_bytes)
            # K, V and dK, dV travel
            return [tf.Segment(before), tf.Segment((op,), RING, 2 * kv_bytes), tf.Segment(after)]
    else:
        def fwd(op: Op) -> list[tf.Segment]:
            return [tf.Segment((), ALL_GATHER_CP, cp * kv_bytes), tf.Segment((_scaled(op, cp),))]

        def bwd(op: Op) -> list[tf.Segment]:
            return [tf.Segment((), ALL_GATHER_CP, cp * kv_bytes),
                    tf.Segment((_scaled(op, cp),), REDUCE_SCATTER_CP, cp * kv_bytes)]
    return tf.LayerOps(forward=_split(lo.forward, fwd), backward_input=_split(lo.backward_input, bwd),
                       backward_weight=lo.backward_weight)
