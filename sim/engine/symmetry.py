"""Symmetry analysis: what a symmetric run (one simulated GPU per pipeline stage) must still simulate.

With ``symmetric=True`` the executor simulates data rank 0, tensor rank 0 of each stage; the other GPUs
mirror it. Their traffic still counts where it can slow the simulated GPUs down: this module finds the
links that can bind (their flows could together exceed them), the groups of mirrors whose collectives
share such links with a simulated group (they run alongside, ``mirror_groups``), the mirrored pipeline
sends that share a link (``p2p_mirrors``), and the collective kinds no other traffic can touch, whose
duration depends on their shape only (``cacheable``: simulated once and reused, exact).
"""

from __future__ import annotations

from sim.engine.algorithms import CommConfig, algorithm_pairs, group_shape
from sim.hardware.topology import Topology
from sim.parallel.layout import Layout

KINDS = ("tp", "dp", "ep", "edp", "cp")  # the collective kinds whose groups have mirrors at a stage


def node_period(nodes: list[int]) -> int | None:
    """q when a ring whose ranks sit on ``nodes`` (in ring order) visits its nodes in turn with q ranks on
    each (1 when all share one node), else None."""
    p = len(nodes)
    if len(set(nodes)) == 1:
        return 1
    blocks = [nodes[0]]  # the nodes in ring order, one entry per run of consecutive ranks on one node
    for n in nodes[1:]:
        if n != blocks[-1]:
            blocks.append(n)
    q = p // len(blocks)
    if len(set(blocks)) != len(blocks) or q * len(blocks) != p or any(nodes[i] != nodes[i - i % q] for i in range(p)):
        return None
    return q


