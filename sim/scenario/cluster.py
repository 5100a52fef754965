"""The cluster section: GPUs, intra- and inter-node links, topology, stragglers and jitter."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from sim.hardware.gpu import GPU_ALIASES, GPU_PRESETS, GPUSpec
from sim.hardware.links import INTER_PRESETS, INTRA_PRESETS, LinkSpec
from sim.scenario.base import (
    MAX_GPUS_PER_NODE,
    MAX_LATENCY_US,
    MAX_LAUNCH_US,
    MAX_NICS_PER_NODE,
    MAX_NODES,
    MAX_PEAK_TFLOPS,
    MAX_SLOWDOWN,
    MIN_PEAK_TFLOPS,
    MAX_LINK_Bps,
    MAX_MEMORY_GBps,
    MIN_LINK_Bps,
    MIN_MEMORY_GBps,
    RuleError,
    _Strict,
    _strip_none,
    lookup,
    show,
)

# σ of a GPU's sustained speed across the GPUs of one cluster, same SKU. Sinha et al., "Not All GPUs Are
# Created Equal: Characterizing Variability in Large-Scale, Accelerator-Rich Systems" (SC'22, arXiv:2208.11035)
# measured 8 % average performance variation over >90 % of the GPUs of five clusters (V100, MI60; max 22 %,
# outliers beyond up to 1.5× slower than the median). Their artifact (github.com/hal-uw/
# gpu_variability_sc22_artifact, plot_script/plot_aggregated.py) defines variation as the Tukey-fence range
# over the median, (Q3 + 1.5·IQR − (Q1 − 1.5·IQR)) / Q2 = 4·IQR/Q2; for a normal spread IQR = 1.349 σ, so
# 8 % ⇒ σ = 0.08 / (4 × 1.349) = 1.48 %. The outliers are left out: operators retire such GPUs.
DEFAULT_GPU_SPEED_SPREAD = 0.08 / (4 * 1.349)


def gpu_from(value: Any) -> Any:
    """A GPU preset name → its GPUSpec; anything else passes through to GPUSpec validation."""
    if isinstance(value, str):
        return GPU_PRESETS[lookup("GPU", value, list(GPU_PRESETS), GPU_ALIASES)]
    return value


def link_from(value: Any, presets: dict[str, LinkSpec], kind: str) -> Any:
    """A link preset name → its LinkSpec; anything else passes through to LinkSpec validation."""
    if isinstance(value, str):
        return presets[lookup(kind, value, list(presets))]
    return value



class Topology(_Strict):
    """How nodes connect: one non-blocking switch, a two-level leaf/spine fat tree, or with ``nodes_per_pod``
    a three-level one (pods of leaves under their spines, joined by a core)."""

    kind: Literal["fat-tree", "single-switch"] = Field("fat-tree", description="network shape between nodes")
    oversubscription: float = Field(
        1.0, ge=1, description="fat-tree leaf downlink:uplink bandwidth ratio (1 = non-blocking)"
    )
    nodes_per_leaf: int = Field(16, ge=1, description="nodes under one leaf switch (fat-tree)")
    nodes_per_pod: int | None = Field(
        None, ge=1, description="fat-tree with a third tier: nodes in one pod (a multiple of nodes_per_leaf), "
        "whose leaves meet at the pod's spine; pods meet at a core. Default: no third tier"
    )
    pod_oversubscription: float = Field(
        1.0, ge=1, description="three-level fat-tree: what a pod's leaves send up over what its link to the core "
        "carries (1 = non-blocking; Meta's Llama 3 clusters 7)"
    )

    @model_validator(mode="after")
    def _rules(self) -> Topology:
        if self.kind == "single-switch" and self.oversubscription != 1:
            raise RuleError(
                "oversubscription",
                show(self.oversubscription),
                "a single switch is non-blocking, oversubscription applies to fat-tree only",
                "remove oversubscription or use kind: fat-tree",
            )
        if self.nodes_per_pod is not None:
            if self.kind == "single-switch":
                raise RuleError("nodes_per_pod", show(self.nodes_per_pod),
                                "a single switch has no pods, pods apply to fat-tree only",
                                "remove nodes_per_pod or use kind: fat-tree")
            if self.nodes_per_pod % self.nodes_per_leaf:
                raise RuleError("nodes_per_pod", show(self.nodes_per_pod),
                                f"a pod holds whole leaves of nodes_per_leaf = {self.nodes_per_leaf} nodes",
                                f"use a multiple of {self.nodes_per_leaf}")
        elif self.pod_oversubscription != 1:
            raise RuleError("pod_oversubscription", show(self.pod_oversubscription),
                            "applies to the link between pods, and there are none without nodes_per_pod",
                            "set nodes_per_pod, or remove pod_oversubscription")
        return self


class RandomStragglers(_Strict):
    """Each GPU, each step, runs ``slowdown``× slower with probability ``probability`` (seeded)."""

    probability: float = Field(ge=0, le=1, description="chance that a GPU straggles in a given step")
    slowdown: float = Field(ge=1, description="slow-down factor of a straggling GPU for that step")


class Jitter(_Strict):
    """Kernel-time noise: every compute block's time × a random factor of mean 1 (seeded)."""

    kind: Literal["lognormal"] = Field("lognormal", description="distribution of the factor")
    sigma: float = Field(gt=0, le=1, description="σ of the factor's logarithm (0.03 ≈ 3 % noise)")


