"""Per-GPU memory: model states (ZeRO), activations (checkpointing, in-flight micro-batches), fit checks.

All results are bytes. Formulas follow reference.md: ZeRO (Rajbhandari et al. 2020) for model states and
Korthikanti et al. 2022 Table 2 for transformer activations.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from sim.errors import ScenarioError
from sim.schedules.actions import max_in_flight, stage_actions
from sim.units import DTYPE_BYTES, FULL_PRECISIONS, GB, MIXED_PRECISIONS
from sim.workload.transformer import CHECKPOINTING_KINDS

OPTIMIZERS = ("adam", "adamw", "sgd")

_FP32 = 4
_HALF = 2


def _optimizer_bytes_per_param(precision: str, optimizer: str, state_bytes: int = _FP32) -> int:
    """K: optimizer-state bytes per parameter.

    Adam keeps momentum and variance; SGD keeps momentum only (plain SGD without momentum would be K = 0
    in fp32, not modelled). Mixed precision adds a master copy of the weights. Each in ``state_bytes``
    (fp32; 2 for a bf16 optimizer state, as apex DistributedFusedAdam's ``dtype`` keeps them all).
    """
    states = 2 if optimizer in ("adam", "adamw") else 1
    master = 1 if precision in MIXED_PRECISIONS else 0
    return state_bytes * (states + master)


def model_state_bytes(
    params: float, *, zero_stage: int, dp: int, precision: str, optimizer: str = "adam",
    grad_bytes_per_param: float | None = None, state_bytes: int = _FP32,
) -> dict[str, float]:
    """Weights, gradients and optimizer states per GPU for ``params`` held by this GPU's model shard.

    Mixed precision (fp16/bf16/fp8 compute): 2 + 2 + K bytes per parameter (Adam K = 12: fp32 master,
    momentum, variance; SGD-momentum K = 8). fp32/tf32: 4 + 4 + K (Adam K = 8, SGD-momentum K = 4).
    ZeRO stage 1 shards the optimizer over dp, stage 2 also the gradients, stage 3 also the weights.
    ``params`` is what this GPU holds after tensor/pipeline splitting, before ZeRO.
    ``grad_bytes_per_param`` overrides the gradient element size (Megatron keeps bf16 models' gradients in
    an fp32 ``main_grad`` buffer: 4); ``state_bytes`` the optimizer state's element size (2: bf16, K = 6
    for mixed-precision Adam).

    ZeRO-3 with fp32 gradients is PyTorch FSDP's layout: the sharded flat parameter keeps the weights'
    own fp32 dtype and is what the optimizer updates (the master copy), and the 16-bit shard that
    MixedPrecision gathers from is made for each all-gather and freed after it (``_mp_shard`` in
    torch/distributed/fsdp), so a GPU keeps 4 (weights) + 4 (gradients) + K - 4 (moments) bytes per
    parameter over dp, not a 16-bit copy beside the master. DeepSpeed's ZeRO-3 keeps the 16-bit
    partition and 16-bit gradients: the paper's 2 + 2 + K.
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ScenarioError(f"must be 0, 1, 2 or 3, got {zero_stage}", field="parallel.zero")
    if dp < 1:
        raise ScenarioError(f"must be >= 1, got {dp}", field="parallel.data")
    if precision not in MIXED_PRECISIONS + FULL_PRECISIONS:
        raise ScenarioError(
            f"{precision!r} is not one of {', '.join(MIXED_PRECISIONS + FULL_PRECISIONS)}",
            field="training.precision",
        )
    if optimizer not in OPTIMIZERS:
        raise ScenarioError(
            f"{optimizer!r} is not one of {', '.join(OPTIMIZERS)}", field="training.optimizer"
        )
    elem = _HALF if precision in MIXED_PRECISIONS else DTYPE_BYTES[precision]
    k = _optimizer_bytes_per_param(precision, optimizer, state_bytes)
    grad_elem = elem if grad_bytes_per_param is None else grad_bytes_per_param
    if zero_stage >= 3 and precision in MIXED_PRECISIONS and grad_elem == _FP32 and state_bytes == _FP32:
        elem, k = _FP32, k - _FP32  # FSDP: the fp32 shard is the weights and the master at once
    weights = elem * params / (dp if zero_stage >= 3 else 1)
    gradients = grad_elem * params / (dp if zero_stage >= 2 else 1)
    optimizer_b = k * params / (dp if zero_stage >= 1 else 1)
    return {"weights": float(weights), "gradients": float(gradients), "optimizer": float(optimizer_b)}


