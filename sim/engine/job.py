"""A training job as the executor sees it: per virtual stage, per layer, blocks of priced work.

Built from a scenario by ``sim.build`` (which joins hardware, model and strategy); the executor only
runs it. Durations are per GPU (after tensor-parallel sharding) and per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.hardware.nccl import CommCTAs
from sim.schedules.actions import SPLIT_BACKWARD


@dataclass(frozen=True)
class Block:
    """Compute of ``dur_s`` on the compute stream, then (optionally) a TP collective the next block
    waits for; with ``overlap`` the collective is issued when the compute starts and runs beside it (the
    block ends when both have). ``flops`` counts the arithmetic (for MFU/HFU bookkeeping)."""

    name: str
    dur_s: float
    comm: str | None = None
    comm_bytes: float = 0.0
    flops: float = 0.0
    category: str | None = None  # span category; None: the caller's (forward, backward, …)
    overlap: bool = False
    ctas: int | None = None  # SMs the overlapped collective holds (userbuffers); None: NCCL's CTAs
    hbm_bytes: float = 0.0  # what its kernels read and write in HBM (the overlapped collective shares it)

    @property
    def comm_op_kind(self) -> tuple[str, str]:
        """``comm`` split into (collective op, group kind): "op" runs on the TP group, "op@ep" on another."""
        op, _, kind = (self.comm or "").partition("@")
        return op, kind or "tp"


@dataclass(frozen=True)
class LayerWork:
    name: str
    forward: tuple[Block, ...]
    backward: tuple[Block, ...]  # input gradients (and weight gradients unless the schedule splits them)
    weight: tuple[Block, ...]  # weight gradients (W), used only by split-backward schedules
    recompute: tuple[Block, ...] = ()  # forward re-run before backward (activation checkpointing)
    grad_bytes: float = 0.0  # this GPU's gradient bytes of the layer (data-parallel sync)
    param_bytes: float = 0.0  # this GPU's parameter bytes (ZeRO-3 gathers)
    activation_bytes: float = 0.0  # kept per micro-batch until the backward
    workspace_bytes: float = 0.0  # live while this layer's checkpointed segment is recomputed (full checkpointing)
    expert_grad_bytes: float = 0.0  # MoE: gradients of this GPU's experts (summed over the expert-DP group)
    # PyTorch FSDP's kernels on its DP streams (KernelSet.fsdp_flat_param): the pre-divide of the unsharded
    # gradient before the layer's reduce-scatter, the cast of the fp32 shard before each all-gather.
    pre_reduce_s: float = 0.0
    pre_gather_s: float = 0.0
    # Run once per step before the layer's first forward of the step (its model chunk's first micro-batch):
    # Transformer Engine's fp8 weight casts, reused by the step's other micro-batches.
    step_forward: tuple[Block, ...] = ()


@dataclass(frozen=True)
class ChunkWork:
    """One virtual pipeline stage as run by one GPU."""

    layers: tuple[LayerWork, ...]
    send_bytes: float = 0.0  # activations (and, back, their gradients) to the neighbour per micro-batch


@dataclass
class TrainingJob:
    dp: int
    tp: int
    pp: int
    virtual_stages: int
    microbatches: int
    schedule: str
    chunks: list[ChunkWork]  # index: virtual stage = chunk * pp + stage
    zero: int = 0
    bucket_bytes: float = 25e6
    bucket_first_chunk_only: bool = False  # Megatron-Core: later stages/chunks reduce each chunk whole
    overlap_grad_sync: bool = True
    # ZeRO 1/2: the updated parameters are gathered beside the next step's forward, a model chunk ahead
    # (Megatron-Core --overlap-param-gather). Each simulated step gathers the previous step's update so,
    # as a steady state, and leaves its own to the next.
    overlap_param_gather: bool = False
    optimizer: Block = field(default_factory=lambda: Block("optimizer", 0.0))
    unscale: Block | None = None  # loss-scaling unscale + inf check (then a tiny all-reduce)
    overflow_steps: frozenset[int] = frozenset()  # steps whose update is skipped (loss-scale overflow)
    compression_ratio: float | None = None  # top-k sparsification of DP gradients
    compress: Block | None = None
    decompress: Block | None = None
    index_bytes: int = 4
    grad_elem_bytes: int = 2
    static_bytes: list[float] = field(default_factory=list)  # per stage: weights+grads+optimizer+buffers
    steps: int = 1
    clip: Block | None = None  # gradient-norm pass; then a 4-byte all-reduce over the model-parallel group
    embedding_sync_bytes: float = 0.0  # tied embeddings across stages: first↔last stage gradient all-reduce
    data: Block | None = None  # loading a micro-batch (first virtual stage, before its forward)
    blocking_p2p: bool = False  # a pipeline exchange completes before its GPU computes on (sim.workload.kernels.p2p_blocks)
    # ... and then the host synchronizes the device: the GPU's gradient reductions in flight finish first
    p2p_device_sync: bool = False
    # ... in Megatron's exchange rounds (interleaved schedule, waited exchanges: sim.schedules.exchanges): a
    # forward's output goes with the next backward's gradient in one batched exchange, receives posted there
    exchange_rounds: bool = False
    # Interleaved schedule: micro-batches per group through the chunks (None: pp; parallel.microbatch_group_size)
    # and whether m == pp runs every forward first (KernelSet.interleaved_all_warmup)
    microbatch_group: int | None = None
    interleaved_all_warmup: bool = False
    grad_all_reduce: bool = False  # DP gradients all-reduced in full even under ZeRO-1 (DeepSpeed 2021-22)
    gather_bytes: float = 0.0  # scatter/gather p2p: TP all-gather of this size after each receive
    gather_copy: Block | None = None  # the receiver's copies around each such all-gather (kernels.P2P_GATHERS)
    backward_gathers: int = 1  # rebuilds before each backward (DeepSpeed's: the gradient and the stage's output)
    # The SMs (NCCL CTAs) a collective's kernel holds, by where its ranks are (sim.hardware.nccl; what
    # sim.build sets); without it every overlapped collective slows compute 1/(1 + comm_slowdown).
    nccl: CommCTAs | None = None
    comm_slowdown: float = 0.0
    # The HBM bandwidth its streaming kernels reach (B/s): a collective overlapping a block shares it with
    # the block's kernels (sim.engine.executor, _hbm_stretch); 0 = no contention modelled.
    hbm_Bps: float = 0.0
    ep: int = 1  # expert parallelism (MoE): GPUs sharing one layer's experts, within data parallelism
    cp: int = 1  # context parallelism: GPUs splitting each sequence, within data parallelism (dp counts them)
    rank_order: str = "tp-dp-pp"  # parallel.order (sim.parallel.layout.RANK_ORDERS)

    @property
    def split_backward(self) -> bool:
        return self.schedule in SPLIT_BACKWARD

    @property
    def gathers_update(self) -> bool:
        """A sharded optimizer (ZeRO 1/2) over several replicas: its updated parameters are all-gathered."""
        return self.zero in (1, 2) and self.dp > 1

    def chunk_of(self, stage: int, chunk: int) -> ChunkWork:
        return self.chunks[chunk * self.pp + stage]
