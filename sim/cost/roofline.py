"""Datasheet cost model: each op at the throughput its kernel reaches on this GPU, from public figures.

- GEMM: the shape model (``sim.cost.gemm_model``: best tile and split-K, wave and tile quantisation, short-K
  pipeline losses) under the GPU's sustained ceiling from its reference profile (MAMF × sustained clock
  ratio); GPUs without one use ``gemm_efficiency`` × peak as that ceiling. Never faster than moving the bytes.
- ATTENTION (fused, flash-style): the FLOPs the kernel executes — half the score matrix when causal (the
  kernels skip masked blocks), 2.5× forward in backward (the score recomputation) — at the fraction of peak
  public FlashAttention measurements reach for that head size and sequence length, times the profile's
  sustained clock ratio (those figures, like MAMF, are one GPU benchmarked alone).
- ELEMENTWISE: bytes at the HBM bandwidth its kernel family reaches (``Op.family``: norms, softmax and
  dropout reach less than the streaming kernels; the reference profile's public figures); an op that
  moves no bytes and does no arithmetic launches nothing.
- every kernel pays ``kernel_launch_us`` (launch and tail; host dispatch bounds are the builder's: it
  knows the software stack).
"""

from __future__ import annotations

import warnings

from sim.cost.gemm_model import GemmShapeModel
from sim.cost.reference import ReferenceProfile, reference_profile
from sim.errors import ScenarioError
from sim.hardware.gpu import GPU_PRESETS, GPUSpec
from sim.workload.ops import ATTENTION, ELEMENTWISE, FIXED, GEMM, TE_ATTENTION, Op

FLASH_BWD_EXECUTED = 2.5 / 2.0  # backward runs 5 matmuls of the forward's 2 (recomputes QKᵀ); model FLOPs count 2×
# GPU fields a reference profile's measured figures stand in for (their edits on a preset do nothing).
_REFERENCE_REPLACES = ("gemm_efficiency", "attention_efficiency", "memory_efficiency")


def _warn_ignored(gpu: GPUSpec, preset: GPUSpec) -> None:
    """One warning line when a scenario edits efficiencies of a preset its reference profile prices."""
    changed = [f for f in _REFERENCE_REPLACES if getattr(gpu, f) != getattr(preset, f)]
    if changed:
        warnings.warn(f"cluster.gpu: {', '.join(changed)} of {gpu.name} not used — its reference profile "
                      f"(sim/cost/reference/) prices its kernels from measurements; rename the GPU (e.g. name: "
                      f"{gpu.name}-custom) to price it by these efficiencies instead", stacklevel=3)


