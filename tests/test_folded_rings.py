"""Rings folded onto one period of their hops in symmetric runs (``FoldedRingRun``, ``Symmetry.ring_period``).

Held to ``RingRun`` on idle links (the same time, and the closed form), and to ``RingRun`` in a world where
every node carries the traffic the representative's node carries (what the symmetry assumes), where the
folded ring meets the representative's node's traffic only."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.engine import collective_algorithms as coll
from sim.engine.algorithms import CommConfig
from sim.engine.collective_runs import FoldedRingRun, RingRun
from sim.engine.symmetry import Symmetry
from sim.hardware.topology import Topology
from sim.parallel.layout import Layout
from tests.helpers import INTER, INTRA, world

ROOT = Path(__file__).resolve().parent.parent


def _end(w, spec, gpus: list[int], period: int | None) -> float:
    run = w.run_collective_alone(spec, gpus, fold=(period, 0) if period else None)
    assert isinstance(run, FoldedRingRun if period else RingRun)
    done = run.join_all()
    w.env.run()
    assert done.triggered
    return run.end_s


@pytest.mark.parametrize("p", [2, 3, 8])
@pytest.mark.parametrize("steps_of", [lambda p: p - 1, lambda p: 2 * (p - 1)])  # RS/AG, all-reduce
@pytest.mark.parametrize("between_nodes", [False, True])
def test_a_folded_ring_of_alike_hops_on_idle_links_takes_ring_runs_time_and_the_closed_form(p, steps_of,
                                                                                          between_nodes) -> None:
    steps, chunk = steps_of(p), float(1 << 22)
    spec = coll.RingSpec(p, chunk, steps)
    make = (lambda: world(p, 1)) if between_nodes else (lambda: world(1, p))
    link = INTER if between_nodes else INTRA
    ring_s = _end(make(), spec, list(range(p)), None)
    folded_s = _end(make(), spec, list(range(p)), 1)
    assert folded_s == pytest.approx(ring_s, rel=1e-12)
    assert folded_s == pytest.approx(steps * (link.latency_s + chunk / link.bandwidth_Bps), rel=1e-9)


@pytest.mark.parametrize("per_node,nics", [(2, 1), (2, 2), (4, 4)])
def test_a_ring_of_several_ranks_per_node_folds_onto_one_node_on_idle_links(per_node, nics) -> None:
    """Four nodes, ``per_node`` ranks of the ring on each (hops inside the node, then one out): folded onto
    one period the ring ends when ``RingRun`` does."""
    p = 4 * per_node
    spec = coll.RingSpec(p, float(1 << 22), 2 * (p - 1))
    ring_s = _end(world(4, per_node, nics_per_node=nics), spec, list(range(p)), None)
    folded_s = _end(world(4, per_node, nics_per_node=nics), spec, list(range(p)), per_node)
    assert folded_s == pytest.approx(ring_s, rel=1e-12)


def _traffic(w, nodes: int, per_node: int, at_s: float, chunk: float) -> None:
    """The traffic of one ring node ``n`` for every n < ``nodes``: its first GPU sends a flow out of the ring's
    nodes (its NIC's uplink) from ``at_s`` on, receives one (the downlink) from 2·``at_s`` on, and sends one
    to its second GPU over NVLink from 3·``at_s`` on (the hop the ring takes there)."""
    total = w.topology.nodes // 2  # ring nodes; the same number of outside nodes after them

    def flow(src: int, dst: int, start_s: float, size: float):
        yield w.env.timeout(start_s)
        rt = w.topology.route(src, dst)
        yield w.network.transfer_event([(rt.links, 1.0)], size, rt.latency_s)

    for n in range(nodes):
        first, outside = n * per_node, (total + n) * per_node
        w.env.process(flow(first, outside, at_s, 3 * chunk))
        w.env.process(flow(outside, first, 2 * at_s, 2 * chunk))
        if per_node > 1:
            w.env.process(flow(first, first + 1, 3 * at_s, 40 * chunk))


@pytest.mark.parametrize("nodes,per_node,nics", [(3, 1, 1), (6, 1, 1), (3, 2, 2), (4, 2, 1)])
def test_a_folded_ring_meeting_its_nodes_traffic_is_the_ring_where_every_node_carries_it(nodes, per_node, nics) -> None:
    """``RingRun`` over ``nodes`` × ``per_node`` ranks where every node's first GPU sends, receives and feeds
    its neighbour (``_traffic``), and the ring folded onto one node with that traffic on the first node
    only, end at the same instant. (``RingRun`` with the first node's traffic only, as symmetric runs had
    it before, ends no later, and with one rank per node sooner: the other nodes' hops ran on idle links.)"""
    p = nodes * per_node
    chunk = float(1 << 22)
    spec = coll.RingSpec(p, chunk, 2 * (p - 1))
    step_s = INTER.latency_s + chunk / INTER.bandwidth_Bps

    def end(period: int | None, traffic_nodes: int) -> float:
        w = world(2 * nodes, per_node, nics_per_node=nics)
        _traffic(w, traffic_nodes, per_node, 2.5 * step_s, chunk)
        return _end(w, spec, list(range(p)), period)

    everywhere = end(None, nodes)
    assert end(per_node, 1) == pytest.approx(everywhere, rel=1e-9)
    assert end(None, 1) <= everywhere * (1 + 1e-12)
    assert everywhere > 2 * (p - 1) * step_s / nics * 1.05  # the traffic did slow the ring down


def _symmetry(nodes: int, per_node: int, dp: int, tp: int, pp: int, order: str = "tp-dp-pp",
              oversubscription: float = 1.0, nodes_per_leaf: int = 16) -> tuple[Symmetry, Layout]:
    topo = Topology(nodes, per_node, INTRA, INTER, per_node, oversubscription=oversubscription,
                    nodes_per_leaf=nodes_per_leaf)
    lay = Layout(dp, tp, pp, order=order)
    gpus = [lay.rank(0, 0, s) for s in range(pp)]
    return Symmetry(topo, lay, pp, CommConfig(), gpus, symmetric=True, ring_only={"tp", "dp"},
                    ring_routes={"tp", "dp"}), lay


def test_the_period_is_the_ranks_a_ring_has_on_each_node() -> None:
    sym, lay = _symmetry(nodes=8, per_node=8, dp=8, tp=8, pp=1)  # TP in the node, DP one rank per node
    g = lay.rank(0, 0, 0)
    assert sym.ring_period(g, "tp") == 1 and sym.ring_period(g, "dp") == 1
    sym, lay = _symmetry(nodes=4, per_node=8, dp=8, tp=4, pp=1)  # DP: two ranks per node, in turn
    assert sym.ring_period(g, "tp") == 1 and sym.ring_period(g, "dp") == 2
    assert sym.ring_period(g, "mp") is None  # a group across stages holds no mirrors of g
    assert sym._period_of([0, 8, 1, 9]) is None  # nodes 0, 1, 0, 1: the node's ranks apart in the ring
    assert sym._period_of([0, 1, 8, 16, 17, 24]) is None  # two ranks on some nodes, one on others
    full, _ = _symmetry(nodes=8, per_node=8, dp=8, tp=8, pp=1)
    full.symmetric = False
    full._period.clear()
    assert full.ring_period(g, "dp") is None  # every GPU simulated: each rank runs its own part


def test_a_ring_through_a_leaf_uplink_that_can_bind_does_not_fold() -> None:
    """Eight nodes under four leaves, uplinks 8× oversubscribed: the DP rings of the eight GPUs of a node
    cross the same leaf uplinks, which they can fill, so the hops that cross leaves are slower than the
    others and the ring keeps its hop-by-hop run."""
    sym, lay = _symmetry(nodes=8, per_node=8, dp=8, tp=8, pp=1, oversubscription=8.0, nodes_per_leaf=2)
    assert sym.fabric_binds
    assert sym.ring_period(lay.rank(0, 0, 0), "dp") is None
    sym, lay = _symmetry(nodes=8, per_node=8, dp=8, tp=8, pp=1, nodes_per_leaf=2)  # the same tree, non-blocking
    assert not sym.fabric_binds and sym.ring_period(lay.rank(0, 0, 0), "dp") == 1


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_2_and_3_with_folded_rings_of_two_ranks_per_node_agree_with_every_gpu_simulated(zero) -> None:
    """GPT-3 1.3B on 4 nodes × 4 GPUs, TP 2 × PP 2 × DP 4: each DP ring has two ranks per node and the
    per-micro-batch reduce-scatters (and ZeRO-3's gathers) share the NICs with the pipeline sends. The
    symmetric run (folded rings) is within 1 % of the run of every GPU."""
    from sim.api import simulate
    from sim.scenario.load import load_scenario

    sets = ["cluster.nodes=4", "cluster.gpus_per_node=4", "parallel.tensor=2", "parallel.pipeline=2",
            "parallel.data=4", f"parallel.zero={zero}", "training.global_batch=8"]
    path = ROOT / "scenarios" / "gpt3-1.3b-16xa100.yaml"
    on = simulate(load_scenario(path, [*sets, "simulation.symmetry=on"])).summary["step_time_s"]
    off = simulate(load_scenario(path, [*sets, "simulation.symmetry=off"])).summary["step_time_s"]
    assert on == pytest.approx(off, rel=0.01)
