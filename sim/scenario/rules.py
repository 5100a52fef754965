"""Cross-section rules: what one section alone cannot check (layout × GPU count, layers × stages,
dimensions × tensor width, batch × data, precision × GPU, collective × cluster, ...).

``SCENARIO_RULES`` runs in order after every section validated; each raises a ``RuleError`` whose field
is the full dotted path from the scenario's root.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sim.hardware.gpu import GPU_PRESETS
from sim.scenario.base import PRECISIONS, RuleError, show
from sim.scenario.model import CollectiveModel, TransformerModel
from sim.scenario.parallel import Parallel
from sim.schedules.actions import interleaved_group_problem

if TYPE_CHECKING:
    from sim.scenario.schema import Scenario


def _layout_fix(p: Parallel, n: int, tensor_ok: bool = True) -> str:
    """--set settings that make data×tensor×pipeline×context = n: one degree changed where one can be
    (context parallelism counts in every product: a fix that ignored it would miss n by that factor), else
    data = n/context on one tensor rank and one stage. Never a tensor width where ``tensor_ok`` is False:
    only transformers are split over tensor ranks, so there a tensor width > 1 is reset to 1 first (the
    tensor-model rule would refuse it once the product is right)."""
    d, t, pp, c = p.data, p.tensor, p.pipeline, p.cp
    reset = [] if tensor_ok or t == 1 else ["--set parallel.tensor=1"]
    if reset:
        t = 1
    if n % (t * pp * c) == 0:
        data = n // (t * pp * c)  # equal to d only where resetting tensor alone fixes the product
        return " ".join(reset + ([f"--set parallel.data={data}"] if data != d else []))
    if n % (d * t * c) == 0:
        return " ".join([*reset, f"--set parallel.pipeline={n // (d * t * c)}"])
    if n % (d * pp * c) == 0 and tensor_ok:
        return f"--set parallel.tensor={n // (d * pp * c)}"
    keep_c = n % c == 0  # keep context parallelism where n allows it
    wanted = {"data": n // c if keep_c else n, "tensor": 1, "pipeline": 1, "context": c if keep_c else 1}
    have = {"data": d, "tensor": p.tensor, "pipeline": pp, "context": c}
    return " ".join(f"--set parallel.{k}={v}" for k, v in wanted.items() if v != have[k])


def _sections(sc: Scenario) -> None:
    if sc.is_collective:
        return
    examples = {"parallel": f"{{data: {sc.total_gpus}}}", "training": "{global_batch: 8}"}
    for section, example in examples.items():
        if getattr(sc, section) is None:
            raise RuleError(
                section,
                "missing",
                f"a {sc.model.kind} model needs a {section} section",
                f"add {section}: {example}",
            )


def _layout(sc: Scenario) -> None:
    p, c = sc.parallel, sc.cluster
    if p is not None and p.world_size != c.total_gpus:
        raise RuleError(
            "parallel",
            (f"data×tensor×pipeline×context = {p.data}×{p.tensor}×{p.pipeline}×{p.cp} = {p.world_size}"
             if p.cp > 1 else f"data×tensor×pipeline = {p.data}×{p.tensor}×{p.pipeline} = {p.world_size}"),
            f"must equal the GPU count nodes×gpus_per_node = {c.nodes}×{c.gpus_per_node} = {c.total_gpus}",
            f"make the product {c.total_gpus}, e.g. {_layout_fix(p, c.total_gpus, isinstance(sc.model, TransformerModel))}",
        )


def _stages(sc: Scenario) -> None:
    p, m = sc.parallel, sc.model
    if p is None or isinstance(m, CollectiveModel):
        return
    chunks = p.pipeline * p.virtual_stages
    # Given stage_layers, _stage_layers checks them (a transformer's first and last chunk may hold only
    # the embedding or the head, as Llama 3's pipeline did: one layer fewer on the first and last stage).
    if m.num_layers < chunks and p.stage_layers is None:
        raise RuleError(
            "model.layers",
            f"{m.num_layers} layers",
            f"fewer than pipeline×virtual_stages = {p.pipeline}×{p.virtual_stages} = {chunks} model chunks",
            f"use pipeline ≤ {max(1, m.num_layers // p.virtual_stages)} (adjusting data) or a deeper model",
        )


def _experts(sc: Scenario) -> None:
    p, m = sc.parallel, sc.model
    shared = getattr(m, "shared_experts", None)
    width = getattr(m, "expert_ffn_hidden", None) or getattr(m, "ffn_hidden", None)
    if p is not None and shared and width and (shared * width) % p.tensor:
        raise RuleError("model.shared_experts", show(shared),
                        f"the shared experts' width shared_experts × expert_ffn_hidden must divide by "
                        f"tensor = {p.tensor} (they are split like the dense MLP)", "change tensor or the widths")
    if p is None or p.ep == 1:
        return
    experts = getattr(m, "experts", None)
    if experts is None:
        raise RuleError("parallel.expert", show(p.expert), "expert parallelism needs a mixture-of-experts model",
                        "set model.experts, or remove parallel.expert")
    if experts % p.ep:
        raise RuleError("parallel.expert", show(p.expert), f"must divide model.experts = {experts}",
                        f"use a divisor of {experts}")
    if p.data % p.ep:
        raise RuleError("parallel.expert", show(p.expert),
                        f"expert-parallel GPUs are data-parallel ranks: must divide data = {p.data}",
                        "use a divisor of parallel.data")
    if p.zero == 3:
        raise RuleError("parallel.zero", "3", "ZeRO-3 with expert parallelism is not modelled",
                        "use zero ≤ 2, or expert: 1")


def _tensor_model(sc: Scenario) -> None:
    """Tensor parallelism splits a transformer's attention and MLP (Megatron-style); synthetic and layer-list
    models have no such split in dtsim, so tensor > 1 would only add idle GPUs: refused, not ignored."""
    p, m = sc.parallel, sc.model
    if p is None or p.tensor == 1 or isinstance(m, TransformerModel | CollectiveModel):
        return
    raise RuleError("parallel.tensor", show(p.tensor),
                    f"tensor parallelism needs a transformer model (dtsim splits a transformer's attention and MLP "
                    f"over the tensor ranks; a {m.kind} model has no such split)",
                    f"set parallel.tensor: 1 (e.g. --set parallel.tensor=1 --set parallel.data={p.data * p.tensor}), "
                    "or use a transformer model")


def _context(sc: Scenario) -> None:
    p, m = sc.parallel, sc.model
    if p is None or (p.cp == 1 and p.context_attention is None):
        return
    if p.cp == 1:
        raise RuleError("parallel.context_attention", show(p.context_attention),
                        "applies to context parallelism", "set parallel.context > 1, or remove it")
    if not isinstance(m, TransformerModel):
        raise RuleError("parallel.context", show(p.context), f"splits sequences; a {m.kind} model has none",
                        "use a transformer model, or remove parallel.context")
    if p.ep > 1:
        raise RuleError("parallel.context", show(p.context), "context and expert parallelism together are "
                        "not modelled", "use one of them")
    if m.attention != "flash":
        # Megatron-Core runs context parallelism through Transformer Engine, whose unfused attention does
        # not support it (transformer_engine/pytorch/attention/dot_product_attention/utils.py,
        # get_attention_backend: "Disabling UnfusedDotProductAttention as it does not support context
        # parallelism").
        raise RuleError("model.attention", show(m.attention), f"context = {p.cp} needs fused (flash) attention: "
                        "the unfused kernels do not support context parallelism",
                        "set model.attention: flash, or parallel.context: 1")
    mb = sc.training.micro_batch if sc.training else 1
    step = p.cp * (p.tensor if p.sequence_parallel and p.tensor > 1 else 1)
    if m.seq_len % p.cp or (m.seq_len // p.cp * mb) % (step // p.cp):
        raise RuleError("model.seq_len", show(m.seq_len),
                        f"context = {p.cp} splits every sequence: seq_len must divide by it (and, with "
                        f"sequence parallelism, seq_len/context × micro_batch by tensor = {p.tensor})",
                        f"use seq_len a multiple of {step}")


def _stage_layers(sc: Scenario) -> None:
    p, m = sc.parallel, sc.model
    if p is None or p.stage_layers is None or isinstance(m, CollectiveModel):
        return
    counts, chunks, n = p.stage_layers, p.pipeline * p.virtual_stages, m.num_layers
    if len(counts) != chunks:
        raise RuleError("parallel.stage_layers", show(counts),
                        f"needs one entry per model chunk: pipeline×virtual_stages = {p.pipeline}×"
                        f"{p.virtual_stages} = {chunks}, not {len(counts)}",
                        f"give {chunks} layer counts, or remove stage_layers for an even split")
    if sum(counts) != n:
        raise RuleError("parallel.stage_layers", show(counts),
                        f"the counts add up to {sum(counts)}, the model has {n} layers",
                        f"make them sum to {n}")
    # The first and last chunks of a transformer also hold the embedding and the head, so they may
    # hold no transformer layer; every other chunk needs one.
    ends = (0, chunks - 1) if isinstance(m, TransformerModel) else ()
    for i, k in enumerate(counts):
        if k == 0 and i not in ends:
            where = "chunks other than the first and last need" if ends else "every chunk needs"
            raise RuleError(f"parallel.stage_layers[{i}]", "0",
                            f"{where} at least one layer (the first and last may hold only the embedding "
                            "or the head of a transformer)", "move a layer into it")


def _tensor_problem(m: TransformerModel, t: int, sp: bool, micro_batch: int) -> tuple[str, int, str] | None:
    """The first transformer dimension that tensor width ``t`` cannot split, or None.

    kv_heads must divide by t too (Megatron splits key/value groups; replicating them is not modelled)."""
    if m.heads % t:
        return (
            "heads",
            m.heads,
            f"heads must be divisible by tensor = {t} (each tensor rank holds whole heads)",
        )
    if m.kv_heads % t:
        return (
            "kv_heads",
            m.kv_heads,
            f"kv_heads must be divisible by tensor = {t} (each rank holds whole KV groups)",
        )
    if m.ffn_hidden % t:
        return "ffn_hidden", m.ffn_hidden, f"ffn_hidden must be divisible by tensor = {t}"
    if sp and t > 1 and (m.seq_len * micro_batch) % t:
        return (
            "seq_len",
            m.seq_len,
            f"sequence parallelism needs seq_len×micro_batch = {m.seq_len}×{micro_batch} "
            f"divisible by tensor = {t}",
        )
    return None


def _tensor(sc: Scenario) -> None:
    m, p = sc.model, sc.parallel
    if p is None or not isinstance(m, TransformerModel):
        return
    mb = sc.training.micro_batch if sc.training else 1
    problem = _tensor_problem(m, p.tensor, p.sequence_parallel, mb)
    if problem:
        field, value, rule = problem
        n = sc.total_gpus
        ok = [
            t
            for t in range(1, n + 1)
            if n % t == 0 and _tensor_problem(m, t, p.sequence_parallel, mb) is None
        ]
        origin = f" (from {m.name})" if m.name else ""
        raise RuleError(
            f"model.{field}",
            f"{value}{origin}",
            rule,
            f"use parallel.tensor in {ok} and adjust data so data×tensor×pipeline = {n}",
        )


def _batch(sc: Scenario) -> None:
    p, t = sc.parallel, sc.training
    if p is None or t is None:
        return
    step = p.data * t.micro_batch
    if t.global_batch % step:
        low = max(step, t.global_batch // step * step)
        options = f"{low}" if t.global_batch < step else f"{low} or {low + step}"
        raise RuleError(
            "training.global_batch",
            show(t.global_batch),
            f"must be a multiple of data×micro_batch = {p.data}×{t.micro_batch} = {step}",
            f"use global_batch: {options}, or change micro_batch",
        )
    m = t.global_batch // step
    if p.schedule != "interleaved-1f1b" or (p.virtual_stages == 1 and p.microbatch_group_size is None):
        return
    n = p.microbatch_group_size
    if n is not None and not p.pipeline <= n <= m:
        raise RuleError(
            "parallel.microbatch_group_size",
            show(n),
            f"must lie between pipeline = {p.pipeline} and the micro-batch count m = global_batch/(data×"
            f"micro_batch) = {m} (Megatron-Core refuses other sizes)",
            f"use microbatch_group_size in {p.pipeline}..{m}" if m >= p.pipeline else
            f"use global_batch: {step * p.pipeline} or more, or drop microbatch_group_size",
        )
    problem = interleaved_group_problem(p.pipeline, m, n)
    if problem is not None and n is None:
        good = step * p.pipeline * math.ceil(m / p.pipeline)
        raise RuleError(
            "training.global_batch",
            show(t.global_batch),
            f"interleaved-1f1b needs the micro-batch count m = global_batch/(data×micro_batch) = {m} "
            f"to be a multiple of pipeline = {p.pipeline}",
            f"use global_batch: {good}, schedule: 1f1b, or a parallel.microbatch_group_size whose last group "
            f"is whole or at least {p.pipeline} long",
        )
    if problem is not None:
        raise RuleError(
            "parallel.microbatch_group_size",
            show(n),
            f"{problem}: Megatron-Core refuses it (the pipeline would wait between groups)",
            f"use a group size that divides {m}, or leaves a last group of at least {p.pipeline}",
        )


def _precision(sc: Scenario) -> None:
    t, gpu = sc.training, sc.gpu
    if t is None:
        return
    try:
        gpu.peak_flops(t.precision)
    except KeyError:
        have = [d for d in PRECISIONS if d in gpu.peak_tflops or (d == "tf32" and "fp32" in gpu.peak_tflops)]
        fallback = next((d for d in ("bf16", "fp16", "fp32") if d in have), None)
        others = [g for g, spec in GPU_PRESETS.items() if t.precision in spec.peak_tflops]
        alternatives = [f"precision: {fallback}"] * (fallback is not None) + [
            f"cluster.gpu: {g}" for g in others[:1]
        ]
        raise RuleError(
            "training.precision",
            show(t.precision),
            f"GPU {gpu.name} does not support {t.precision} (it supports {', '.join(have) or 'nothing'})",
            f"use {' or '.join(alternatives) or 'a GPU that does'}",
        ) from None


def _tokens(sc: Scenario) -> None:
    t = sc.training
    if t is not None and t.tokens is not None and not isinstance(sc.model, TransformerModel):
        raise RuleError(
            "training.tokens",
            show(t.tokens),
            f"tokens per step need a sequence length, which a {sc.model.kind} model lacks",
            "use train_steps instead",
        )


def _collective(sc: Scenario) -> None:
    m, c = sc.model, sc.cluster
    if not isinstance(m, CollectiveModel):
        return
    if m.ranks > c.total_gpus:
        raise RuleError(
            "model.ranks",
            show(m.ranks),
            f"more ranks than GPUs ({c.nodes}×{c.gpus_per_node} = {c.total_gpus})",
            f"use ranks ≤ {c.total_gpus} (or null for all), or more nodes",
        )
    if m.algorithm in ("hierarchical", "hierarchical_sharp") and m.ranks > c.gpus_per_node and (
        m.ranks % c.gpus_per_node
    ):
        raise RuleError(
            "model.ranks",
            show(m.ranks),
            f"{m.algorithm} needs whole nodes: ranks must be a multiple of gpus_per_node = {c.gpus_per_node}",
            f"use ranks: {m.ranks // c.gpus_per_node * c.gpus_per_node}, or another algorithm",
        )
    if m.algorithm == "nvls" and m.ranks > c.gpus_per_node:
        raise RuleError(
            "model.algorithm",
            show(m.algorithm),
            f"NVLS reduces inside one node's NVSwitch; {m.ranks} ranks span {-(-m.ranks // c.gpus_per_node)} nodes",
            f"use ranks ≤ {c.gpus_per_node}, or algorithm: hierarchical_sharp / auto",
        )
    if m.algorithm == "hierarchical_sharp" and not c.inter_node.sharp:
        raise RuleError(
            "model.algorithm",
            show(m.algorithm),
            f"the inter-node link {c.inter_node.name} does not reduce in the network (hdr, ndr, xdr do)",
            "use inter_node: hdr, or algorithm: hierarchical",
        )
    if m.algorithm == "nvls" and c.intra_node.nvls_efficiency is None:
        raise RuleError(
            "model.algorithm",
            show(m.algorithm),
            f"the intra-node link {c.intra_node.name} has no NVLink SHARP (nvlink4 and nvlink5 do)",
            "use intra_node: nvlink4, or another algorithm",
        )


def _symmetry(sc: Scenario) -> None:
    if sc.simulation.symmetry == "on" and sc.cluster.fixed_stragglers:
        raise RuleError(
            "simulation.symmetry",
            "'on'",
            "stragglers make GPUs differ, so ranks are not symmetric",
            "use symmetry: auto (or off), or remove cluster.stragglers",
        )


def _reliability(sc: Scenario) -> None:
    r, t = sc.reliability, sc.training
    if r is None:
        return
    if sc.is_collective or t is None:
        raise RuleError("reliability", f"set for a {sc.model.kind} model",
                        "failures and checkpoints apply to training runs",
                        "remove reliability, or simulate a training model")
    if t.tokens is None and t.train_steps is None:
        how = "training.train_steps or training.tokens" if isinstance(sc.model, TransformerModel) \
            else "training.train_steps"
        raise RuleError("reliability", "set, but training has neither tokens nor train_steps",
                        "goodput and expected time to train need the run's length",
                        f"set {how}, or remove reliability")


def _tp_comm_overlap(sc: Scenario) -> None:
    p, t = sc.parallel, sc.training
    if p is None or not p.tp_comm_overlap:
        return
    if getattr(sc.model, "experts", None):
        raise RuleError("parallel.tp_comm_overlap", show(p.tp_comm_overlap),
                        "userbuffers overlap is modelled for dense layers, not mixture-of-experts ones",
                        "set tp_comm_overlap: false")
    if t is None or t.kernels == "transformer-engine":
        return
    raise RuleError("parallel.tp_comm_overlap", show(p.tp_comm_overlap),
                    f"userbuffers are Transformer Engine's; training.kernels {t.kernels} has no TP overlap",
                    "set training.kernels: transformer-engine, or tp_comm_overlap: false")


def _compression(sc: Scenario) -> None:
    p, t = sc.parallel, sc.training
    if p is None or t is None or t.gradient_compression is None or p.zero < 2:
        return
    raise RuleError("parallel.zero", show(p.zero),
                    "gradient compression all-gathers every replica's sparse gradients once per step; ZeRO-2/3 "
                    "reduce-scatter each micro-batch's gradients into shards instead",
                    "use zero ≤ 1 with training.gradient_compression, or remove the compression")


SCENARIO_RULES = (_sections, _layout, _tensor_model, _stages, _stage_layers, _experts, _context, _tensor, _batch,
                  _precision, _tokens, _collective, _symmetry, _compression, _tp_comm_overlap, _reliability)
