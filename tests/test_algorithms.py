"""Algorithm choice inside training and benchmarks: parameter servers, NVLS, the NCCL-like tuner."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import analytic as an
from sim.api import simulate
from sim.engine import algorithms as algs
from sim.engine.collective_workload import run_collectives
from sim.engine.world import World
from sim.hardware.links import INTER_PRESETS, INTRA_PRESETS
from sim.hardware.nccl import base_latency_s
from sim.hardware.topology import Topology
from sim.scenario.load import scenario_from_dict
from tests.helpers import INTER, INTRA

SCEN = Path(__file__).resolve().parent.parent / "scenarios"


def _world(nodes: int, gpn: int, intra=INTRA, inter=INTER, nics: int | None = None, **cfg) -> World:
    w = World(Topology(nodes, gpn, intra, inter, nics or gpn))
    w.comm = algs.CommConfig(**cfg)
    return w


@pytest.mark.parametrize("servers", [1, 2, 4, 8])
@pytest.mark.parametrize("aggregate_Bps", [None, 20e9])
def test_sharded_parameter_server_closed_form(servers: int, aggregate_Bps: float | None) -> None:
    """W = 8 workers, one per node and NIC; S colocated servers: each server NIC carries (W-1)·N/S in
    and out: 2(α + (W-1)(N/S)/B) plus the summation of W + 1 shards at the server's memory bandwidth."""
    w_count, n = 8, 1 << 28
    w = _world(w_count, 1, parameter_servers=servers, aggregate_Bps=aggregate_Bps)
    (r,) = run_collectives(w, "all_reduce", "ps", list(range(w_count)), [n], protocol="Simple")
    expect = an.sharded_parameter_server_time(w_count, servers, n, INTER.latency_s, INTER.bandwidth_Bps,
                                              aggregate_Bps, colocated=True)
    shard = n / servers
    agg = 0.0 if aggregate_Bps is None else (w_count + 1) * shard / aggregate_Bps
    assert expect == pytest.approx(2 * (INTER.latency_s + (w_count - 1) * shard / INTER.bandwidth_Bps) + agg)
    assert r.time_s == pytest.approx(base_latency_s("ps", "Simple") + expect, rel=1e-9)


def _dp_job(workers: int, algorithm: str, **par) -> dict:
    return {
        "name": f"ps-{workers}",
        "cluster": {"nodes": workers, "gpus_per_node": 1, "gpu": "A100-80GB", "inter_node": "hdr"},
        "model": {"kind": "synthetic", "layers": 1, "forward_ms": 10, "backward_ms": 20,
                  "params_per_layer": 25_000_000},
        "parallel": {"data": workers, "overlap_grad_sync": False, "bucket_MB": 1000, "dp_algorithm": algorithm,
                     **par},
        "training": {"global_batch": workers * 8, "micro_batch": 8, "precision": "fp32"},
        "simulation": {"symmetry": "off"},
    }


def test_one_parameter_server_slows_linearly_while_ring_stays_flat() -> None:
    """Gradient sync time (step − compute) against the worker count W: one server's NIC carries
    (W-1)·N each way (linear); a ring moves 2(W-1)/W·N per NIC (flat, below 2N)."""
    def comm(workers: int, algorithm: str) -> float:
        s = simulate(scenario_from_dict(_dp_job(workers, algorithm))).summary
        return s["step_time_s"] - s["compute_s"]

    ps = {w: comm(w, "parameter_server") for w in (2, 4, 8)}
    ring = {w: comm(w, "ring") for w in (2, 4, 8)}
    assert ps[8] / ps[2] == pytest.approx(7.0, rel=0.05)
    assert ps[4] / ps[2] == pytest.approx(3.0, rel=0.05)
    assert ring[8] / ring[2] == pytest.approx((2 * 7 / 8) / (2 * 1 / 2), rel=0.05)  # 1.75: bounded by 2
    # Sharding over S = W servers restores the ring's volume.
    sharded = simulate(scenario_from_dict(_dp_job(8, "parameter_server", parameter_servers=8))).summary
    assert sharded["step_time_s"] - sharded["compute_s"] == pytest.approx(ring[8], rel=0.15)


def test_dedicated_servers_bind_on_their_nics() -> None:
    """Dedicated CPU servers (one NIC each, extra nodes): every worker's shard crosses a server NIC:
    2·W·(N/S)/B + summation at the servers' DRAM bandwidth."""
    workers, servers = 4, 2
    s = simulate(scenario_from_dict(_dp_job(workers, "parameter_server", parameter_servers=servers,
                                            parameter_server_placement="dedicated"))).summary
    hdr = INTER_PRESETS["hdr"]
    n = 25_000_000 * 4.0
    expect = an.sharded_parameter_server_time(workers, servers, n, hdr.latency_s, hdr.bandwidth_Bps,
                                              algs.CPU_SERVER_MEMORY_Bps, colocated=False)
    assert s["step_time_s"] - s["compute_s"] == pytest.approx(expect + base_latency_s("ps", "Simple"), rel=0.02)
    assert s["collective_algorithms"] == {"dp:all_reduce": {"ps": 1}}


