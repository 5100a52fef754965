"""Rings of alike hops in symmetric runs (``AlikeRingRun``): one chain of steps stands for the whole ring.

Held to ``RingRun`` on idle links (the same time, and the closed form), and to ``RingRun`` in a world where
every rank carries the traffic the representative carries (what the symmetry assumes), where the collapsed
ring meets the representative's traffic only. ``Symmetry.ring_is_alike`` decides when a ring collapses."""

from __future__ import annotations

import pytest

from sim.engine import collective_algorithms as coll
from sim.engine.algorithms import CommConfig
from sim.engine.collective_runs import AlikeRingRun, RingRun
from sim.engine.symmetry import Symmetry
from sim.hardware.topology import Topology
from sim.parallel.layout import Layout
from tests.helpers import INTER, INTRA, world


def _end(w, spec, gpus: list[int], alike: bool) -> float:
    run = w.run_collective_alone(spec, gpus, alike=alike)
    assert isinstance(run, AlikeRingRun if alike else RingRun)
    done = run.join_all()
    w.env.run()
    assert done.triggered
    return run.end_s


@pytest.mark.parametrize("p", [2, 3, 8])
@pytest.mark.parametrize("steps_of", [lambda p: p - 1, lambda p: 2 * (p - 1)])  # RS/AG, all-reduce
@pytest.mark.parametrize("between_nodes", [False, True])
def test_an_alike_ring_on_idle_links_takes_ring_runs_time_and_the_closed_form(p, steps_of, between_nodes) -> None:
    steps, chunk = steps_of(p), float(1 << 22)
    spec = coll.RingSpec(p, chunk, steps)
    make = (lambda: world(p, 1)) if between_nodes else (lambda: world(1, p))
    link = INTER if between_nodes else INTRA
    ring_s = _end(make(), spec, list(range(p)), alike=False)
    alike_s = _end(make(), spec, list(range(p)), alike=True)
    assert alike_s == pytest.approx(ring_s, rel=1e-12)
    assert alike_s == pytest.approx(steps * (link.latency_s + chunk / link.bandwidth_Bps), rel=1e-9)


@pytest.mark.parametrize("p", [3, 6])
def test_an_alike_ring_meeting_the_representatives_traffic_is_the_ring_where_every_rank_carries_it(p) -> None:
    """p ring ranks, one GPU per node, and p more nodes that exchange traffic with them: rank i sends a
    flow out (its NIC's uplink, as its ring send) from 2.5 steps on, and receives one (its NIC's downlink,
    as its ring receive) from 5 steps on. ``RingRun`` with that traffic on every rank, and the collapsed ring
    with the representative's (rank 0's) only, end at the same instant, and so do the flows. (``RingRun``
    with the representative's traffic only, as symmetric runs had it before, ends sooner: the other hops
    ran on idle links.)"""
    chunk, steps = float(1 << 22), 2 * (p - 1)
    step_s = INTER.latency_s + chunk / INTER.bandwidth_Bps
    spec = coll.RingSpec(p, chunk, steps)

    def run(alike: bool, everyone: bool) -> tuple[float, list[float]]:
        w = world(2 * p, 1)
        ranks = range(p) if everyone else range(1)
        ends: list[float] = []

        def flow(src: int, dst: int, at_s: float, size: float):
            yield w.env.timeout(at_s)
            rt = w.topology.route(src, dst)
            yield w.network.transfer_event([(rt.links, 1.0)], size, rt.latency_s)
            ends.append(w.env.now)

        for i in ranks:
            w.env.process(flow(i, p + i, 2.5 * step_s, 3 * chunk))
            w.env.process(flow(p + (i + 1) % p, i, 5 * step_s, 2 * chunk))
        end = _end(w, spec, list(range(p)), alike)
        return end, sorted(set(round(e, 15) for e in ends))

    ring_end, ring_flows = run(alike=False, everyone=True)
    alike_end, alike_flows = run(alike=True, everyone=False)
    assert alike_end == pytest.approx(ring_end, rel=1e-9)
    assert run(alike=False, everyone=False)[0] < ring_end * (1 - 1e-3)
    assert alike_flows == pytest.approx(ring_flows, rel=1e-9)
    assert alike_end > steps * step_s * 1.1  # the traffic did slow the ring down


def _symmetry(nodes: int, per_node: int, dp: int, tp: int, pp: int, order: str = "tp-dp-pp",
              oversubscription: float = 1.0, nodes_per_leaf: int = 16) -> tuple[Symmetry, Layout]:
    topo = Topology(nodes, per_node, INTRA, INTER, per_node, oversubscription=oversubscription,
                    nodes_per_leaf=nodes_per_leaf)
    lay = Layout(dp, tp, pp, order=order)
    gpus = [lay.rank(0, 0, s) for s in range(pp)]
    return Symmetry(topo, lay, pp, CommConfig(), gpus, symmetric=True, ring_only={"tp", "dp"},
                    ring_routes={"tp", "dp"}), lay


def test_rings_within_a_node_or_one_rank_per_node_are_alike_mixed_ones_are_not() -> None:
    sym, lay = _symmetry(nodes=8, per_node=8, dp=8, tp=8, pp=1)  # TP in the node, DP one rank per node
    g = lay.rank(0, 0, 0)
    assert sym.ring_is_alike(g, "tp") and sym.ring_is_alike(g, "dp")
    sym, lay = _symmetry(nodes=4, per_node=8, dp=8, tp=4, pp=1)  # DP: two ranks per node, hops of both kinds
    assert sym.ring_is_alike(lay.rank(0, 0, 0), "tp") and not sym.ring_is_alike(lay.rank(0, 0, 0), "dp")
    sym, lay = _symmetry(nodes=8, per_node=8, dp=8, tp=8, pp=1)
    assert not sym.ring_is_alike(g, "mp")  # a group across stages holds no mirrors of g
    full, _ = _symmetry(nodes=8, per_node=8, dp=8, tp=8, pp=1)
    full.symmetric = False
    full._alike.clear()
    assert not full.ring_is_alike(g, "dp")  # every GPU simulated: each rank runs its own part


def test_a_ring_through_a_leaf_uplink_that_can_bind_is_not_alike() -> None:
    """Eight nodes under four leaves, uplinks 8× oversubscribed: the DP rings of the eight GPUs of a node
    cross the same leaf uplinks, which they can fill, so the hops that cross leaves are slower than the
    others and the ring keeps its hop-by-hop run."""
    sym, lay = _symmetry(nodes=8, per_node=8, dp=8, tp=8, pp=1, oversubscription=8.0, nodes_per_leaf=2)
    assert sym.fabric_binds
    assert not sym.ring_is_alike(lay.rank(0, 0, 0), "dp")
    sym, lay = _symmetry(nodes=8, per_node=8, dp=8, tp=8, pp=1, nodes_per_leaf=2)  # the same tree, non-blocking
    assert not sym.fabric_binds and sym.ring_is_alike(lay.rank(0, 0, 0), "dp")
