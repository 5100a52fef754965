"""Which algorithm and protocol a collective runs with: the user's choice, or NCCL's tuner.

NCCL's tuner (``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime`` in src/graph/tuning.cc) predicts, for
every (algorithm, protocol) it may use, ``base latency + hops × hop latency + bytes / bus bandwidth``
and runs the fastest. ``choose`` does the same with dtsim's own closed forms (``sim.analytic``) over
the group's links, so ``auto`` follows the message size and the group's shape: LL for tiny messages,
tree where many hops make the ring's 2(p − 1) latencies dominate, NVLS inside an NVSwitch node when
in-network reduction is on, ring for large buffers. Where two candidates come within 30 % of each
other (a crossover, where these closed forms can be ~20 % off for a tree at medium sizes), groups of
up to 64 ranks time them on idle links with the simulator and take the faster. The choice depends only
on the group's shape and the size, so symmetric and full simulations choose alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sim import analytic as an
from sim.engine import collective_algorithms as coll
from sim.engine.collective_runs import CollectiveRun
from sim.engine.transfer_graphs import DAG, btree_parent, server_ranks
from sim.engine.world import World
from sim.hardware.nccl import (
    IN_NETWORK_LATENCY_US,
    PROTOCOL_BW_FRACTION,
    PROTOCOLS,
    base_latency_s,
    chunks_for,
)

if TYPE_CHECKING:  # the engine reads a scenario but never needs the schema module at run time
    from sim.scenario.schema import Scenario

PIPELINE_PROTOCOLS = {"ring": PROTOCOLS, "tree": PROTOCOLS}  # others run Simple only (as NCCL's NVLS/CollNet)


@dataclass(frozen=True)
class CommConfig:
    """The scenario's collective settings (parallel.dp_algorithm …, cluster.in_network_reduction)."""

    dp_algorithm: str = "auto"
    parameter_servers: int = 1
    placement: str = "colocated"
    in_network_reduction: bool = False
    aggregate_Bps: float | None = None  # a server's summation (memory) bandwidth
    server_gpus: tuple[int, ...] = field(default_factory=tuple)  # dedicated servers' endpoint ids


@dataclass(frozen=True)
class Choice:
    algorithm: str
    protocol: str
    launch_s: float
    predicted_s: float

    @property
    def label(self) -> str:
        return self.algorithm if self.protocol == "Simple" else f"{self.algorithm}/{self.protocol}"


@dataclass(frozen=True)
class GroupShape:
    """What the cost of a collective depends on: ranks per node, the group's NICs per node, links."""

    p: int
    nodes: int
    per_node: int
    nics: int  # the group's NICs on one node
    ranks_by_node: tuple[tuple[int, ...], ...]


def group_shape(topology, gpus: list[int]) -> GroupShape:
    """The group's shape, memoised on the topology (a training step asks for the same groups again and again)."""
    memo = topology.__dict__.setdefault("_group_shapes", {})
    key = tuple(gpus)
    shape = memo.get(key)
    if shape is None:
        shape = memo[key] = _group_shape(topology, gpus)
    return shape


def _group_shape(topology, gpus: list[int]) -> GroupShape:
    by: dict[int, list[int]] = {}
    for i, g in enumerate(gpus):
        by.setdefault(topology.node_of(g), []).append(i)
    nics = topology.group_nics(gpus)
    return GroupShape(len(gpus), len(by), max(len(v) for v in by.values()),
                      min(len(v) for v in nics.values()), tuple(tuple(v) for v in by.values()))


def candidates(op: str, kind: str, shape: GroupShape, cfg: CommConfig, topology) -> list[str]:
    """Algorithms this collective may run with under ``cfg`` (``kind``: "dp", "tp", "mp" or "bench")."""
    if op in ("all_to_all", "send_recv"):
        return ["direct"]
    if op != "all_reduce":
        return ["chain"] if op in ("broadcast", "reduce") else ["ring"]
    even = len({len(r) for r in shape.ranks_by_node}) == 1
    nvls = (cfg.in_network_reduction and shape.nodes == 1 and shape.p > 2
            and topology.intra_link.nvls_efficiency is not None)
    sharp = (cfg.in_network_reduction and shape.nodes > 1 and even and topology.inter_link.sharp)
    if kind == "dp" and cfg.dp_algorithm != "auto":
        alg = cfg.dp_algorithm
        if alg == "parameter_server":
            return ["ps"]
        if alg == "hierarchical":
            if not even or shape.nodes == 1:
                return ["ring"]
            return ["hierarchical_sharp" if sharp else "hierarchical"]
        return [alg]
    out = ["ring", "tree"] if shape.p >= 4 else ["ring"]  # 2–3 ranks: a tree is a ring with extra steps
    if nvls:
        out.append("nvls")
    if sharp and shape.per_node > 1:
        out.append("hierarchical_sharp")
    return out


