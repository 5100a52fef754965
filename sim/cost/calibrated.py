"""A cost model from a measured calibration profile (``dtsim calibrate``), with a datasheet fallback.

How each op is priced:
  GEMM         achieved FLOP/s at its shape, interpolated in log2(m, n, k) over the measured shapes
               (inverse-distance weighting of the 4 nearest); a batched GEMM is priced as one GEMM of
               shape (batch·m, n, k), which is how strided-batched kernels fill the GPU. A coarse op
               without a shape (generic layers) is priced by its FLOPs and arithmetic intensity
               (FLOPs / bytes) against the measured GEMMs (FLOPs alone: as a cube). Never faster than
               the fastest GEMM measured.
  ATTENTION    as a GEMM of the equivalent shape: (batch·m, n, k) (one head's score matrix, batch = the
               b × heads count), else by FLOPs and intensity; and never faster than moving its bytes at
               measured bandwidth. Fused attention also does softmax and masking, so this is a lower
               bound on real kernels.
  ELEMENTWISE  bytes / measured bandwidth at that size: a streaming op at the median over copy/add/mul/
               gelu, an op of a kernel family (Op.family: norm, softmax, dropout) at its family's curve
               (per byte, so the dtype does not matter); a family the profile did not measure goes to the
               fallback (the reference profile's public figure).
  FIXED        op.fixed_s.
Dtypes (or sections) the profile lacks go to ``fallback`` and ``report()`` lists them. Shapes outside
the measured range are extrapolated, counted (distinct ops) and named in ``report()`` (no Python warning:
the CLI prints one note line).

Only numpy and JSON are used here; the profile format and its reader are ``sim.cost.profile``.
"""

from __future__ import annotations

import os

from sim.cost.base import CostModel
from sim.cost.profile import BandwidthCurve, ShapeTable, device_name, load_profile
from sim.units import DTYPE_BYTES
from sim.workload.ops import ATTENTION, ELEMENTWISE, FIXED, GEMM, MEASURED_AS, Op

LINK_SOURCE_OPS = ("all_reduce", "all_gather")  # fits that define per-link (α, B), in order of preference


class CalibratedCostModel:
    """CostModel backed by a profile; anything the profile cannot answer goes to ``fallback``."""

    name = "calibrated"

    def __init__(self, profile_path: str | os.PathLike, fallback: CostModel):
        self.profile_path = str(profile_path)
        self.profile = load_profile(profile_path, field="calibration")
        self.fallback = fallback
        fits = self.profile["fits"]
        self._gemm = {
            dtype: ShapeTable(t["points"], t["min_time_s"], t.get("elem_bytes", DTYPE_BYTES.get(dtype, 2)))
            for dtype, t in fits.get("gemm", {}).items()
        }
        self._mem = BandwidthCurve(fits["memory"]["kernels"]) if fits.get("memory") else None
        self._links = [
            f for f in fits.get("collectives", []) if f["op"] in LINK_SOURCE_OPS and f.get("bandwidth_Bps")
        ]
        self._cache: dict[Op, float] = {}
        self._extrapolated = 0
        self._first_extrapolated = ""
        self._fallbacks: dict[str, None] = {}  # ordered set of reasons

    # ------------------------------------------------------------------------------------------ ops

    def op_time_s(self, op: Op) -> float:
        """Seconds for ``op``; memoised, so each distinct op is priced (and counted) once."""
        if op.kind == FIXED:
            return op.fixed_s
        cached = self._cache.get(op)
        if cached is None:
            cached = self._cache[op] = self._price(op)
        return cached

    def _price(self, op: Op) -> float:
        if op.kind == ELEMENTWISE:
            if op.bytes <= 0 and op.flops <= 0:
                return 0.0  # moves nothing: no kernel runs
            if self._mem is None:
                return self._fall(op, "elementwise: profile has no memory section")
            if op.bytes <= 0:
                return self._fall(op, "elementwise: op without bytes")
            family = op.family if self._mem.has(op.family) else MEASURED_AS.get(op.family, op.family)
            if not self._mem.has(family):
                return self._fall(op, f"elementwise: profile has no {op.family} kernels measured")
            t, extrapolated = self._mem.time_s(op.bytes, family)
            return self._note(op, t, extrapolated, f"{op.bytes:.3g} bytes")
        if op.kind not in (GEMM, ATTENTION):
            return self._fall(op, f"op kind {op.kind!r}: not calibrated")
        table = self._gemm.get(op.dtype)
        if table is None:
            have = ", ".join(sorted(self._gemm)) or "none"
            return self._fall(op, f"{op.kind} dtype {op.dtype}: not in profile (measured: {have})")
        if op.m > 0 and op.n > 0 and op.k > 0:
            m, n, k = float(op.m * max(1, op.batch)), float(op.n), float(op.k)
            flops = op.flops if op.flops > 0 else 2.0 * m * n * k
            tput, extrapolated = table.flops_per_s(m, n, k)
            where = f"(m, n, k) = ({m:.0f}, {n:.0f}, {k:.0f})"
        elif op.flops > 0 and op.bytes > 0:
            flops = op.flops
            tput, extrapolated = table.flops_per_s_by_intensity(flops, op.bytes)
            where = f"({flops:.3g} FLOPs, {flops / op.bytes:.3g} FLOP/byte)"
        elif op.flops > 0:  # FLOPs alone: a cube of the same FLOPs
            flops, side = op.flops, (op.flops / 2.0) ** (1.0 / 3.0)
            tput, extrapolated = table.flops_per_s(side, side, side)
            where = f"({flops:.3g} FLOPs as a cube)"
        else:
            return 0.0
        t = max(flops / tput, table.min_time_s)
        if op.kind == ATTENTION and op.bytes > 0 and self._mem is not None:
            t_mem, mem_extra = self._mem.time_s(op.bytes)
            if t_mem > t:
                t, extrapolated = t_mem, mem_extra
        return self._note(op, t, extrapolated, where)

    def _note(self, op: Op, t: float, extrapolated: bool, where: str) -> float:
        if extrapolated:
            self._extrapolated += 1
            if self._extrapolated == 1:  # reported in the summary (and by the CLI as one note), not warned
                self._first_extrapolated = f"{op.name} {where}"
        return t

    def _fall(self, op: Op, reason: str) -> float:
        self._fallbacks[f"{reason} -> {getattr(self.fallback, 'name', type(self.fallback).__name__)}"] = None
        return self.fallback.op_time_s(op)

    # ------------------------------------------------------------------------------------------ links

    def link_params(self, scope: str, group_size: int) -> tuple[float, float] | None:
        """Per-link (α_s, B_Bps) of ``scope`` from the fitted ring all-reduce (else all-gather) at the
        nearest measured group size; None when the profile did not measure that scope."""
        for op in LINK_SOURCE_OPS:
            fits = [f for f in self._links if f["op"] == op and f["scope"] == scope]
            if fits:
                best = min(fits, key=lambda f: (abs(f["group_size"] - group_size), -f["group_size"]))
                return float(best["alpha_s"]), float(best["bandwidth_Bps"])
        return None

    # ------------------------------------------------------------------------------------------ report

    def report(self) -> dict:
        return {
            "name": self.name,
            "profile": self.profile_path,
            "device": device_name(self.profile),
            "extrapolated_ops": self._extrapolated,
            "first_extrapolated_op": self._first_extrapolated,
            "fallbacks": list(self._fallbacks),
            "link_scopes": sorted({f["scope"] for f in self._links}),
        }