def activation_bytes_per_layer(
    *,
    seq: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    checkpointing: str = "none",
    bytes_per_elem: int = 2,
    fp8_gemm_inputs: bool = False,
    fp32_softmax: bool = False,
    ffn_hidden: int | None = None,
    gated_mlp: bool = False,
    kv_heads: int | None = None,
    dropout: bool = True,
) -> float:
    """Activation bytes one transformer layer keeps for one micro-batch (Korthikanti et al. 2022, Table 2).

    none: sbh(10 + 24/t + 5as/(ht)) (= sbh(34 + 5as/h) at t = 1); with SP sbh(34/t + 5as/(ht)).
    selective: sbh(10 + 24/t), or 34sbh/t with SP. full: 2sbh (the layer input), 2sbh/t with SP.
    The table counts 16-bit activations (and 1-byte dropout masks) with MHA, ffn = 4h and unfused
    attention; the result is scaled by bytes_per_elem / 2.

    The same tensor-by-tensor count for other layer shapes (the defaults give the table's GPT layer):
    - ``ffn_hidden`` F = f·h (None: 4h): the MLP keeps its FC1 input (2sbh), FC1's output (2f·sbh, what the
      activation's backward reads) and the activation's output (2f·sbh, FC2's input); ``gated_mlp``
      (SwiGLU) doubles FC1's output (gate and up: 4f·sbh). The table's 19sbh is 2 + 8 + 8 + a 1-byte mask.
    - ``kv_heads`` (grouped-query attention): K and V keep 2sbh·(kv/a) each instead of 2sbh.
    - ``dropout`` False (Llama, MPT): no 1-byte masks (the two hidden dropouts' sbh each, the scores'
      as²b) and, in standard attention, no dropout output: the context GEMM reads the softmax output.
    So the replicated part (without SP) is 4 (two norm inputs) + 2 (QKV input) + 2 (FC1 input) + 2 masks,
    the split part 2 (Q) + 4kv/a (K, V) + 2 (projection input) + 4f or 6f (MLP).

    ``fp8_gemm_inputs``: the four GEMMs' inputs the weight gradients need are kept as the 1-byte fp8 copies
    their casts made, as Transformer Engine's LayerNormLinear, Linear and LayerNormMLP save them
    (``ln_out``/``inputmat`` quantized, ``update_usage(rowwise_usage=False)`` keeping the column-wise copy
    for the wgrad GEMM; with sequence parallelism the row-wise local shard that backward re-gathers). That
    halves the table's QKV and FC1 inputs (2sbh each, /t with SP) and the output projection's and FC2's
    (2sbh/t, 2f·sbh/t): (3 + f)sbh/t fewer bytes with SP (7 at f = 4), sbh(2 + (1 + f)/t) without. Full
    checkpointing keeps the 16-bit layer input only.

    ``fp32_softmax``: the softmax ran as torch's fp32 fallback (``sim.workload.attention``), whose backward
    keeps its 4-byte output where the fused kernel keeps 2 bytes (the 16-bit probabilities the context GEMM
    saves stay): 5as/(ht) becomes 7as/(ht) for 16-bit activations (6as/(ht) without dropout).
    """
    if checkpointing not in CHECKPOINTING_KINDS:
        raise ScenarioError(
            f"{checkpointing!r} is not one of {', '.join(CHECKPOINTING_KINDS)}", field="training.checkpointing"
        )
    s, b, h, a, t = seq, micro_batch, hidden, heads, tp
    f = 4.0 if ffn_hidden is None else ffn_hidden / h
    kv = 1.0 if kv_heads is None else kv_heads / a
    sbh = s * b * h
    sp = sequence_parallel and t > 1
    mlp_rep, mlp_split = _mlp_terms(f, gated_mlp, dropout)
    # the attention half: norm inputs (4) and QKV input (2), the projection's dropout mask; Q, K, V and the
    # projection input split over TP
    replicated = 6 + (1 if dropout else 0) + mlp_rep
    split = 4 + 4 * kv + mlp_split
    if checkpointing == "full":
        per_16bit = 2 * sbh / (t if sp else 1)
    elif checkpointing == "selective":
        per_16bit = sbh * ((replicated + split) / t if sp else replicated + split / t)
    else:
        # the scores: the softmax output (2 bytes, 4 when it ran in fp32) and what the context GEMM reads: the
        # dropout's 2-byte output beside its 1-byte mask, or without dropout the softmax output itself (its
        # 16-bit copy, 2 bytes, after an fp32 softmax)
        fp32 = fp32_softmax and bytes_per_elem == 2
        score_bytes = (4 if fp32 else 2) + (3 if dropout else 2 if fp32 else 0)
        per_16bit = sbh * ((replicated + split) / t if sp else replicated + split / t) + sbh * score_bytes * a * s / (h * t)
    if fp8_gemm_inputs and checkpointing != "full":
        per_16bit -= sbh * (2 / (t if sp else 1) + (1 + f) / t)  # half of (2 + 2)·sbh replicated-or-/t and (2 + 2f)·sbh/t
    return per_16bit * bytes_per_elem / 2