class RooflineCostModel:
    name = "roofline"

    def __init__(self, gpu: GPUSpec, use_reference: bool = True):
        self.gpu = gpu
        self.reference: ReferenceProfile | None = reference_profile(gpu.name) if use_reference else None
        # The reference profile's figures were measured on the preset of that name: kernel rates scale
        # with this GPU's peaks over the preset's, so a preset given faster (or slower) peaks in a
        # scenario runs faster (or slower), not at the preset's measured rate.
        preset = GPU_PRESETS.get(gpu.name)
        self._reference_peak_16bit = preset.peak_16bit_flops() if self.reference and preset else None
        if self.reference is not None and preset is not None:
            _warn_ignored(gpu, preset)
        fraction = self.reference.memory_fraction if self.reference else gpu.memory_efficiency
        self._mem_Bps = gpu.memory_bw_Bps * fraction
        self._gemm: dict[str, GemmShapeModel] = {}
        self._cache: dict[Op, float] = {}

    def _peak(self, dtype: str) -> float:
        try:
            return self.gpu.peak_flops(dtype)
        except KeyError:
            raise ScenarioError(
                f"GPU {self.gpu.name} has no {dtype} peak (it has {', '.join(self.gpu.peak_tflops)}); "
                "choose a supported training.precision",
                "training.precision",
            ) from None

    def _peak_16bit(self) -> float:
        """The bf16 (else fp16) dense peak of the GPU the public kernel figures were measured on: the
        preset of this name where the reference profile comes from one, else this GPU's."""
        peak = self._reference_peak_16bit or self.gpu.peak_16bit_flops()
        return peak if peak is not None else self._peak("fp16")  # neither: the one clear error _peak gives

    def gemm_model(self, dtype: str) -> GemmShapeModel:
        model = self._gemm.get(dtype)
        if model is None:
            peak = self._peak(dtype)
            if self.reference is not None:
                model = self.reference.gemm_model(self.gpu.sm_count, peak, self._peak_16bit(), dtype)
            else:
                model = GemmShapeModel(peak * self.gpu.gemm_efficiency, self.gpu.sm_count)
            self._gemm[dtype] = model
        return model

    def gemm_flops_per_s(self, op: Op) -> float:
        """Throughput of a GEMM op; one without a shape (coarse layers) runs at the ceiling."""
        model = self.gemm_model(op.dtype)
        if op.m and op.n and op.k:
            return model.flops_per_s(op.m, op.n, op.k, op.batch)
        return min(model.ceiling_flops_per_s, model.cap_flops_per_s)

    def attention_flops_per_s(self, op: Op) -> float:
        """The fused attention kernel's rate: the reference profile's fit for its FlashAttention generation
        (``op.kernel``; "" the profile's own), else ``attention_efficiency`` × peak."""
        head_dim, seq = op.k or 128, op.n or 2048
        if self.reference is not None:
            fit = self.reference.flash_by_kernel.get(op.kernel) if op.kernel else self.reference.flash
            if fit is None and op.kernel == TE_ATTENTION:  # TE runs the GPU's own kernel where no TE fit
                fit = self.reference.flash
            if fit is None:
                have = ", ".join(["latest", *sorted(k for k in self.reference.flash_by_kernel if k != TE_ATTENTION)])
                raise ScenarioError(
                    f"{op.kernel!r} — the {self.gpu.name} reference profile has no public FlashAttention "
                    f"{op.kernel} figures (it has: {have}); use latest, or calibrate this GPU",
                    "training.flash_attention")
            # The published attention figures are a GPU benchmarked alone (burst clocks), like MAMF; in a
            # training job every GPU of the node is power-saturated and holds the sustained clock, which
            # compute-bound attention kernels feel as GEMMs do.
            fraction = fit.fraction(seq, head_dim, op.backward, self._peak_16bit()) * self.reference.sustained_clock_ratio
        else:
            fraction = self.gpu.attention_efficiency
        return self._peak(op.dtype) * fraction

    def op_time_s(self, op: Op) -> float:
        if op.kind == FIXED:
            return op.fixed_s
        t = self._cache.get(op)
        if t is None:
            t = self._cache[op] = self._price(op)
        return t

    def memory_Bps(self, family: str = "") -> float:
        """Achieved HBM bandwidth of a memory-bound kernel of ``family`` ("" a streaming kernel)."""
        if self.reference is None or not family:
            return self._mem_Bps
        return self.gpu.memory_bw_Bps * self.reference.memory_fraction_of(family)

    def _price(self, op: Op) -> float:
        if op.kind == ELEMENTWISE and op.bytes <= 0 and op.flops <= 0:
            return 0.0
        memory_s = op.bytes / self.memory_Bps(op.family if op.kind == ELEMENTWISE else "")
        if op.kind == ELEMENTWISE:
            compute_s = 0.0
        elif op.kind == ATTENTION:
            executed = op.flops * (0.5 if op.causal else 1.0) * (FLASH_BWD_EXECUTED if op.backward else 1.0)
            compute_s = executed / self.attention_flops_per_s(op)
        elif op.kind == GEMM:
            compute_s = op.flops / self.gemm_flops_per_s(op)
        else:  # pragma: no cover - Op kinds are closed
            raise ValueError(op.kind)
        return max(compute_s, memory_s) + self.gpu.kernel_launch_s

    def link_params(self, scope: str, group_size: int) -> tuple[float, float] | None:
        return None

    def report(self) -> dict:
        out: dict = {"kind": "roofline", "gpu": self.gpu.name}
        if self.reference is not None:
            out["reference_profile"] = self.reference.path.name
        return out
