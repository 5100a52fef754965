"""Collectives as step-by-step transfer graphs, run over the fluid network.

Each algorithm is a pure function building a DAG of point-to-point transfers between group ranks
(``src``, ``dst``, ``size_bytes``; an edge a→b means b may start only after a finished). A
``CollectiveRun`` executes the DAG: a transfer starts once its predecessors are done and both of its
ranks have joined the collective (NCCL's rendezvous), so a late rank delays everyone who needs it.
Closed forms for the uncontended case are in ``sim.analytic``; tests hold the simulation to them.

NCCL's cost structure (``sim.hardware.nccl``): every run pays its algorithm's base (launch) latency once,
each hop the per-hop latency of the run's protocol (LL / LL128 / Simple) on that link class, and its
bytes go at the protocol's share of the link bandwidth. Pipelined algorithms (chain, double binary tree)
send in chunks; only a hop's first chunk waits the hop latency, later chunks follow back to back (the
latency of chunk c+1 overlaps the data of chunk c, as in NCCL's slot pipeline).
In-network reductions (NVLS on the NVSwitch, SHARP in InfiniBand switches) are not transfers between
ranks: ``InNetworkSpec`` streams each rank's bytes up to the switch and the result back down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy

from sim.errors import ScenarioError
from sim.hardware.nccl import IN_NETWORK_LATENCY_US, PROTOCOL_BW_FRACTION, chunks_for

# Which algorithms each collective supports; the first is the default. "tree" is NCCL's pipelined double
# binary tree; "nvls" the NVSwitch in-network all-reduce (one node); "hierarchical_sharp" the hierarchical
# all-reduce with its inter-node phase reduced in InfiniBand switches (SHARP).
ALGORITHMS = {
    "all_reduce": ("ring", "tree", "hierarchical", "ps", "nvls", "hierarchical_sharp"),
    "reduce_scatter": ("ring",),
    "all_gather": ("ring",),
    "broadcast": ("chain", "binomial", "ps"),
    "reduce": ("chain", "binomial", "ps"),
    "all_to_all": ("direct",),
    "send_recv": ("direct",),
}


@dataclass
class DAG:
    """Transfers between group ranks (0..p-1) and their dependencies (edge a→b: b waits for a)."""

    src: np.ndarray
    dst: np.ndarray
    size: np.ndarray
    edge_from: np.ndarray
    edge_to: np.ndarray
    lat_scale: np.ndarray | None = None  # per transfer: share of the hop latency it waits (pipelining: 0)
    delay_s: np.ndarray | None = None  # per transfer: extra wait, e.g. a server's aggregation

    @property
    def n(self) -> int:
        return len(self.src)

    def lat(self) -> np.ndarray:
        return np.ones(self.n) if self.lat_scale is None else self.lat_scale

    def delay(self) -> np.ndarray:
        return np.zeros(self.n) if self.delay_s is None else self.delay_s

    @staticmethod
    def empty() -> DAG:
        z = np.zeros(0, dtype=np.int64)
        return DAG(z, z, np.zeros(0), z, z)

    @staticmethod
    def from_lists(src: list[int], dst: list[int], size: list[float], edges: list[tuple[int, int]],
                   lat_scale: list[float] | None = None, delay_s: list[float] | None = None) -> DAG:
        e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        return DAG(
            np.asarray(src, dtype=np.int64),
            np.asarray(dst, dtype=np.int64),
            np.asarray(size, dtype=float),
            e[:, 0].copy(),
            e[:, 1].copy(),
            None if lat_scale is None else np.asarray(lat_scale, dtype=float),
            None if delay_s is None else np.asarray(delay_s, dtype=float),
        )


def _union(dags: list[DAG], rank_maps: list[np.ndarray]) -> DAG:
    """Disjoint union of DAGs whose local ranks map to group ranks through ``rank_maps``."""
    srcs, dsts, sizes, efs, ets, lats, dels = [], [], [], [], [], [], []
    off = 0
    for d, m in zip(dags, rank_maps, strict=True):
        srcs.append(m[d.src])
        dsts.append(m[d.dst])
        sizes.append(d.size)
        efs.append(d.edge_from + off)
        ets.append(d.edge_to + off)
        lats.append(d.lat())
        dels.append(d.delay())
        off += d.n
    if not dags:
        return DAG.empty()
    return DAG(*(np.concatenate(x) if x else np.zeros(0) for x in (srcs, dsts, sizes, efs, ets, lats, dels)))


def _sequence(first: DAG, second: DAG, p: int) -> DAG:
    """Run ``second`` after ``first`` rank by rank: a transfer of ``second`` with no predecessor waits
    for the last transfers of ``first`` that touch its source or destination rank."""
    n1 = first.n
    has_dep_out = np.zeros(n1, dtype=bool)
    has_dep_out[first.edge_from] = True
    last: list[list[int]] = [[] for _ in range(p)]
    for t in np.flatnonzero(~has_dep_out):
        last[int(first.src[t])].append(int(t))
        last[int(first.dst[t])].append(int(t))
    has_dep_in = np.zeros(second.n, dtype=bool)
    has_dep_in[second.edge_to] = True
    ef, et = [], []
    for t in np.flatnonzero(~has_dep_in):
        for r in {int(second.src[t]), int(second.dst[t])}:
            for a in last[r]:
                ef.append(a)
                et.append(int(t) + n1)
    return DAG(
        np.concatenate([first.src, second.src]),
        np.concatenate([first.dst, second.dst]),
        np.concatenate([first.size, second.size]),
        np.concatenate([first.edge_from, second.edge_from + n1, np.asarray(ef, dtype=np.int64)]),
        np.concatenate([first.edge_to, second.edge_to + n1, np.asarray(et, dtype=np.int64)]),
        np.concatenate([first.lat(), second.lat()]),
        np.concatenate([first.delay(), second.delay()]),
    )


# ---- algorithms (pure) ----------------------------------------------------------------------------
RING_SLOTS = 8  # NCCL_STEPS (src/include/device.h): sends a connection may have in flight


def ring(p: int, chunk_bytes: float, steps: int) -> DAG:
    """``steps`` ring steps; at step k rank i sends one chunk to i+1, after receiving step k-1 from i-1
    (and once its send of step k-8 finished: NCCL's 8 slots). All-reduce: 2(p-1) steps of N/p; RS/AG:
    p-1 steps of N/p."""
    if p < 2 or steps == 0:
        return DAG.empty()
    i = np.tile(np.arange(p), steps)
    k = np.repeat(np.arange(steps), p)
    src, dst = i, (i + 1) % p
    t = k * p + i
    later = k >= 1
    tl, kl, il = t[later], k[later], i[later]
    slots = RING_SLOTS
    old = k >= slots  # at most ``slots`` sends of a rank in flight (NCCL's connection slots)
    edge_from = np.concatenate([(kl - 1) * p + (il - 1) % p, (k[old] - slots) * p + i[old]])
    edge_to = np.concatenate([tl, t[old]])
    return DAG(src, dst, np.full(len(t), float(chunk_bytes)), edge_from, edge_to)


def chain(p: int, size_bytes: float, chunks: int, root: int = 0, reverse: bool = False) -> DAG:
    """Pipelined chain broadcast (root → root+1 → …) in ``chunks`` pieces; ``reverse`` gives the reduce
    (… → root+1 → root). Only each hop's first chunk waits the hop latency (NCCL's slots overlap the
    rest): time (p-1)α + (p-1+k-1)·N/(kB)."""
    if p < 2:
        return DAG.empty()
    order = [(root + j) % p for j in range(p)]
    if reverse:
        order = order[::-1]
    src, dst, size, edges, lat = [], [], [], [], []
    idx = {}
    c_bytes = size_bytes / chunks
    for c in range(chunks):
        for j in range(p - 1):
            idx[(c, j)] = len(src)
            src.append(order[j])
            dst.append(order[j + 1])
            size.append(c_bytes)
            lat.append(1.0 if c == 0 else 0.0)
            if j > 0:
                edges.append((idx[(c, j - 1)], idx[(c, j)]))
            if c > 0:
                edges.append((idx[(c - 1, j)], idx[(c, j)]))
    return DAG.from_lists(src, dst, size, edges, lat)


def _binomial_children(i: int, p: int) -> list[int]:
    """Children of rank i (relative to the root) in a binomial tree, largest subtree first."""
    low = i & -i if i else 1 << max(0, (p - 1).bit_length())
    kids = []
    step = low >> 1
    while step >= 1:
        if i + step < p:
            kids.append(i + step)
        step >>= 1
    return kids


def binomial_broadcast(p: int, size_bytes: float, root: int = 0) -> DAG:
    """Binomial tree: each rank forwards to its children, largest subtree first. ⌈log2 p⌉(α + N/B)."""
    src, dst, size, edges = [], [], [], []
    recv_of: dict[int, int] = {}

    def visit(i: int) -> None:
        prev = recv_of.get(i)
        for c in _binomial_children(i, p):
            t = len(src)
            src.append((i + root) % p)
            dst.append((c + root) % p)
            size.append(size_bytes)
            if prev is not None:
                edges.append((prev, t))
            prev = t
            recv_of[c] = t
        for c in _binomial_children(i, p):
            visit(c)

    if p >= 2:
        visit(0)
    return DAG.from_lists(src, dst, size, edges)


def reverse(d: DAG) -> DAG:
    """The mirror image: every transfer reversed in direction and in time (broadcast → reduce)."""
    n = d.n
    return DAG(
        d.dst[::-1].copy(), d.src[::-1].copy(), d.size[::-1].copy(), (n - 1) - d.edge_to, (n - 1) - d.edge_from,
        d.lat()[::-1].copy(), d.delay()[::-1].copy(),
    )


def server_ranks(p: int, servers: int) -> list[int]:
    """Colocated servers: one on every ⌈p/S⌉-th rank, spread over the group (BytePS colocated mode)."""
    return [s * p // servers for s in range(servers)]


def parameter_server(p: int, size_bytes: float, root: int = 0, push: bool = True, pull: bool = True,
                     servers: int = 1, aggregate_Bps: float | None = None, dedicated: bool = False) -> DAG:
    """Workers push their gradients to the servers, each server sums its shard and sends it back.

    With S servers (sharded, BytePS-style) server s owns N/S bytes: every worker pushes N/S to each
    server, the server reads the W shards it received plus its own and writes the sum (``aggregate_Bps``:
    its memory bandwidth; None = free), then every worker pulls N/S from each server. Colocated servers
    are group ranks (one in ⌈p/S⌉, a worker too, whose own shard does not travel); ``dedicated`` servers
    are extra ranks p..p+S-1 that do not train. One server and no aggregation: 2(α + (p-1)N/B)."""
    if dedicated:
        srv = [p + s for s in range(servers)]
        workers = list(range(p))
    else:
        srv = [(root + r) % p for r in server_ranks(p, servers)] if servers > 1 else [root]
        workers = list(range(p))
    shard = size_bytes / servers
    src, dst, size, edges, lat, delay = [], [], [], [], [], []

    def add(a: int, b: int, n: float, deps: list[int], lat_s: float = 1.0, d: float = 0.0) -> int:
        t = len(src)
        src.append(a)
        dst.append(b)
        size.append(n)
        lat.append(lat_s)
        delay.append(d)
        edges.extend((x, t) for x in deps)
        return t

    for server in srv:
        pushes = [add(w, server, shard, []) for w in workers if w != server] if push else []
        ready = pushes
        if push and aggregate_Bps:
            contributions = len(pushes) + (0 if dedicated else 1)
            agg_s = (contributions + 1) * shard / aggregate_Bps  # read every shard, write the sum
            ready = [add(server, server, 0.0, pushes, 0.0, agg_s)]
        if pull:
            for w in workers:
                if w != server:
                    add(server, w, shard, ready)
    return DAG.from_lists(src, dst, size, edges, lat, delay)


def btree_parent(n: int, rank: int) -> int:
    """Parent of ``rank`` in NCCL's in-order binary tree over n ranks rooted at 0 (-1 for the root):
    the tree of ``ncclGetBtree`` in NCCL's src/graph/trees.cc (leaves and inner nodes alternate)."""
    if rank == 0:
        return -1
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return up if up < n else rank ^ bit


