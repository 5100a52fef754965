"""Link specifications: per-direction data rate, per-message latency, achievable fraction.

Data rates are per direction (reference.md): NVLink per GPU, PCIe x16, InfiniBand 4x per port.
``efficiency`` is the fraction of the data rate bulk transfers reach (NCCL bus bandwidth on NVLink is
about 80% of the link rate; InfiniBand verbs reach about 95%). ``latency_us`` is the per-message cost a
collective step pays (software + hardware), not the wire latency alone: the figures sit between NCCL's
own per-step ring latencies for the LL128 and Simple protocols in its tuning model (NVLink ≈ 1.9–3.4 µs,
PCIe ≈ 2.5–5.7 µs, network ≈ 4–9.6 µs per step).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.units import GB, US


class LinkSpec(BaseModel):
    """One link type. Inline mappings give ``bandwidth_GBps`` (bytes) or ``bandwidth_Gbps`` (bits)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    bandwidth_GBps: float | None = Field(None, gt=0, description="per-direction data rate, GB/s")
    bandwidth_Gbps: float | None = Field(None, gt=0, description="per-direction data rate, Gb/s")
    latency_us: float = Field(2.0, ge=0, description="per-message latency, µs")
    efficiency: float = Field(1.0, gt=0, le=1, description="fraction of the data rate bulk transfers reach")

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
        """Achievable per-direction bandwidth in bytes/s (rate × efficiency)."""
        return self.rate_Bps * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * US


INTRA_PRESETS: dict[str, LinkSpec] = {
    s.name: s
    for s in [
        LinkSpec(name="nvlink2", bandwidth_GBps=150, latency_us=2.0, efficiency=0.80),
        LinkSpec(name="nvlink3", bandwidth_GBps=300, latency_us=2.0, efficiency=0.80),
        LinkSpec(name="nvlink4", bandwidth_GBps=450, latency_us=2.0, efficiency=0.80),
        LinkSpec(name="nvlink5", bandwidth_GBps=900, latency_us=2.0, efficiency=0.80),
        LinkSpec(name="pcie4", bandwidth_GBps=31.5, latency_us=3.0, efficiency=0.80),
        LinkSpec(name="pcie5", bandwidth_GBps=63.0, latency_us=3.0, efficiency=0.80),
    ]
}
INTER_PRESETS: dict[str, LinkSpec] = {
    s.name: s
    for s in [
        LinkSpec(name="edr", bandwidth_Gbps=100, latency_us=5.0, efficiency=0.95),
        LinkSpec(name="hdr", bandwidth_Gbps=200, latency_us=5.0, efficiency=0.95),
        LinkSpec(name="ndr", bandwidth_Gbps=400, latency_us=5.0, efficiency=0.95),
        LinkSpec(name="xdr", bandwidth_Gbps=800, latency_us=5.0, efficiency=0.95),
    ]
}