def stragglers_from(value: Any) -> Any:
    """Accept {gpu_id: factor}, [{gpu, factor}, ...] or {probability, slowdown}; string digit keys (from
    JSON) become ints."""
    if isinstance(value, dict) and value and set(value) <= {"probability", "slowdown"}:
        return value
    if isinstance(value, list):
        out: dict[Any, Any] = {}
        for i, item in enumerate(value):
            if not isinstance(item, dict) or set(item) != {"gpu", "factor"}:
                raise RuleError(
                    str(i),
                    show(item),
                    "a straggler list entry is a mapping with gpu and factor",
                    "write {gpu: 3, factor: 1.5}",
                )
            if item["gpu"] in out:
                raise RuleError(str(i), show(item["gpu"]), "GPU listed twice", "give each GPU once")
            out[item["gpu"]] = item["factor"]
        return out
    if isinstance(value, dict):
        return {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in value.items()}
    return value


class Cluster(_Strict):
    """The hardware: identical nodes of identical GPUs, an intra-node fabric and an inter-node network."""

    nodes: int = Field(ge=1, le=MAX_NODES, description="number of nodes (at most 1,000,000)")
    gpus_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE, description="GPUs in each node (at most 1024)")
    gpu: GPUSpec = Field(
        description="GPU preset name (case-insensitive; see sim/hardware/gpu.py) or an inline GPU mapping"
    )
    intra_node: LinkSpec = Field(
        description="intra-node link preset (nvlink2..5, pcie4, pcie5) or inline mapping; "
        "default: the GPU's nvlink, else pcie4",
    )
    inter_node: LinkSpec = Field(
        INTER_PRESETS["hdr"],
        description="inter-node link preset (edr, hdr, ndr, xdr) or inline mapping (per NIC)",
    )
    nics_per_node: int = Field(
        ge=1, le=MAX_NICS_PER_NODE, description="network interfaces per node (at most 64); default: gpus_per_node"
    )
    topology: Topology = Field(
        Topology(),
        description="fat-tree | single-switch, or a mapping {kind, oversubscription, nodes_per_leaf, nodes_per_pod, "
        "pod_oversubscription}",
    )
    stragglers: dict[Annotated[int, Field(ge=0)], Annotated[float, Field(ge=1, le=MAX_SLOWDOWN)]] = Field(
        default_factory=dict,
        description="slow GPUs: {gpu_id: slow-down factor ≥ 1}, a list of {gpu, factor}, or random "
        "stragglers {probability, slowdown} (each GPU, each step; stored as random_stragglers)",
    )
    random_stragglers: RandomStragglers | None = Field(
        None, description="each GPU, each step, slow with a probability: {probability, slowdown}"
    )
    jitter: Jitter | None = Field(
        None, description="kernel-time noise {kind: lognormal, sigma}; null = every step identical"
    )
    gpu_speed_spread: float = Field(
        DEFAULT_GPU_SPEED_SPREAD, ge=0, le=0.2,
        description="σ of each GPU's own, persistent compute speed across the GPUs of the cluster (power "
        "management and manufacturing make identical SKUs run at different sustained clocks); synchronous "
        "training waits for the slowest. Default 0.0148 from Sinha et al., SC'22; 0 = identical GPUs",
    )
    in_network_reduction: bool = Field(
        False,
        description="reduce in the switches where the hardware can: NVLink SHARP (NVLS) inside a node "
        "with nvlink4/nvlink5, InfiniBand SHARP across nodes on hdr/ndr/xdr",
    )

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _strip_none(data, "intra_node", "inter_node", "nics_per_node", "topology", "stragglers")
        given = data.get("stragglers")
        if isinstance(given, dict) and given and set(given) <= {"probability", "slowdown"}:
            if data.get("random_stragglers") is not None:
                raise RuleError("stragglers", show(given), "random stragglers given twice",
                                "keep stragglers: {probability, slowdown} or random_stragglers, not both")
            data = {**data, "random_stragglers": given}
            del data["stragglers"]
        if "intra_node" not in data:
            try:
                gpu = GPUSpec.model_validate(gpu_from(data.get("gpu")))
            except (ValueError, TypeError):
                gpu = None  # the gpu field reports its own error
            data["intra_node"] = (gpu and gpu.nvlink) or "pcie4"
        if "nics_per_node" not in data and "gpus_per_node" in data:
            data["nics_per_node"] = data["gpus_per_node"]
        return data

    @field_validator(
        "gpu",
        mode="before",
        json_schema_input_type=Literal[tuple(GPU_PRESETS) + tuple(GPU_ALIASES)] | GPUSpec,
    )
    @classmethod
    def _gpu(cls, value: Any) -> Any:
        return gpu_from(value)

    @field_validator(
        "intra_node", mode="before", json_schema_input_type=Literal[tuple(INTRA_PRESETS)] | LinkSpec
    )
    @classmethod
    def _intra(cls, value: Any) -> Any:
        return link_from(value, INTRA_PRESETS, "intra-node link")

    @field_validator(
        "inter_node", mode="before", json_schema_input_type=Literal[tuple(INTER_PRESETS)] | LinkSpec
    )
    @classmethod
    def _inter(cls, value: Any) -> Any:
        return link_from(value, INTER_PRESETS, "inter-node link")

    @field_validator(
        "topology",
        mode="before",
        json_schema_input_type=Literal["fat-tree", "single-switch"] | Topology,
    )
    @classmethod
    def _topology(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    @field_validator(
        "stragglers",
        mode="before",
        json_schema_input_type=dict[int, float] | list[dict[str, float]] | RandomStragglers,
    )
    @classmethod
    def _stragglers(cls, value: Any) -> Any:
        return stragglers_from(value)

    @model_validator(mode="after")
    def _rules(self) -> Cluster:
        _check_physical(self)
        for gpu_id in self.fixed_stragglers:
            if gpu_id >= self.total_gpus:
                raise RuleError(
                    "stragglers",
                    show(gpu_id),
                    f"GPU ids run from 0 to {self.total_gpus - 1} ({self.nodes}×{self.gpus_per_node} GPUs)",
                    f"use an id below {self.total_gpus}",
                )
        return self

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def fixed_stragglers(self) -> dict[int, float]:
        """The explicit {gpu: factor} map."""
        return self.stragglers


def _check_physical(c: Cluster) -> None:
    """Hardware figures in ranges that keep the simulated clock moving and every time finite."""
    for name, link in (("intra_node", c.intra_node), ("inter_node", c.inter_node)):
        bw = link.bandwidth_Bps
        unit = "bandwidth_Gbps" if link.bandwidth_Gbps is not None else "bandwidth_GBps"
        if not MIN_LINK_Bps <= bw <= MAX_LINK_Bps:
            raise RuleError(
                f"{name}.{unit}",
                show(link.bandwidth_Gbps if link.bandwidth_Gbps is not None else link.bandwidth_GBps),
                f"bandwidth × efficiency = {bw:.3g} B/s must lie between {MIN_LINK_Bps:.0e} B/s (1 MB/s) and "
                f"{MAX_LINK_Bps:.0e} B/s",
                "give a real link's rate, e.g. bandwidth_Gbps: 200 (HDR InfiniBand)",
            )
        if link.latency_us > MAX_LATENCY_US:
            raise RuleError(f"{name}.latency_us", show(link.latency_us), f"must be ≤ {MAX_LATENCY_US:.0e} µs",
                            "give a real latency, e.g. latency_us: 5")
    g = c.gpu
    for dtype, tflops in g.peak_tflops.items():
        if not MIN_PEAK_TFLOPS <= tflops <= MAX_PEAK_TFLOPS:
            raise RuleError(f"gpu.peak_tflops.{dtype}", show(tflops),
                            f"must lie between {MIN_PEAK_TFLOPS:g} and {MAX_PEAK_TFLOPS:g} TFLOP/s",
                            "give the datasheet figure, e.g. bf16: 312 (A100)")
    if not MIN_MEMORY_GBps <= g.memory_bandwidth_GBps <= MAX_MEMORY_GBps:
        raise RuleError("gpu.memory_bandwidth_GBps", show(g.memory_bandwidth_GBps),
                        f"must lie between {MIN_MEMORY_GBps:g} and {MAX_MEMORY_GBps:g} GB/s",
                        "give the datasheet figure, e.g. 2039 (A100 80GB)")
    if g.memory_GB > 1e9:
        raise RuleError("gpu.memory_GB", show(g.memory_GB), "must be ≤ 1e9 GB", "give e.g. memory_GB: 80")
    if g.kernel_launch_us > MAX_LAUNCH_US:
        raise RuleError("gpu.kernel_launch_us", show(g.kernel_launch_us), f"must be ≤ {MAX_LAUNCH_US:g} µs",
                        "give e.g. kernel_launch_us: 4")