def double_binary_tree_all_reduce(p: int, size_bytes: float, chunks: int) -> DAG:
    """NCCL's double binary tree: two complementary binary trees (the second mirrored for even p,
    shifted by one for odd p, so a leaf in one is inner in the other) each all-reduce half the buffer:
    chunks are reduced up towards the root and broadcast back down, pipelined, each hop sending chunk
    c+1 right after chunk c. Every rank sends and receives about 2N in all: ≈ 2dα + 2N/B for depth d."""
    if p < 2:
        return DAG.empty()
    half = size_bytes / 2
    c_bytes = half / chunks
    parent = [btree_parent(p, r) for r in range(p)]
    children: list[list[int]] = [[] for _ in range(p)]
    for r in range(1, p):
        children[parent[r]].append(r)
    src, dst, size, edges, lat = [], [], [], [], []
    up: dict[tuple[int, int], int] = {}
    down: dict[tuple[int, int], int] = {}

    def add(a: int, b: int, deps: list[int], first: bool) -> int:
        t = len(src)
        src.append(a)
        dst.append(b)
        size.append(c_bytes)
        lat.append(1.0 if first else 0.0)
        edges.extend((x, t) for x in deps)
        return t

    order = sorted(range(1, p), key=lambda r: -_depth(parent, r))  # leaves' sends first (deps exist)
    for c in range(chunks):
        for r in order:
            deps = [up[(c, x)] for x in children[r]] + ([up[(c - 1, r)]] if c else [])
            up[(c, r)] = add(r, parent[r], deps, c == 0)
        for r in sorted(range(1, p), key=lambda r: _depth(parent, r)):
            q = parent[r]
            deps = [up[(c, x)] for x in children[q]] if q == 0 else [down[(c, q)]]
            if c:
                deps.append(down[(c - 1, r)])
            down[(c, r)] = add(q, r, deps, c == 0)
    one = DAG.from_lists(src, dst, size, edges, lat)
    ids = np.arange(p)
    mirror = (p - 1 - ids) if p % 2 == 0 else (ids + 1) % p
    return _union([one, one], [ids, mirror])


