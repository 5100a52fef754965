"""Simulated collectives against their closed forms (sim.analytic), and link contention."""

from __future__ import annotations

import math

import pytest

from sim import analytic as an
from sim.engine import collective_algorithms as coll
from sim.engine.algorithms import choose as alg_choose
from sim.engine.collective_workload import run_collectives
from sim.engine.transfer_graphs import btree_depth
from sim.hardware.nccl import base_latency_s
from tests.helpers import INTER, INTRA, world

A = INTRA.latency_s
B = INTRA.bandwidth_Bps
SIZES = [1024, 1 << 20, 1 << 30]


def L(algorithm: str) -> float:
    """NCCL's per-collective launch latency with the Simple protocol (tuning.cc baseLatencies)."""
    return base_latency_s(algorithm, "Simple")


def sim_time(op: str, algorithm: str, p: int, n: int, nodes: int = 1, chunks: int | None = 1,
             protocol: str = "Simple", **kw) -> float:
    """Simulated time of one collective; Simple protocol unless asked (the test links have one latency)."""
    w = world(nodes, p // nodes, **kw)
    (r,) = run_collectives(w, op, algorithm, list(range(p)), [n], chunks=chunks, protocol=protocol)
    return r.time_s


@pytest.mark.parametrize("p", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("n", SIZES)
def test_ring_all_reduce_matches_closed_form(p: int, n: int) -> None:
    expect = 2 * (p - 1) * (A + n / (p * B))
    assert sim_time("all_reduce", "ring", p, n) == pytest.approx(L("ring") + expect, rel=1e-9)
    assert an.ring_all_reduce_time(p, n, A, B) == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize("p", [2, 5, 8])
def test_ring_rs_ag_closed_form(op: str, p: int) -> None:
    n = 1 << 26
    assert sim_time(op, "ring", p, n) == pytest.approx(L("ring") + (p - 1) * (A + n / (p * B)), rel=1e-9)


@pytest.mark.parametrize("p", [4, 8, 16])
@pytest.mark.parametrize("n", [1 << 26, 1 << 30])
def test_double_binary_tree_all_reduce_reaches_pipelined_closed_form(p: int, n: int) -> None:
    """NCCL's double binary tree, pipelined: ≈ 2dα + 2N/B (plus a fill of d chunks), not 2d(α + N/B)."""
    d = btree_depth(p)
    assert d == math.ceil(math.log2(p))  # NCCL's in-order btree over p ranks
    k = 64  # NCCL's 512 KiB chunks, capped
    expect = L("tree") + an.double_binary_tree_all_reduce_time(p, n, A, B, d, k)
    t = sim_time("all_reduce", "tree", p, n, chunks=None)
    floor = L("tree") + an.double_binary_tree_all_reduce_time(p, n, A, B, d, 10**9)  # infinitely many chunks
    assert floor * (1 - 1e-9) <= t <= expect * 1.005
    assert t < 0.6 * (L("tree") + 2 * d * (A + n / B))  # the unpipelined binomial form is far slower
    # Bandwidth term 2N/B against the ring's 2(p-1)N/(pB).
    assert t / sim_time("all_reduce", "ring", p, n) == pytest.approx(p / (p - 1), rel=0.06)


def test_tree_beats_ring_for_small_messages_on_many_ranks() -> None:
    """Latency: 2⌈log2 p⌉ hops against the ring's 2(p-1)."""
    p, n = 64, 64 * 1024
    assert sim_time("all_reduce", "tree", p, n, nodes=8, chunks=None) < 0.5 * sim_time("all_reduce", "ring", p, n,
                                                                                         nodes=8)


@pytest.mark.parametrize("op", ["broadcast", "reduce"])
@pytest.mark.parametrize("chunks", [1, 4, 16, 64])
def test_pipelined_chain_closed_form(op: str, chunks: int) -> None:
    p, n = 8, 1 << 26
    expect = an.pipelined_chain_time(p, n, A, B, chunks)
    assert expect == pytest.approx((p - 1) * A + (p - 1 + chunks - 1) * n / chunks / B)
    assert sim_time(op, "chain", p, n, chunks=chunks) == pytest.approx(L("chain") + expect, rel=1e-9)


def test_chain_broadcast_100MB_over_edr_is_pipelined() -> None:
    """The issue's case: 8 ranks, 100 MB over EDR: ≈ (p-1)α + N/B with NCCL's chunks, not 7(α + N/B)."""
    from sim.engine.world import World
    from sim.hardware.links import INTER_PRESETS
    from sim.hardware.topology import Topology

    edr = INTER_PRESETS["edr"]
    w = World(Topology(8, 1, INTRA, edr, 1))
    n = 100e6
    (r,) = run_collectives(w, "broadcast", "chain", list(range(8)), [int(n)], protocol="Simple")
    pipelined = L("chain") + 7 * edr.latency_s + n / edr.bandwidth_Bps
    assert r.time_s == pytest.approx(pipelined, rel=0.12)  # 64 chunks: fill (p-2)/k = 9 % of N/B
    assert r.time_s < 0.2 * 7 * (edr.latency_s + n / edr.bandwidth_Bps)


@pytest.mark.parametrize("op", ["broadcast", "reduce"])
def test_binomial_tree_closed_form(op: str) -> None:
    p, n = 8, 1 << 26
    assert sim_time(op, "binomial", p, n) == pytest.approx(L("binomial") + 3 * (A + n / B), rel=1e-9)


def test_parameter_server_root_link_is_shared() -> None:
    """Push to the root, aggregate, broadcast back: the root's links carry p-1 flows each way."""
    p, n = 8, 1 << 26
    expect = an.parameter_server_time(p, n, A, B)
    assert expect == pytest.approx(2 * (A + (p - 1) * n / B))
    assert sim_time("all_reduce", "ps", p, n) == pytest.approx(L("ps") + expect, rel=1e-9)
    # One-way variants.
    assert sim_time("broadcast", "ps", p, n) == pytest.approx(L("ps") + A + (p - 1) * n / B, rel=1e-9)


def test_hierarchical_all_reduce_closed_form() -> None:
    nodes, g, n = 4, 4, 1 << 26
    expect = an.hierarchical_all_reduce_time(nodes, g, n, A, B, INTER.latency_s, INTER.bandwidth_Bps)
    assert sim_time("all_reduce", "hierarchical", nodes * g, n, nodes=nodes) == pytest.approx(
        L("hierarchical") + expect, rel=1e-9)


def test_all_to_all_and_send_recv() -> None:
    p, n = 8, 1 << 24
    # Each GPU's uplink carries p-1 flows of N/p: each gets B/(p-1).
    assert sim_time("all_to_all", "direct", p, n) == pytest.approx(L("direct") + A + (p - 1) * n / p / B, rel=1e-9)
    assert sim_time("send_recv", "direct", 2, n) == pytest.approx(L("direct") + an.send_recv_time(n, A, B), rel=1e-9)


def test_busbw_follows_nccl_tests_definition() -> None:
    p, n = 8, 1 << 30
    w = world(1, p)
    (r,) = run_collectives(w, "all_reduce", "ring", list(range(p)), [n])
    assert r.algbw_GBps == pytest.approx(n / r.time_s / 1e9)
    assert r.busbw_GBps == pytest.approx(r.algbw_GBps * 2 * (p - 1) / p)
    # For a large message the bus bandwidth approaches the link bandwidth.
    assert r.busbw_GBps == pytest.approx(B / 1e9, rel=0.01)


def test_ring_fast_path_equals_generic_dag() -> None:
    """On equal links RingRun (arithmetic dependencies) and DagRun over the same DAG give identical times."""
    w1, w2 = world(1, 8), world(1, 8)
    spec = coll.RingSpec(8, (1 << 24) / 8, 14)
    r1 = w1.run_collective_alone(spec, list(range(8)))
    r2 = w2.run_collective_alone(spec.to_dag(), list(range(8)))
    r1.join_all()
    r2.join_all()
    w1.env.run()
    w2.env.run()
    assert r1.end_s == pytest.approx(r2.end_s, rel=1e-12)


def test_ring_over_a_slow_hop_puts_steps_on_the_wire_in_turn_and_pays_its_latency_once() -> None:
    """Two nodes of 4 GPUs, 2 NICs each (two channels): the two inter-node hops pace the ring, one step's
    chunk after another over both NICs. Each step's latency runs while the wire carries the steps ahead, so
    the hop's latency shows once, at the end: 14 · c/(2·B_e) + α_e."""
    w = world(2, 4, nics_per_node=2)
    c = (1 << 24) / 8
    r = w.run_collective_alone(coll.RingSpec(8, c, 14), list(range(8)))
    r.join_all()
    w.env.run()
    assert r.end_s == pytest.approx(14 * c / (2 * INTER.bandwidth_Bps) + INTER.latency_s, rel=1e-9)


def test_a_latency_bound_ring_over_two_nodes_pays_the_network_latency_per_crossing_not_per_step() -> None:
    """LL ring all-reduce of 512 KiB over 2 × 8 GPUs on EDR: the inter-node latency (2.7 µs with LL) dwarfs
    a step's data there, yet a connection keeps its next steps' latencies running behind the one on the
    wire, so the ring takes what the tuner's model says: launch + steps · max(NVLink hop, network chunk)
    + crossings · network latency (found by the property test below when steps paid it one by one)."""
    from sim.hardware.links import INTER_PRESETS, INTRA_PRESETS
    from tests.test_algorithms import _world

    w = _world(2, 8, INTRA_PRESETS["nvlink3"], INTER_PRESETS["edr"], in_network_reduction=False)
    gpus = list(range(16))
    choice = alg_choose("all_reduce", "bench", 1 << 19, w.topology, gpus, w.comm)
    (r,) = run_collectives(w, "all_reduce", "ring", gpus, [1 << 19], protocol="LL", record_spans=False)
    assert (choice.algorithm, choice.protocol) == ("ring", "LL")
    assert r.time_s == pytest.approx(choice.predicted_s, rel=0.01)


@pytest.mark.parametrize("late_s", [5e-6, 50e-6, 200e-6])
@pytest.mark.parametrize("algorithm,nodes,per_node,size", [("ring", 1, 4, 2e6), ("hierarchical", 4, 2, 8e6)])
def test_a_rank_that_joins_late_delays_a_ring_by_its_lateness_only(late_s: float, algorithm: str, nodes: int,
                                                                   per_node: int, size: float) -> None:
    """NCCL's connection is a FIFO: while the late rank is away its neighbours' steps wait, and once it
    joins the ring runs as if everyone had joined then (concurrent sends sharing the wire would make the
    awaited data arrive later than that). The same for the rings of the hierarchical all-reduce's DAG."""
    p = nodes * per_node

    def ends(late: float) -> list[float]:
        w = world(nodes, per_node)
        spec = coll.build("all_reduce", algorithm, p, size,
                          ranks_by_node=[list(range(n * per_node, (n + 1) * per_node)) for n in range(nodes)])
        run = w.run_collective_alone(spec, list(range(p)))
        out = [0.0] * p

        def rank(i: int):
            yield w.env.timeout(late if i == p - 1 else 0.0)
            yield run.join(i)
            out[i] = w.env.now
        for i in range(p):
            w.env.process(rank(i))
        w.env.run()
        return out
    together = max(ends(0.0))
    assert max(ends(late_s)) == pytest.approx(together + late_s, rel=1e-9)


def test_two_all_reduces_sharing_a_nic_take_twice_as_long() -> None:
    """GPUs 0,2 and 1,3 sit on two nodes with one NIC each: two concurrent rings share both NICs."""
    n = 1 << 28
    alone = world(2, 2, nics_per_node=1)
    a = alone.run_collective_alone(coll.build("all_reduce", "ring", 2, n), [0, 2])
    a.join_all()
    alone.env.run()
    both = world(2, 2, nics_per_node=1)
    x = both.run_collective_alone(coll.build("all_reduce", "ring", 2, n), [0, 2])
    y = both.run_collective_alone(coll.build("all_reduce", "ring", 2, n), [1, 3])
    x.join_all()
    y.join_all()
    both.env.run()
    assert x.end_s / a.end_s == pytest.approx(2.0, rel=0.01)
    assert y.end_s == pytest.approx(x.end_s)
    # With a NIC each they do not interfere.
    sep = world(2, 2, nics_per_node=2)
    x = sep.run_collective_alone(coll.build("all_reduce", "ring", 2, n), [0, 2])
    y = sep.run_collective_alone(coll.build("all_reduce", "ring", 2, n), [1, 3])
    x.join_all()
    y.join_all()
    sep.env.run()
    assert x.end_s == pytest.approx(a.end_s, rel=1e-9)


def test_channels_spread_over_the_nodes_nics() -> None:
    """A full-node ring crossing nodes uses every NIC of the node (NCCL channels), not just one."""
    n = 1 << 30
    w8 = world(2, 8, nics_per_node=8)
    (r8,) = run_collectives(w8, "all_reduce", "ring", list(range(16)), [n])
    w1 = world(2, 8, nics_per_node=8)
    (r1,) = run_collectives(w1, "all_reduce", "ring", list(range(16)), [n], channels=1)
    assert r8.channels == 8
    # Boundary hops get 8 NICs' bandwidth instead of one: the ring is limited by 8×10 GB/s, not 10.
    assert r1.time_s / r8.time_s > 6


def test_late_rank_delays_everyone() -> None:
    """NCCL rendezvous: nobody finishes before the last member has joined."""
    w = world(1, 4)
    run = w.run_collective_alone(coll.build("all_reduce", "ring", 4, 1 << 20), [0, 1, 2, 3])
    for i in range(3):
        run.join(i)

    def late():
        yield w.env.timeout(0.01)
        run.join(3)

    w.env.process(late())
    w.env.run()
    assert run.end_s > 0.01
    assert run.end_s == pytest.approx(0.01 + 2 * 3 * (A + (1 << 20) / 4 / B), rel=0.5)


def test_protocols_follow_nccl_latency_and_bandwidth() -> None:
    """LL halves the bandwidth but cuts the hop latency (NCCL hwLatencies NVLink ring: 0.6 vs 3.4 µs)."""
    from sim.engine.world import World
    from sim.hardware.links import INTRA_PRESETS
    from sim.hardware.topology import Topology

    nvl = INTRA_PRESETS["nvlink3"]

    def t(n: int, proto: str) -> float:
        w = World(Topology(1, 8, nvl, INTER, 8))
        (r,) = run_collectives(w, "all_reduce", "ring", list(range(8)), [n], protocol=proto)
        return r.time_s

    for proto, a_us, frac in (("LL", 0.6, 0.5), ("LL128", 1.9, 0.92), ("Simple", 3.4, 1.0)):
        n = 1 << 20
        expect = base_latency_s("ring", proto) + 14 * (a_us * 1e-6 + n / 8 / (nvl.bandwidth_Bps * frac))
        assert t(n, proto) == pytest.approx(expect, rel=1e-9)
    assert t(1024, "LL") < t(1024, "Simple")
    assert t(1 << 30, "Simple") < t(1 << 30, "LL")


def test_hierarchical_sharp_all_reduce_closed_form() -> None:
    """Intra-node ring RS, then the switches reduce every rank's N/g shard (one trip up and down its
    NIC, α + (N/g)/B), then intra-node ring AG: half the inter-node bytes of the ring phase it replaces."""
    nodes, g, n = 4, 4, 1 << 26
    intra = an.ring_reduce_scatter_time(g, n, A, B)
    expect = L("hierarchical_sharp") + 2 * intra + 30e-6 + n / g / INTER.bandwidth_Bps  # CollNet hop: 30 µs
    t = sim_time("all_reduce", "hierarchical_sharp", nodes * g, n, nodes=nodes)
    assert t == pytest.approx(expect, rel=1e-9)
    assert t < sim_time("all_reduce", "hierarchical", nodes * g, n, nodes=nodes)
