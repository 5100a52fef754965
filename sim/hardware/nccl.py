"""NCCL's own performance model, as data: protocols, per-hop and per-collective latencies, chunking.

Every number below is read from NCCL's tuner, ``src/graph/tuning.cc`` (github.com/NVIDIA/nccl, master of
2026-06; the tables ``baseLatencies`` and ``hwLatencies`` and the protocol bandwidth factors in
``ncclTopoTuneModel``), or from NCCL's documented defaults. dtsim uses them the way NCCL does: a collective
pays a per-collective base (launch) latency once, then a per-hop latency on every step, and its bytes
travel at the link's bandwidth times the protocol's wire efficiency.

Protocols (NCCL's three):
- ``LL``: 8-byte stores of 4 B data + 4 B flag — lowest latency, half the bandwidth (tuning.cc: ring LL
  ``busBw * .5``).
- ``LL128``: 128-byte lines of 120 B data + 8 B flag (tuning.cc: ring LL128 ``busBw * 0.92 /*120.0/128.0*/``).
- ``Simple``: plain copies with a fence per chunk — full bandwidth, highest latency.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.units import US, KiB

PROTOCOLS = ("LL", "LL128", "Simple")

# Fraction of the link bandwidth a protocol's payload reaches (tuning.cc, ring: LL ×0.5, LL128 ×0.92).
PROTOCOL_BW_FRACTION = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}

# Per-hop latency (µs) by NCCL hardware class and protocol, ring rows of tuning.cc ``hwLatencies``:
# NVLINK {LL .6, LL128 1.9, Simple 3.4}, PCI {1.0, 2.5, 5.7}, NET {2.7, 4.0, 14.0}.
HW_LATENCY_US = {
    "nvlink": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
    "pcie": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
    "net": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
}

# Per-collective base latency (µs), tuning.cc ``baseLatencies``: Tree {6.8, 14.0, 8.4}, Ring {6.6, 14.0,
# 8.4}, NVLS 0 (its whole latency is the one in-network hop below). dtsim's other algorithms (chain,
# parameter server, hierarchical) launch like a ring.
BASE_LATENCY_US = {
    "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
    "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
    "nvls": {"LL": 0.0, "LL128": 0.0, "Simple": 0.0},
}

# Latency of one in-network reduction (µs), Simple protocol (tuning.cc hwLatencies): NVLS on NVLink 25;
# CollNet (SHARP) over the network: CollNetDirect 31, CollNetChain 30 → 30.
IN_NETWORK_LATENCY_US = {"nvlink": 25.0, "net": 30.0}

# NCCL pipelines a collective in chunks of one buffer slot: NCCL_BUFFSIZE (default 4 MiB, NCCL
# environment-variable documentation) over NCCL_STEPS = 8 slots (src/include/device.h) = 512 KiB.
CHUNK_BYTES = 4 * 1024 * KiB / 8
# dtsim caps the number of pipelined chunks per collective to keep transfer graphs small; with k chunks
# the pipeline-fill overhead is (depth-1)/k of the bandwidth term (≤ 1.6 % for depth 2·log2(1024) at 1024).
MAX_CHUNKS = 64


def base_latency_s(algorithm: str, protocol: str) -> float:
    """Launch latency NCCL charges once per collective (ring row for algorithms it lacks)."""
    row = BASE_LATENCY_US[algorithm if algorithm in BASE_LATENCY_US else "ring"]
    return row[protocol] * US


def chunks_for(size_bytes: float) -> int:
    """Pipeline chunks NCCL would cut a buffer of ``size_bytes`` into (capped, at least 1)."""
    return max(1, min(MAX_CHUNKS, int(-(-size_bytes // CHUNK_BYTES))))


# ---- SMs a collective's kernel holds ------------------------------------------------------------------
# NCCL launches one CTA per channel, each on its own SM for the kernel's whole run; a large collective
# (past ~1 MB: enqueue.cc lowers the count only while nBytes < nChannels·threads·threshold) uses every
# channel of its communicator. The count comes from the topology search (src/graph/search.cc), doubled
# there when the speed found is high (``ncclTopoDupChannels``) and doubled again when the rings are
# connected (src/graph/connect.cc: ``nChannels = std::min(MAXCHANNELS, nChannels*2)``). Per-GPU figures
# (GPUSpec.nccl_ctas_*) are what that gives on DGX-class boxes, with public logs beside them; a pipeline
# send to another node uses NCCL_NCHANNELS_PER_NET_PEER channels (default 2, NCCL environment docs).
NET_P2P_CTAS = 2


@dataclass(frozen=True)
class CommCTAs:
    """How many SMs one collective's NCCL kernel holds on a GPU, by where its ranks are. Compute beside it
    runs (SMs − CTAs)/SMs as fast. Cross-check: 16 CTAs cost an A100 17 % more compute time and an H100
    14 %, 24 inside a node 29 % and 22 %, beside the 18.9 % average compute slowdown under overlapped
    communication that Lee et al. measured on A100/H100 training runs ("Characterizing Compute-Communication
    Overlap in GPU-Accelerated Distributed Deep Learning", arXiv:2507.03114, 2025; maximum 40 %)."""

    sm_count: int
    net: int  # a ring through the NICs with several GPUs per node (and any case without a figure)
    nvlink: int | None = None  # every rank in one NVSwitch node
    nvls: int | None = None  # NVLink SHARP (NVLS) inside a node
    one_per_node: int | None = None  # one rank per node: a single ring, NIC to NIC

    def of(self, nodes: int, per_node: int, algorithm: str) -> int:
        """CTAs of a collective over ``nodes`` nodes with at most ``per_node`` ranks on one, run as
        ``algorithm`` ("direct" for point-to-point and all-to-all)."""
        if algorithm == "direct":
            return NET_P2P_CTAS if nodes > 1 and per_node == 1 else self.net
        if nodes == 1:
            if algorithm == "nvls" and self.nvls is not None:
                return self.nvls
            return self.nvlink if self.nvlink is not None else self.net
        if per_node == 1 and self.one_per_node is not None:
            return self.one_per_node
        return self.net

    def share(self, nodes: int, per_node: int, algorithm: str) -> float:
        """The share of the GPU's SMs that kernel holds."""
        return min(self.of(nodes, per_node, algorithm), self.sm_count - 1) / self.sm_count
