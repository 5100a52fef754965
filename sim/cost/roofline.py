"""Datasheet roofline cost model: max(compute, memory) time at the efficiency real kernels reach,
plus wave quantisation for GEMMs and a fixed launch overhead per kernel."""

from __future__ import annotations

import math

from sim.errors import ScenarioError
from sim.hardware.gpu import GPUSpec
from sim.workload.ops import ATTENTION, ELEMENTWISE, FIXED, GEMM, Op

TILE = 128  # output tile edge of a typical tensor-core GEMM kernel (cuBLAS/CUTLASS 128×128 tiles)


class RooflineCostModel:
    name = "roofline"

    def __init__(self, gpu: GPUSpec):
        self.gpu = gpu
        self._mem_Bps = gpu.memory_bw_Bps * gpu.memory_efficiency

    def _peak(self, dtype: str) -> float:
        try:
            return self.gpu.peak_flops(dtype)
        except KeyError:
            raise ScenarioError(
                f"GPU {self.gpu.name} has no {dtype} peak (it has {', '.join(self.gpu.peak_tflops)}); "
                "choose a supported training.precision",
                "training.precision",
            ) from None

    def wave_efficiency(self, op: Op) -> float:
        """Fraction of the SMs doing useful work over the GEMM's waves of output tiles."""
        if not (op.m and op.n):
            return 1.0
        tiles = math.ceil(op.m / TILE) * math.ceil(op.n / TILE) * op.batch
        waves = math.ceil(tiles / self.gpu.sm_count)
        return tiles / (waves * self.gpu.sm_count)

    def op_time_s(self, op: Op) -> float:
        if op.kind == FIXED:
            return op.fixed_s
        memory_s = op.bytes / self._mem_Bps
        if op.kind == ELEMENTWISE:
            compute_s = 0.0
        elif op.kind == ATTENTION:
            compute_s = op.flops / (self._peak(op.dtype) * self.gpu.attention_efficiency)
        elif op.kind == GEMM:
            compute_s = op.flops / (self._peak(op.dtype) * self.gpu.gemm_efficiency * self.wave_efficiency(op))
        else:  # pragma: no cover - Op kinds are closed
            raise ValueError(op.kind)
        return max(compute_s, memory_s) + self.gpu.kernel_launch_s

    def link_params(self, scope: str, group_size: int) -> tuple[float, float] | None:
        return None

    def report(self) -> dict:
        return {"kind": "roofline", "gpu": self.gpu.name}