def _depth(parent: list[int], r: int) -> int:
    d = 0
    while parent[r] >= 0:
        r = parent[r]
        d += 1
    return d


def btree_depth(p: int) -> int:
    """Edges from the root to the deepest leaf of NCCL's binary tree over p ranks."""
    parent = [btree_parent(p, r) for r in range(p)]
    return max((_depth(parent, r) for r in range(p)), default=0)


def all_to_all(p: int, size_bytes: float) -> DAG:
    """Every rank sends N/p to every other rank at once; links shared fairly."""
    src, dst = [], []
    for a in range(p):
        for b in range(p):
            if a != b:
                src.append(a)
                dst.append(b)
    return DAG.from_lists(src, dst, [size_bytes / p] * len(src), [])


def send_recv(p: int, size_bytes: float) -> DAG:
    """Each rank sends N to the next (nccl-tests sendrecv); with p = 2 a single exchange pair."""
    if p < 2:
        return DAG.empty()
    if p == 2:
        return DAG.from_lists([0], [1], [size_bytes], [])
    return DAG.from_lists(list(range(p)), [(i + 1) % p for i in range(p)], [size_bytes] * p, [])


def hierarchical_all_reduce(ranks_by_node: list[list[int]], size_bytes: float) -> DAG:
    """Intra-node ring reduce-scatter → inter-node ring all-reduce among same-local-index ranks (one ring
    per local index, in parallel) → intra-node ring all-gather. Ranks are group indices. The phases
    follow each other rank by rank on the whole buffer; they are not overlapped chunk by chunk as
    NCCL's CollNet / NVLS-tree pipelines do."""
    g = len(ranks_by_node[0])
    if any(len(r) != g for r in ranks_by_node):
        raise ScenarioError("hierarchical all-reduce needs the same number of ranks on every node", "model.algorithm")
    n_nodes = len(ranks_by_node)
    p = g * n_nodes
    intra_maps = [np.asarray(r) for r in ranks_by_node]
    rs = _union([ring(g, size_bytes / g, g - 1)] * n_nodes, intra_maps)
    inter_maps = [np.asarray([ranks_by_node[n][j] for n in range(n_nodes)]) for j in range(g)]
    ar = _union([ring(n_nodes, size_bytes / g / n_nodes, 2 * (n_nodes - 1))] * g, inter_maps)
    ag = _union([ring(g, size_bytes / g, g - 1)] * n_nodes, intra_maps)
    return _sequence(_sequence(rs, ar, p), ag, p)


