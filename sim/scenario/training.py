"""The training section: batch, precision, loss scaling, activation checkpointing, optimizer, kernels."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from sim.memory import OPTIMIZERS
from sim.scenario.base import PRECISIONS, RuleError, _Strict, show
from sim.workload.kernels import CE_KERNELS, DEFAULT_KERNEL_SET, FUSIONS, KERNEL_SET_NAMES, NORM_KERNELS
from sim.workload.transformer import CHECKPOINTING_KINDS, FP8_RECIPES

CE_KERNEL_CHOICES = ("auto", *CE_KERNELS)  # training.cross_entropy_kernel


class LossScaling(_Strict):
    """fp16 loss scaling; overflows (given steps or a probability) skip the step and back off the scale."""

    kind: Literal["none", "static", "dynamic"] = Field("none", description="loss-scaling policy")
    init_scale: float = Field(65536.0, gt=0, description="initial (or static) scale")
    growth_factor: float = Field(
        2.0, gt=1, description="dynamic: scale multiplier after growth_interval clean steps"
    )
    backoff_factor: float = Field(0.5, gt=0, lt=1, description="dynamic: scale multiplier after an overflow")
    growth_interval: int = Field(2000, ge=1, description="dynamic: clean steps before growing the scale")
    overflow_steps: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, description="steps (0-based) whose gradients overflow"
    )
    overflow_probability: float | None = Field(
        None, ge=0, le=1, description="chance that a step overflows (seeded)"
    )

    @field_validator("overflow_steps")
    @classmethod
    def _sorted(cls, steps: list[int]) -> list[int]:
        return sorted(set(steps))

    @model_validator(mode="after")
    def _rules(self) -> LossScaling:
        if self.overflow_steps and self.overflow_probability is not None:
            raise RuleError(
                "overflow_probability",
                show(self.overflow_probability),
                "give overflow_steps or overflow_probability, not both",
                "remove one of them",
            )
        if self.kind == "none" and (self.overflow_steps or self.overflow_probability is not None):
            raise RuleError(
                "kind",
                show(self.kind),
                "overflows need loss scaling",
                "use kind: dynamic (or static), or remove the overflows",
            )
        return self


class Checkpointing(_Strict):
    """Activation checkpointing: none, selective (attention only) or full in blocks of ``every`` layers."""

    kind: Literal[CHECKPOINTING_KINDS] = Field(  # type: ignore[valid-type]
        "none", description="what to recompute in backward"
    )
    every: int = Field(
        1,
        ge=1,
        description="full: keep the input of one layer in `every`, recompute the block (1 = every layer)",
    )
    partition_activations: bool = Field(
        False,
        description="full: each tensor-parallel rank keeps 1/t of every checkpointed input and all-gathers it "
        "over the TP group before the recompute (Megatron-LM --distribute-checkpointed-activations of 2021, "
        "--distribute-saved-activations from 2022, DeepSpeed's partition_activations: "
        "Megatron-DeepSpeed --partition-activations); with sequence parallelism the input is split already",
    )

    @model_validator(mode="after")
    def _rules(self) -> Checkpointing:
        if self.every != 1 and self.kind != "full":
            raise RuleError(
                "every",
                show(self.every),
                f"`every` applies to full checkpointing, not {self.kind}",
                "use kind: full",
            )
        if self.partition_activations and self.kind != "full":
            raise RuleError(
                "partition_activations",
                "true",
                f"partitioned checkpoints are the inputs full checkpointing keeps, not {self.kind}",
                "use kind: full, or drop partition_activations",
            )
        return self


def checkpointing_from(value: Any) -> Any:
    """ "full" → {kind: full}; {every: k} → {kind: full, every: k}; {partition_activations: true} → {kind:
    full, partition_activations: true} (both options of full checkpointing only)."""
    if isinstance(value, str):
        return {"kind": value}
    if isinstance(value, dict) and "kind" not in value and (
            "every" in value or value.get("partition_activations") is True):
        return {"kind": "full", **value}
    return value


class Fusion(_Strict):
    """Megatron's fusions, each on or off as its flag sets it (--no-bias-gelu-fusion,
    --no-bias-dropout-fusion, --no-masked-softmax-fusion, --cross-entropy-loss-fusion); unset: what
    training.kernels ran."""

    bias_gelu: bool = Field(True, description="the MLP bias added inside the GeLU kernel (else its own kernel)")
    bias_dropout_add: bool = Field(
        True, description="bias + dropout + residual add as one kernel (else three: Megatron's eager path)"
    )
    masked_softmax: bool = Field(
        True, description="standard attention: the fused scale-mask-softmax kernel, where the scores' shape "
        "allows it (else torch's path: fp32 cast, scale, mask, softmax, cast back)"
    )
    cross_entropy: bool = Field(
        True, description="the loss as Megatron-Core's fused vocab-parallel cross-entropy (cross_entropy_loss_fusion, "
        "off by default in Megatron-Core and in NeMo configs that do not set it; else the fp32 cast of the logits "
        "and five passes over them)"
    )
    gradient_accumulation: bool | None = Field(
        None, description="the weight-gradient GEMMs accumulate into the fp32 main_grad themselves (Megatron's "
        "gradient_accumulation_fusion); false: each micro-batch's 16-bit gradient is added to the fp32 "
        "accumulator by its own pass (read 2 + 4 bytes, write 4 per parameter), as PyTorch eager runs it (FSDP2's "
        "fp32 accumulation with gradient sync off, --no-gradient-accumulation-fusion); unset: what "
        "training.kernels ran. Not covered by the true/false shorthand"
    )


class Compression(_Strict):
    """Gradient compression for the data-parallel all-reduce."""

    kind: Literal["topk"] = Field(description="top-k sparsification")
    ratio: float = Field(gt=0, le=1, description="fraction of gradient elements sent")


class Training(_Strict):
    """The batch, precision and optimizer: what one training step does."""

    global_batch: int = Field(
        ge=1, description="samples (sequences) per optimizer step, all replicas together"
    )
    micro_batch: int = Field(1, ge=1, description="samples per micro-batch per replica")
    precision: Literal[PRECISIONS] = Field("bf16", description="compute dtype")  # type: ignore[valid-type]
    loss_scaling: LossScaling = Field(LossScaling(), description="none | static | dynamic, or a mapping")
    checkpointing: Checkpointing = Field(Checkpointing(), description="none | full | selective | {every: k}")
    optimizer: Literal[OPTIMIZERS] = Field(  # type: ignore[valid-type]
        "adam", description="optimizer (sets optimizer-state memory)"
    )
    gradient_compression: Compression | None = Field(None, description="null, or {kind: topk, ratio}")
    kernels: Literal[KERNEL_SET_NAMES] = Field(  # type: ignore[valid-type]
        DEFAULT_KERNEL_SET,
        description="the software stack's kernel set (sim/workload/kernels.py): which kernels it launched "
        "and fused, e.g. megatron-lm-2021 (bmm attention, fp32 grad-accumulation pass) or "
        "transformer-engine (flash attention, fused kernels)",
    )
    flash_attention: Literal["latest", "te-2024", "v2", "v1"] = Field(
        "latest", description="the FlashAttention generation the stack ran (model.attention: flash): latest "
        "(the GPU reference profile's kernel: FlashAttention-2 on A100, -3 on H100/H200; under kernels "
        "transformer-engine the kernel TE selects: cuDNN's fused attention on H100/H200), te-2024 "
        "(that cuDNN fused attention as of cuDNN 9.1, May 2024: Transformer Engine stacks of mid-2024 such as "
        "NeMo 24.07), v2 (FlashAttention-2) or v1 (FlashAttention of 2022 and its Triton port, e.g. llm-foundry's "
        "attn_impl: triton in 2023), each priced from its published speed curves",
    )
    fusion: Fusion = Field(
        Fusion(), description="true | false | {bias_gelu, bias_dropout_add, masked_softmax, cross_entropy}: Megatron's fusions, "
        "each true or false (false alone: all off); unset keys: what training.kernels ran",
    )
    cross_entropy_kernel: Literal[CE_KERNEL_CHOICES] = Field(  # type: ignore[valid-type]
        "auto", description="the fused loss (fusion.cross_entropy on): auto (what training.kernels ran), native "
        "(Megatron-Core's torch.compile'd vocab-parallel cross-entropy, its cross_entropy_fusion_impl default), "
        "te (Transformer Engine's Triton cross-entropy, cross_entropy_fusion_impl te, as Megatron-Bridge's "
        "recipes set it) or xentropy (flash-attn's fused CUDA cross-entropy, llm-foundry's default loss)",
    )
    norm_kernel: Literal[NORM_KERNELS] = Field(  # type: ignore[valid-type]
        "auto", description="the LayerNorm/RMSNorm kernels: auto (what training.kernels ran: apex's affine "
        "kernels in Megatron 2021 and Megatron-DeepSpeed, apex's persistent FastLayerNorm in Megatron 2022 "
        "for the hidden sizes it supports, Transformer Engine's own), framework (torch or apex affine "
        "kernels, e.g. PyTorch eager) or persistent",
    )
    fp8_recipe: Literal[FP8_RECIPES] = Field(  # type: ignore[valid-type]
        "delayed", description="precision fp8: Transformer Engine's scaling recipe, delayed (DelayedScaling, "
        "TE's default: scales from the amax history, no extra pass) or current (Float8CurrentScaling: an amax "
        "pass over each GEMM input before its cast)",
    )
    grad_reduce_dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="the dtype gradients accumulate and are reduced in over data parallelism: auto "
        "(what training.kernels does: Megatron keeps bf16 and fp8 models' main gradients in fp32, fp16 ones in "
        "fp16), fp32, or bf16 (Megatron-Core's --grad-reduce-in-bf16, apex/NeMo DistributedFusedAdam's "
        "grad_sync_dtype: bf16): half the gradient memory and data-parallel traffic",
    )
    optimizer_state_dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="the dtype of the optimizer's own state (Adam's moments and, in mixed precision, "
        "the master weights): fp32, or bf16 (apex DistributedFusedAdam's dtype: bf16, which NeMo's Nemotron "
        "340B ran): half the optimizer memory and step traffic",
    )
    grad_clip: float | None = Field(
        1.0, gt=0, description="gradient-norm clipping threshold (Megatron's --clip-grad, default 1.0): "
        "a norm pass over the gradients and its all-reduce; null = no clipping",
    )
    tokens: float | None = Field(
        None, gt=0, le=1e18, description="total training tokens (time-to-train, at most 1e18); transformer only"
    )
    train_steps: int | None = Field(
        None, gt=0, le=10**12, description="total optimizer steps (time-to-train, at most 1e12)"
    )

    @field_validator(
        "loss_scaling",
        mode="before",
        json_schema_input_type=Literal["none", "static", "dynamic"] | LossScaling,
    )
    @classmethod
    def _loss_scaling(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    @field_validator(
        "checkpointing",
        mode="before",
        json_schema_input_type=Literal[CHECKPOINTING_KINDS] | Checkpointing,
    )
    @classmethod
    def _checkpointing(cls, value: Any) -> Any:
        return checkpointing_from(value)

    @field_validator("fusion", mode="before", json_schema_input_type=bool | Fusion)
    @classmethod
    def _fusion(cls, value: Any) -> Any:
        return dict.fromkeys(FUSIONS, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _rules(self) -> Training:
        for key, what, default in (("grad_reduce_dtype", "bf16 gradient reduction", "auto"),
                                   ("optimizer_state_dtype", "a bf16 optimizer state", "fp32")):
            if getattr(self, key) == "bf16" and self.precision not in ("bf16", "fp8"):
                raise RuleError(key, show("bf16"), f"{what} needs bf16 or fp8 compute, not precision "
                                f"{self.precision}", f"set training.{key}: {default}, or training.precision: bf16")
        if self.cross_entropy_kernel != "auto" and not self.fusion.cross_entropy:
            raise RuleError("cross_entropy_kernel", show(self.cross_entropy_kernel),
                            "picks a fused loss, but training.fusion.cross_entropy is false here (the stack's "
                            "unfused loss runs)", "set training.fusion.cross_entropy: true, or "
                            "training.cross_entropy_kernel: auto")
        if self.tokens is not None and self.train_steps is not None:
            raise RuleError(
                "train_steps",
                show(self.train_steps),
                "give tokens or train_steps, not both",
                "remove one of them",
            )
        return self
