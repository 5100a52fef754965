"""The Timeline: every output (summary, CSV, Chrome trace, charts) is derived from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Span categories. Charts colour by these; metrics sum by these.
FORWARD = "forward"
BACKWARD = "backward"  # full backward (input + weight gradients)
BACKWARD_INPUT = "backward_input"  # B of zero-bubble schedules
BACKWARD_WEIGHT = "backward_weight"  # W of zero-bubble schedules
RECOMPUTE = "recompute"
OPTIMIZER = "optimizer"
COMPUTE = "compute"  # anything else on a compute stream
GRAD_ACCUM = "grad_accum"  # per-micro-batch accumulation of weight gradients into fp32 main_grad
CLIP_GRAD = "clip_grad"  # gradient-norm pass before the optimizer
FSDP_COPY = "fsdp_copy"  # PyTorch FSDP's passes around its collectives: flat-grad copy, pre-divide, shard cast
WEIGHT_CAST = "weight_cast"  # fp8 copies of the weights, once per step (Transformer Engine's cached casts)
DATA = "data"  # loading a micro-batch's tokens onto the GPU
INTERFERENCE = "interference"  # compute time lost to NCCL kernels holding SMs (overlapped communication)
COMM_TP = "comm_tp"
COMM_DP = "comm_dp"
COMM_PP = "comm_pp"
COMM_EMB = "comm_embedding"  # tied-embedding gradient all-reduce between first and last stage
COMM_CLIP = "comm_clip"  # the gradient-norm all-reduce
COMM_EP = "comm_ep"  # expert-parallel all-to-all (MoE dispatch / combine)
COMM_CP = "comm_cp"  # context-parallel K/V exchange (ring attention) or gather
COMM = "comm"  # a standalone collective workload
COMPUTE_CATEGORIES = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, RECOMPUTE, OPTIMIZER, COMPUTE,
                      GRAD_ACCUM, CLIP_GRAD, FSDP_COPY, WEIGHT_CAST, DATA, INTERFERENCE)
COMM_CATEGORIES = (COMM_TP, COMM_DP, COMM_PP, COMM_EMB, COMM_CLIP, COMM_EP, COMM_CP, COMM)

# Stream names (Chrome trace tid).
STREAM_COMPUTE = "compute"
STREAM_COMM = "comm"  # collectives (TP, DP)
STREAM_P2P = "p2p"  # pipeline sends/receives


@dataclass(slots=True)
class Span:
    """One busy interval of one stream of one GPU."""

    gpu: int
    stream: str
    name: str
    category: str
    start_s: float
    dur_s: float
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s


@dataclass(slots=True)
class CounterSample:
    """A sampled value over time for one GPU, e.g. allocated memory in bytes."""

    gpu: int
    name: str
    t_s: float
    value: float


@dataclass
class Timeline:
    """All spans and counters of a run, plus which GPUs were simulated explicitly.

    ``gpus`` lists the GPU ids that appear (with symmetry, one representative per class);
    ``represents`` maps a simulated GPU to how many real GPUs it stands for.
    ``labels`` gives a human label per GPU (e.g. "node0/gpu3 dp0 tp3 pp0").
    """

    spans: list[Span] = field(default_factory=list)
    counters: list[CounterSample] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    represents: dict[int, int] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)
    stage_of: dict[int, int] = field(default_factory=dict)  # gpu -> pipeline stage
    end_s: float = 0.0

    def add(self, span: Span) -> None:
        self.spans.append(span)

    def for_gpu(self, gpu: int) -> list[Span]:
        return [s for s in self.spans if s.gpu == gpu]
