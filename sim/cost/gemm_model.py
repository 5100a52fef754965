"""Achieved GEMM throughput by shape: what a cuBLAS-class kernel reaches on (m, n, k), not a flat share.

A tensor-core GEMM kernel tiles the output into BM×BN tiles, one thread block per tile, and streams K in
slices through a software pipeline. Three losses follow from that structure, and cuBLAS's heuristic picks
the tile (and split-K factor) that loses least:

- wave quantisation: ceil(tiles / SMs) waves, the last one partly idle (NVIDIA, "Matrix Multiplication
  Background User's Guide", §Wave quantisation);
- tile feed: a tile does BM·BN multiply-adds per K element it loads, BM + BN elements; small tiles spend
  relatively more time feeding the tensor cores (same guide, §Tile quantisation / arithmetic intensity);
- pipeline fill and epilogue per tile, worth ``k_overhead`` K elements: short K (attention's head_dim,
  thin projections) reaches far less than long K. The epilogue (storing the tile's 16-bit output) is most
  of it; where a public per-shape sweep exists (OpenXLA's GEMM table: H100, B200) the value is fitted to
  it, and it counts twice the K elements in fp8 (sim/cost/reference.py).

The ceiling those factors multiply is the measured best-shape throughput (MAMF) of the GPU, divided by
the model's own factors at that shape, times the sustained-to-boost clock ratio under full power (MSMF /
MAMF): see the reference profiles in ``sim/cost/reference/`` for the figures and their sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Output tiles cuBLAS/CUTLASS kernels for Ampere and Hopper offer (BM, BN).
TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
SPLIT_K = (1, 2, 4, 8)  # split-K factors cuBLAS uses when M·N gives too few tiles
MIN_SPLIT_K_ELEMS = 1024  # no split leaves a slice shorter than this


@dataclass(frozen=True)
class GemmShapeModel:
    """Parameters of the shape model for one GPU (from its reference profile)."""

    ceiling_flops_per_s: float  # sustained throughput of an ideal tile with infinite K and full waves
    sm_count: int
    k_overhead: float = 64.0  # pipeline fill + epilogue per tile, in K elements
    tile_feed: float = 8.0  # BM·BN/(BM+BN) at which feeding costs as much as computing (relative)
    # No shape beats the best one measured: MAMF is by definition the maximum over a sweep of M, N and K,
    # so the model's small gain for K longer than the best shape's stops at that shape's rate, and so does
    # its K factor (``k_plateau``, the best shape's K): had longer K run faster, the sweep would have found
    # its best at a longer K (mamf-finder's suggested sweeps reach K = 5376 on A100, 20480 on H100: its
    # README). Without the plateau a long-K shape of ragged waves would run faster than the same waves at
    # the best shape's K.
    cap_flops_per_s: float = math.inf
    k_plateau: float = math.inf

    def tile_efficiency(self, bm: int, bn: int) -> float:
        """Feed cost of a tile relative to the largest (256×128) tile."""
        def raw(a: int, b: int) -> float:
            intensity = a * b / (a + b)
            return intensity / (intensity + self.tile_feed)

        return raw(bm, bn) / raw(*TILES[0])

    def efficiency(self, m: int, n: int, k: int, batch: int = 1) -> float:
        """Fraction of ``ceiling_flops_per_s`` reached by ``batch`` GEMMs of (m, n, k): the best tile and split."""
        best = 0.0
        for bm, bn in TILES:
            tiles = math.ceil(m / bm) * math.ceil(n / bn) * batch
            useful = (m * n * batch) / (tiles * bm * bn)  # tile quantisation: padded edges do no work
            for split in SPLIT_K:
                # cuBLAS splits K only when the tiles cannot fill the SMs once, and never into short slices.
                if split > 1 and (tiles >= self.sm_count or k / split < MIN_SPLIT_K_ELEMS):
                    break
                blocks = tiles * split
                waves = math.ceil(blocks / self.sm_count)
                wave_eff = blocks / (waves * self.sm_count)
                k_slice = min(k / split, self.k_plateau)
                k_eff = k_slice / (k_slice + self.k_overhead)
                # (split-K's reduction of the partial tiles is memory traffic, priced by the caller's bytes)
                eff = useful * wave_eff * k_eff * self.tile_efficiency(bm, bn)
                best = max(best, eff)
        return best

    def flops_per_s(self, m: int, n: int, k: int, batch: int = 1) -> float:
        return min(self.ceiling_flops_per_s * self.efficiency(m, n, k, batch), self.cap_flops_per_s)