def _links(topology, protocol: str, nics: int) -> tuple[float, float, float, float]:
    """(α_intra, B_intra, α_inter, B_inter of the group's NICs on a node) with ``protocol``."""
    intra, inter = topology.intra_link, topology.inter_link
    a_i = topology.intra_latency_s * intra.protocol_latency_scale(protocol)
    a_e = topology.inter_latency_s * inter.protocol_latency_scale(protocol)
    f = PROTOCOL_BW_FRACTION[protocol]
    return a_i, topology.intra_bw_Bps * f, a_e, topology.inter_bw_Bps * f * nics


def predict_s(op: str, algorithm: str, protocol: str, size_bytes: float, shape: GroupShape, topology,
              cfg: CommConfig, inter_share: float = 1.0) -> float:
    """Closed-form time of the collective on idle links (the tuner's model), launch included.
    ``inter_share`` (≥ 1): the group's NICs get 1/inter_share of their bandwidth, as when other groups fill
    an oversubscribed tree's uplinks beside it (the planner's screen: ``sim.explore.fabric``)."""
    p, n = shape.p, size_bytes
    a_i, b_i, a_e, b_e = _links(topology, protocol, shape.nics)
    b_e /= inter_share
    multi = shape.nodes > 1
    launch = base_latency_s(algorithm, protocol)
    if op in ("reduce_scatter", "all_gather", "all_reduce") and algorithm == "ring":
        steps = (2 if op == "all_reduce" else 1) * (p - 1)
        c = n / p
        if not multi:
            return launch + steps * (a_i + c / b_i)
        if shape.per_node == 1:
            return launch + steps * (a_e + c / b_e)
        # As NCCL's ring model (tuning.cc): inter-node steps pay the network latency once (the
        # connection's slots overlap it with the data behind), and every step is paced by the slower
        # of an NVLink hop (latency + chunk) and the boundary hop's NICs (chunk). A chunk's path visits
        # every hop alike, so a share nodes/p of its steps cross a node boundary (NCCL counts
        # 2(nodes-1): the same for p ≫ nodes).
        n_inter = steps * shape.nodes / p
        return launch + steps * max(a_i + c / b_i, c / b_e) + n_inter * a_e
    if algorithm == "chain":
        k = chunks_for(n)
        hop_a, hop_b = (a_e, min(b_i, b_e)) if multi else (a_i, b_i)
        return launch + an.pipelined_chain_time(p, n, hop_a, hop_b, k)
    if algorithm == "tree":
        return launch + _tree_time(shape, n, a_i, b_i, a_e, b_e)
    if algorithm == "nvls":
        link = topology.intra_link
        b_n = topology.intra_bw_Bps / link.efficiency * link.nvls_efficiency
        return launch + an.nvls_all_reduce_time(p, n, IN_NETWORK_LATENCY_US["nvlink"] * 1e-6, b_n)
    if algorithm in ("hierarchical", "hierarchical_sharp"):
        g, nodes = shape.per_node, shape.nodes
        intra = an.ring_reduce_scatter_time(g, n, a_i, b_i)
        rail_b = b_e / g
        if algorithm == "hierarchical_sharp":
            inter = IN_NETWORK_LATENCY_US["net"] * 1e-6 + (n / g) / rail_b
        else:
            inter = an.ring_all_reduce_time(nodes, n / g, a_e, rail_b)
        return launch + 2 * intra + inter
    if algorithm == "ps":
        return launch + _ps_time(shape, n, a_i, b_i, a_e, b_e, cfg)
    return launch + (a_e if multi else a_i) + n / (b_e if multi else b_i)