@pytest.mark.parametrize("size", [1 << 30, 4 << 30])
def test_nvls_all_reduce_busbw_on_8xh100(size: int) -> None:
    """8×H100 with in-network reduction: NVLS all-reduce busbw ≈ 470–480 GB/s (public nccl-tests)."""
    w = _world(1, 8, INTRA_PRESETS["nvlink4"], INTER_PRESETS["ndr"], in_network_reduction=True)
    (r,) = run_collectives(w, "all_reduce", "auto", list(range(8)), [size])
    assert r.algorithm == "nvls"
    assert 470 <= r.busbw_GBps <= 480
    nvl = INTRA_PRESETS["nvlink4"]
    # NCCL's NVLS latency: 25 µs once, no base (tuning.cc).
    expect = an.nvls_all_reduce_time(8, size, 25e-6, nvl.nvls_bandwidth_Bps)
    assert r.time_s == pytest.approx(expect, rel=1e-9)
    # Without it: NCCL's ring at the NVLink efficiency.
    w = _world(1, 8, INTRA_PRESETS["nvlink4"], INTER_PRESETS["ndr"])
    (r,) = run_collectives(w, "all_reduce", "auto", list(range(8)), [size])
    assert r.algorithm in ("ring", "tree")
    assert r.busbw_GBps < 0.8 * 450


def test_shipped_nccl_scenario_in_public_ranges() -> None:
    """8×A100 ring ≈ 230 GB/s busbw at 1 GiB; across HDR nodes: per-NIC busbw 20–24 GB/s."""
    from sim.scenario.load import load_scenario

    s = simulate(load_scenario(SCEN / "nccl-allreduce-8xa100.yaml")).summary
    assert 225 <= s["collectives"][-1]["busbw_GBps"] <= 240
    # Two DGX A100 nodes, 8 HDR NICs each: busbw per NIC at 256 MiB and 1 GiB.
    s = simulate(load_scenario(SCEN / "nccl-allreduce-16xa100-hdr.yaml")).summary
    for c in s["collectives"][-2:]:
        assert 20 <= c["busbw_GBps"] / 8 <= 24
    # One GPU per node on one HDR NIC each: a ring across them.
    w = _world(2, 1, INTRA_PRESETS["nvlink3"], INTER_PRESETS["hdr"], nics=1)
    (r,) = run_collectives(w, "all_reduce", "ring", [0, 1], [1 << 30])
    assert 20 <= r.busbw_GBps <= 24


SHAPES = st.sampled_from([(1, 2), (1, 4), (1, 8), (2, 1), (2, 4), (2, 8), (4, 1), (4, 2), (4, 4), (8, 1), (16, 1)])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=SHAPES, log_size=st.integers(10, 28), intra=st.sampled_from(["nvlink3", "nvlink4", "pcie4"]),
       inter=st.sampled_from(["edr", "hdr", "ndr"]), innet=st.booleans())
def test_auto_never_picks_a_much_slower_algorithm(shape, log_size: int, intra: str, inter: str, innet: bool) -> None:
    """Whatever auto picks, the simulator times it within 10 % of the best available (algorithm, protocol)."""
    nodes, gpn = shape
    size = 1 << log_size
    gpus = list(range(nodes * gpn))

    def timed(alg: str, proto: str) -> float:
        w = _world(nodes, gpn, INTRA_PRESETS[intra], INTER_PRESETS[inter], in_network_reduction=innet)
        (r,) = run_collectives(w, "all_reduce", alg, gpus, [size], protocol=proto, record_spans=False)
        return r.time_s

    w = _world(nodes, gpn, INTRA_PRESETS[intra], INTER_PRESETS[inter], in_network_reduction=innet)
    pick = algs.choose("all_reduce", "bench", size, w.topology, gpus, w.comm)
    shape_ = algs.group_shape(w.topology, gpus)
    options = [(a, p) for a in algs.candidates("all_reduce", "bench", shape_, w.comm, w.topology)
               for p in algs.PIPELINE_PROTOCOLS.get(a, ("Simple",))]
    times = {o: timed(*o) for o in options}
    assert times[(pick.algorithm, pick.protocol)] <= 1.10 * min(times.values()), (pick, times)


