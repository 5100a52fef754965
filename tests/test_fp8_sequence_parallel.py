"""fp8 with sequence parallelism: Transformer Engine gathers quantized tensors (1 byte per element).

Hand counts for one Llama-shaped layer (h 4096, FFN 14336, 8 KV heads, 4096 tokens) on TP 4: every
all-gather moves tokens·h bytes where bf16 moves 2·tokens·h, the reduce-scatters stay bf16, each gathered
input is quantized on this rank's shard before the gather (by its norm under delayed scaling, 1 byte
written instead of 2; else a cast of 2 + 1 bytes per shard element) and transposed (1 + 1 bytes per
gathered element) where its weight gradient needs it.
"""

from __future__ import annotations

import pytest

from sim.workload import transformer as tf

H, FFN, TOKENS, TP = 4096, 14336, 4096, 4
SHARD = TOKENS * H // TP


def _dims() -> tf.TransformerDims:
    return tf.TransformerDims(layers=2, hidden=H, heads=32, ffn_hidden=FFN, vocab=1000, seq_len=TOKENS,
                              kv_heads=8, mlp="swiglu", bias=False, norm="rmsnorm", position="rope", dropout=0.0)


def _ops(dtype: str = "fp8", recipe: str = "delayed", overlap: bool = True, sp: bool = True) -> tf.LayerOps:
    return tf.layer_ops(_dims(), micro_batch=1, tp=TP, sequence_parallel=sp, dtype=dtype, fp8_recipe=recipe,
                        tp_backward_overlap=overlap)


def _comms(segments, kind: str) -> list[float]:
    return [s.comm_bytes for s in segments if s.comm == kind]


def _named(segments, name: str) -> list:
    return [op for s in segments for op in s.ops if op.name == name]


@pytest.mark.parametrize("overlap", [True, False])
def test_all_gathers_move_fp8_bytes_and_reduce_scatters_bf16(overlap: bool) -> None:
    fp8, bf16 = _ops(overlap=overlap), _ops(dtype="bf16", overlap=overlap)
    for segs, ref in ((fp8.forward, bf16.forward), (fp8.backward_input, bf16.backward_input)):
        gathers = _comms(segs, tf.ALL_GATHER)
        assert gathers and gathers == [TOKENS * H * 1.0] * len(gathers)
        assert gathers == [b / 2 for b in _comms(ref, tf.ALL_GATHER)]
        assert _comms(segs, tf.REDUCE_SCATTER) == _comms(ref, tf.REDUCE_SCATTER) != []
    # forward: before QKV and before the MLP; backward: the two output gradients (+ two re-gathers with overlap)
    assert len(_comms(fp8.forward, tf.ALL_GATHER)) == 2
    assert len(_comms(fp8.backward_input, tf.ALL_GATHER)) == (4 if overlap else 2)


def test_gathered_inputs_are_cast_on_the_shard_before_the_gather() -> None:
    """Delayed scaling: the forward's gathered inputs come from norms, which write the fp8 shard
    themselves (1 byte per element where bf16 writes 2); the backward's gathered output gradients are
    cast on the shard (2 + 1 bytes)."""
    lo, bf = _ops(), _ops(dtype="bf16")
    for segs, ref in ((lo.forward, bf.forward), (lo.backward_input, bf.backward_input)):
        blocking = [i for i, s in enumerate(segs) if s.comm == tf.ALL_GATHER and not s.overlap]
        for i in blocking:
            last = segs[i].ops[-1]
            if last.name.startswith("norm"):
                ref_norm = next(op for s in ref for op in s.ops if op.name == last.name)
                assert last.bytes == ref_norm.bytes - SHARD * (2 - 1)
            else:
                assert last.name == "fp8 cast (shard)" and last.bytes == SHARD * (2 + 1)
    assert not _named(lo.forward, "fp8 cast (shard)") and len(_named(lo.backward_input, "fp8 cast (shard)")) == 2
    assert len(_named(_ops(recipe="current").forward, "fp8 cast (shard)")) == 2  # current: no fused norm
    # Forward: QKV's and the MLP's inputs arrive gathered, so their segments cast only the local inputs:
    # the output projection's (tokens × h/t) and the MLP down projection's (tokens × FFN/t).
    casts = _named(lo.forward, "fp8 cast_transpose")
    assert [c.bytes for c in casts] == [TOKENS * (H // TP) * 4, TOKENS * (FFN // TP) * 4]


def test_gathered_tensors_are_transposed_where_their_weight_gradients_need_them() -> None:
    lo = _ops()
    full = TOKENS * H * (1 + 1)
    segs = lo.backward_input
    transposes = _named(segs, "fp8 transpose")
    # the two gathered output gradients (before the row-parallel dgrads) and the two re-gathered inputs
    assert [t.bytes for t in transposes] == [full] * 4
    order = [op.name for s in segs for op in s.ops]
    for wgrad in ("mlp_gate_up.wgrad", "qkv.wgrad"):
        assert order[order.index(wgrad) - 1] == "fp8 transpose"
    for dgrad in ("mlp_down.dgrad", "attn_out.dgrad"):
        assert order[order.index(dgrad) - 1] == "fp8 transpose"
    assert not _named(lo.forward, "fp8 transpose")  # the forward gathers row-wise data only


def test_split_backward_transposes_beside_its_weight_gradients() -> None:
    lo = _ops(overlap=False)
    names = [op.name for op in lo.backward_weight]
    assert names == ["mlp_down.wgrad", "fp8 transpose", "mlp_gate_up.wgrad", "attn_out.wgrad",
                     "fp8 transpose", "qkv.wgrad"]
    assert all(op.bytes == TOKENS * H * 2 for op in lo.backward_weight if op.name == "fp8 transpose")


def test_current_scaling_reduces_the_shard_amax_over_tp_before_the_cast() -> None:
    lo = _ops(recipe="current")
    for segs in (lo.forward, lo.backward_input):
        for i, s in enumerate(segs):
            if s.comm == tf.ALL_GATHER and not s.overlap:
                amax_seg = segs[i - 1]
                assert amax_seg.comm == tf.ALL_REDUCE and amax_seg.comm_bytes == 4
                assert amax_seg.ops[-1].name == "fp8 amax (shard)" and amax_seg.ops[-1].bytes == SHARD * 2
                assert [op.name for op in s.ops] == ["fp8 cast (shard)"]
    delayed = _ops()
    assert not [s for s in delayed.forward if s.comm == tf.ALL_REDUCE]
    assert len([s for s in lo.forward if s.comm == tf.ALL_REDUCE]) == 2


def test_without_sequence_parallelism_fp8_casts_are_unchanged() -> None:
    """Without SP nothing is gathered: current scaling casts every input in the segment (QKV's tokens × h
    and the output projection's tokens × h/t, 4 bytes each); delayed scaling fuses QKV's into its norm."""
    lo = _ops(sp=False, recipe="current")
    assert not _named(lo.forward, "fp8 cast (shard)") and not _named(lo.backward_input, "fp8 transpose")
    first = lo.forward[0].ops[1]
    assert first.name == "fp8 cast_transpose" and first.bytes == TOKENS * (H + H // TP) * 4
    delayed = _ops(sp=False).forward[0].ops[0]
    assert delayed.name == "fp8 cast_transpose" and delayed.bytes == TOKENS * (H // TP) * 4