def _tree_time(shape: GroupShape, n: float, a_i: float, b_i: float, a_e: float, b_e: float) -> float:
    """Double binary tree, the tuner's estimate: the steady state moves N/2 each way over every tree
    edge (2N through an inner rank's NVLink, N/2 per edge leaving a node through its NICs), plus the
    first chunk's trip up and down the deepest path — its hop latencies in full, its per-hop data
    divided by k (pipelined, it mostly overlaps the data behind it; one whole chunk per hop when k = 1).
    Checked against the simulation by tests/test_algorithms.py's property test."""
    p = shape.p
    node = {r: i for i, rs in enumerate(shape.ranks_by_node) for r in rs}
    parent = [btree_parent(p, r) for r in range(p)]
    mirror = [(p - 1 - r) if p % 2 == 0 else (r + 1) % p for r in range(p)]
    second = [-1] * p
    for r in range(1, p):
        second[mirror[r]] = mirror[parent[r]]
    cross = [0] * shape.nodes  # tree edges leaving each node (through its NICs), both trees
    deg = [0] * p  # intra-node tree edges at each rank (through its NVLink), both trees
    for par in (parent, second):
        for r in range(p):
            q = par[r]
            if q >= 0 and node[r] != node[q]:
                cross[node[r]] += 1
                cross[node[q]] += 1
            elif q >= 0:
                deg[r] += 1
                deg[q] += 1
    k = chunks_for(n / 2)
    c = n / 2 / k / k  # the first chunk's per-hop time hides behind the other k-1 chunks' data
    path = 0.0
    for par in (parent, second):
        for r in range(p):
            cost, x = 0.0, r
            while par[x] >= 0:
                q = par[x]
                if node[x] != node[q]:
                    share = max(1.0, max(cross[node[x]], cross[node[q]]) / 2 / shape.nics)
                    cost += 2 * a_e + c * share / b_e
                else:
                    cost += 2 * a_i + c * max(1.0, max(deg[x], deg[q]) / 2) / b_i
                x = q
            path = max(path, cost)
    # Every edge carries N/2 each way over the whole collective (reduce one way, broadcast back).
    bw_s = max(max(deg) * (n / 2) / b_i, max(cross) * (n / 2) / b_e if shape.nodes > 1 else 0.0)
    return path + bw_s


def _ps_time(shape: GroupShape, n: float, a_i: float, b_i: float, a_e: float, b_e: float, cfg: CommConfig) -> float:
    s = cfg.parameter_servers
    dedicated = cfg.placement == "dedicated"
    b = b_e if (shape.nodes > 1 or dedicated) else b_i
    a = a_e if (shape.nodes > 1 or dedicated) else a_i
    if dedicated:
        b = b_e / shape.nics  # a dedicated server has one NIC
    return an.sharded_parameter_server_time(shape.p, s, n, a, b, cfg.aggregate_Bps, colocated=not dedicated)


# Near a crossover the closed forms above can be off by up to ~20 % (tree pipelines at medium sizes);
# there the tuner times the close candidates on idle links with the simulator itself (small groups).
REFINE_WITHIN = 1.3
REFINE_MAX_RANKS = 64


def choose(op: str, kind: str, size_bytes: float, topology, gpus: list[int], cfg: CommConfig,
           cache: dict | None = None) -> Choice:
    """The (algorithm, protocol) with the smallest predicted time among those allowed; candidates
    within ``REFINE_WITHIN`` of the best are timed on idle links when the group is small."""
    shape = group_shape(topology, gpus)
    key = (op, kind, size_bytes, shape)
    if cache is not None and key in cache:
        return cache[key]
    options: list[Choice] = []
    for alg in candidates(op, kind, shape, cfg, topology):
        for proto in PIPELINE_PROTOCOLS.get(alg, ("Simple",)):
            t = predict_s(op, alg, proto, size_bytes, shape, topology, cfg)
            options.append(Choice(alg, proto, base_latency_s(alg, proto), t))
    best = min(options, key=lambda c: c.predicted_s)
    close = [c for c in options if c.predicted_s <= REFINE_WITHIN * best.predicted_s]
    if len(close) > 1 and shape.p <= REFINE_MAX_RANKS and not cfg.server_gpus:
        best = _fastest_alone(op, close, size_bytes, topology, gpus, shape, cfg)
    if cache is not None:
        cache[key] = best
    return best


def _fastest_alone(op: str, close: list[Choice], size_bytes: float, topology, gpus: list[int], shape: GroupShape,
                   cfg: CommConfig) -> Choice:
    """The first of ``close`` with the shortest simulated time on idle links. Candidates are timed in the
    order of a lower bound on their time (``_lower_bound_s``); once that bound exceeds the best time so
    far the rest cannot win, so they are not simulated: the same choice as timing them all."""
    plans = []
    for c in close:
        w = World(topology)
        spec = coll.build(op, c.algorithm, shape.p, size_bytes, ranks_by_node=[list(r) for r in shape.ranks_by_node],
                          servers=cfg.parameter_servers, aggregate_Bps=cfg.aggregate_Bps)
        run = w.run_collective_alone(spec, gpus, None, c.protocol, c.launch_s)
        plans.append((_lower_bound_s(run, spec, topology), w, run))
    times: dict[int, float] = {}
    best_s = math.inf
    for i in sorted(range(len(close)), key=lambda i: plans[i][0]):
        bound_s, w, run = plans[i]
        if bound_s > best_s * (1 + 1e-9):
            break
        run.join_all()
        w.env.run()
        assert run.end_s is not None and run.start_s is not None, "a collective run alone always finishes"
        times[i] = run.end_s - run.start_s
        best_s = min(best_s, times[i])
    return close[min(times, key=lambda i: (times[i], i))]


