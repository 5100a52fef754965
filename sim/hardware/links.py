"""Link specifications: per-direction data rate, the share of it NCCL reaches, and NCCL's latencies.

Data rates are per direction (reference.md): NVLink per GPU, PCIe x16, InfiniBand 4x per port.

``efficiency`` is the fraction of the data rate that NCCL's bus bandwidth reaches for large messages
with the Simple protocol, from public nccl-tests ``all_reduce_perf`` runs (figures per preset below).
``latency_us`` is the per-hop latency of the Simple protocol and ``kind`` selects NCCL's hardware class
(NVLink, PCI, network), whose LL and LL128 per-hop latencies scale it (``sim.hardware.nccl``, from NCCL's
``src/graph/tuning.cc``). A custom link (``kind: custom``) has one latency for every protocol.

``nvls_efficiency``: NVLink SHARP (NVSwitch multicast/reduce, H100 and later): the share of the NVLink
rate NVLS traffic reaches; null where the switch has no NVLS. ``sharp``: the InfiniBand switches reduce
in the network (SHARPv2 on Quantum HDR, SHARPv3 on Quantum-2 NDR; SHARPv1 on EDR handles small messages
only, so EDR is marked without).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.hardware.nccl import HW_LATENCY_US, PROTOCOL_BW_FRACTION
from sim.units import GB, US


class LinkSpec(BaseModel):
    """One link type. Inline mappings give ``bandwidth_GBps`` (bytes) or ``bandwidth_Gbps`` (bits)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    name: str = "custom"
    bandwidth_GBps: float | None = Field(None, gt=0, description="per-direction data rate, GB/s")
    bandwidth_Gbps: float | None = Field(None, gt=0, description="per-direction data rate, Gb/s")
    latency_us: float = Field(2.0, ge=0, description="per-hop latency with NCCL's Simple protocol, µs")
    efficiency: float = Field(
        1.0, gt=0, le=1, description="fraction of the data rate NCCL bus bandwidth reaches for large messages"
    )
    kind: Literal["nvlink", "pcie", "net", "custom"] = Field(
        "custom", description="NCCL hardware class (sets LL/LL128 latencies relative to Simple); custom: one latency"
    )
    nvls_efficiency: float | None = Field(
        None, gt=0, le=1, description="NVLink SHARP: fraction of the data rate NVLS traffic reaches; null = no NVLS"
    )
    sharp: bool = Field(False, description="the switches reduce in the network (InfiniBand SHARP)")

    @model_validator(mode="after")
    def _one_rate(self) -> LinkSpec:
        if (self.bandwidth_GBps is None) == (self.bandwidth_Gbps is None):
            raise ValueError("give exactly one of bandwidth_GBps (bytes/s) or bandwidth_Gbps (bits/s)")
        return self

    @property
    def rate_Bps(self) -> float:
        """Nominal per-direction data rate in bytes/s."""
        if self.bandwidth_GBps is not None:
            return self.bandwidth_GBps * GB
        return self.bandwidth_Gbps * GB / 8  # type: ignore[operator]

    @property
    def bandwidth_Bps(self) -> float:
        """Achievable per-direction bandwidth in bytes/s (rate × efficiency), Simple protocol."""
        return self.rate_Bps * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * US

    def protocol_latency_scale(self, protocol: str) -> float:
        """Per-hop latency of ``protocol`` relative to Simple (NCCL's hwLatencies ratio for this class)."""
        row = HW_LATENCY_US.get(self.kind)
        return row[protocol] / row["Simple"] if row else 1.0

    def protocol_latency_s(self, protocol: str) -> float:
        return self.latency_s * self.protocol_latency_scale(protocol)

    def protocol_bandwidth_Bps(self, protocol: str) -> float:
        """Payload bandwidth with ``protocol`` (LL halves it, LL128 keeps 92 %)."""
        return self.bandwidth_Bps * PROTOCOL_BW_FRACTION[protocol]

    @property
    def nvls_bandwidth_Bps(self) -> float:
        return self.rate_Bps * (self.nvls_efficiency or 0.0)


