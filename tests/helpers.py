"""Small builders shared by the simulation tests."""

from __future__ import annotations

from sim.engine.world import World
from sim.hardware.links import LinkSpec
from sim.hardware.topology import Topology

INTRA = LinkSpec(name="t-intra", bandwidth_GBps=100, latency_us=3.0, efficiency=1.0)
INTER = LinkSpec(name="t-inter", bandwidth_GBps=10, latency_us=7.0, efficiency=1.0)


def world(nodes: int = 1, gpus_per_node: int = 8, nics_per_node: int | None = None, **kw) -> World:
    return World(Topology(nodes, gpus_per_node, INTRA, INTER, nics_per_node or gpus_per_node, **kw))


def synthetic(name: str = "syn", **over) -> dict:
    """A 4-GPU synthetic pipeline (simulates in milliseconds)."""
    d = {
        "name": name,
        "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "A100-80GB", "gpu_speed_spread": 0.0},
        "model": {"kind": "synthetic", "layers": 8, "forward_ms": 2, "params_per_layer": 1000},
        "parallel": {"data": 1, "tensor": 1, "pipeline": 4, "schedule": "1f1b"},
        "training": {"global_batch": 16, "micro_batch": 1},
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        d[section][field] = value
    return d
