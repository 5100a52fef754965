"""Reference profiles: the public figures that price kernels on a preset GPU when nothing was measured.

One JSON file per GPU preset in ``sim/cost/reference/`` (same envelope as a calibration profile:
schema_version, kind, metadata, fits, plus ``sources`` naming where every number comes from). The roofline
cost model reads it; a measured profile (``dtsim calibrate``) replaces what it measured.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from sim.cost.gemm_model import GemmShapeModel
from sim.workload.ops import MEMORY_FAMILIES

REFERENCE_DIR = Path(__file__).with_name("reference")
REFERENCE_KIND = "dtsim-reference-profile"
# Presets that share a die (and so a profile) with another preset.
SAME_DIE = {"A100-40GB": "A100-80GB"}


@dataclass(frozen=True)
class AttentionCurves:
    """A fused attention kernel's published speed by sequence length, causal, per head size: TFLOP/s as
    FlashAttention's benchmarks count them (forward 4·s²·d per head and sequence, halved when causal;
    backward 2.5× the forward's). ``passes``: "fwd" (the forward alone) or "fwd+bwd" (3.5× the forward's
    FLOPs over both passes); ``bwd_over_fwd`` (backward rate / forward rate) splits a fwd+bwd figure into
    its passes, or prices the backward from a forward figure."""

    passes: str
    seq_len: tuple[int, ...]
    tflops_by_head_dim: dict[int, tuple[float, ...]]
    bwd_over_fwd: float = 0.0
    # The backward's own published TFLOP/s ("fwd" curves only); it replaces bwd_over_fwd.
    bwd_tflops_by_head_dim: dict[int, tuple[float, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.passes not in ("fwd", "fwd+bwd"):
            raise ValueError(f"attention curves: passes {self.passes!r} — use fwd or fwd+bwd")
        if list(self.seq_len) != sorted(set(self.seq_len)) or not self.tflops_by_head_dim:
            raise ValueError("attention curves: seq_len must increase and at least one head size be given")
        for table in (self.tflops_by_head_dim, self.bwd_tflops_by_head_dim):
            for hd, row in table.items():
                if len(row) != len(self.seq_len) or min(row) <= 0:
                    raise ValueError(f"attention curves: head_dim {hd} needs {len(self.seq_len)} positive values")
        if self.bwd_tflops_by_head_dim:
            if self.passes != "fwd" or set(self.bwd_tflops_by_head_dim) != set(self.tflops_by_head_dim):
                raise ValueError("attention curves: backward rows go with forward rows of the same head sizes")
        elif self.bwd_over_fwd <= 0:
            raise ValueError("attention curves: give bwd_over_fwd or the backward's own rows")

    def _at(self, row: tuple[float, ...], seq_len: int, seq_half: float) -> float:
        """``row`` at ``seq_len``: linear in log(s) between the published lengths, flat past the longest,
        and below the shortest scaled by s/(s + seq_half) (fewer query blocks than SMs)."""
        s = self.seq_len
        if seq_len <= s[0]:
            return row[0] * (seq_len / (seq_len + seq_half)) / (s[0] / (s[0] + seq_half))
        if seq_len >= s[-1]:
            return row[-1]
        i = bisect.bisect_right(s, seq_len)
        w = math.log(seq_len / s[i - 1]) / math.log(s[i] / s[i - 1])
        return row[i - 1] + w * (row[i] - row[i - 1])

    def tflops(self, seq_len: int, head_dim: int, backward: bool, seq_half: float) -> float:
        """Forward or backward TFLOP/s at this length and head size (linear between the published head
        sizes, the nearest one outside them)."""
        own = backward and bool(self.bwd_tflops_by_head_dim)
        table = self.bwd_tflops_by_head_dim if own else self.tflops_by_head_dim
        dims = sorted(table)
        lo = max([d for d in dims if d <= head_dim], default=dims[0])
        hi = min([d for d in dims if d >= head_dim], default=dims[-1])
        r_lo = self._at(table[lo], seq_len, seq_half)
        r_hi = self._at(table[hi], seq_len, seq_half)
        rate = r_lo if hi == lo else r_lo + (head_dim - lo) / (hi - lo) * (r_hi - r_lo)
        if own:
            return rate
        rho = self.bwd_over_fwd
        fwd = rate if self.passes == "fwd" else rate * (1.0 + 2.5 / rho) / 3.5
        return fwd * rho if backward else fwd


@dataclass(frozen=True)
class FlashAttentionFit:
    """A fused attention kernel's fraction of the dtype's peak, per pass: from its published curves where
    the profile has them, else fractions at long sequences × s/(s + seq_half)."""

    fwd_fraction: float = 0.0
    bwd_fraction: float = 0.0
    seq_half: float = 256.0  # efficiency × s/(s + seq_half): short sequences leave the SMs underfed
    head_dim_64_factor: float = 0.85  # head_dim ≤ 64 reaches this share of head_dim 128's rate
    kernel: str = ""
    curves: AttentionCurves | None = None

    def fraction(self, seq_len: int, head_dim: int, backward: bool, peak_16bit_flops_per_s: float) -> float:
        """Share of the 16-bit peak (``peak_16bit_flops_per_s``: what the curves were measured against)."""
        if self.curves is not None:
            return self.curves.tflops(seq_len, head_dim, backward, self.seq_half) * 1e12 / peak_16bit_flops_per_s
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
        # A tile's fixed cost (pipeline fill and, most of it, the epilogue storing its 16-bit output) takes
        # as long whatever the operands' dtype, while a dtype of k× the peak streams K k× faster: counted in
        # K elements it grows with the peak (fp8: twice bf16's; XLA's B200 sweep fits 768 for fp8 against
        # 384 for bf16, sim/cost/reference/B200.json).
        k_overhead = self.k_overhead * peak_flops_per_s / reference_peak_flops_per_s
        probe = GemmShapeModel(1.0, sm_count, k_overhead, self.tile_feed, k_plateau=self.gemm_mamf_shape[2])
        at_best = probe.efficiency(*self.gemm_mamf_shape)
        ceiling = self.gemm_mamf_flops_per_s / at_best * self.sustained_clock_ratio
        if dtype == "fp8":
            ceiling *= self.fp8_vs_bf16_fraction
        scaled = ceiling * peak_flops_per_s / reference_peak_flops_per_s
        # capped at the best shape's own rate (MAMF × sustained clock, scaled): the sweep's maximum
        return GemmShapeModel(scaled, sm_count, k_overhead, self.tile_feed, cap_flops_per_s=scaled * at_best,
                              k_plateau=self.gemm_mamf_shape[2])


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
        c = f.get("curves")
        curves = None if c is None else AttentionCurves(
            str(c["passes"]), tuple(int(s) for s in c["seq_len"]),
            {int(hd): tuple(float(x) for x in row) for hd, row in c["tflops_causal"].items()},
            float(c.get("bwd_over_fwd", 0.0)),
            {int(hd): tuple(float(x) for x in row) for hd, row in c.get("tflops_causal_bwd", {}).items()})
        if curves is None and not ("fwd_fraction" in f and "bwd_fraction" in f):
            raise ValueError(f"{path}: a flash_attention fit needs curves or fwd_fraction and bwd_fraction")
        return FlashAttentionFit(float(f.get("fwd_fraction", 0.0)), float(f.get("bwd_fraction", 0.0)),
                                 float(f.get("seq_half", 256.0)), float(f.get("head_dim_64_factor", 0.85)),
                                 str(f.get("kernel", "")), curves)

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
