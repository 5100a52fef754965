"""Collective algorithms as transfer graphs: DAGs of point-to-point transfers between group ranks.

Each algorithm is a pure function building a DAG of transfers (``src``, ``dst``, ``size_bytes``; an
edge a→b means b may start only after a finished). ``sim.engine.collective_runs`` executes them over the
fluid network; ``sim.engine.collective_algorithms`` names them (the registry) and builds the one asked for.
Closed forms for the uncontended case are in ``sim.analytic``; tests hold the simulation to them.

Pipelined algorithms (chain, double binary tree) send in chunks; only a hop's first chunk waits the hop
latency, later chunks follow back to back (the latency of chunk c+1 overlaps the data of chunk c, as in
NCCL's slot pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.errors import ScenarioError


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


def ring(p: int, chunk_bytes: float, steps: int) -> DAG:
    """``steps`` ring steps; at step k rank i sends one chunk to i+1, after receiving step k-1 from i-1
    and once its own send of step k-1 is done (NCCL's connection puts its steps on the wire in turn: were
    they concurrent, a rank joining late would cost the ring more than its lateness). On the equal links
    of the rings a DAG builds (within a node, or between nodes) each step waits for its data anyway; the
    latency overlap over a slow hop is ``RingRun``'s. All-reduce: 2(p-1) steps of N/p; RS/AG: p-1 steps
    of N/p."""
    if p < 2 or steps == 0:
        return DAG.empty()
    i = np.tile(np.arange(p), steps)
    k = np.repeat(np.arange(steps), p)
    src, dst = i, (i + 1) % p
    t = k * p + i
    later = k >= 1
    tl, kl, il = t[later], k[later], i[later]
    edge_from = np.concatenate([(kl - 1) * p + (il - 1) % p, (kl - 1) * p + il])
    edge_to = np.concatenate([tl, tl])
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
    src: list[int] = []
    dst: list[int] = []
    size: list[float] = []
    edges: list[tuple[int, int]] = []
    lat: list[float] = []
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
    src: list[int] = []
    dst: list[int] = []
    size: list[float] = []
    edges: list[tuple[int, int]] = []
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
    src: list[int] = []
    dst: list[int] = []
    size: list[float] = []
    edges: list[tuple[int, int]] = []
    lat: list[float] = []
    delay: list[float] = []

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
    src: list[int] = []
    dst: list[int] = []
    size: list[float] = []
    edges: list[tuple[int, int]] = []
    lat: list[float] = []
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
