"""Rank layout: rank ↔ (data, tensor, pipeline) coordinates and process groups.

Two orders, both with tensor parallelism innermost (consecutive ranks, so a TP group sits inside a node
on NVLink):
- ``tp-dp-pp`` (Megatron's, DeepSpeed's): then data (context parallelism inside it), then pipeline:
  rank = tp + T·(dp + D·pp). A pipeline stage is a block of T·D consecutive ranks.
- ``tp-pp-dp`` (Meta's for Llama 3: "[TP, CP, PP, DP]", Llama 3 paper §3.3.2): then context, pipeline,
  and data outermost: rank = tp + T·(cp + C·(pp + P·dpo)), with the data index dp = cp + C·dpo. A model
  replica is a block of T·C·P consecutive ranks, so pipeline sends stay near and only the data-parallel
  traffic crosses far.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from dataclasses import dataclass

RANK_ORDERS = ("tp-dp-pp", "tp-pp-dp")  # innermost first; parallel.order


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int
    ep: int = 1  # expert parallelism: groups of ep consecutive data-parallel ranks share a layer's experts
    cp: int = 1  # context parallelism: groups of cp consecutive data-parallel ranks split each sequence
    order: str = "tp-dp-pp"  # RANK_ORDERS

    def __post_init__(self) -> None:
        if self.order not in RANK_ORDERS:
            raise ValueError(f"rank order {self.order!r} is not one of {', '.join(RANK_ORDERS)}")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def rank(self, dp: int, tp: int, pp: int) -> int:
        if self.order == "tp-dp-pp":
            return tp + self.tp * (dp + self.dp * pp)
        c, outer = dp % self.cp, dp // self.cp
        return tp + self.tp * (c + self.cp * (pp + self.pp * outer))

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp, tp, pp) of ``rank``."""
        tp = rank % self.tp
        rest = rank // self.tp
        if self.order == "tp-dp-pp":
            return rest % self.dp, tp, rest // self.dp
        c, rest = rest % self.cp, rest // self.cp
        return c + self.cp * (rest // self.pp), tp, rest % self.pp

    def tp_group(self, rank: int) -> list[int]:
        d, _, p = self.coords(rank)
        return [self.rank(d, t, p) for t in range(self.tp)]

    def dp_group(self, rank: int) -> list[int]:
        _, t, p = self.coords(rank)
        return [self.rank(d, t, p) for d in range(self.dp)]

    def ep_group(self, rank: int) -> list[int]:
        """The data-parallel ranks (same tensor rank and stage) whose GPUs hold one copy of all experts."""
        d, t, p = self.coords(rank)
        first = d - d % self.ep
        return [self.rank(x, t, p) for x in range(first, first + self.ep)]

    def cp_group(self, rank: int) -> list[int]:
        """The ranks (same tensor rank and stage) holding the other parts of this rank's sequences; in
        the data dimension, so gradients are summed over them too (as Megatron's DP×CP group)."""
        d, t, p = self.coords(rank)
        first = d - d % self.cp
        return [self.rank(x, t, p) for x in range(first, first + self.cp)]

    def edp_group(self, rank: int) -> list[int]:
        """Ranks holding the same experts (same stage, same slot in their EP group, any tensor rank): their
        expert gradients are summed (each tensor rank routes its own share of the tokens)."""
        d, _, p = self.coords(rank)
        return [self.rank(x, t, p) for x in range(d % self.ep, self.dp, self.ep) for t in range(self.tp)]

    def mp_group(self, rank: int) -> list[int]:
        """All ranks of this rank's model replica (tensor × pipeline)."""
        d, _, _ = self.coords(rank)
        return [self.rank(d, t, p) for p in range(self.pp) for t in range(self.tp)]

    def stage_peer(self, rank: int, stage: int) -> int:
        """The rank holding the same data/tensor slice on pipeline stage ``stage``."""
        d, t, _ = self.coords(rank)
        return self.rank(d, t, stage)

    def label(self, rank: int, gpus_per_node: int) -> str:
        d, t, p = self.coords(rank)
        return f"gpu{rank} n{rank // gpus_per_node} dp{d} tp{t} pp{p}"


def partition_layers(n_layers: int, stages: int, counts: list[int] | tuple[int, ...] | None = None
                     ) -> list[list[int]]:
    """Contiguous partition of layers into ``stages`` groups: ``counts`` layers each when given (uneven
    stages, e.g. Llama 3's lighter first and last stages), else balanced (earlier stages get the extra)."""
    if counts is not None:
        if len(counts) != stages or sum(counts) != n_layers or min(counts, default=0) < 0:
            raise ValueError(f"counts {list(counts)} do not split {n_layers} layers into {stages} groups")
        bounds = [0, *itertools.accumulate(counts)]
        return [list(range(a, b)) for a, b in itertools.pairwise(bounds)]
    base, extra = divmod(n_layers, stages)
    out, start = [], 0
    for s in range(stages):
        k = base + (1 if s < extra else 0)
        out.append(list(range(start, start + k)))
        start += k
    return out


def stage_layers_for(stage_layers: list[int] | tuple[int, ...] | None, pipeline: int, virtual_stages: int
                     ) -> list[int] | None:
    """``stage_layers`` if it describes this many model chunks, else None (a layout search that changes the
    pipeline depth falls back to the balanced split)."""
    if stage_layers is not None and len(stage_layers) == pipeline * virtual_stages:
        return list(stage_layers)
    return None


# Megatron-DeepSpeed's GPTModelPipe (megatron/model/gpt_model.py, 2021-22) hands DeepSpeed's PipelineModule
# a list of layer specs: three before the transformer layers (the 16-bit cast, the tied embedding, a
# transpose) and, after them, a transpose, the final LayerNorm, the tied embedding as the head and, in
# 16-bit training, a cast of the logits to fp32.
DEEPSPEED_GPT_SPECS_BEFORE = 3
DEEPSPEED_GPT_SPECS_AFTER = {True: 4, False: 3}  # keyed by 16-bit training


def _deepspeed_probe(prefix: list[int], parts: int, bottleneck: float) -> tuple[list[int], bool]:
    """One probe of DeepSpeed's ``_lprobe``: part boundaries that keep each part's weight under
    ``bottleneck``, searching each boundary only in a window of ``len // parts`` items, and whether they
    fit. It takes the same steps as DeepSpeed's probe, its early-exit test included: the cuts it gives are
    the ones that ran, quirks and all."""
    n = len(prefix)
    bounds = [0] + [n] * parts
    window = n // parts
    step = window
    target = bottleneck
    for p in range(1, parts):
        while step < n and prefix[step] < target:
            step += window
        bounds[p] = bisect.bisect_left(prefix, target, lo=step - window, hi=min(step, n))
        if bounds[p] == n:
            return bounds, prefix[-1] - prefix[bounds[p - 1]] < bottleneck
        target = prefix[bounds[p] - 1] + bottleneck
    return bounds, target >= prefix[-1]


def deepspeed_type_partition(n_layers: int, stages: int, sixteen_bit: bool = True) -> list[int] | None:
    """The cuts of ``_deepspeed_type_cuts`` (cached: the planner asks per candidate), as a fresh list."""
    cuts = _deepspeed_type_cuts(n_layers, stages, sixteen_bit)
    return None if cuts is None else list(cuts)


@functools.cache
def _deepspeed_type_cuts(n_layers: int, stages: int, sixteen_bit: bool) -> tuple[int, ...] | None:
    """Transformer layers per pipeline stage as DeepSpeed's pipeline engine placed Megatron-DeepSpeed's GPT
    (``PipelineModule(partition_method='type:transformer')``): each transformer layer weighs 1 and every
    other spec 0, and ``partition_balanced`` binary-searches the smallest bottleneck (tolerance 1e-3) for
    which its windowed greedy probe fits, then cuts there. The cuts fill the first stages and leave the
    deficit to the last: 70 layers over 12 stages give 6 each and 4 on the last stage, not 6 × 10 + 5 × 2.
    deepspeed/runtime/pipe/module.py ``_partition_layers`` and runtime/utils.py ``partition_balanced``,
    ``_rb_partition_balanced``, ``_lprobe``: the same code from v0.5.4 (Oct. 2021) to v0.8.2 (2023); its
    December 2023 rewrite (#4312) postdates the stack this describes.

    None where DeepSpeed would leave a stage without a transformer layer (the head then sits on an earlier
    stage, which dtsim's layout cannot express) or the specs are no more than the stages (its uniform
    fallback)."""
    weights = ([0] * DEEPSPEED_GPT_SPECS_BEFORE + [1] * n_layers
               + [0] * DEEPSPEED_GPT_SPECS_AFTER[sixteen_bit])
    if len(weights) <= stages:
        return None
    prefix = list(itertools.accumulate(weights))
    eps = 1e-3
    lower, upper = prefix[-1] / stages, float(prefix[-1])
    while upper > lower + eps:
        mid = lower + (upper - lower) / 2
        if _deepspeed_probe(prefix, stages, mid)[1]:
            upper = mid
        else:
            lower = mid + eps
    bounds, _ = _deepspeed_probe(prefix, stages, upper)
    counts = tuple(sum(weights[a:b]) for a, b in itertools.pairwise(bounds))
    return counts if min(counts) >= 1 and sum(counts) == n_layers else None
