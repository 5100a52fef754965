"""Data-parallel scaling, interconnect generations, oversubscription and gradient compression."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.api import simulate
from sim.engine import collective_algorithms as coll
from sim.scenario.load import load_scenario
from tests.helpers import world

SCEN = Path(__file__).resolve().parent.parent / "scenarios"


def resnet(nodes: int, gpn: int, ib: str, *extra: str) -> dict:
    n = nodes * gpn
    sets = [f"cluster.nodes={nodes}", f"cluster.gpus_per_node={gpn}", f"parallel.data={n}",
            f"training.global_batch={256 * n}", f"cluster.nics_per_node={gpn}", *extra]
    return simulate(load_scenario(SCEN / f"resnet50-dp-1024xa100-{ib}.yaml", sets)).summary


def test_dp_scaling_efficiency_falls_with_gpus_and_rises_with_faster_networks() -> None:
    one = simulate(load_scenario(SCEN / "resnet50-dp-1xa100.yaml")).summary
    assert one["efficiency"] == pytest.approx(1.0)
    eff = {}
    for ib in ("edr", "hdr", "ndr"):
        for nodes in (2, 8):
            s = resnet(nodes, 8, ib, "parallel.overlap_grad_sync=false")
            assert s["global_batch"] == 256 * nodes * 8  # B_global = p · B_local
            eff[(ib, nodes)] = s["efficiency"]
    for ib in ("edr", "hdr", "ndr"):
        assert eff[(ib, 8)] < eff[(ib, 2)] < 1.0
    for nodes in (2, 8):
        assert eff[("edr", nodes)] < eff[("hdr", nodes)] < eff[("ndr", nodes)]


def test_overlap_hides_gradient_sync() -> None:
    no = resnet(4, 8, "edr", "parallel.overlap_grad_sync=false")
    yes = resnet(4, 8, "edr", "parallel.overlap_grad_sync=true")
    assert yes["step_time_s"] < no["step_time_s"]
    assert yes["exposed_comm_s"] < no["exposed_comm_s"]


def test_oversubscribed_fat_tree_slows_cross_leaf_traffic() -> None:
    """All-to-all across 4 leaves: every flow crosses the spine, whose capacity is cut by the ratio."""
    n = 1 << 26
    times = []
    for ratio in (1.0, 4.0):
        w = world(8, 1, nics_per_node=1, nodes_per_leaf=2, oversubscription=ratio)
        run = w.run_collective_alone(coll.build("all_to_all", "direct", 8, n), list(range(8)))
        run.join_all()
        w.env.run()
        times.append(run.end_s)
    assert times[1] > 1.5 * times[0]


def test_topk_compression_pays_on_slow_networks_only() -> None:
    """Top-k sends values + indices by all-gather: each GPU receives (p-1)·k·(2+4) bytes instead of the
    all-reduce's 2(p-1)/p · N. 1% on EDR wins; 10% over NVLink loses (more bytes, plus the selection)."""
    def step(ib: str, gpn: int, nodes: int, ratio: float | None) -> float:
        extra = ["parallel.overlap_grad_sync=false"]
        if ratio:
            extra.append(f"training.gradient_compression={{kind: topk, ratio: {ratio}}}")
        return resnet(nodes, gpn, ib, *extra)["step_time_s"]

    slow = [step("edr", 1, 16, r) for r in (None, 0.01)]  # one GPU per node: every hop on EDR
    assert slow[1] < slow[0]
    fast = [step("ndr", 8, 1, r) for r in (None, 0.1)]  # one node: the all-reduce is on NVLink
    assert fast[1] > fast[0]