@dataclass(frozen=True)
class RingSpec:
    """A plain ring (the same transfers as ``ring()``), run by ``RingRun`` without building the DAG:
    the dependencies are arithmetic, which keeps thousand-rank rings cheap."""

    p: int
    chunk_bytes: float
    steps: int

    @property
    def n(self) -> int:
        return self.p * self.steps if self.p >= 2 else 0

    def to_dag(self) -> DAG:
        return ring(self.p, self.chunk_bytes, self.steps)


@dataclass(frozen=True)
class InNetworkSpec:
    """An in-network reduction: each rank streams ``up_bytes`` to the switch and receives ``down_bytes``
    back, both at once (the switch reduces and multicasts chunk by chunk). ``level`` "nvlink": the
    NVSwitch (NVLS) over each GPU's NVLink; "net": the InfiniBand leaf (SHARP) over the rank's NICs."""

    p: int
    up_bytes: float
    down_bytes: float
    level: str

    @property
    def n(self) -> int:
        return 2 * self.p


@dataclass(frozen=True)
class PhasedSpec:
    """Phases run one after the other over the same ranks (a barrier between them)."""

    phases: tuple

    @property
    def n(self) -> int:
        return sum(ph.n for ph in self.phases)


Spec = DAG | RingSpec | InNetworkSpec | PhasedSpec


