"""How much an oversubscribed tree slows one kind of traffic when every group of that kind runs at once.

The planner's screen prices a collective on idle links (``sim.engine.algorithms.predict_s``), one group at a
time. On a fat tree whose leaf (or pod) uplinks carry less than the NICs under them can send, the groups of a
layout share those uplinks: a data-parallel all-reduce whose ring crosses leaves competes with every other
data-parallel ring of the job, and the simulation (which routes every flow over the tree) shows it. This
module gives the screen that sharing as one factor per kind of traffic: the group's inter-node bandwidth is
divided by it.

The load model is the simulation's own routing (``Topology.route_links``) applied to the traffic pattern of
a ring: each group visits its nodes in rank order, and every node-to-node edge (the wrap-around included)
carries one flow per channel, on the group's NICs of the two nodes (as ``sim.engine.symmetry`` enumerates
them); a pipeline pair is a ring of two, so both directions (forward activations, backward gradients) run
together, as in 1F1B's steady state. Every flow asks for its NICs' speed (what the screen prices it at on
idle links). A link's demand is
bounded the way the symmetric simulation bounds it (``Symmetry._fabric_binding``): the flows leaving one NIC
share that NIC, as do those entering one, so the demand is capped per first and per last link. A group's
factor is the largest demand / capacity over the leaf and pod links its flows cross (at least 1), and a kind's
is that of its slowest group: the step waits for it.

Assumed, and stated so: every group of the kind communicates at the same time (the gradient syncs of all
stages at the step's end, the pipeline's sends in its steady state), and a double binary tree or a
hierarchical all-reduce loads the uplinks as a ring does. Both make the factor an upper bound in a pipeline
whose stages finish their backward apart; the planner simulates its best candidates anyway, so the factor only
decides which of them it simulates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sim.hardware.topology import Topology
from sim.parallel.layout import Layout
from sim.scenario.schema import Scenario

KINDS = ("dp", "pp", "tp", "emb")


def tree_oversubscribed(scenario: Scenario) -> bool:
    """Whether the scenario's cluster is a tree with more than one leaf whose leaf or pod uplinks carry less
    than the NICs below them (then where a layout's groups sit decides what they share: ``fabric_share``)."""
    c = scenario.cluster
    t = c.topology
    return (t.kind != "single-switch" and c.nodes > t.nodes_per_leaf
            and (t.oversubscription > 1 or t.pod_oversubscription > 1))


def layout_groups(lay: Layout, kind: str) -> list[list[int]]:
    """Every group of ``kind`` in the layout: data-parallel, tensor-parallel, pipeline neighbours (one pair
    per stage boundary) or the tied embedding's first/last-stage pairs."""
    r = lay.rank
    if kind == "dp":
        return [[r(d, t, p) for d in range(lay.dp)] for p in range(lay.pp) for t in range(lay.tp)]
    if kind == "tp":
        return [[r(d, t, p) for t in range(lay.tp)] for p in range(lay.pp) for d in range(lay.dp)]
    if kind == "pp":
        return [[r(d, t, p), r(d, t, p + 1)] for p in range(lay.pp - 1) for d in range(lay.dp) for t in range(lay.tp)]
    if kind == "emb":
        return [[r(d, t, 0), r(d, t, lay.pp - 1)] for d in range(lay.dp) for t in range(lay.tp)] if lay.pp > 1 else []
    raise ValueError(f"unknown traffic kind {kind!r} (one of {', '.join(KINDS)})")


def _ring_routes(topo: Topology, group: Sequence[int]) -> list[tuple[int, ...]]:
    """The inter-node routes of a ring over ``group``: its nodes in rank order, one flow per channel on
    each node-to-node edge (the wrap-around included; both directions for two nodes)."""
    first: dict[int, int] = {}  # node -> the group's first GPU there
    for g in group:
        first.setdefault(topo.node_of(g), g)
    nodes = list(first)
    if len(nodes) < 2:
        return []
    nics = topo.group_nics(list(group))
    channels = max(len(v) for v in nics.values())
    routes = []
    for i, a in enumerate(nodes):
        b = nodes[(i + 1) % len(nodes)]
        na, nb = nics[a], nics[b]
        for c in range(channels):
            routes.append(topo.route_links(first[a], first[b], na[c % len(na)], nb[c % len(nb)]))
    return routes


def fabric_share(topo: Topology, groups: Iterable[Sequence[int]]) -> float:
    """The factor (≥ 1) by which the leaf and pod links slow the slowest of ``groups`` when all of them
    communicate at once (see the module's docstring); 1 on a tree that is not oversubscribed."""
    if not topo.oversubscribed:
        return 1.0
    fabric = set(topo.fabric_links)
    cap: list[float] = topo.capacity_Bps.tolist()
    by_src: dict[int, dict[int, float]] = {}  # fabric link -> first link of a route -> summed top speeds
    by_dst: dict[int, dict[int, float]] = {}
    crossed: list[set[int]] = []  # per group, the fabric links its flows cross
    for group in groups:
        mine: set[int] = set()
        for route in _ring_routes(topo, group):
            hit = fabric.intersection(route)
            if not hit:
                continue
            top = min(cap[route[0]], cap[route[-1]])  # its NICs' speed: what it would move on idle links
            mine |= hit
            for link in hit:
                src, dst = by_src.setdefault(link, {}), by_dst.setdefault(link, {})
                src[route[0]] = src.get(route[0], 0.0) + top
                dst[route[-1]] = dst.get(route[-1], 0.0) + top
        crossed.append(mine)

    def bound(per: dict[int, float]) -> float:
        return sum(min(cap[end], d) for end, d in per.items())

    load = {link: min(bound(by_src[link]), bound(by_dst[link])) / cap[link] for link in by_src}
    return max([1.0, *(load[link] for links in crossed for link in links)])


def kind_shares(topo: Topology, lay: Layout, kinds: Iterable[str] = KINDS) -> dict[str, float]:
    """``fabric_share`` of each kind of traffic of the layout (1.0 where the tree is not oversubscribed)."""
    if not topo.oversubscribed:
        return {k: 1.0 for k in kinds}
    return {k: fabric_share(topo, layout_groups(lay, k)) for k in kinds}
