"""The collective-algorithm registry: for every collective op, algorithm name → builder of its transfers.

This is the one place algorithm names are defined: the scenario schema, the tuner and the executor
import them from here. A builder turns (ranks, size, ``BuildArgs``) into a ``Spec`` that
``sim.engine.collective_runs.make_run`` executes: a transfer ``DAG`` (``sim.engine.transfer_graphs``),
a ``RingSpec`` (a plain ring whose dependencies are arithmetic), an ``InNetworkSpec`` (switch
reductions: NVLS on the NVSwitch, SHARP in InfiniBand switches, which are not transfers between ranks)
or a ``PhasedSpec`` (phases with a barrier between them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.engine.transfer_graphs import (
    DAG,
    _union,
    all_to_all,
    binomial_broadcast,
    chain,
    double_binary_tree_all_reduce,
    hierarchical_all_reduce,
    parameter_server,
    reverse,
    ring,
    send_recv,
)
from sim.errors import ScenarioError
from sim.hardware.nccl import chunks_for


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


@dataclass(frozen=True)
class BuildArgs:
    """What some builders need besides ranks and size: the node layout (hierarchical, nvls), pipeline
    chunks (chain, tree; None: NCCL's chunking, ``nccl.chunks_for``), the parameter servers' shards,
    summation bandwidth and placement (dedicated servers are extra ranks p..p+S-1)."""

    ranks_by_node: list[list[int]]
    chunks: int | None = None
    servers: int = 1
    aggregate_Bps: float | None = None
    dedicated: bool = False


Builder = Callable[[int, float, BuildArgs], Spec]


def _same_per_node(rbn: list[list[int]]) -> None:
    if any(len(r) != len(rbn[0]) for r in rbn):
        raise ScenarioError("hierarchical all-reduce needs the same number of ranks on every node", "model.algorithm")


def _nvls(p: int, n: float, a: BuildArgs) -> Spec:
    if len(a.ranks_by_node) > 1:
        raise ScenarioError("nvls all-reduce runs inside one node; use ring, tree or hierarchical", "model.algorithm")
    return nvls_all_reduce(p, n)


def _sharp(p: int, n: float, a: BuildArgs) -> Spec:
    _same_per_node(a.ranks_by_node)
    return hierarchical_sharp_all_reduce(a.ranks_by_node, n)


def _ps(p: int, n: float, a: BuildArgs) -> Spec:
    return parameter_server(p, n, servers=a.servers, aggregate_Bps=a.aggregate_Bps, dedicated=a.dedicated)


def _rooted(rev: bool) -> dict[str, Builder]:
    """broadcast (rev=False) and reduce (its mirror image)."""
    def binomial(p: int, n: float, a: BuildArgs) -> Spec:
        d = binomial_broadcast(p, n)
        return reverse(d) if rev else d

    return {
        "chain": lambda p, n, a: chain(p, n, a.chunks or chunks_for(n), reverse=rev),
        "binomial": binomial,
        "ps": lambda p, n, a: parameter_server(p, n, push=rev, pull=not rev),  # one server, rank 0
    }


# op → algorithm → builder; the first algorithm of each op is its default. "ring": NCCL's ring; "tree":
# NCCL's pipelined double binary tree; "hierarchical": an intra-node phase around an inter-node one (needs
# whole nodes); "ps": parameter server; "nvls": the NVSwitch in-network all-reduce (one node);
# "hierarchical_sharp": hierarchical with its inter-node phase reduced in InfiniBand switches (SHARP);
# "chain": pipelined chain (NCCL's ring for rooted ops); "direct": every rank sends to its peers directly.
REGISTRY: dict[str, dict[str, Builder]] = {
    "all_reduce": {
        "ring": lambda p, n, a: RingSpec(p, n / p, 2 * (p - 1)),
        "tree": lambda p, n, a: double_binary_tree_all_reduce(p, n, a.chunks or chunks_for(n / 2)),
        "hierarchical": lambda p, n, a: hierarchical_all_reduce(a.ranks_by_node, n),
        "ps": _ps,
        "nvls": _nvls,
        "hierarchical_sharp": _sharp,
    },
    "reduce_scatter": {"ring": lambda p, n, a: RingSpec(p, n / p, p - 1)},
    "all_gather": {"ring": lambda p, n, a: RingSpec(p, n / p, p - 1)},
    "broadcast": _rooted(rev=False),
    "reduce": _rooted(rev=True),
    "all_to_all": {"direct": lambda p, n, a: all_to_all(p, n)},
    "send_recv": {"direct": lambda p, n, a: send_recv(p, n)},
}
COLLECTIVE_ALGORITHMS: dict[str, tuple[str, ...]] = {op: tuple(algs) for op, algs in REGISTRY.items()}
ALGORITHM_NAMES: tuple[str, ...] = ("auto", *dict.fromkeys(a for algs in REGISTRY.values() for a in algs))
# parallel.dp_algorithm: the data-parallel all-reduce's algorithm ("auto": the tuner chooses);
# "parameter_server" runs the registry's "ps".
DP_ALGORITHMS = ("auto", "ring", "tree", "hierarchical", "parameter_server")


def build(op: str, algorithm: str, p: int, size_bytes: float, *, ranks_by_node: list[list[int]] | None = None,
          chunks: int | None = None, servers: int = 1, aggregate_Bps: float | None = None,
          dedicated: bool = False) -> Spec:
    """The transfers of collective ``op`` with ``algorithm`` over p ranks of total size ``size_bytes``
    (the nccl-tests convention: N is the full buffer; for all-gather the gathered size)."""
    builder = REGISTRY.get(op, {}).get(algorithm)
    if builder is None:
        raise ScenarioError(
            f"{op} does not support algorithm {algorithm!r}; use one of {', '.join(COLLECTIVE_ALGORITHMS.get(op, ()))}",
            "model.algorithm",
        )
    if p < 2:
        return DAG.empty()
    args = BuildArgs(ranks_by_node or [list(range(p))], chunks, servers, aggregate_Bps, dedicated)
    return builder(p, size_bytes, args)