def nvls_all_reduce(p: int, size_bytes: float) -> InNetworkSpec:
    """NVLS all-reduce in one node: multimem ld_reduce of each GPU's 1/p shard (every GPU's whole buffer
    goes up, its reduced shard comes down) then a multicast store of the shard (N/p up, the whole
    reduced buffer down): N(p+1)/p each way per GPU, pipelined."""
    per = size_bytes * (p + 1) / p
    return InNetworkSpec(p, per, per, "nvlink")


def hierarchical_sharp_all_reduce(ranks_by_node: list[list[int]], size_bytes: float) -> PhasedSpec:
    """Intra-node ring reduce-scatter, then every rank's N/g shard reduced by the InfiniBand switches
    (SHARP: N/g up, N/g down per rank over its NICs), then intra-node ring all-gather."""
    g = len(ranks_by_node[0])
    n_nodes = len(ranks_by_node)
    intra_maps = [np.asarray(r) for r in ranks_by_node]
    rs = _union([ring(g, size_bytes / g, g - 1)] * n_nodes, intra_maps)
    ag = _union([ring(g, size_bytes / g, g - 1)] * n_nodes, intra_maps)
    p = g * n_nodes
    return PhasedSpec((rs, InNetworkSpec(p, size_bytes / g, size_bytes / g, "net"), ag))


def build(op: str, algorithm: str, p: int, size_bytes: float, *, ranks_by_node: list[list[int]] | None = None,
          chunks: int | None = None, servers: int = 1, aggregate_Bps: float | None = None,
          dedicated: bool = False) -> Spec:
    """The transfer graph for collective ``op`` with ``algorithm`` over p ranks of total size
    ``size_bytes`` (the nccl-tests convention: N is the full buffer; for all-gather the gathered size).
    ``chunks``: pipeline chunks of chain and tree (default: NCCL's chunking, ``nccl.chunks_for``);
    ``servers``, ``aggregate_Bps``, ``dedicated``: the parameter server's shards, summation bandwidth
    and placement (dedicated servers are extra ranks p..p+S-1)."""
    if algorithm not in ALGORITHMS.get(op, ()):
        raise ScenarioError(
            f"{op} does not support algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS.get(op, ()))}",
            "model.algorithm",
        )
    if p < 2:
        return DAG.empty()
    rbn = ranks_by_node or [list(range(p))]
    if op == "all_reduce":
        if algorithm == "ring":
            return RingSpec(p, size_bytes / p, 2 * (p - 1))
        if algorithm == "tree":
            return double_binary_tree_all_reduce(p, size_bytes, chunks or chunks_for(size_bytes / 2))
        if algorithm == "hierarchical":
            return hierarchical_all_reduce(rbn, size_bytes)
        if algorithm == "nvls":
            if len(rbn) > 1:
                raise ScenarioError("nvls all-reduce runs inside one node; use ring, tree or hierarchical",
                                    "model.algorithm")
            return nvls_all_reduce(p, size_bytes)
        if algorithm == "hierarchical_sharp":
            if any(len(r) != len(rbn[0]) for r in rbn):
                raise ScenarioError("hierarchical all-reduce needs the same number of ranks on every node",
                                    "model.algorithm")
            return hierarchical_sharp_all_reduce(rbn, size_bytes)
        return parameter_server(p, size_bytes, servers=servers, aggregate_Bps=aggregate_Bps, dedicated=dedicated)
    if op in ("reduce_scatter", "all_gather"):
        return RingSpec(p, size_bytes / p, p - 1)
    if op in ("broadcast", "reduce"):
        rev = op == "reduce"
        if algorithm == "chain":
            return chain(p, size_bytes, chunks or chunks_for(size_bytes), reverse=rev)
        if algorithm == "binomial":
            d = binomial_broadcast(p, size_bytes)
            return reverse(d) if rev else d
        return parameter_server(p, size_bytes, push=rev, pull=not rev)
    if op == "all_to_all":
        return all_to_all(p, size_bytes)
    return send_recv(p, size_bytes)