def _mlp_terms(f: float, gated: bool, dropout: bool) -> tuple[float, float]:
    """The MLP's 16-bit units of sbh kept for backward, (replicated without SP, split over TP): FC1's input
    (2) and the dropout mask after FC2 (1); FC1's output (2f, 4f gated: gate and up) and the activation's
    output (2f)."""
    return 2 + (1 if dropout else 0), (6 if gated else 4) * f


def mlp_activation_bytes(*, seq: int, micro_batch: int, hidden: int, tp: int = 1, sequence_parallel: bool = False,
                         bytes_per_elem: int = 2, ffn_hidden: int | None = None, gated_mlp: bool = False,
                         dropout: bool = True) -> float:
    """The MLP's share of ``activation_bytes_per_layer`` (no checkpointing): FC1's input, FC1's output and the
    activation's output, and the hidden-dropout mask after FC2 (19sbh/t with SP at ffn = 4h; 3sbh + 16sbh/t
    without). A MoE layer replaces it with its experts' own."""
    sbh = seq * micro_batch * hidden
    replicated, split = _mlp_terms(4.0 if ffn_hidden is None else ffn_hidden / hidden, gated_mlp, dropout)
    sp = sequence_parallel and tp > 1
    per_16bit = sbh * ((replicated + split) / tp if sp else replicated + split / tp)
    return per_16bit * bytes_per_elem / 2


def activation_bytes_per_stage(
    layers_on_stage: int,
    per_layer_bytes: float,
    *,
    checkpointing: str,
    every_k: int | None = None,
    in_flight_microbatches: float,
    checkpoint_bytes: float | None = None,
    include_recompute: bool = True,
) -> float:
    """Peak activation bytes of a pipeline stage.

    per_layer_bytes is what a layer keeps for one micro-batch without full checkpointing (for
    "selective", pass the selective figure). With "full", a checkpoint (the input of a segment of
    every_k layers, default 1) is kept for each of ceil(L/k) segments and each in-flight micro-batch;
    checkpoint_bytes is its size, defaulting to per_layer_bytes (the seeds' M_checkpoint ≈ C·M_layer).
    Backward then recomputes one segment of one micro-batch at a time, adding k·per_layer_bytes
    (include_recompute=False drops this, giving the seeds' figure).
    """
    if checkpointing not in CHECKPOINTING_KINDS:
        raise ScenarioError(
            f"{checkpointing!r} is not one of {', '.join(CHECKPOINTING_KINDS)}", field="training.checkpointing"
        )
    if checkpointing != "full":
        return layers_on_stage * per_layer_bytes * in_flight_microbatches
    k = 1 if every_k is None else every_k
    if k < 1:
        raise ScenarioError(f"must be >= 1, got {every_k}", field="training.checkpointing.every")
    k = min(k, layers_on_stage) if layers_on_stage else k
    checkpoints = math.ceil(layers_on_stage / k)
    ckpt = per_layer_bytes if checkpoint_bytes is None else checkpoint_bytes
    stored = checkpoints * ckpt * in_flight_microbatches
    recompute = k * per_layer_bytes if (include_recompute and layers_on_stage) else 0.0
    return stored + recompute


