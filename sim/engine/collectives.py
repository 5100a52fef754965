"""Collectives as step-by-step transfer graphs, run over the fluid network.

Each algorithm is a pure function building a DAG of point-to-point transfers between group ranks
(``src``, ``dst``, ``size_bytes``; an edge a→b means b may start only after a finished). A
``CollectiveRun`` executes the DAG: a transfer starts once its predecessors are done and both of its
ranks have joined the collective (NCCL's rendezvous), so a late rank delays everyone who needs it.
Closed forms for the uncontended case are in ``sim.analytic``; tests hold the simulation to them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy

from sim.errors import ScenarioError

# Which algorithms each collective supports; the first is the default.
ALGORITHMS = {
    "all_reduce": ("ring", "tree", "hierarchical", "ps"),
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

    @property
    def n(self) -> int:
        return len(self.src)

    @staticmethod
    def empty() -> DAG:
        z = np.zeros(0, dtype=np.int64)
        return DAG(z, z, np.zeros(0), z, z)

    @staticmethod
    def from_lists(src: list[int], dst: list[int], size: list[float], edges: list[tuple[int, int]]) -> DAG:
        e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        return DAG(
            np.asarray(src, dtype=np.int64),
            np.asarray(dst, dtype=np.int64),
            np.asarray(size, dtype=float),
            e[:, 0].copy(),
            e[:, 1].copy(),
        )


def _union(dags: list[DAG], rank_maps: list[np.ndarray]) -> DAG:
    """Disjoint union of DAGs whose local ranks map to group ranks through ``rank_maps``."""
    srcs, dsts, sizes, efs, ets = [], [], [], [], []
    off = 0
    for d, m in zip(dags, rank_maps, strict=True):
        srcs.append(m[d.src])
        dsts.append(m[d.dst])
        sizes.append(d.size)
        efs.append(d.edge_from + off)
        ets.append(d.edge_to + off)
        off += d.n
    if not dags:
        return DAG.empty()
    return DAG(*(np.concatenate(x) if x else np.zeros(0) for x in (srcs, dsts, sizes, efs, ets)))


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
    )


# ---- algorithms (pure) ----------------------------------------------------------------------------
def ring(p: int, chunk_bytes: float, steps: int) -> DAG:
    """``steps`` ring steps; at step k rank i sends one chunk to i+1, after receiving step k-1 from i-1
    and finishing its own step k-1 send. All-reduce: 2(p-1) steps of N/p; RS/AG: p-1 steps of N/p."""
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
    (… → root+1 → root). Time (p-1+k-1)(α + N/(kB))."""
    if p < 2:
        return DAG.empty()
    order = [(root + j) % p for j in range(p)]
    if reverse:
        order = order[::-1]
    src, dst, size, edges = [], [], [], []
    idx = {}
    c_bytes = size_bytes / chunks
    for c in range(chunks):
        for j in range(p - 1):
            idx[(c, j)] = len(src)
            src.append(order[j])
            dst.append(order[j + 1])
            size.append(c_bytes)
            if j > 0:
                edges.append((idx[(c, j - 1)], idx[(c, j)]))
            if c > 0:
                edges.append((idx[(c - 1, j)], idx[(c, j)]))
    return DAG.from_lists(src, dst, size, edges)


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
        d.dst[::-1].copy(), d.src[::-1].copy(), d.size[::-1].copy(), (n - 1) - d.edge_to, (n - 1) - d.edge_from
    )