def log2ceil(p: int) -> int:
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


# ---- execution ------------------------------------------------------------------------------------
class CollectiveRun:
    """One instance of a collective over ``gpus`` (group rank i = gpus[i]) on a ``World``.

    Subclasses decide which transfers may start; this base handles joining, routing over channels,
    and per-rank completion events.
    """

    def __init__(self, world, gpus: list[int], channels: int | None, n_transfers: int, bytes_sent: float,
                 protocol: str = "Simple", launch_s: float = 0.0):
        self.world = world
        self.gpus = gpus
        p = len(gpus)
        self.p = p
        self.protocol = protocol
        self.launch_s = launch_s
        self._wire = 1.0 / PROTOCOL_BW_FRACTION[protocol]
        self.arrived = [False] * p
        self.joined = [False] * p
        self.done = [world.env.event() for _ in range(p)]
        self._waiting: list[list[int]] = [[] for _ in range(p)]
        topo = world.topology
        self._group_nics = topo.group_nics(gpus)
        if channels is None:
            channels = max((len(v) for v in self._group_nics.values()), default=1)
        self.channels = max(1, int(channels))
        self._routes: dict[tuple[int, int], tuple[list, float]] = {}
        self.n_transfers = n_transfers
        self.bytes_sent = bytes_sent
        self.start_s: float | None = None
        self.end_s: float | None = None
        self._remaining_ranks = p

    def join(self, i: int) -> simpy.Event:
        """Rank i (group index) arrives; returns the event of its part completing. It takes part after
        the collective's launch latency (NCCL's per-collective base latency)."""
        if self.start_s is None:
            self.start_s = self.world.env.now
        self.arrived[i] = True
        if self.launch_s > 0:
            ev = self.world.env.timeout(self.launch_s)
            ev.callbacks.append(lambda _e: self._join_now(i))
        else:
            self._join_now(i)
        return self.done[i]

    def _join_now(self, i: int) -> None:
        self.joined[i] = True
        self._on_join(i)

    def join_all(self) -> simpy.Event:
        """Every rank arrives now (symmetric mode: the other members mirror the representative)."""
        for i in range(self.p):
            self.join(i)
        return self.world.env.all_of(self.done)

    def _on_join(self, i: int) -> None:
        raise NotImplementedError

    def _rank_done(self, i: int) -> None:
        if not self.done[i].triggered:
            self.done[i].succeed()
            self._remaining_ranks -= 1
            if self._remaining_ranks == 0:
                self.end_s = self.world.env.now

    def _send(self, a: int, b: int, size: float, tag: int, lat_scale: float = 1.0, delay_s: float = 0.0) -> None:
        routes, latency = self._route(a, b)
        self.world.network.transfer(routes, size * self._wire, latency * lat_scale + delay_s, self, tag)

    def _hop_latency(self, rt) -> float:
        """The route's per-hop latency with this run's protocol (NCCL's hwLatencies ratio)."""
        topo = self.world.topology
        link = getattr(topo, "inter_link" if rt.inter_node else "intra_link", None)
        return rt.latency_s * (link.protocol_latency_scale(self.protocol) if link is not None else 1.0)

    def _route(self, a: int, b: int) -> tuple[list, float]:
        key = (a, b)
        r = self._routes.get(key)
        if r is None:
            topo = self.world.topology
            ga, gb = self.gpus[a], self.gpus[b]
            na, nb = topo.node_of(ga), topo.node_of(gb)
            if na == nb or self.channels == 1:
                rt = topo.route(ga, gb)
                r = ([(rt.links, 1.0)], self._hop_latency(rt))
            else:
                nics_a, nics_b = self._group_nics[na], self._group_nics[nb]
                share: dict[tuple[int, ...], float] = {}
                lat = 0.0
                for c in range(self.channels):
                    rt = topo.route(ga, gb, nics_a[c % len(nics_a)], nics_b[c % len(nics_b)])
                    share[rt.links] = share.get(rt.links, 0.0) + 1.0 / self.channels
                    lat = self._hop_latency(rt)
                r = (list(share.items()), lat)
            self._routes[key] = r
        return r

    def transfer_done(self, tag: int) -> None:
        raise NotImplementedError


