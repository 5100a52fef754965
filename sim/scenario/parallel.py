"""The parallel section: data × tensor × pipeline (× context, expert), the schedule, ZeRO, gradient sync."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from sim.scenario.base import DP_ALGORITHMS, RuleError, _Strict, show
from sim.schedules.actions import SCHEDULES


class Parallel(_Strict):
    """How the GPUs split the work: data × tensor × pipeline, the pipeline schedule, ZeRO, DDP buckets."""

    data: int = Field(1, ge=1, description="data-parallel replicas")
    tensor: int = Field(1, ge=1, description="tensor-parallel width (Megatron-style; may span nodes)")
    pipeline: int = Field(1, ge=1, description="pipeline stages")
    schedule: Literal[SCHEDULES] = Field("1f1b", description="pipeline schedule")  # type: ignore[valid-type]
    virtual_stages: int = Field(1, ge=1, description="model chunks per GPU (interleaved-1f1b only)")
    microbatch_group_size: int | None = Field(
        None, ge=1,
        description="interleaved-1f1b with virtual_stages > 1: micro-batches that go through each model chunk "
        "together before the next chunk (Megatron-Core's microbatch_group_size_per_vp_stage, the N of the "
        "Llama 3 paper): between pipeline and the micro-batch count, the last group whole or at least "
        "pipeline long; larger holds more activations in flight (breadth-first at the micro-batch count); "
        "null = pipeline (depth-first, Megatron's default)",
    )
    sequence_parallel: bool = Field(
        False, description="Megatron sequence parallelism (a no-op when tensor = 1)"
    )
    zero: int = Field(
        0, ge=0, le=3, description="ZeRO stage: 0 = DDP, 1 optimizer, 2 +gradients, 3 +weights (FSDP)"
    )
    bucket_MB: float | None = Field(
        None, ge=1e-3, le=1e9,
        description="gradient bucket size, MB (1 kB to 1 PB); default: the training stack's — for transformers "
        "Megatron-Core's max(40 M, 1 M × data) parameters, bucketed on the first pipeline stage's first "
        "model chunk only; otherwise PyTorch DDP's 25 MB",
    )
    overlap_grad_sync: bool = Field(
        True,
        description="overlap the gradient all-reduce with the backward pass; default: what "
        "training.kernels did (Megatron-LM 2021/2022 reduced after the last micro-batch)"
    )
    overlap_param_gather: bool = Field(
        False,
        description="ZeRO 1/2 (Megatron's distributed optimizer): all-gather the updated parameters beside "
        "the next step's forward, a model chunk ahead, each layer waiting for its own (Megatron-Core's "
        "--overlap-param-gather), instead of all at once after the optimizer step",
    )
    scatter_gather: bool | None = Field(
        None,
        description="pipeline sends under tensor parallelism: each TP rank sends 1/tensor of the activation and "
        "the receivers all-gather it over NVLink (Megatron's scatter/gather, off with "
        "--no-scatter-gather-tensors-in-pipeline), or every rank sends it whole; default: what training.kernels "
        "did (Megatron-LM, Megatron-DeepSpeed: on)",
    )
    overlap_p2p_comm: bool | None = Field(
        None,
        description="pipeline sends and receives run beside compute (Megatron-Core's overlap_p2p_comm), or each "
        "exchange completes before the GPU computes on, the host then synchronizing the device (Megatron's "
        "batched p2p with batch_p2p_sync); default: what training.kernels did for the schedule — Megatron-LM "
        "2021/2022 and Megatron-DeepSpeed wait; Megatron-Core (transformer-engine) overlaps under "
        "interleaved-1f1b, as NeMo and Megatron-Bridge configure it, and waits under every other schedule",
    )
    tp_comm_overlap: bool = Field(
        False,
        description="Transformer Engine's userbuffers overlap of the tensor-parallel collectives with their "
        "GEMMs (NeMo's and Megatron-Bridge's tp_comm_overlap): the all-gathers stream chunk by chunk beside "
        "the GEMM that consumes them (ring exchange on copy engines), the forward reduce-scatters beside "
        "the GEMM's later chunks (pipelined, 16 SMs), the backward's bulk overlaps on 16 SMs; needs "
        "sequence_parallel and training.kernels transformer-engine; no effect with tensor = 1",
    )
    dp_algorithm: Literal[DP_ALGORITHMS] = Field(  # type: ignore[valid-type]
        "auto",
        description="gradient all-reduce algorithm: auto (NCCL's tuner per collective and size), ring, tree "
        "(double binary tree), hierarchical (intra-node RS, inter-node AR, intra-node AG; SHARP with "
        "in_network_reduction), parameter_server",
    )
    parameter_servers: int = Field(
        1, ge=1, description="parameter_server: how many servers (sharded, BytePS-style, when > 1)"
    )
    parameter_server_placement: Literal["colocated", "dedicated"] = Field(
        "colocated", description="parameter_server: colocated (on worker nodes) or dedicated (extra CPU nodes)"
    )
    expert: int | None = Field(
        None, ge=1, description="expert parallelism: GPUs sharing one layer's experts, carved out of data "
        "(divides data and model.experts); null = 1"
    )
    context: int | None = Field(
        None, ge=1, description="context parallelism: GPUs splitting each sequence (ring attention); the "
        "GPU count is data × context × tensor × pipeline; null = 1"
    )
    order: Literal["tp-dp-pp", "tp-pp-dp"] = Field(
        "tp-dp-pp", description="how ranks map to GPUs, innermost first: tp-dp-pp (Megatron's and DeepSpeed's: a "
        "pipeline stage is a block of consecutive GPUs) or tp-pp-dp (Meta's [TP, CP, PP, DP] for Llama 3: a model "
        "replica is a block, pipeline sends stay near and data parallelism crosses far)"
    )
    context_attention: Literal["ring", "all_gather"] | None = Field(
        None, description="context parallelism: ring (K/V blocks passed around, overlapped; default) or "
        "all_gather (Llama 3: gather K/V, then attend)"
    )
    stage_layers: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        description="layers of each model chunk in pipeline order (virtual stage = chunk × pipeline + stage), "
        "pipeline × virtual_stages entries summing to the model's layers, e.g. fewer on the first and last "
        "stage to balance the embedding and the head; null = as even as possible",
    )

    @model_validator(mode="after")
    def _rules(self) -> Parallel:
        if self.dp_algorithm != "parameter_server" and (
            self.parameter_servers != 1 or self.parameter_server_placement != "colocated"
        ):
            raise RuleError(
                "parameter_servers",
                show(self.parameter_servers),
                f"parameter servers apply to dp_algorithm: parameter_server, not {self.dp_algorithm}",
                "set dp_algorithm: parameter_server or remove parameter_servers/parameter_server_placement",
            )
        if self.parameter_server_placement == "colocated" and self.parameter_servers > self.data:
            raise RuleError(
                "parameter_servers",
                show(self.parameter_servers),
                f"colocated servers sit on the {self.data} data-parallel workers, at most one each",
                f"use parameter_servers: {self.data} or parameter_server_placement: dedicated",
            )
        if self.dp_algorithm == "parameter_server" and self.zero:
            raise RuleError(
                "dp_algorithm",
                show(self.dp_algorithm),
                f"a parameter server syncs whole gradients (all-reduce), ZeRO {self.zero} shards them",
                "use zero: 0 or another dp_algorithm",
            )
        if self.overlap_param_gather and self.zero not in (1, 2):
            raise RuleError(
                "overlap_param_gather",
                show(self.overlap_param_gather),
                f"only a sharded optimizer (ZeRO 1 or 2) gathers its updated parameters; zero is {self.zero}",
                "set zero: 1 (Megatron's distributed optimizer) or drop overlap_param_gather",
            )
        if self.tp_comm_overlap and self.tensor > 1 and not self.sequence_parallel:
            raise RuleError(
                "tp_comm_overlap",
                show(self.tp_comm_overlap),
                "userbuffers overlap the all-gathers and reduce-scatters of sequence parallelism; without it "
                "there are none to overlap (Megatron-Core refuses tp_comm_overlap without sequence_parallel)",
                "set sequence_parallel: true, or tp_comm_overlap: false",
            )
        if self.microbatch_group_size is not None and (self.schedule != "interleaved-1f1b"
                                                       or self.virtual_stages == 1):
            raise RuleError(
                "microbatch_group_size",
                show(self.microbatch_group_size),
                "micro-batch groups order the model chunks of the interleaved schedule; "
                f"schedule is {self.schedule} with virtual_stages {self.virtual_stages}",
                "use schedule: interleaved-1f1b with virtual_stages > 1, or drop microbatch_group_size",
            )
        if self.virtual_stages > 1 and self.schedule != "interleaved-1f1b":
            raise RuleError(
                "virtual_stages",
                show(self.virtual_stages),
                f"model chunks per GPU need the interleaved-1f1b schedule, not {self.schedule}",
                "use schedule: interleaved-1f1b or virtual_stages: 1",
            )
        return self

    @property
    def world_size(self) -> int:
        return self.data * self.tensor * self.pipeline * self.cp

    @property
    def ep(self) -> int:
        return self.expert or 1

    @property
    def cp(self) -> int:
        return self.context or 1
