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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sim.units import DTYPE_BYTES, storage_dtype
from sim.workload import transformer as tf
from sim.workload.ops import ATTENTION, Op

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


def context_layer_ops(lo: tf.LayerOps, *, cp: int, algorithm: str, kv_bytes: float) -> tf.LayerOps:
    """A layer's ops (built for s/cp tokens) with its attention run across the CP group."""
    if cp == 1:
        return lo
    if algorithm == "ring":
        def fwd(op: Op) -> list[tf.Segment]:
            return [tf.Segment((op,), RING, kv_bytes)]

        def bwd(op: Op) -> list[tf.Segment]:
            return [tf.Segment((op,), RING, 2 * kv_bytes)]  # K, V and dK, dV travel
    else:
        def fwd(op: Op) -> list[tf.Segment]:
            return [tf.Segment((), ALL_GATHER_CP, cp * kv_bytes), tf.Segment((_scaled(op, cp),))]

        def bwd(op: Op) -> list[tf.Segment]:
            return [tf.Segment((), ALL_GATHER_CP, cp * kv_bytes),
                    tf.Segment((_scaled(op, cp),), REDUCE_SCATTER_CP, cp * kv_bytes)]
    return tf.LayerOps(forward=_split(lo.forward, fwd), backward_input=_split(lo.backward_input, bwd),
                       backward_weight=lo.backward_weight)
