"""Megatron's fusion switches (training.fusion), the fused softmax's shape limits, and scatter/gather p2p.

Byte counts against hand calculations of the kernels Megatron's eager fallbacks launch; simulated step
times against the sum of the added kernels' prices; the pipeline's sends against the activation size.
"""

from __future__ import annotations

import pytest

from sim.api import simulate
from sim.cost.roofline import RooflineCostModel
from sim.engine.timeline import COMM_PP
from sim.errors import ScenarioError
from sim.hardware.gpu import GPU_PRESETS
from sim.scenario import scenario_from_dict
from sim.workload.attention import standard_attention
from sim.workload.kernels import KERNEL_SETS, fused_softmax_runs, with_overrides
from sim.workload.transformer import TransformerDims, layer_ops

D = TransformerDims(layers=2, hidden=1024, heads=16, ffn_hidden=4096, vocab=1024, seq_len=1024)


def _softmax_bytes(ops) -> float:
    """Bytes of every op of the attention core but its GEMMs and dropout (the softmax and its wrappers)."""
    return sum(op.bytes for op in ops if op.kind != "gemm" and "dropout" not in op.name)


@pytest.mark.parametrize(("dtype", "fwd_per_elem", "bwd_per_elem"), [
    ("bf16", 6 + 8 + 8 + 8 + 6, 6 + 12 + 8 + 8 + 6),  # cast, scale, mask, softmax, cast back (fp32 inside)
    ("fp32", 8 + 8 + 8, 12 + 8 + 8),  # no casts: scale, mask, softmax
])
def test_torch_softmax_moves_its_five_kernels_bytes(dtype, fwd_per_elem, bwd_per_elem):
    b, t = 2, 4
    scores = b * (D.heads // t) * D.seq_len ** 2
    fwd, bwd = standard_attention(D, b, t, dtype, dropout_kernel=True, fused_softmax=False)
    assert _softmax_bytes(fwd) == scores * fwd_per_elem
    assert _softmax_bytes(bwd) == scores * bwd_per_elem
    e = 2 if dtype == "bf16" else 4
    fused_f, fused_b = standard_attention(D, b, t, dtype, dropout_kernel=True)
    assert _softmax_bytes(fused_f) == scores * 2 * e and _softmax_bytes(fused_b) == scores * 3 * e
    # every fallback kernel is part of the attention core (selective recompute re-runs it)
    assert all(op.name.startswith("attention.") for op in fwd)


def test_fused_softmax_shape_limits_per_code_base():
    m21, m22, te = KERNEL_SETS["megatron-lm-2021"], KERNEL_SETS["megatron-lm-2022"], KERNEL_SETS["transformer-engine"]
    assert fused_softmax_runs(m21, 2048, 12, "bf16") and not fused_softmax_runs(m21, 4096, 12, "bf16")
    assert fused_softmax_runs(m22, 4096, 12, "fp16") and not fused_softmax_runs(m22, 8192, 12, "fp16")
    assert fused_softmax_runs(te, 8192, 12, "bf16") and not fused_softmax_runs(te, 16384, 12, "bf16")
    assert fused_softmax_runs(m22, 2052, 12, "bf16") and not fused_softmax_runs(te, 2052, 12, "bf16")  # s % 8
    assert not fused_softmax_runs(m21, 2048, 6, "bf16")  # b·heads/t not a multiple of 4
    assert not fused_softmax_runs(m21, 16, 12, "bf16")  # 16 < s
    assert not fused_softmax_runs(m21, 2048, 12, "fp32")  # 16-bit scores only
    assert not fused_softmax_runs(with_overrides(m21, {"masked_softmax": False}), 2048, 12, "bf16")
    assert not fused_softmax_runs(KERNEL_SETS["pytorch-fsdp-2023"], 2048, 12, "bf16")  # eager torch


def _forward_ops(**kw):
    lo = layer_ops(D, micro_batch=2, tp=2, sequence_parallel=False, dtype="bf16", attention="standard", **kw)
    return [op for seg in lo.forward for op in seg.ops], [op for seg in lo.backward_input for op in seg.ops]


def _bytes(ops) -> float:
    return sum(op.bytes for op in ops)


@pytest.mark.parametrize("bias", [True, False])
def test_unfused_bias_dropout_add_adds_the_eager_kernels_bytes(bias):
    """Fused: branch and residual in, sum out, 1-byte mask (3e + 1 per element). Eager: x + bias (2e),
    dropout (2e + 1), residual + out (3e): 4e more with a bias, 2e without; the backward is unchanged."""
    d = TransformerDims(**{**D.__dict__, "bias": bias})
    n, e = 2 * d.seq_len * d.hidden, 2  # tokens × h per dropout-add, two per layer
    fused = layer_ops(d, micro_batch=2, tp=2, sequence_parallel=False, dtype="bf16")
    eager = layer_ops(d, micro_batch=2, tp=2, sequence_parallel=False, dtype="bf16", bias_dropout_fusion=False)
    f_ops = [op for s in fused.forward for op in s.ops]
    e_ops = [op for s in eager.forward for op in s.ops]
    assert _bytes(e_ops) - _bytes(f_ops) == 2 * n * e * (4 if bias else 2)
    assert len(e_ops) - len(f_ops) == 2 * (2 if bias else 1)
    assert _bytes(op for s in eager.backward_input for op in s.ops) == _bytes(
        op for s in fused.backward_input for op in s.ops)


def test_unfused_bias_gelu_adds_the_bias_kernel():
    """F.gelu(x + bias): one more pass in and out over the b·s × ffn/t activation; nothing for SwiGLU
    or bias-free layers (no bias to add)."""
    f, _ = _forward_ops()
    u, _ = _forward_ops(bias_gelu_fusion=False)
    assert _bytes(u) - _bytes(f) == 2 * (2 * D.seq_len) * (D.ffn_hidden // 2) * 2
    assert [op.name for op in u if op.name not in {o.name for o in f}] == ["mlp_bias_add"]
    for d in (TransformerDims(**{**D.__dict__, "bias": False}), TransformerDims(**{**D.__dict__, "mlp": "swiglu"})):
        a = layer_ops(d, micro_batch=1, tp=1, sequence_parallel=False, dtype="bf16")
        b = layer_ops(d, micro_batch=1, tp=1, sequence_parallel=False, dtype="bf16", bias_gelu_fusion=False)
        assert a == b


def _gpt(fusion=None, kernels="megatron-lm-2021", seq=1024, **par) -> dict:
    tr = {"global_batch": 4, "micro_batch": 1, "kernels": kernels, "precision": "bf16"}
    if fusion is not None:
        tr["fusion"] = fusion
    gpus = par.get("data", 2) * par.get("tensor", 1) * par.get("pipeline", 1)
    return {"name": "fusion", "cluster": {"nodes": 1, "gpus_per_node": gpus, "gpu": "A100-80GB",
                                          "gpu_speed_spread": 0.0},
            "model": {"kind": "transformer", "layers": 4, "hidden": 1024, "heads": 16, "ffn_hidden": 4096,
                      "vocab": 8192, "seq_len": seq, "attention": "standard"},
            "parallel": {"data": 2, **par}, "training": tr, "simulation": {"symmetry": "off"}}


def test_unfused_step_costs_exactly_the_added_kernels():
    """Data parallelism only: the fused and the eager run differ on GPU 0's compute stream by the priced
    kernels Megatron's fallbacks add, forward and backward, for 4 layers × 2 micro-batches."""
    fused = simulate(scenario_from_dict(_gpt()))
    eager = simulate(scenario_from_dict(_gpt(fusion=False)))
    cost = RooflineCostModel(GPU_PRESETS["A100-80GB"])
    d = TransformerDims(layers=4, hidden=1024, heads=16, ffn_hidden=4096, vocab=8192, seq_len=1024)
    kw = dict(micro_batch=1, tp=1, sequence_parallel=False, dtype="bf16", attention="standard",
              attention_dropout_kernel=True)
    a = layer_ops(d, **kw)
    b = layer_ops(d, **kw, bias_gelu_fusion=False, bias_dropout_fusion=False, fused_softmax=False)

    def priced(lo) -> float:
        return sum(cost.op_time_s(op) for s in (*lo.forward, *lo.backward_input) for op in s.ops)

    def compute_s(res) -> float:
        return sum(x.dur_s for x in res.timeline.spans if x.gpu == 0 and x.stream == "compute")

    expected = 4 * 2 * (priced(b) - priced(a))
    assert expected > 0
    assert compute_s(eager) - compute_s(fused) == pytest.approx(expected, rel=1e-9)
    assert eager.summary["step_time_s"] > fused.summary["step_time_s"]


def test_cross_entropy_fusion_switch_runs_megatrons_unfused_loss_under_transformer_engine():
    """training.fusion {cross_entropy: false} under kernels transformer-engine (NeMo configs that do not
    set cross_entropy_loss_fusion): GPU 0's compute stream gains exactly the priced difference between
    the unfused and the fused loss kernels of its 2 micro-batches; fusion false turns it off too."""
    from sim.training.step_work import blocks, kernel_set
    from sim.workload.transformer import head_ops

    fused = simulate(scenario_from_dict(_gpt(kernels="transformer-engine")))
    sc = scenario_from_dict(_gpt(kernels="transformer-engine", fusion={"cross_entropy": False}))
    assert not kernel_set(sc).fused_cross_entropy and kernel_set(sc).bias_gelu_fusion
    assert not kernel_set(scenario_from_dict(_gpt(kernels="transformer-engine", fusion=False))).fused_cross_entropy
    eager = simulate(sc)
    cost = RooflineCostModel(GPU_PRESETS["A100-80GB"])
    d = TransformerDims(layers=4, hidden=1024, heads=16, ffn_hidden=4096, vocab=8192, seq_len=1024)
    kw = dict(micro_batch=1, tp=1, sequence_parallel=False, dtype="bf16", persistent_norm=True)

    host_s = KERNEL_SETS["transformer-engine"].host_dispatch_us * 1e-6  # TE's eager dispatch bound

    def priced(lo) -> float:  # as the builder prices them: each kernel at least one host dispatch
        return sum(b.dur_s for b in blocks(cost, (*lo.forward, *lo.backward_input), host_s=host_s))

    def compute_s(res) -> float:
        return sum(x.dur_s for x in res.timeline.spans if x.gpu == 0 and x.stream == "compute")

    expected = 2 * (priced(head_ops(d, **kw, fused_ce=False)) - priced(head_ops(d, **kw)))
    assert expected > 0
    assert compute_s(eager) - compute_s(fused) == pytest.approx(expected, rel=1e-6)


def test_long_sequence_falls_back_to_torch_softmax_and_keeps_fp32_probabilities():
    """Megatron-LM 2021's fused softmax stops at s = 2048: at 4096 the torch path runs (and its backward
    keeps the fp32 output, 2 more bytes per score element); Megatron-LM 2022's kernel goes to 4096."""
    r21 = simulate(scenario_from_dict(_gpt(seq=4096)))
    r22 = simulate(scenario_from_dict(_gpt(seq=4096, kernels="megatron-lm-2022")))
    extra = 2 * 1 * 16 * 4096 ** 2 * 4  # 2 bytes × b·heads·s², 4 layers (no pipeline: all in flight)
    act21 = r21.summary["memory_by_stage"][0]["activations"]
    forced = simulate(scenario_from_dict(_gpt(seq=4096, kernels="megatron-lm-2022",
                                              fusion={"masked_softmax": False})))
    assert forced.summary["memory_by_stage"][0]["activations"] - r22.summary["memory_by_stage"][0][
        "activations"] == pytest.approx(extra, rel=1e-9)
    assert act21 == pytest.approx(forced.summary["memory_by_stage"][0]["activations"], rel=1e-9)


def test_scatter_gather_off_sends_the_whole_activation_per_tp_rank():
    """Megatron's scatter/gather: each of t TP ranks sends 1/t of b·s·h·2 bytes (then all-gathers it);
    off, each sends all of it, which across nodes takes longer."""
    base = {"tensor": 2, "pipeline": 2, "data": 2}
    act = 1 * 1024 * 1024 * 2

    def sends(sg):
        spec = _gpt(**base)
        spec["cluster"].update(nodes=2, gpus_per_node=4, inter_node="hdr", nics_per_node=4)  # stages apart
        if sg is not None:
            spec["parallel"]["scatter_gather"] = sg
        res = simulate(scenario_from_dict(spec))
        return {x.args.get("bytes") for x in res.timeline.spans if x.category == COMM_PP and x.gpu == 0
                and x.stream == "p2p"}, res.summary["step_time_s"]

    (on, t_on), (off, t_off) = sends(None), sends(False)
    assert on == {act / 2} and off == {act}
    assert t_off > t_on


def test_fusion_shorthand_partial_mapping_and_bad_keys():
    sc = scenario_from_dict(_gpt(fusion=False))
    # the shorthand leaves gradient accumulation as the kernel set ran it (Megatron-LM 2021: not fused)
    assert sc.training.fusion.model_dump() == {"bias_gelu": False, "bias_dropout_add": False, "masked_softmax": False,
                                               "cross_entropy": False, "gradient_accumulation": False}
    sc = scenario_from_dict(_gpt(fusion={"bias_gelu": False}))
    assert sc.training.fusion.model_dump() == {"bias_gelu": False, "bias_dropout_add": True, "masked_softmax": True,
                                               "cross_entropy": False,  # megatron-lm-2021: the unfused loss
                                               "gradient_accumulation": False}
    sc = scenario_from_dict(_gpt(kernels="transformer-engine", fusion=False))
    assert sc.training.fusion.gradient_accumulation is True  # Transformer Engine's stack fused it
    sc = scenario_from_dict(_gpt(kernels="pytorch-fsdp-2023"))
    assert sc.training.fusion.masked_softmax is False  # eager torch has no fused softmax
    assert sc.parallel.scatter_gather is False
    with pytest.raises(ScenarioError, match="fusion"):
        scenario_from_dict(_gpt(fusion={"bias_gleu": False}))
    with pytest.raises(ScenarioError, match="must be true, false or a mapping"):
        scenario_from_dict(_gpt(fusion="off"))


def test_unfused_cross_entropy_moves_megatrons_passes_over_the_fp32_logits():
    """Megatron-LM's loss before Megatron-Core's fusion: logits.float() (2 + 4 bytes per logit), max (4),
    subtract (8), exp (8), sum (4), divide (8) forward; mul_ (8) and the cast back (4 + 2) backward.
    The 2021/2022 Megatron sets and Megatron-DeepSpeed run it; Transformer Engine's (NeMo) the fused one,
    Megatron-Core's four torch.compile'd steps: cast + max (2 + 4), exp-sum into a fresh buffer (4 + 4) and
    its copy back (4 + 4), divide (4 + 4); backward the scatter's copy (4 + 4), then read 4, write the
    mutated softmax 4 and the bf16 gradient 2."""
    from sim.workload.transformer import head_ops

    b, t = 2, 4
    kw = dict(micro_batch=b, tp=t, sequence_parallel=False, dtype="bf16")
    n, tokens = b * D.seq_len * (D.vocab // t), b * D.seq_len

    def ce_bytes(lo, backward):
        segs = lo.backward_input if backward else lo.forward
        return sum(op.bytes for s in segs for op in s.ops
                   if op.kind != "gemm" and "norm" not in op.name)

    fused, eager = head_ops(D, **kw), head_ops(D, **kw, fused_ce=False)
    small = tokens * (8 + 2 + 4) + 4 * tokens * 4  # target gather and the per-token loss, both alike
    assert ce_bytes(eager, False) == n * 38 + 2 * tokens * 4 + small  # max and sum write one fp32 per token
    assert ce_bytes(eager, True) == n * 14
    assert ce_bytes(fused, False) == n * 30 + 2 * tokens * 4 + small
    assert ce_bytes(fused, True) == n * 18
    assert not KERNEL_SETS["megatron-lm-2021"].fused_cross_entropy
    assert not KERNEL_SETS["megatron-deepspeed-2022"].fused_cross_entropy
    assert KERNEL_SETS["transformer-engine"].fused_cross_entropy


def test_xentropy_loss_reads_the_logits_twice_forward_and_once_backward():
    """flash-attn's fused CUDA cross-entropy (llm-foundry's default loss_fn): forward one block per token
    reads the bf16 logits for max and sum, then again for the exponent sum (2 + 2 bytes per logit) and
    writes the loss and log-sum-exp (4 + 4 per token, beside the 8-byte label); backward reads the logits
    and writes the gradient (2 + 2). Far below Megatron-Core's compiled loss (30 + 18)."""
    from sim.workload.transformer import head_ops

    b, t = 2, 1
    kw = dict(micro_batch=b, tp=t, sequence_parallel=False, dtype="bf16")
    n, tokens = b * D.seq_len * D.vocab, b * D.seq_len
    lo = head_ops(D, **kw, ce_kernel="xentropy")
    ops = {op.name: op for s in (*lo.forward, *lo.backward_input) for op in s.ops}
    assert ops["ce xentropy"].bytes == 4 * n + tokens * (8 + 4 + 4)
    assert ops["ce xentropy.bwd"].bytes == 4 * n
    assert not any(name.startswith("ce_") for name in ops)
    assert KERNEL_SETS["pytorch-fsdp-2023"].cross_entropy_kernel == "xentropy"
    assert KERNEL_SETS["transformer-engine"].cross_entropy_kernel == "native"
    with pytest.raises(ValueError, match="cross-entropy kernel"):
        head_ops(D, **kw, ce_kernel="liger")


def test_te_triton_loss_moves_ten_bytes_per_logit_and_the_scenario_key_selects_it():
    """Transformer Engine's Triton cross-entropy (v2.9): online softmax reads the bf16 logits (2), the
    loss kernel reads them again and writes the gradient in place (2 + 2); backward scales it (2 + 2).
    training.cross_entropy_kernel te selects it under any kernel set; auto keeps the set's own."""
    from sim.training.step_work import kernel_set
    from sim.workload.transformer import head_ops

    b, t = 1, 2
    kw = dict(micro_batch=b, tp=t, sequence_parallel=False, dtype="bf16")
    n, tokens = b * D.seq_len * (D.vocab // t), b * D.seq_len
    lo = head_ops(D, **kw, ce_kernel="te")
    ops = {op.name: op for s in (*lo.forward, *lo.backward_input) for op in s.ops}
    assert ops["ce te online_softmax"].bytes == 2 * n + tokens * (8 + 3 * 4)
    assert ops["ce te loss+grad"].bytes == 4 * n + tokens * 4 * 4
    assert ops["ce te grad scale"].bytes == 4 * n
    stats = [(s.comm, s.comm_bytes) for s in lo.forward if s.comm]
    assert stats == [("all_gather", 3 * 4 * tokens * t)]  # (max, sum, target logit) per token, every rank
    assert kernel_set(scenario_from_dict(_gpt(kernels="transformer-engine"))).cross_entropy_kernel == "native"
    te = scenario_from_dict({**_gpt(kernels="transformer-engine"),
                             "training": {**_gpt(kernels="transformer-engine")["training"],
                                          "cross_entropy_kernel": "te"}})
    assert kernel_set(te).cross_entropy_kernel == "te"
    with pytest.raises(ScenarioError, match="cross_entropy_kernel"):
        scenario_from_dict({**_gpt(), "training": {**_gpt()["training"], "cross_entropy_kernel": "liger"}})


def test_loss_memory_follows_the_loss_kernel():
    """The last stage's analytic peak holds the loss's logits as its kernels keep them: Megatron-Core's
    compiled loss 4 kept + 6 at its peak (the fresh fp32 buffer and the 16-bit logits), Transformer
    Engine's Triton loss only the 16-bit logits (2, the gradient written over them): 8 bytes per logit
    apart, for b·s·V/t logits."""
    from sim.build import build_job, cost_model_for

    def peak(kernel: str) -> float:
        d = _gpt(kernels="transformer-engine")
        d["training"]["cross_entropy_kernel"] = kernel
        sc = scenario_from_dict(d)
        _, info = build_job(sc, cost_model_for(sc))
        return info.memory_by_stage[-1]["peak"]

    d = _gpt()["model"]
    logits = 1 * d["seq_len"] * d["vocab"]  # micro-batch 1, tensor 1
    assert peak("native") - peak("te") == pytest.approx(8 * logits)
    assert peak("xentropy") - peak("te") == pytest.approx(2 * logits)
