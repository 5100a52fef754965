"""Collective runs: one instance of a collective executing its transfers over the fluid network.

A run starts a transfer once its predecessors are done and both of its ranks have joined the collective
(NCCL's rendezvous), so a late rank delays everyone who needs it. ``DagRun`` runs any transfer DAG,
``RingRun`` a ring without building its DAG, ``FoldedRingRun`` a symmetric run's ring folded onto one
period of its hops, ``InNetworkRun`` a switch reduction, ``PhasedRun`` phases
with barriers between them; ``make_run`` picks the class for a ``Spec``.

NCCL's cost structure (``sim.hardware.nccl``): every run pays its algorithm's base (launch) latency once,
each hop the per-hop latency of the run's protocol (LL / LL128 / Simple) on that link class, and its
bytes go at the protocol's share of the link bandwidth.
"""

from __future__ import annotations

import numpy as np
import simpy

from sim.engine.collective_algorithms import InNetworkSpec, PhasedSpec, RingSpec, Spec
from sim.engine.transfer_graphs import DAG
from sim.hardware.nccl import IN_NETWORK_LATENCY_US, PROTOCOL_BW_FRACTION


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
    i+1 has joined.

    A connection puts its steps on the wire one after another (NCCL's connection is a FIFO of NCCL_STEPS
    = 8 slots, src/include/device.h), and a step's latency runs from the moment it is ready (its data
    received, both ranks joined), overlapping the steps ahead of it on the wire: a step issued when the
    wire frees pays only what is left of its latency (none once it waited a full latency). That is the
    exact arrival time of a FIFO wire with the latency after the data, so a slow hop's latency is paid
    once per pass, not per step, and a rank that joins late by δ delays the ring by δ, not more
    (concurrent sends sharing the wire would make the data of the step everyone waits for arrive later).
    On equal links nothing changes: each step waits for its data."""

    def __init__(self, world, spec: RingSpec, gpus: list[int], channels: int | None = None,
                 protocol: str = "Simple", launch_s: float = 0.0, positions: int | None = None):
        """``positions``: the ring positions run, each a sender with its own hop (all p; fewer when folded,
        ``FoldedRingRun``)."""
        super().__init__(world, gpus, channels, spec.n, spec.n * spec.chunk_bytes, protocol, launch_s)
        self.spec = spec
        p = len(gpus) if positions is None else positions
        self._steps = spec.steps
        self._wire_bytes = spec.chunk_bytes * self._wire  # what each send puts on the wire
        self._next = [(i + 1) % p for i in range(p)]
        self._hop: list[tuple[list, float] | None] = [None] * p  # rank i's routes to i+1, and latency
        self._sent = [0] * p
        self._recvd = [0] * p
        self._busy = [0] * p  # sends on the wire (at most one: the connection is a FIFO)
        self._recv_at: list[list[float]] = [[] for _ in range(p)]  # when rank i received each step
        self._joined_at = [0.0] * p

    def _on_join(self, i: int) -> None:
        p = self.p
        if p < 2 or self._steps == 0:
            self._rank_done(i)
            return
        self._joined_at[i] = self.world.env.now
        self._try(i)
        self._try((i - 1) % p)

    def _try(self, i: int) -> None:
        k = self._sent[i]
        j = self._next[i]
        if not (k < self._steps and self.joined[i] and self._recvd[i] >= k and self.joined[j]):
            return
        if self._busy[i]:  # the wire is busy: transfer_done tries again when it frees
            return
        self._busy[i] = 1
        self._sent[i] = k + 1
        hop = self._hop[i]
        if hop is None:
            hop = self._hop[i] = self._route(i, j)
        ready = max(self._joined_at[i], self._joined_at[j], self._recv_at[i][k - 1] if k else 0.0)
        latency = max(0.0, hop[1] - (self.world.env.now - ready))
        self.world.network.transfer(hop[0], self._wire_bytes, latency, self, i)

    def transfer_done(self, i: int) -> None:
        j = self._next[i]
        sent, recvd, busy = self._sent, self._recvd, self._busy
        busy[i] -= 1
        recvd[j] += 1
        self._recv_at[j].append(self.world.env.now)
        steps = self._steps
        # _try only when the rank has the data for its next send (most completions find it has not yet)
        if sent[i] == steps and recvd[i] == steps and not busy[i]:
            self._rank_done(i)
        elif sent[i] < steps and recvd[i] >= sent[i]:
            self._try(i)
        if recvd[j] == steps and sent[j] == steps and not busy[j]:
            self._rank_done(j)
        elif recvd[j] >= sent[j]:
            self._try(j)


class FoldedRingRun(RingRun):
    """The ring of ``RingSpec`` in a symmetric run, folded onto one period of its hops (``Symmetry.ring_period``).

    Every rank of the ring mirrors the representative and joins with it; the ring visits its nodes in turn,
    q ranks on each (q − 1 hops inside the node, then one to the next node), every node alike. By the
    symmetry rank i then moves step k when rank i mod q does, so ``RingRun`` over q virtual ranks, virtual
    hop j standing for hops j, j + q, j + 2q, …, runs the same steps with p/q times fewer transfers (q = 1
    when every hop is alike: one transfer per step).

    Virtual hop j runs where ``RingRun`` ran the hop leaving position j of the representative's node (the
    block of q ranks from ``block``), whose links carry the simulated traffic of that node. The hop out of
    the node also crosses the link by which the block's first rank receives (its NIC of that channel): every
    node's first rank receives from the node before, and meets its own traffic there, which is the
    representative's (``RingRun`` met it on the one hop into the representative's node; the other nodes'
    ran on idle links). This keeps per-micro-batch reduce-scatters over hundreds of ranks (ZeRO-2 and 3)
    cheap to simulate."""

    def __init__(self, world, spec: RingSpec, gpus: list[int], period: int, block: int = 0,
                 channels: int | None = None, protocol: str = "Simple", launch_s: float = 0.0):
        super().__init__(world, spec, gpus, channels, protocol, launch_s, positions=period)
        self._q = period
        self._block = block  # group index of the first rank on the representative's node (a multiple of q)
        self._n_joined = 0

    def _on_join(self, i: int) -> None:
        self._n_joined += 1
        if self._n_joined < self.p:
            return
        if self._steps == 0:
            for j in range(self._q):
                self._rank_done(j)
            return
        now = self.world.env.now
        for j in range(self._q):
            self._joined_at[j] = now
            self._hop[j] = self._folded_hop(j)
        for j in range(self._q):
            self._try(j)

    def _folded_hop(self, j: int) -> tuple[list, float]:
        """Routes (with their shares over the channels) and latency of virtual hop j: the hop from position j
        of the representative's node, and for the hop out of the node the link into the node's first rank."""
        topo = self.world.topology
        a, b = self.gpus[self._block + j], self.gpus[(self._block + j + 1) % self.p]
        first = self.gpus[self._block]  # the node's first rank: receives from the node before
        na, nb = topo.node_of(a), topo.node_of(b)
        if na == nb:
            rt = topo.route(a, b)
            links = rt.links
            if j == self._q - 1:  # a ring inside one node (q = 1): the hop into ``first`` is one more of them
                links = tuple(dict.fromkeys((*links, topo.gpu_down[first])))
            return [(links, 1.0)], self._hop_latency(rt)
        share: dict[tuple[int, ...], float] = {}
        latency = 0.0
        for c in range(self.channels):
            if self.channels == 1:  # as CollectiveRun._route: each GPU's own first NIC
                ia, ib, i_first = topo.nics_of(a)[0], topo.nics_of(b)[0], topo.nics_of(first)[0]
            else:
                nics_a, nics_b = self._group_nics[na], self._group_nics[nb]
                ia, ib, i_first = nics_a[c % len(nics_a)], nics_b[c % len(nics_b)], nics_a[c % len(nics_a)]
            rt = topo.route(a, b, ia, ib)
            links = tuple(dict.fromkeys((*rt.links, topo.nic_down[na][i_first])))
            share[links] = share.get(links, 0.0) + 1.0 / self.channels
            latency = self._hop_latency(rt)
        return list(share.items()), latency

    def _rank_done(self, j: int) -> None:
        """Virtual rank j is done: so is every rank j, j + q, j + 2q, … it stands for."""
        for r in range(j, self.p, self._q):
            super()._rank_done(r)


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
             launch_s: float = 0.0, fold: tuple[int, int] | None = None) -> CollectiveRun:
    """The run of ``dag``; ``fold`` (period, index in ``gpus`` of the first rank on the representative's node):
    a symmetric run's ring whose hops repeat every period ranks, folded onto one period (``FoldedRingRun``)."""
    if isinstance(dag, RingSpec):
        if fold is not None:
            return FoldedRingRun(world, dag, gpus, fold[0], fold[1], channels, protocol, launch_s)
        return RingRun(world, dag, gpus, channels, protocol, launch_s)
    if isinstance(dag, InNetworkSpec):
        return InNetworkRun(world, dag, gpus, channels, protocol, launch_s)
    if isinstance(dag, PhasedSpec):
        return PhasedRun(world, dag, gpus, channels, protocol, launch_s)
    return DagRun(world, dag, gpus, channels, protocol, launch_s)
