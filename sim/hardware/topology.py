"""Cluster topology: which directed links a byte crosses between two GPUs, and their capacities.

Model (one direction per link; each direction is its own link):
- inside a node, every GPU has an uplink to and a downlink from the node's switch (NVSwitch or a PCIe
  switch) at the intra-node link's bandwidth, so GPU-to-GPU traffic crosses ``gpu_up[a]`` then ``gpu_down[b]``;
- every node has ``nics_per_node`` NICs, each with an uplink to and a downlink from its leaf switch;
  GPU ``l`` of a node (local index) is attached to the NICs ``l*k .. l*k+k-1`` (k = NICs per GPU) or, with
  fewer NICs than GPUs, shares NIC ``l*nics//gpus`` with its neighbours (PCIe affinity as in DGX systems);
- a fat tree groups ``nodes_per_leaf`` nodes under one leaf; leaf-to-spine capacity is the leaf's NIC
  capacity divided by the oversubscription ratio, modelled as one aggregated link per direction (ECMP
  spreading flows evenly). A ``single-switch`` topology has no leaf-spine tier.
- a third tier (``nodes_per_pod``): the leaves of ``nodes_per_pod`` nodes form a pod under their spine,
  and pods meet at a core whose capacity per pod is what the pod's leaves send up divided by
  ``pod_oversubscription`` (again one aggregated link per direction). Traffic between leaves of one pod
  crosses its spine only; between pods it crosses the pod's link to the core as well. Large clusters are
  built so: Meta's 24K-GPU RoCE clusters for Llama 3 join 192 racks of 16 GPUs into pods of 3,072 at full
  bisection, and pods through aggregation switches at 1:7 (Llama 3 paper, arXiv:2407.21783, §3.3.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.hardware.links import LinkSpec


@dataclass(frozen=True)
class Route:
    links: tuple[int, ...]
    latency_s: float
    inter_node: bool


class Topology:
    """Link table plus routing. Link ids are dense ints; ``capacity_Bps[i]`` is link i's bandwidth."""

    def __init__(
        self,
        nodes: int,
        gpus_per_node: int,
        intra: LinkSpec,
        inter: LinkSpec,
        nics_per_node: int,
        kind: str = "fat-tree",
        oversubscription: float = 1.0,
        nodes_per_leaf: int = 16,
        nodes_per_pod: int | None = None,
        pod_oversubscription: float = 1.0,
        intra_override: tuple[float, float] | None = None,
        inter_override: tuple[float, float] | None = None,
    ):
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.nics_per_node = nics_per_node
        self.num_gpus = nodes * gpus_per_node
        self.intra_link, self.inter_link = intra, inter  # NCCL protocol latencies (sim.engine.collectives)
        intra_lat, intra_bw = intra_override or (intra.latency_s, intra.bandwidth_Bps)
        inter_lat, inter_bw = inter_override or (inter.latency_s, inter.bandwidth_Bps)
        self.intra_latency_s, self.intra_bw_Bps = intra_lat, intra_bw
        self.inter_latency_s, self.inter_bw_Bps = inter_lat, inter_bw

        caps: list[float] = []
        self.names: list[str] = []

        def add(name: str, cap: float) -> int:
            caps.append(cap)
            self.names.append(name)
            return len(caps) - 1

        g = self.num_gpus
        self.gpu_up = [add(f"gpu{i}->switch", intra_bw) for i in range(g)]
        self.gpu_down = [add(f"switch->gpu{i}", intra_bw) for i in range(g)]
        self.nic_up = [[add(f"node{n}/nic{j}->leaf", inter_bw) for j in range(nics_per_node)] for n in range(nodes)]
        self.nic_down = [
            [add(f"leaf->node{n}/nic{j}", inter_bw) for j in range(nics_per_node)] for n in range(nodes)
        ]
        self.nodes_per_leaf = nodes if kind == "single-switch" else max(1, min(nodes_per_leaf, nodes))
        self.leaves = -(-nodes // self.nodes_per_leaf)
        self.leaf_up: list[int] = []
        self.leaf_down: list[int] = []
        if self.leaves > 1:
            for leaf in range(self.leaves):
                n_in_leaf = min(self.nodes_per_leaf, nodes - leaf * self.nodes_per_leaf)
                cap = n_in_leaf * nics_per_node * inter_bw / oversubscription
                self.leaf_up.append(add(f"leaf{leaf}->spine", cap))
                self.leaf_down.append(add(f"spine->leaf{leaf}", cap))
        # Pods: whole leaves each (the scenario checks nodes_per_pod is a multiple of nodes_per_leaf).
        self.leaves_per_pod = self.leaves
        if nodes_per_pod is not None and self.leaves > 1:
            self.leaves_per_pod = max(1, min(nodes_per_pod, nodes) // self.nodes_per_leaf)
        self.pods = -(-self.leaves // self.leaves_per_pod)
        self.pod_up: list[int] = []
        self.pod_down: list[int] = []
        if self.pods > 1:
            pod_nodes = self.leaves_per_pod * self.nodes_per_leaf
            for pod in range(self.pods):
                n_in_pod = min(pod_nodes, nodes - pod * pod_nodes)
                cap = n_in_pod * nics_per_node * inter_bw / oversubscription / pod_oversubscription
                self.pod_up.append(add(f"pod{pod}->core", cap))
                self.pod_down.append(add(f"core->pod{pod}", cap))
        self.capacity_Bps = np.asarray(caps, dtype=float)
        # The links above the NICs (leaf↔spine, pod↔core), and whether any carries less than what sends into it
        # (then traffic from other nodes can fill it: ``sim.engine.symmetry``).
        self.fabric_links: tuple[int, ...] = (*self.leaf_up, *self.leaf_down, *self.pod_up, *self.pod_down)
        self.oversubscribed = bool(self.fabric_links) and (oversubscription > 1 or pod_oversubscription > 1)

    # ---- placement -------------------------------------------------------------------------------
    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def nics_of(self, gpu: int) -> list[int]:
        """NICs (local indices) attached to this GPU."""
        local = gpu % self.gpus_per_node
        k = self.nics_per_node // self.gpus_per_node
        if k >= 1:
            return list(range(local * k, local * k + k))
        return [local * self.nics_per_node // self.gpus_per_node]

    def group_nics(self, ranks: list[int]) -> dict[int, list[int]]:
        """Per node, the NICs owned by the group's members there (the rails a collective may use)."""
        out: dict[int, list[int]] = {}
        for r in ranks:
            lst = out.setdefault(self.node_of(r), [])
            for nic in self.nics_of(r):
                if nic not in lst:
                    lst.append(nic)
        return out

    # ---- routing ---------------------------------------------------------------------------------
    def route(self, src: int, dst: int, nic_src: int | None = None, nic_dst: int | None = None) -> Route:
        """Links crossed from GPU ``src`` to GPU ``dst``; NICs default to the GPUs' own first NIC."""
        na, nb = self.node_of(src), self.node_of(dst)
        if na == nb:
            return Route((self.gpu_up[src], self.gpu_down[dst]), self.intra_latency_s, False)
        return Route(self._inter_links(src, dst, na, nb, nic_src, nic_dst), self.inter_latency_s, True)

    def route_links(self, src: int, dst: int, nic_src: int | None = None, nic_dst: int | None = None
                    ) -> tuple[int, ...]:
        """The links of ``route(src, dst, nic_src, nic_dst)`` (without building the Route)."""
        na, nb = self.node_of(src), self.node_of(dst)
        if na == nb:
            return (self.gpu_up[src], self.gpu_down[dst])
        return self._inter_links(src, dst, na, nb, nic_src, nic_dst)

    def _inter_links(self, src: int, dst: int, na: int, nb: int, nic_src: int | None, nic_dst: int | None
                     ) -> tuple[int, ...]:
        """Links from GPU ``src`` on node ``na`` to GPU ``dst`` on another node ``nb``."""
        ia = self.nics_of(src)[0] if nic_src is None else nic_src
        ib = self.nics_of(dst)[0] if nic_dst is None else nic_dst
        la, lb = na // self.nodes_per_leaf, nb // self.nodes_per_leaf
        if la == lb or self.leaves == 1:
            return (self.nic_up[na][ia], self.nic_down[nb][ib])
        pa, pb = la // self.leaves_per_pod, lb // self.leaves_per_pod
        if pa == pb:
            return (self.nic_up[na][ia], self.leaf_up[la], self.leaf_down[lb], self.nic_down[nb][ib])
        return (self.nic_up[na][ia], self.leaf_up[la], self.pod_up[pa], self.pod_down[pb], self.leaf_down[lb],
                self.nic_down[nb][ib])
