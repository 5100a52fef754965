"""Reference profiles: the public figures that price kernels on a preset GPU when nothing was measured.

One JSON file per GPU preset in ``sim/cost/reference/`` (same envelope as a calibration profile:
schema_version, kind, metadata, fits, plus ``sources`` naming where every number comes from). The roofline
cost model reads it; a measured profile (``dtsim calibrate``) replaces what it measured.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

from sim.cost.gemm_model import GemmShapeModel
from sim.workload.ops import MEMORY_FAMILIES

REFERENCE_DIR = Path(__file__).with_name("reference")
REFERENCE_KIND = "dtsim-reference-profile"
# Presets that share a die (and so a profile) with another preset.
SAME_DIE = {"A100-40GB": "A100-80GB"}


@dataclass(frozen=True)
class FlashAttentionFit:
    """Fraction of the dtype's peak a fused attention kernel reaches at long sequences, per pass."""

    fwd_fraction: float
    bwd_fraction: float
    seq_half: float = 256.0  # efficiency × s/(s + seq_half): short sequences leave the SMs underfed
    head_dim_64_factor: float = 0.85  # head_dim ≤ 64 reaches this share of head_dim 128's rate
    kernel: str = ""

    def fraction(self, seq_len: int, head_dim: int, backward: bool) -> float:
        base = self.bwd_fraction if backward else self.fwd_fraction
        hd = self.head_dim_64_factor if head_dim <= 64 else 1.0
        return base * hd * seq_len / (seq_len + self.seq_half)


@dataclass(frozen=True)
class ReferenceProfile:
    name: str
    path: Path
    gemm_mamf_flops_per_s: float
    gemm_mamf_shape: tuple[int, int, int]
    sustained_clock_ratio: float
    k_overhead: float
    tile_feed: float
    flash: FlashAttentionFit
    memory_fraction: float
    sources: dict
    fp8_vs_bf16_fraction: float = 1.0  # fp8 GEMMs reach this share of bf16's fraction of peak
    # Older FlashAttention generations the profile has public figures for, by ``Op.kernel`` ("v1").
    flash_by_kernel: dict[str, FlashAttentionFit] = field(default_factory=dict)
    # Share of peak HBM bandwidth each memory-bound kernel family reaches (``Op.family``); a family not
    # listed streams at ``memory_fraction``.
    family_fractions: dict[str, float] = field(default_factory=dict)

    def memory_fraction_of(self, family: str) -> float:
        return self.family_fractions.get(family, self.memory_fraction)

    def gemm_model(self, sm_count: int, peak_flops_per_s: float, reference_peak_flops_per_s: float,
                   dtype: str = "bf16") -> GemmShapeModel:
        """The shape model whose best-shape throughput equals MAMF × the sustained clock ratio.

        The ceiling scales with ``peak_flops_per_s / reference_peak_flops_per_s`` so the same profile
        prices other dtypes (fp8, tf32) at the same share of their own peak."""
        probe = GemmShapeModel(1.0, sm_count, self.k_overhead, self.tile_feed)
        at_best = probe.efficiency(*self.gemm_mamf_shape)
        ceiling = self.gemm_mamf_flops_per_s / at_best * self.sustained_clock_ratio
        if dtype == "fp8":
            ceiling *= self.fp8_vs_bf16_fraction
        return GemmShapeModel(ceiling * peak_flops_per_s / reference_peak_flops_per_s, sm_count,
                              self.k_overhead, self.tile_feed)


@functools.cache
def reference_profile(gpu_name: str) -> ReferenceProfile | None:
    """The shipped reference profile of a GPU preset, or None (inline GPUs, presets without one)."""
    name = SAME_DIE.get(gpu_name, gpu_name)
    path = REFERENCE_DIR / f"{name}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if data.get("kind") != REFERENCE_KIND:
        raise ValueError(f"{path}: not a {REFERENCE_KIND}")
    g, fa, mem = data["fits"]["gemm"], data["fits"]["flash_attention"], data["fits"]["memory"]

    def flash_fit(f: dict) -> FlashAttentionFit:
        return FlashAttentionFit(float(f["fwd_fraction"]), float(f["bwd_fraction"]), float(f["seq_half"]),
                                 float(f["head_dim_64_factor"]), str(f.get("kernel", "")))

    return ReferenceProfile(
        name=name, path=path,
        gemm_mamf_flops_per_s=float(g["mamf_flops_per_s"]),
        gemm_mamf_shape=tuple(int(x) for x in g["mamf_shape"]),  # type: ignore[arg-type]
        sustained_clock_ratio=float(g["sustained_clock_ratio"]),
        k_overhead=float(g["k_overhead"]), tile_feed=float(g["tile_feed"]),
        flash=flash_fit(fa),
        memory_fraction=float(mem["stream_fraction"]),
        sources=dict(data.get("sources", {})),
        fp8_vs_bf16_fraction=float(g.get("fp8_vs_bf16_fraction", 1.0)),
        flash_by_kernel={key[len("flash_attention_"):]: flash_fit(f) for key, f in data["fits"].items()
                         if key.startswith("flash_attention_")},
        family_fractions=_family_fractions(path, mem.get("family_fractions", {})),
    )


def _family_fractions(path: Path, given: dict) -> dict[str, float]:
    unknown = sorted(set(given) - set(MEMORY_FAMILIES))
    if unknown:
        raise ValueError(f"{path}: memory.family_fractions names unknown kernel families {unknown} "
                         f"(known: {', '.join(MEMORY_FAMILIES)})")
    return {k: float(v) for k, v in given.items()}