class DagRun(CollectiveRun):
    """Runs any transfer DAG: a transfer starts when its predecessors are done and both ranks joined."""

    def __init__(self, world, dag: DAG, gpus: list[int], channels: int | None = None, protocol: str = "Simple",
                 launch_s: float = 0.0):
        n = dag.n
        p = len(gpus)
        super().__init__(world, gpus, channels, n, float(dag.size.sum()) if n else 0.0, protocol, launch_s)
        self._lat = dag.lat().tolist()
        self._delay = dag.delay().tolist()
        order = np.argsort(dag.edge_from, kind="stable")
        succ_idx = dag.edge_to[order]
        ptr = np.concatenate([[0], np.cumsum(np.bincount(dag.edge_from, minlength=n))]).astype(np.int64)
        self._succ = [succ_idx[ptr[t] : ptr[t + 1]].tolist() for t in range(n)]
        self._ndeps = np.bincount(dag.edge_to, minlength=n).tolist() if n else []
        self._src = dag.src.tolist()
        self._dst = dag.dst.tolist()
        self._size = dag.size.tolist()
        self._left = (np.bincount(dag.src, minlength=p) + np.bincount(dag.dst, minlength=p)).tolist() if n else [0] * p
        self._ready: list[int] | None = [t for t in range(n) if self._ndeps[t] == 0]

    def _on_join(self, i: int) -> None:
        if self._left[i] == 0:
            self._rank_done(i)
        if self._ready is not None:
            ready, self._ready = self._ready, None
            for t in ready:
                self._try_start(t)
        waiting, self._waiting[i] = self._waiting[i], []
        for t in waiting:
            self._try_start(t)

    def _try_start(self, t: int) -> None:
        a, b = self._src[t], self._dst[t]
        if not self.joined[a]:
            self._waiting[a].append(t)
        elif not self.joined[b]:
            self._waiting[b].append(t)
        else:
            self._send(a, b, self._size[t], t, self._lat[t], self._delay[t])

    def transfer_done(self, t: int) -> None:
        a, b = self._src[t], self._dst[t]
        left = self._left
        left[a] -= 1
        if left[a] == 0 and self.joined[a]:
            self._rank_done(a)
        left[b] -= 1
        if left[b] == 0 and self.joined[b]:
            self._rank_done(b)
        ndeps = self._ndeps
        for s in self._succ[t]:
            ndeps[s] -= 1
            if ndeps[s] == 0:
                self._try_start(s)


class RingRun(CollectiveRun):
    """The ring of ``RingSpec``: rank i sends step k to i+1 once it received step k-1 from i-1 and
    i+1 has joined. Like NCCL's connections (NCCL_STEPS = 8 slots, src/include/device.h) a rank may
    have up to ``SLOTS`` sends in flight, so a slow hop's latency overlaps the data behind it instead
    of being paid again for every step; on equal links nothing changes (each step waits for its data)."""

    SLOTS = RING_SLOTS

    def __init__(self, world, spec: RingSpec, gpus: list[int], channels: int | None = None,
                 protocol: str = "Simple", launch_s: float = 0.0):
        super().__init__(world, gpus, channels, spec.n, spec.n * spec.chunk_bytes, protocol, launch_s)
        self.spec = spec
        p = len(gpus)
        self._sent = [0] * p
        self._recvd = [0] * p
        self._busy = [0] * p  # sends in flight

    def _on_join(self, i: int) -> None:
        p = self.p
        if p < 2 or self.spec.steps == 0:
            self._rank_done(i)
            return
        self._try(i)
        self._try((i - 1) % p)

    def _try(self, i: int) -> None:
        k = self._sent[i]
        if (
            self._busy[i] < self.SLOTS
            and k < self.spec.steps
            and self.joined[i]
            and self._recvd[i] >= k
            and self.joined[(i + 1) % self.p]
        ):
            self._busy[i] += 1
            self._sent[i] = k + 1
            self._send(i, (i + 1) % self.p, self.spec.chunk_bytes, i)

    def transfer_done(self, i: int) -> None:
        p = self.p
        j = (i + 1) % p
        self._busy[i] -= 1
        self._recvd[j] += 1
        steps = self.spec.steps
        if self._sent[i] == steps and self._recvd[i] == steps and not self._busy[i]:
            self._rank_done(i)
        elif self._sent[i] < steps:
            self._try(i)
        if self._recvd[j] == steps and self._sent[j] == steps and not self._busy[j]:
            self._rank_done(j)
        else:
            self._try(j)