class Symmetry:
    """The groups of every GPU and, in symmetric mode, the mirrored traffic to simulate."""

    def __init__(self, topology: Topology, layout: Layout, pp: int, comm: CommConfig, gpus: list[int],
                 symmetric: bool, ring_only: set[str] | None = None,
                 apart: frozenset[frozenset[str]] = frozenset(), ring_routes: set[str] | None = None):
        self.topology = topology
        self.layout = layout
        self.pp = pp
        self.comm = comm
        self.gpus = gpus
        self.symmetric = symmetric
        # Kinds ("tp", "dp") whose collectives all run as rings. When both do, every collective is gated
        # step by step and g's mirrors on its own node carry the traffic its rings meet, so the peers'
        # groups on the other kind's links (needed for trees and servers) are not added. Not a proof of
        # exactness: identical to the full simulation on the small layouts tested (tests/
        # test_training_sim.py), within 0.2 % of the step on the 175B plan winner's layout (README).
        self.ring_only = ring_only or set()
        # Pairs of kinds whose traffic never runs at the same time (``TrainingExecutor._apart_kinds``: e.g.
        # TP and DP when every DP collective waits for the end of the backward pass): sharing a link with
        # each other does not stop a kind's collectives being simulated once and reused (``cacheable``).
        self.apart = apart
        # Kinds whose collectives that move data all run as rings (``TrainingExecutor._ring_route_kinds``):
        # their groups' flows are those of ring neighbours only, not every pair another algorithm could use.
        # (Latency-bound ones, such as the 4-byte gradient-norm all-reduce, load no link enough to matter.)
        self.ring_routes = ring_routes or set()
        self._link_cache: dict[tuple, set[int]] = {}
        self._route_cache: dict[tuple, list[tuple[int, ...]]] = {}
        self._group_cache: dict[tuple[int, str], tuple[int, ...]] = {}
        self._stage_cache: dict[int, list[int]] = {}
        self._mirrors: dict[tuple, list] = {}
        self._period: dict[tuple[int, str], int | None] = {}
        self.binding: set[int] = self._binding_links() | self._fabric_binding() if symmetric else set()
        # A leaf or pod link can bind: then the mirrors whose traffic meets g's are on any node of its stage,
        # not only on its own (``candidates``).
        self.fabric_binds = bool(self.binding & set(topology.fabric_links))
        self.cacheable: set[str] = self._cacheable_kinds()

    def _group_routes(self, group: list[int], kind: str) -> list[tuple[int, ...]]:
        """Routes the collectives of ``kind`` over ``group`` may use (every channel's NIC choice included):
        ring neighbours, and unless the kind runs rings only (``ring_routes``) the pairs of every other
        algorithm the scenario allows (a superset keeps the symmetry analysis exact). Computed once per
        group."""
        rings = kind in self.ring_routes
        key = (tuple(group), rings)
        routes = self._route_cache.get(key)
        if routes is None:
            routes = self._route_cache[key] = self._find_group_routes(group, rings)
        return routes

    def _find_group_routes(self, group: list[int], rings: bool = False) -> list[tuple[int, ...]]:
        topo = self.topology
        servers = list(self.comm.server_gpus) if self.comm.dp_algorithm == "parameter_server" else []
        members = group + servers
        nics = topo.group_nics(members)
        channels = max((len(v) for v in nics.values()), default=1)
        routes: list[tuple[int, ...]] = []
        by_node = [list(r) for r in group_shape(topo, group).ranks_by_node]
        p = len(group)
        pairs = (sorted({(i, (i + 1) % p) for i in range(p)}) if rings
                 else sorted(algorithm_pairs(p, by_node, self.comm, len(servers))))
        node = [topo.node_of(x) for x in members]
        for ia, ib in pairs:
            a, b = members[ia], members[ib]
            if a == b:
                continue
            na, nb = node[ia], node[ib]
            if na == nb:
                routes.append(topo.route_links(a, b))
            else:
                nics_a, nics_b = nics[na], nics[nb]
                for c in range(channels):
                    routes.append(topo.route_links(a, b, nics_a[c % len(nics_a)], nics_b[c % len(nics_b)]))
        return routes

    def _routes(self, ranks, kinds: tuple[str, ...]):
        """The route of every flow the traffic of ``ranks`` may start: their groups' collectives of ``kinds``
        (each group once, every algorithm's pairs and channels) and their pipeline sends to both neighbours."""
        lay, topo = self.layout, self.topology
        groups: set[tuple] = set()
        for x in ranks:
            for kind in kinds:
                grp = self.group(x, kind)
                if len(grp) > 1 and (kind, tuple(grp)) not in groups:
                    groups.add((kind, tuple(grp)))
                    yield from self._group_routes(grp, kind)
            stage = lay.coords(x)[2]
            for s2 in (stage - 1, stage + 1):
                if 0 <= s2 < self.pp:
                    yield topo.route_links(x, lay.stage_peer(x, s2))

    def _binding_links(self) -> set[int]:
        """Links that could limit some flow: those whose capacity is below the sum of the top speeds
        (route bottlenecks) of every flow that could ever cross them. Sharing any other link changes
        nobody's rate, so the symmetry analysis ignores it (e.g. a non-oversubscribed spine). The leaf and
        pod links are decided over every rank's traffic instead (``_fabric_binding``)."""
        topo = self.topology
        cap: list[float] = topo.capacity_Bps.tolist()
        fabric = set(topo.fabric_links)
        demand: dict[int, float] = {}
        for r in self._routes([x for g in self.gpus for x in (g, *self.same_place(g))], KINDS):
            top = min(cap[link] for link in r)
            for link in r:
                if link not in fabric:
                    demand[link] = demand.get(link, 0.0) + top
        return {link for link, d in demand.items() if d > cap[link] * (1 + 1e-9)}

    def _fabric_binding(self) -> set[int]:
        """Leaf and pod links of an oversubscribed tree that the whole job's traffic could fill. Every rank
        counts here, not only the representatives: in a symmetric run the GPUs of other nodes under the same
        leaf are mirrors, and their sends share its uplink. A flow moves no faster than its route's narrowest
        link; all flows leaving one first link (a NIC) share it, as do all flows entering one last link. So
        each source's demand on a link is capped at the source's capacity and each destination's at its own,
        and a link above the smaller of the two summed demands can never be full (the bound is sound).
        Without oversubscription neither a leaf's or pod's uplink (its sources are its NICs) nor its downlink
        (its destinations are) can be, so nothing is enumerated."""
        topo = self.topology
        if not (self.symmetric and topo.oversubscribed):
            return set()
        fabric = set(topo.fabric_links)
        cap: list[float] = topo.capacity_Bps.tolist()
        by_src: dict[int, dict[int, float]] = {}  # fabric link -> first link of a route -> summed top speeds
        by_dst: dict[int, dict[int, float]] = {}  # fabric link -> last link of a route -> summed top speeds
        # The model-parallel group ("mp") carries only 4-byte all-reduces (gradient norm, found-inf): latency,
        # no load on any link, so its tree edges are not counted.
        kinds = (*KINDS, "emb") if self.pp > 1 else KINDS
        for route in self._routes(range(self.layout.world_size), kinds):
            hit = fabric.intersection(route)
            if hit:
                top = min(cap[link] for link in route)
                for link in hit:
                    for per, end in ((by_src.setdefault(link, {}), route[0]), (by_dst.setdefault(link, {}), route[-1])):
                        per[end] = per.get(end, 0.0) + top

        def bound(per: dict[int, float]) -> float:
            return sum(min(cap[end], d) for end, d in per.items())

        return {link for link in by_src if min(bound(by_src[link]), bound(by_dst[link])) > cap[link] * (1 + 1e-9)}

    def candidates(self, g: int) -> list[int]:
        """The ranks whose mirrored traffic may share g's binding links: the GPUs of g's node at its stage
        (``same_place``), or every other rank of its stage when a leaf or pod link can bind."""
        if not self.fabric_binds:
            return self.same_place(g)
        return [x for x in self._stage_ranks(self.layout.coords(g)[2]) if x != g]

    def cross_stage_mirrors(self, g: int, kind: str) -> list[list[int]]:
        """The mirrors' groups to run beside g's own cross-stage collective ("emb", "mp"): those of g's
        node at its stage, and with a binding leaf or pod link those of its stage whose links meet g's."""
        key = (g, "cross", kind)
        out = self._mirrors.get(key)
        if out is None:
            mine = self.group(g, kind)
            seen, out = {tuple(mine)}, []
            links = self._links_of(mine, kind) if self.fabric_binds else None
            for x in self.candidates(g):
                grp = self.group(x, kind)
                if tuple(grp) in seen or (links is not None and not self._links_of(grp, kind) & links):
                    continue
                seen.add(tuple(grp))
                out.append(grp)
            self._mirrors[key] = out
        return out

    def _group_links(self, group: list[int], kind: str) -> set[int]:
        """The binding links the collectives of ``kind`` over ``group`` may cross."""
        return {link for r in self._group_routes(group, kind) for link in r} & self.binding

    def _cacheable_kinds(self) -> set[str]:
        """Collective kinds whose links no other traffic of the job can touch while they run (symmetric mode
        only): none shares them, or only kinds that run at other times (``apart``).

        Such a collective always runs on otherwise idle links, so its duration depends only on its
        shape: simulate it once, then reuse the measured duration (exact, and much faster)."""
        if not self.symmetric:
            return set()
        lay = self.layout
        users: dict[int, set[tuple]] = {}

        def use(links: set[int], owner: tuple) -> None:
            for link in links:
                users.setdefault(link, set()).add(owner)

        for g in self.gpus:
            _, _, stage = lay.coords(g)
            for kind in KINDS:
                grp = self.group(g, kind)
                if len(grp) > 1:
                    use(self._links_of(grp, kind), (kind, tuple(grp)))
                for m in self.mirror_groups(g, kind):
                    use(self._links_of(m, kind), (kind, tuple(m)))
            for s2 in (stage - 1, stage + 1):
                if 0 <= s2 < self.pp:
                    for a, b in [(g, lay.stage_peer(g, s2)), *self.p2p_mirrors(g, s2)]:
                        use(set(self.topology.route_links(a, b)) & self.binding, ("pp", a))
        shared = {o[0] for owners in users.values() if len(owners) > 1 for o in owners
                  if any(o2 != o and frozenset((o[0], o2[0])) not in self.apart for o2 in owners)}
        return {k for k in KINDS if k not in shared}

    def group(self, g: int, kind: str) -> list[int]:
        key = (g, kind)
        grp = self._group_cache.get(key)
        if grp is None:
            grp = self._group_cache[key] = tuple(self._find_group(g, kind))
        return list(grp)

    def _find_group(self, g: int, kind: str) -> list[int]:
        lay = self.layout
        if kind == "emb":  # first and last pipeline stage of g's (data, tensor) coordinates
            d, t, _ = lay.coords(g)
            return [lay.rank(d, t, 0), lay.rank(d, t, self.pp - 1)]
        if kind in ("ep", "edp", "cp"):  # MoE all-to-all, expert-gradient sync; context-parallel K/V
            if (lay.cp if kind == "cp" else lay.ep) == 1:
                return [g]  # not used by this job (dense, or no context parallelism)
            return lay.ep_group(g) if kind == "ep" else lay.edp_group(g) if kind == "edp" else lay.cp_group(g)
        return lay.tp_group(g) if kind == "tp" else lay.dp_group(g) if kind == "dp" else lay.mp_group(g)

    def _links_of(self, group: list[int], kind: str) -> set[int]:
        key = (tuple(group), kind in self.ring_routes)
        links = self._link_cache.get(key)
        if links is None:
            links = self._link_cache[key] = self._group_links(group, kind)
        return links

    def same_place(self, g: int) -> list[int]:
        """The other GPUs on g's node at g's pipeline stage: in symmetric mode they mirror g."""
        topo, lay = self.topology, self.layout
        node, stage = topo.node_of(g), lay.coords(g)[2]
        first = node * topo.gpus_per_node
        return [x for x in range(first, first + topo.gpus_per_node)
                if x != g and x < lay.world_size and lay.coords(x)[2] == stage]

    def mirror_groups(self, g: int, kind: str) -> list[list[int]]:
        """Groups of g's mirrors whose collectives share links with g's own (symmetric mode): they run
        the same collective at the same time, so their traffic must be simulated too."""
        key = (g, kind)
        out = self._mirrors.get(key)
        if out is None:
            mine = self.group(g, kind)
            out = []
            if len(mine) > 1:
                links = self._links_of(mine, kind)
                seen = {tuple(mine)}
                for x in self.candidates(g):
                    grp = self.group(x, kind)
                    if tuple(grp) not in seen and self._links_of(grp, kind) & links:
                        seen.add(tuple(grp))
                        out.append(grp)
                # Groups crossing the links of g's other collective (e.g. the TP pairs of g's DP peers
                # on the DP tree's links): a tree or a server is not gated step by step like a ring,
                # so the peers' own traffic must be there, not only g's.
                other_kind = "dp" if kind == "tp" else "tp"
                other = self.group(g, other_kind)
                rings = {"tp", "dp"} <= self.ring_only  # both rings: each is gated by its own mirrors
                if kind in ("tp", "dp") and len(other) > 1 and not rings:
                    other_links = self._links_of(other, other_kind)
                    covered = set(mine)  # ranks whose group was looked at (groups of a kind partition the ranks)
                    for x in self._stage_ranks(self.layout.coords(g)[2]):
                        if x in covered:
                            continue
                        grp = self.group(x, kind)
                        covered.update(grp)
                        if tuple(grp) not in seen and self._links_of(grp, kind) & other_links:
                            seen.add(tuple(grp))
                            out.append(grp)
            self._mirrors[key] = out
        return out

    def ring_period(self, g: int, kind: str) -> int | None:
        """The period q onto which the rings over g's ``kind`` group and over its mirror groups fold
        (``FoldedRingRun``), or None. In a symmetric run, groups of g's mirrors (one stage), each visiting its
        nodes in turn with q ranks on each (q = 1: every hop between nodes, or all inside one node), so that
        every node's q − 1 hops inside it and its hop out are alike, each with ranks on g's node (where the
        folded ring runs), every node giving a group as many NICs, and no leaf or pod link that can bind."""
        if not self.symmetric or kind not in KINDS:
            return None
        key = (g, kind)
        if key not in self._period:
            self._period[key] = self._find_ring_period(g, kind)
        return self._period[key]

    def block_start(self, group: list[int], g: int) -> int:
        """Index in ``group`` of its first rank on g's node: where a folded ring runs (``ring_period``)."""
        node = self.topology.node_of(g)
        return next(i for i, x in enumerate(group) if self.topology.node_of(x) == node)

    def _find_ring_period(self, g: int, kind: str) -> int | None:
        mine = self.group(g, kind)
        if len(mine) < 2 or self.fabric_binds:
            return None
        node = self.topology.node_of(g)
        groups = [mine, *self.mirror_groups(g, kind)]
        if not all(any(self.topology.node_of(x) == node for x in grp) for grp in groups):
            return None
        periods = {self._period_of(grp) for grp in groups}
        return periods.pop() if len(periods) == 1 else None

    def _period_of(self, grp: list[int]) -> int | None:
        """q when ``grp`` visits its nodes in turn, q ranks on each, with as many NICs on each; else None."""
        topo = self.topology
        q = node_period([topo.node_of(x) for x in grp])
        if q is None or len({len(v) for v in topo.group_nics(grp).values()}) != 1:
            return None
        return q

    def _stage_ranks(self, stage: int) -> list[int]:
        """Every rank of pipeline stage ``stage``, in rank order."""
        ranks = self._stage_cache.get(stage)
        if ranks is None:
            lay = self.layout
            ranks = self._stage_cache[stage] = sorted(lay.rank(d, t, stage) for d in range(lay.dp)
                                                      for t in range(lay.tp))
        return ranks

    def p2p_mirrors(self, g: int, dst_stage: int) -> list[tuple[int, int]]:
        """Pipeline sends of g's mirrors that share a link with g's own send to ``dst_stage``."""
        key = (g, "pp", dst_stage)
        out = self._mirrors.get(key)
        if out is None:
            topo, lay = self.topology, self.layout
            links = set(topo.route(g, lay.stage_peer(g, dst_stage)).links) & self.binding
            out = [(x, lay.stage_peer(x, dst_stage)) for x in self.candidates(g)
                   if links & set(topo.route(x, lay.stage_peer(x, dst_stage)).links)]
            self._mirrors[key] = out
        return out