def parameter_server(p: int, size_bytes: float, root: int = 0, push: bool = True, pull: bool = True) -> DAG:
    """Every worker pushes its gradients to the root; once all arrived, the root sends the update back.
    The root's links are shared by p-1 flows: 2(α + (p-1)N/B) for push + pull."""
    workers = [r for r in range(p) if r != root]
    src, dst, size, edges = [], [], [], []
    if push:
        for w in workers:
            src.append(w)
            dst.append(root)
            size.append(size_bytes)
    n_push = len(src)
    if pull:
        for w in workers:
            t = len(src)
            src.append(root)
            dst.append(w)
            size.append(size_bytes)
            edges.extend((a, t) for a in range(n_push))
    return DAG.from_lists(src, dst, size, edges)


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
    per local index, in parallel) → intra-node ring all-gather. Ranks are group indices."""
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


def build(op: str, algorithm: str, p: int, size_bytes: float, *, ranks_by_node: list[list[int]] | None = None,
          chunks: int = 1) -> DAG | RingSpec:
    """The DAG for collective ``op`` with ``algorithm`` over p ranks of total size ``size_bytes`` (the
    nccl-tests convention: N is the full buffer; for all-gather the gathered size)."""
    if algorithm not in ALGORITHMS.get(op, ()):
        raise ScenarioError(
            f"{op} does not support algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS.get(op, ()))}",
            "model.algorithm",
        )
    if p < 2:
        return DAG.empty()
    if op == "all_reduce":
        if algorithm == "ring":
            return RingSpec(p, size_bytes / p, 2 * (p - 1))
        if algorithm == "tree":
            red = reverse(binomial_broadcast(p, size_bytes))
            return _sequence(red, binomial_broadcast(p, size_bytes), p)
        if algorithm == "hierarchical":
            return hierarchical_all_reduce(ranks_by_node or [list(range(p))], size_bytes)
        return parameter_server(p, size_bytes)
    if op in ("reduce_scatter", "all_gather"):
        return RingSpec(p, size_bytes / p, p - 1)
    if op in ("broadcast", "reduce"):
        rev = op == "reduce"
        if algorithm == "chain":
            return chain(p, size_bytes, chunks, reverse=rev)
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

    def __init__(self, world, gpus: list[int], channels: int | None, n_transfers: int, bytes_sent: float):
        self.world = world
        self.gpus = gpus
        p = len(gpus)
        self.p = p
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
        """Rank i (group index) arrives; returns the event of its part completing."""
        if self.start_s is None:
            self.start_s = self.world.env.now
        self.joined[i] = True
        self._on_join(i)
        return self.done[i]

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

    def _send(self, a: int, b: int, size: float, tag: int) -> None:
        routes, latency = self._route(a, b)
        self.world.network.transfer(routes, size, latency, self, tag)

    def _route(self, a: int, b: int) -> tuple[list, float]:
        key = (a, b)
        r = self._routes.get(key)
        if r is None:
            topo = self.world.topology
            ga, gb = self.gpus[a], self.gpus[b]
            na, nb = topo.node_of(ga), topo.node_of(gb)
            if na == nb or self.channels == 1:
                rt = topo.route(ga, gb)
                r = ([(rt.links, 1.0)], rt.latency_s)
            else:
                nics_a, nics_b = self._group_nics[na], self._group_nics[nb]
                share: dict[tuple[int, ...], float] = {}
                lat = 0.0
                for c in range(self.channels):
                    rt = topo.route(ga, gb, nics_a[c % len(nics_a)], nics_b[c % len(nics_b)])
                    share[rt.links] = share.get(rt.links, 0.0) + 1.0 / self.channels
                    lat = rt.latency_s
                r = (list(share.items()), lat)
            self._routes[key] = r
        return r

    def transfer_done(self, tag: int) -> None:
        raise NotImplementedError


class DagRun(CollectiveRun):
    """Runs any transfer DAG: a transfer starts when its predecessors are done and both ranks joined."""

    def __init__(self, world, dag: DAG, gpus: list[int], channels: int | None = None):
        n = dag.n
        p = len(gpus)
        super().__init__(world, gpus, channels, n, float(dag.size.sum()) if n else 0.0)
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
            self._send(a, b, self._size[t], t)

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
    """The ring of ``RingSpec``: rank i sends step k to i+1 once it received step k-1 from i-1 and its
    own step k-1 send finished, and once i+1 has joined."""

    def __init__(self, world, spec: RingSpec, gpus: list[int], channels: int | None = None):
        super().__init__(world, gpus, channels, spec.n, spec.n * spec.chunk_bytes)
        self.spec = spec
        p = len(gpus)
        self._sent = [0] * p
        self._recvd = [0] * p
        self._busy = [False] * p

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
            not self._busy[i]
            and k < self.spec.steps
            and self.joined[i]
            and self._recvd[i] >= k
            and self.joined[(i + 1) % self.p]
        ):
            self._busy[i] = True
            self._sent[i] = k + 1
            self._send(i, (i + 1) % self.p, self.spec.chunk_bytes, i)

    def transfer_done(self, i: int) -> None:
        p = self.p
        j = (i + 1) % p
        self._busy[i] = False
        self._recvd[j] += 1
        steps = self.spec.steps
        if self._sent[i] == steps and self._recvd[i] == steps:
            self._rank_done(i)
        elif self._sent[i] < steps:
            self._try(i)
        if self._recvd[j] == steps and self._sent[j] == steps and not self._busy[j]:
            self._rank_done(j)
        else:
            self._try(j)


def make_run(world, dag: DAG | RingSpec, gpus: list[int], channels: int | None = None) -> CollectiveRun:
    if isinstance(dag, RingSpec):
        return RingRun(world, dag, gpus, channels)
    return DagRun(world, dag, gpus, channels)