def _lower_bound_s(run: CollectiveRun, spec: coll.Spec, topology) -> float:
    """No collective ends before its launch latency plus the time its busiest link needs for the bytes
    crossing it at full capacity (max-min rates never exceed a link's capacity). Transfer graphs and
    rings only; others are bounded by their launch latency alone."""
    if isinstance(spec, coll.RingSpec):
        p = spec.p
        src, dst, size = np.arange(p), (np.arange(p) + 1) % p, np.full(p, spec.chunk_bytes * spec.steps)
    elif isinstance(spec, DAG):
        src, dst, size = spec.src, spec.dst, spec.size
    else:
        return run.launch_s
    keep = src != dst
    base = int(max(src.max(initial=0), dst.max(initial=0))) + 1
    uniq, inv = np.unique(src[keep] * base + dst[keep], return_inverse=True)
    per_pair = np.bincount(inv, weights=size[keep])
    load: dict[int, float] = {}
    for key, nbytes in zip(uniq.tolist(), per_pair.tolist(), strict=True):
        routes, _ = run._route(key // base, key % base)
        for links, frac in routes:
            for link in links:
                load[link] = load.get(link, 0.0) + nbytes * frac * run._wire
    cap = topology.capacity_Bps
    return run.launch_s + max((b / cap[link] for link, b in load.items()), default=0.0)


# Dedicated parameter servers: CPU nodes whose DRAM bandwidth bounds the summation. Datasheet: 2 sockets ×
# 8 channels × DDR4-3200 (25.6 GB/s per channel, AMD EPYC 7002 / Intel Ice Lake SP) = 409.6 GB/s.
CPU_SERVER_MEMORY_Bps = 2 * 8 * 25.6e9


def comm_config_for(scenario: Scenario, topology) -> CommConfig:
    """The scenario's collective settings; dedicated servers sit on the extra nodes after the GPUs'."""
    par, c = scenario.parallel, scenario.cluster
    if par is None:  # a collective benchmark: only the cluster's switches matter
        return CommConfig(in_network_reduction=c.in_network_reduction)
    dedicated = par.dp_algorithm == "parameter_server" and par.parameter_server_placement == "dedicated"
    if dedicated:
        agg = CPU_SERVER_MEMORY_Bps
        servers = tuple((c.nodes + s) * c.gpus_per_node for s in range(par.parameter_servers))
    else:
        # Colocated servers sum on the GPU they share, at the bandwidth memory-bound kernels reach.
        agg = scenario.gpu.memory_bandwidth_GBps * 1e9 * scenario.gpu.memory_efficiency
        servers = ()
    return CommConfig(par.dp_algorithm, par.parameter_servers, par.parameter_server_placement,
                      c.in_network_reduction, agg, servers)


def server_nodes(scenario: Scenario) -> int:
    """Extra nodes the topology needs for dedicated parameter servers (one NIC used each)."""
    par = scenario.parallel
    if par is not None and par.dp_algorithm == "parameter_server" and par.parameter_server_placement == "dedicated":
        return par.parameter_servers
    return 0


def algorithm_pairs(p: int, ranks_by_node: list[list[int]], cfg: CommConfig, extra: int = 0) -> set[tuple[int, int]]:
    """Rank pairs (a, b) any algorithm ``cfg`` allows may send between (symmetry analysis): ring
    neighbours always, tree edges, parameter-server (worker, server) pairs, hierarchical rails.
    In-network algorithms cross only links these already cross. ``extra``: dedicated servers p..p+extra-1."""
    pairs = {(i, (i + 1) % p) for i in range(p)} if p > 1 else set()
    alg = cfg.dp_algorithm
    if p > 2:  # tensor-parallel and auto groups may run the tree whatever dp_algorithm says
        mirror = [(p - 1 - r) if p % 2 == 0 else (r + 1) % p for r in range(p)]
        for r in range(1, p):
            q = btree_parent(p, r)
            for a, b in ((r, q), (mirror[r], mirror[q])):
                pairs.update({(a, b), (b, a)})
    if alg == "parameter_server":
        srv = list(range(p, p + extra)) if extra else server_ranks(p, cfg.parameter_servers)
        for s in srv:
            for w in range(p):
                if w != s:
                    pairs.update({(w, s), (s, w)})
    if alg == "hierarchical":
        g = len(ranks_by_node[0])
        for j in range(g):
            rail = [r[j] for r in ranks_by_node if j < len(r)]
            pairs.update({(rail[i], rail[(i + 1) % len(rail)]) for i in range(len(rail)) if len(rail) > 1})
        for node in ranks_by_node:
            pairs.update({(node[i], node[(i + 1) % len(node)]) for i in range(len(node)) if len(node) > 1})
    return pairs