class InNetworkRun(CollectiveRun):
    """Runs an ``InNetworkSpec``: once every rank has joined (the switch needs all contributions), each
    rank's upward and downward streams flow at once; a rank is done when both have arrived."""

    def __init__(self, world, spec: InNetworkSpec, gpus: list[int], channels: int | None = None,
                 protocol: str = "Simple", launch_s: float = 0.0):
        super().__init__(world, gpus, channels, spec.n, spec.p * (spec.up_bytes + spec.down_bytes), protocol,
                         launch_s)
        self.spec = spec
        self._n_joined = 0
        self._parts = [0] * self.p

    def _on_join(self, i: int) -> None:
        self._n_joined += 1
        if self._n_joined < self.p:
            return
        topo = self.world.topology
        scale = 1.0
        if self.spec.level == "nvlink":  # NVLS traffic reaches nvls_efficiency of the rate, not efficiency
            link = topo.intra_link
            scale = link.efficiency / link.nvls_efficiency if link.nvls_efficiency else 1.0
        for r in range(self.p):
            g = self.gpus[r]
            lat = IN_NETWORK_LATENCY_US[self.spec.level] * 1e-6  # NCCL's NVLS / CollNet hop latency
            if self.spec.level == "nvlink":
                ups = [((topo.gpu_up[g],), 1.0)]
                downs = [((topo.gpu_down[g],), 1.0)]
            else:
                node = topo.node_of(g)
                nics = self._group_nics[node]
                own = [n for n in topo.nics_of(g) if n in nics] or nics[:1]
                ups = [((topo.nic_up[node][n],), 1.0 / len(own)) for n in own]
                downs = [((topo.nic_down[node][n],), 1.0 / len(own)) for n in own]
            net = self.world.network
            net.transfer(ups, self.spec.up_bytes * self._wire * scale, lat, self, r)
            net.transfer(downs, self.spec.down_bytes * self._wire * scale, lat, self, r)

    def transfer_done(self, r: int) -> None:
        self._parts[r] += 1
        if self._parts[r] == 2:
            self._rank_done(r)


class PhasedRun(CollectiveRun):
    """Runs a ``PhasedSpec``: phase k+1 starts over all ranks once phase k has finished everywhere."""

    def __init__(self, world, spec: PhasedSpec, gpus: list[int], channels: int | None = None,
                 protocol: str = "Simple", launch_s: float = 0.0):
        super().__init__(world, gpus, channels, spec.n, 0.0, protocol, launch_s)
        self.spec = spec
        self._channels = channels
        self._phase = 0
        self._current = make_run(world, spec.phases[0], gpus, channels, protocol)
        self._current_done = world.env.all_of(self._current.done)
        self._current_done.callbacks.append(self._next)

    def _on_join(self, i: int) -> None:
        self._current.join(i)

    def _next(self, _e) -> None:
        self._phase += 1
        if self._phase == len(self.spec.phases):
            for i in range(self.p):
                self._rank_done(i)
            return
        run = make_run(self.world, self.spec.phases[self._phase], self.gpus, self._channels, self.protocol)
        self._current = run
        done = run.join_all()
        done.callbacks.append(self._next)

    def transfer_done(self, tag: int) -> None:  # pragma: no cover - phases own their transfers
        raise AssertionError("PhasedRun sends nothing itself")


def make_run(world, dag: Spec, gpus: list[int], channels: int | None = None, protocol: str = "Simple",
             launch_s: float = 0.0) -> CollectiveRun:
    if isinstance(dag, RingSpec):
        return RingRun(world, dag, gpus, channels, protocol, launch_s)
    if isinstance(dag, InNetworkSpec):
        return InNetworkRun(world, dag, gpus, channels, protocol, launch_s)
    if isinstance(dag, PhasedSpec):
        return PhasedRun(world, dag, gpus, channels, protocol, launch_s)
    return DagRun(world, dag, gpus, channels, protocol, launch_s)
