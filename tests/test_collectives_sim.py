"""Simulated collectives against their closed forms (sim.analytic), and link contention."""

from __future__ import annotations

import math

import pytest

from sim import analytic as an
from sim.engine import collectives as coll
from sim.engine.collective_workload import run_collectives
from tests.helpers import INTER, INTRA, world

A = INTRA.latency_s
B = INTRA.bandwidth_Bps
SIZES = [1024, 1 << 20, 1 << 30]


def sim_time(op: str, algorithm: str, p: int, n: int, nodes: int = 1, chunks: int = 1, **kw) -> float:
    w = world(nodes, p // nodes, **kw)
    (r,) = run_collectives(w, op, algorithm, list(range(p)), [n], chunks=chunks)
    return r.time_s


@pytest.mark.parametrize("p", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("n", SIZES)
def test_ring_all_reduce_matches_closed_form(p: int, n: int) -> None:
    expect = 2 * (p - 1) * (A + n / (p * B))
    assert sim_time("all_reduce", "ring", p, n) == pytest.approx(expect, rel=1e-9)
    assert an.ring_all_reduce_time(p, n, A, B) == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize("p", [2, 5, 8])
def test_ring_rs_ag_closed_form(op: str, p: int) -> None:
    n = 1 << 26
    assert sim_time(op, "ring", p, n) == pytest.approx((p - 1) * (A + n / (p * B)), rel=1e-9)


@pytest.mark.parametrize("p", [2, 4, 8, 6])
def test_tree_all_reduce_is_binomial_reduce_plus_broadcast(p: int) -> None:
    n = 1 << 24
    expect = an.tree_reduce_time(p, n, A, B) + an.tree_broadcast_time(p, n, A, B)
    assert expect == pytest.approx(2 * math.ceil(math.log2(p)) * (A + n / B))
    assert sim_time("all_reduce", "tree", p, n) == pytest.approx(expect, rel=1e-9)


@pytest.mark.parametrize("op", ["broadcast", "reduce"])
@pytest.mark.parametrize("chunks", [1, 4, 16])
def test_pipelined_chain_closed_form(op: str, chunks: int) -> None:
    p, n = 8, 1 << 26
    expect = an.pipelined_chain_broadcast_time(p, n, A, B, chunks)
    assert expect == pytest.approx((p - 1 + chunks - 1) * (A + n / chunks / B))
    assert sim_time(op, "chain", p, n, chunks=chunks) == pytest.approx(expect, rel=1e-9)


@pytest.mark.parametrize("op", ["broadcast", "reduce"])
def test_binomial_tree_closed_form(op: str) -> None:
    p, n = 8, 1 << 26
    assert sim_time(op, "binomial", p, n) == pytest.approx(3 * (A + n / B), rel=1e-9)


def test_parameter_server_root_link_is_shared() -> None:
    """Push to the root, aggregate, broadcast back: the root's links carry p-1 flows each way."""
    p, n = 8, 1 << 26
    expect = an.parameter_server_time(p, n, A, B)
    assert expect == pytest.approx(2 * (A + (p - 1) * n / B))
    assert sim_time("all_reduce", "ps", p, n) == pytest.approx(expect, rel=1e-9)
    # One-way variants.
    assert sim_time("broadcast", "ps", p, n) == pytest.approx(A + (p - 1) * n / B, rel=1e-9)


def test_hierarchical_all_reduce_closed_form() -> None:
    nodes, g, n = 4, 4, 1 << 26
    expect = an.hierarchical_all_reduce_time(nodes, g, n, A, B, INTER.latency_s, INTER.bandwidth_Bps)
    assert sim_time("all_reduce", "hierarchical", nodes * g, n, nodes=nodes) == pytest.approx(expect, rel=1e-9)


def test_all_to_all_and_send_recv() -> None:
    p, n = 8, 1 << 24
    # Each GPU's uplink carries p-1 flows of N/p: each gets B/(p-1).
    assert sim_time("all_to_all", "direct", p, n) == pytest.approx(A + (p - 1) * n / p / B, rel=1e-9)
    assert sim_time("send_recv", "direct", 2, n) == pytest.approx(an.send_recv_time(n, A, B), rel=1e-9)


def test_busbw_follows_nccl_tests_definition() -> None:
    p, n = 8, 1 << 30
    w = world(1, p)
    (r,) = run_collectives(w, "all_reduce", "ring", list(range(p)), [n])
    assert r.algbw_GBps == pytest.approx(n / r.time_s / 1e9)
    assert r.busbw_GBps == pytest.approx(r.algbw_GBps * 2 * (p - 1) / p)
    # For a large message the bus bandwidth approaches the link bandwidth.
    assert r.busbw_GBps == pytest.approx(B / 1e9, rel=0.01)


def test_ring_fast_path_equals_generic_dag() -> None:
    """RingRun (arithmetic dependencies) and DagRun over the same DAG give identical times."""
    w1, w2 = world(2, 4, nics_per_node=2), world(2, 4, nics_per_node=2)
    spec = coll.RingSpec(8, (1 << 24) / 8, 14)
    r1 = w1.run_collective_alone(spec, list(range(8)))
    r2 = w2.run_collective_alone(spec.to_dag(), list(range(8)))
    r1.join_all()
    r2.join_all()
    w1.env.run()
    w2.env.run()
    assert r1.end_s == pytest.approx(r2.end_s, rel=1e-12)


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
