"""The one cost-model interface: how long does this op take on this GPU?

Both the datasheet roofline (presets) and calibrated profiles implement it, so the engine never
knows which it has. Link parameters may also come from a profile (fitted from real collectives).
"""

from __future__ import annotations

from typing import Protocol

from sim.workload.ops import Op

INTRA_NODE = "intra_node"
INTER_NODE = "inter_node"


class CostModel(Protocol):
    name: str

    def op_time_s(self, op: Op) -> float:
        """Seconds for ``op`` on one GPU."""
        ...

    def link_params(self, scope: str, group_size: int) -> tuple[float, float] | None:
        """(latency_s, bandwidth_Bps) per link for collectives in ``scope`` (INTRA_NODE/INTER_NODE)
        over a group of ``group_size``, or None to use the hardware preset."""
        ...

    def report(self) -> dict:
        """What the summary should say about this model (profile, extrapolations, fallbacks)."""
        ...
