"""Small builders shared by the simulation tests."""

from __future__ import annotations

from sim.engine.world import World
from sim.hardware.links import LinkSpec
from sim.hardware.topology import Topology

INTRA = LinkSpec(name="t-intra", bandwidth_GBps=100, latency_us=3.0, efficiency=1.0)
INTER = LinkSpec(name="t-inter", bandwidth_GBps=10, latency_us=7.0, efficiency=1.0)


def world(nodes: int = 1, gpus_per_node: int = 8, nics_per_node: int | None = None, **kw) -> World:
    return World(Topology(nodes, gpus_per_node, INTRA, INTER, nics_per_node or gpus_per_node, **kw))