@pytest.mark.parametrize("over", [
    {"parallel__dp_algorithm": "auto", "parallel__tensor": 1, "parallel__data": 8},
    {"parallel__dp_algorithm": "tree", "parallel__overlap_grad_sync": False},
    {"parallel__dp_algorithm": "tree", "parallel__tensor": 1, "parallel__data": 8},
    {"parallel__dp_algorithm": "hierarchical"},
    {"parallel__dp_algorithm": "parameter_server", "parallel__parameter_servers": 2},
    {"parallel__dp_algorithm": "parameter_server", "parallel__parameter_servers": 2,
     "parallel__parameter_server_placement": "dedicated"},
    {"cluster__in_network_reduction": True, "cluster__gpu": "H100-SXM", "cluster__inter_node": "ndr"},
])
def test_symmetric_and_full_agree_for_every_algorithm(over: dict) -> None:
    """Exact wherever a group's ranks finish a collective together or nothing else shares its links."""
    from tests.test_training_sim import _tiny

    base = dict(parallel__data=4, parallel__tensor=2, parallel__pipeline=2, training__global_batch=32)
    base.update(over)
    full = simulate(scenario_from_dict(_tiny(simulation__symmetry="off", **base)))
    sym = simulate(scenario_from_dict(_tiny(simulation__symmetry="on", **base)))
    assert sym.summary["step_time_s"] == pytest.approx(full.summary["step_time_s"], rel=1e-9)
    assert sym.summary["collective_algorithms"] == full.summary["collective_algorithms"]
    # Exposed communication averages every GPU's; a tree's ranks finish at different times and the
    # representative stands for the slowest, so it may differ slightly.
    assert sym.summary["exposed_comm_s"] == pytest.approx(full.summary["exposed_comm_s"], rel=0.02)
    dp = [sp for sp in full.timeline.spans if sp.category == "comm_dp"]
    assert dp and all(sp.args.get("algorithm") for sp in dp)


def test_symmetric_tree_overlapping_tp_traffic_is_close() -> None:
    """A tree's ranks finish at different times; in a full simulation the early ones start the next
    gradient bucket early while the peers' TP traffic crosses the same NVLinks. The representative
    cannot replay that (nor the different compute slowdown those overlaps cause), so symmetric mode differs
    there by under 2 % (documented in the README)."""
    from tests.test_training_sim import _tiny

    over = dict(parallel__data=4, parallel__tensor=2, parallel__pipeline=2, training__global_batch=32,
                parallel__dp_algorithm="tree")
    full = simulate(scenario_from_dict(_tiny(simulation__symmetry="off", **over))).summary
    sym = simulate(scenario_from_dict(_tiny(simulation__symmetry="on", **over))).summary
    assert sym["step_time_s"] == pytest.approx(full["step_time_s"], rel=0.02)


def test_parameter_servers_need_the_parameter_server_algorithm() -> None:
    from sim.errors import ScenarioError
    from tests.test_training_sim import _tiny

    with pytest.raises(ScenarioError, match="parameter_servers"):
        scenario_from_dict(_tiny(parallel__parameter_servers=2))


def test_collective_counts_agree_between_symmetric_and_full_with_loss_scaling() -> None:
    """The found_inf and grad-norm all-reduces span the stages (model-parallel group): counted once per group."""
    from tests.test_training_sim import _tiny

    over = dict(parallel__data=2, parallel__tensor=2, parallel__pipeline=4, training__global_batch=16,
                training__precision="fp16", training__loss_scaling={"kind": "dynamic", "overflow_steps": [5]})
    full = simulate(scenario_from_dict(_tiny(simulation__symmetry="off", **over))).summary
    sym = simulate(scenario_from_dict(_tiny(simulation__symmetry="on", **over))).summary
    assert full["collective_algorithms"] == sym["collective_algorithms"]
    # Per data-parallel replica: the found_inf all-reduce and the gradient-norm all-reduce.
    assert sum(full["collective_algorithms"]["mp:all_reduce"].values()) == 2 * 2


def _time_every_candidate(op: str, close: list, size: float, w: World, gpus: list[int]) -> list[float]:
    """Each close candidate simulated alone on idle links, none skipped (what the tuner did before it
    skipped candidates by their lower bound)."""
    from sim.engine import collective_algorithms as coll

    shape = algs.group_shape(w.topology, gpus)
    out = []
    for c in close:
        scratch = World(w.topology)
        spec = coll.build(op, c.algorithm, shape.p, size, ranks_by_node=[list(r) for r in shape.ranks_by_node])
        run = scratch.run_collective_alone(spec, gpus, None, c.protocol, c.launch_s)
        run.join_all()
        scratch.env.run()
        out.append(run.end_s - run.start_s)
        assert algs._lower_bound_s(run, spec, w.topology) <= out[-1] * (1 + 1e-9)  # a true lower bound
    return out


@settings(max_examples=12, deadline=None)
@given(shape=st.sampled_from([(1, 8), (4, 1), (8, 1), (2, 4), (4, 2)]), log_size=st.integers(12, 29))
def test_refinement_skipping_by_lower_bound_picks_what_timing_all_would(shape, log_size: int) -> None:
    nodes, gpn = shape
    w = _world(nodes, gpn)
    gpus = list(range(nodes * gpn))
    size = float(1 << log_size)
    sh = algs.group_shape(w.topology, gpus)
    options = [algs.Choice(a, pr, base_latency_s(a, pr), algs.predict_s("all_reduce", a, pr, size, sh, w.topology,
                                                                          w.comm))
               for a in ("ring", "tree") for pr in algs.PIPELINE_PROTOCOLS[a]]
    times = _time_every_candidate("all_reduce", options, size, w, gpus)
    expect = options[min(range(len(options)), key=lambda i: (times[i], i))]
    assert algs._fastest_alone("all_reduce", options, size, w.topology, gpus, sh, w.comm) == expect