def in_flight_microbatches(schedule: str, p: int, m: int, stage: int, virtual_stages: int = 1,
                           group: int | None = None, all_warmup: bool = False) -> float:
    """Micro-batches whose activations a stage holds at its peak, in units of the stage's full layer set.

    Counted from the stage's actions (``sim.schedules``): the most chunks whose forward ran and whose
    backward did not, over v chunks per stage. The closed forms it agrees with (tests/test_memory.py):
    GPipe m; 1F1B and ZB-H1 min(m, p − stage); ZB-H2 min(m, 2(p − stage) − 1); interleaved (Megatron,
    v chunks) min(v·m, 2(p − stage − 1) + (v − 1)N + 1) chunk-micro-batches of 1/v of the layers each,
    N the micro-batch group (``group``, None: p), or all v·m when ``all_warmup`` and m = p.
    """
    if p < 1 or m < 1 or virtual_stages < 1:
        raise ScenarioError(
            f"need p, m, virtual_stages >= 1, got {p}, {m}, {virtual_stages}", field="parallel"
        )
    if not 0 <= stage < p:
        raise ScenarioError(f"stage {stage} is outside 0..{p - 1}", field="parallel.pipeline")
    return max_in_flight(stage_actions(schedule, p, m, stage, virtual_stages, group, all_warmup)) / virtual_stages


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU bytes by category; peak is their sum (buffers hold comm buckets, workspace, fragmentation)."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float = 0.0

    @property
    def peak(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.buffers

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "peak": self.peak}


def fits(peak: float, capacity: float, reserve_fraction: float = 0.0) -> bool:
    """Whether ``peak`` bytes fit in ``capacity`` after keeping ``reserve_fraction`` of it free."""
    return peak <= capacity * (1.0 - reserve_fraction)


def suggest_fixes(
    breakdown: MemoryBreakdown,
    capacity: float,
    *,
    zero_stage: int,
    dp: int,
    checkpointing: str,
    pp: int,
    layers: int,
) -> list[str]:
    """Concrete hints (with the bytes each saves) for a configuration that does not fit; [] if it fits."""
    if fits(breakdown.peak, capacity):
        return []
    over = breakdown.peak - capacity
    hints = [f"needs {breakdown.peak / GB:.1f} GB of {capacity / GB:.1f} GB (over by {over / GB:.1f} GB)"]
    if dp > 1:
        saved = 0.0
        # What each stage costs in communication, so a hint never reads as free (ZeRO-2/3 reduce-scatter
        # every micro-batch's gradients; ZeRO-3 also gathers every layer's weights for F and B).
        by_stage = (
            (1, "optimizer states", breakdown.optimizer, ""),
            (2, "gradients", breakdown.gradients, "; reduce-scatters every micro-batch's gradients"),
            (3, "weights", breakdown.weights, "; all-gathers every layer's weights per micro-batch"),
        )
        for stage, label, held, cost in by_stage:
            if stage > zero_stage:
                saved += held * (1 - 1 / dp)
                hints.append(f"enable ZeRO-{stage} (shards {label} too{cost}): saves {saved / GB:.1f} GB")
    if checkpointing != "full" and breakdown.activations > 0:
        hints.append("enable full activation checkpointing (keeps only each layer's input)")
    states = breakdown.weights + breakdown.gradients + breakdown.optimizer
    if states > 0 and pp < layers:
        budget = capacity - breakdown.activations - breakdown.buffers
        factor = math.ceil(states / budget) if budget > 0 else None
        if factor is not None and factor > 1 and pp * factor <= layers:
            hints.append(f"raise pipeline parallelism to {pp * factor} (model states / {factor})")
        else:
            hints.append("raise tensor or pipeline parallelism, or shrink the micro-batch")
    return hints
