"""Rank layout: rank ↔ (data, tensor, pipeline) coordinates and process groups.

Megatron's order puts tensor parallelism innermost (consecutive ranks, so a TP group sits inside a node
on NVLink), then data, then pipeline: rank = tp + T·(dp + D·pp).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int
    ep: int = 1  # expert parallelism: groups of ep consecutive data-parallel ranks share a layer's experts
    cp: int = 1  # context parallelism: groups of cp consecutive data-parallel ranks split each sequence

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def rank(self, dp: int, tp: int, pp: int) -> int:
        return tp + self.tp * (dp + self.dp * pp)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp, tp, pp) of ``rank``."""
        tp = rank % self.tp
        rest = rank // self.tp
        return rest % self.dp, tp, rest // self.dp

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