_NVL = HW_LATENCY_US["nvlink"]["Simple"]
_PCI = HW_LATENCY_US["pcie"]["Simple"]
_NET = HW_LATENCY_US["net"]["Simple"]

# efficiency, NVLink: nccl-tests all_reduce_perf on DGX A100 (8×A100, NVSwitch) reaches ≈ 230–235 GB/s
# bus bandwidth of the 300 GB/s NVLink 3 rate (public all_reduce_perf
# runs on DGX A100 at ≥ 1 GiB) → 0.78. Other NVLink generations: no public ring-only figure used; assumed the same share.
# nvls_efficiency: 8×H100 all_reduce_perf with NVLS reaches ≈ 470–480 GB/s busbw (NVIDIA, "Fast
# Inter-GPU Communication with NCCL for Large Language Models", NCCL 2.18 blog). dtsim's NVLS moves
# N(p+1)/p bytes each way per GPU (multimem ld_reduce then multicast store), so busbw = 2(p−1)/(p+1)·B:
# 475 GB/s at p = 8 → B = 305 GB/s = 0.68 of 450. Blackwell: scaled by NCCL's own nvlsEfficiency ratio
# (tuning.cc: Hopper 0.85, Blackwell 0.74) → 0.59.
# PCIe: PCIe Gen4 x16 copies reach ≈ 25 of 31.5 GB/s (≈ 0.8; 128b/130b coding and TLP headers).
INTRA_PRESETS: dict[str, LinkSpec] = {
    s.name: s
    for s in [
        LinkSpec(name="nvlink2", bandwidth_GBps=150, latency_us=_NVL, efficiency=0.78, kind="nvlink"),
        LinkSpec(name="nvlink3", bandwidth_GBps=300, latency_us=_NVL, efficiency=0.78, kind="nvlink"),
        LinkSpec(name="nvlink4", bandwidth_GBps=450, latency_us=_NVL, efficiency=0.78, kind="nvlink",
                 nvls_efficiency=0.68),
        LinkSpec(name="nvlink5", bandwidth_GBps=900, latency_us=_NVL, efficiency=0.78, kind="nvlink",
                 nvls_efficiency=0.59),
        LinkSpec(name="pcie4", bandwidth_GBps=31.5, latency_us=_PCI, efficiency=0.80, kind="pcie"),
        LinkSpec(name="pcie5", bandwidth_GBps=63.0, latency_us=_PCI, efficiency=0.80, kind="pcie"),
    ]
}
# efficiency, InfiniBand: nccl-tests across nodes reach ≈ 20–24 GB/s bus bandwidth per HDR NIC of
# 25 GB/s and ≈ 46–49 GB/s per NDR NIC of 50 (public all_reduce_perf runs on DGX A100 / DGX H100
# SuperPODs) → HDR 0.92 (23 GB/s), NDR 0.95 (47.5 GB/s). EDR: the same ConnectX verbs path as HDR, 0.92
# (11.5 of 12.5 GB/s); XDR: no public figure yet, assumed as NDR.
INTER_PRESETS: dict[str, LinkSpec] = {
    s.name: s
    for s in [
        LinkSpec(name="edr", bandwidth_Gbps=100, latency_us=_NET, efficiency=0.92, kind="net"),
        LinkSpec(name="hdr", bandwidth_Gbps=200, latency_us=_NET, efficiency=0.92, kind="net", sharp=True),
        LinkSpec(name="ndr", bandwidth_Gbps=400, latency_us=_NET, efficiency=0.95, kind="net", sharp=True),
        LinkSpec(name="xdr", bandwidth_Gbps=800, latency_us=_NET, efficiency=0.95, kind="net", sharp=True),
    ]
}
