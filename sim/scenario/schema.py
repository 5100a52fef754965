"""The scenario as typed, strict pydantic models: one class per section, cross-field rules included.

Every model forbids unknown keys and uses strict types (a quoted "4" is not an int), so a typo or a
wrong type is an error, never a silent default. Preset names (GPUs, links, transformer models) are
expanded while validating, so a validated ``Scenario`` holds only concrete values: dumping it gives the
resolved form, which validates back to an equal ``Scenario``. Rules raise ``RuleError`` carrying the
field, the value, the rule and a fix; ``sim.scenario.errors_format`` turns them into one-line messages.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from sim.engine.collective_algorithms import ALGORITHM_NAMES, COLLECTIVE_ALGORITHMS, DP_ALGORITHMS
from sim.hardware.gpu import GPU_ALIASES, GPU_PRESETS, GPUSpec
from sim.hardware.links import INTER_PRESETS, INTRA_PRESETS, LinkSpec
from sim.schedules.actions import SCHEDULES
from sim.units import DTYPE_BYTES, GiB, KiB, MiB
from sim.workload.kernels import ATTENTION_KINDS, DEFAULT_KERNEL_SET, KERNEL_SET_NAMES, KERNEL_SETS

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")
COLLECTIVE_OPS = (
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
)
ALGORITHMS = ALGORITHM_NAMES  # the engine's registry (sim.engine.collective_algorithms) defines the names
NAME_PATTERN = r"^[A-Za-z0-9._-]+$"


# Ranges that keep every simulated time and byte count finite and meaningful in float64.
MAX_OP_MS = 1e9  # 11.6 days for one layer's micro-batch: far beyond any real kernel
MAX_SLOWDOWN = 1e4  # a straggler 10,000× slower than its peers
MAX_BYTES = 2**60  # 1 EiB in one message or activation
MAX_PARAMS = 10**15  # parameters in one layer
MAX_FLOPS = 1e24  # FLOPs of one layer for one sample
MIN_LINK_Bps = 1e6  # 1 MB/s: below 10 Mb/s Ethernet no training network runs (a floor that keeps time finite)
MAX_LINK_Bps = 1e15  # 1 PB/s per direction, ~1000× NVLink 5
MAX_LATENCY_US = 1e6  # one second per message
MIN_PEAK_TFLOPS = 1e-6  # 1 MFLOP/s
MAX_PEAK_TFLOPS = 1e6
MIN_MEMORY_GBps = 1e-3  # 1 MB/s of HBM bandwidth
MAX_MEMORY_GBps = 1e6
MAX_LAUNCH_US = 1e6
MAX_NICS_PER_NODE = 64  # DGX H100: 8 compute + 2 storage NICs; every NIC is a channel each transfer is split over


class RuleError(ValueError):
    """A broken rule: ``field`` (relative to the model that raised it), the value, the rule and a fix."""

    def __init__(self, field: str | None, value: str, rule: str, fix: str):
        self.field, self.value, self.rule, self.fix = field, value, rule, fix
        super().__init__(f"{value} — {rule}; {fix}")


def show(value: Any, limit: int = 60) -> str:
    """A short repr of a user value for a one-line message."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def did_you_mean(word: str, options: list[str] | tuple[str, ...]) -> str:
    """ "did you mean 'x'? " for the option closest to ``word`` (case-insensitive), or "" if none is close."""
    lower = {o.lower(): o for o in options}
    close = difflib.get_close_matches(str(word).lower(), list(lower), n=1, cutoff=0.6)
    return f"did you mean {lower[close[0]]!r}? " if close else ""


def lookup(kind: str, name: str, names: list[str], aliases: dict[str, str] | None = None) -> str:
    """The canonical key for preset ``name`` (case-insensitive, aliases allowed) or a RuleError."""
    table = {n.lower(): n for n in names}
    table.update({a.lower(): t for a, t in (aliases or {}).items()})
    key = table.get(name.strip().lower())
    if key is not None:
        return key
    known = ", ".join(names) or "(none installed)"
    extra = f"; aliases: {', '.join(aliases)}" if aliases else ""
    hint = did_you_mean(name, list(names) + list(aliases or {}))
    raise RuleError(
        None, show(name), f"unknown {kind} preset", f"{hint}use one of {known}{extra}, or an inline mapping"
    )


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


def model_presets() -> dict[str, Any]:
    """MODEL_PRESETS, imported late (the workload package may not be installed yet): empty if absent."""
    try:
        from sim.workload.model_presets import MODEL_PRESETS
    except ImportError:
        return {}
    return dict(MODEL_PRESETS)


def moe_presets() -> dict[str, dict[str, Any]]:
    """MoE fields of the mixture-of-experts presets (imported late; empty if absent)."""
    try:
        from sim.workload.model_presets import MOE_PRESETS
    except ImportError:
        return {}
    return dict(MOE_PRESETS)


def layer_presets() -> dict[str, Any]:
    """Layer-list presets (resnet50, …) → a function giving their layers, imported late; empty if absent."""
    try:
        from sim.workload import layers as mod
    except ImportError:
        return {}
    names = getattr(mod, "CNN_PRESETS", None) or getattr(mod, "_RESNET_BLOCKS", {})
    return {name: (lambda n=name: mod.cnn_preset(n)) for name in names}


def _as_dict(obj: Any) -> dict[str, Any]:
    """A preset entry (dataclass, pydantic model or mapping) as a plain dict."""
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)  # type: ignore[arg-type]
    return obj.model_dump() if isinstance(obj, BaseModel) else dict(obj)


def _strip_none(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    """A copy without the given keys where they are None, so field defaults apply."""
    return {k: v for k, v in data.items() if not (k in keys and v is None)}


class _Strict(BaseModel):
    """Base for every section: unknown keys are errors, types are strict, values immutable."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, validate_default=True, allow_inf_nan=False
    )


# ----------------------------------------------------------------------------------------- cluster


class Topology(_Strict):
    """How nodes connect: one non-blocking switch, or a two-level leaf/spine fat tree."""

    kind: Literal["fat-tree", "single-switch"] = Field("fat-tree", description="network shape between nodes")
    oversubscription: float = Field(
        1.0, ge=1, description="fat-tree leaf downlink:uplink bandwidth ratio (1 = non-blocking)"
    )
    nodes_per_leaf: int = Field(16, ge=1, description="nodes under one leaf switch (fat-tree)")

    @model_validator(mode="after")
    def _rules(self) -> Topology:
        if self.kind == "single-switch" and self.oversubscription != 1:
            raise RuleError(
                "oversubscription",
                show(self.oversubscription),
                "a single switch is non-blocking, oversubscription applies to fat-tree only",
                "remove oversubscription or use kind: fat-tree",
            )
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

    nodes: int = Field(ge=1, description="number of nodes")
    gpus_per_node: int = Field(ge=1, description="GPUs in each node")
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
        description="fat-tree | single-switch, or a mapping {kind, oversubscription, nodes_per_leaf}",
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


# ------------------------------------------------------------------------------------------- model


class SyntheticModel(_Strict):
    """Identical layers with given times: the seed exercises and schedule studies."""

    kind: Literal["synthetic"] = Field(description="a synthetic model of identical layers")
    layers: int = Field(ge=1, description="number of layers")
    forward_ms: float = Field(ge=0, le=MAX_OP_MS, description="forward time of one layer for one micro-batch, ms")
    backward_ms: float = Field(
        ge=0, le=MAX_OP_MS, description="backward time of one layer for one micro-batch, ms; default 2×forward_ms"
    )
    params_per_layer: int = Field(
        0, ge=0, le=MAX_PARAMS, description="parameters per layer (gradient bytes for data parallelism)"
    )
    activation_bytes: float = Field(
        0.0, ge=0, le=MAX_BYTES, description="bytes sent between pipeline stages per micro-batch"
    )
    optimizer_ms: float = Field(0.0, ge=0, le=MAX_OP_MS, description="optimizer step time per GPU, ms")

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = _strip_none(data, "backward_ms")
            if "backward_ms" not in data and isinstance(data.get("forward_ms"), int | float):
                data["backward_ms"] = 2.0 * data["forward_ms"]
        return data

    @property
    def num_layers(self) -> int:
        return self.layers


def parse_size(value: Any) -> Any:
    """ "1GiB", "256MB", "1.5 KB", 4096 → bytes (int); units are bytes (B), decimal (KB) or binary (KiB)."""
    if not isinstance(value, str):
        return value
    units = {
        "B": 1,
        "KB": 1e3,
        "MB": 1e6,
        "GB": 1e9,
        "TB": 1e12,
        "KIB": KiB,
        "MIB": MiB,
        "GIB": GiB,
        "TIB": 1024 * GiB,
    }
    text = value.strip().replace("_", "")
    number = text.rstrip("BbIiKkMmGgTt ")
    unit = text[len(number) :].strip()
    try:
        scale = units[unit.upper()] if unit else 1
        if unit and not unit.endswith("B"):
            raise KeyError(unit)
        size = float(number) * scale
    except (KeyError, ValueError):
        raise RuleError(
            None,
            show(value),
            "not a size in bytes",
            "write an integer or a number with a unit: B, KB, MB, GB, KiB, MiB, GiB",
        ) from None
    if not math.isfinite(size):
        raise RuleError(None, show(value), "not a finite size", "write e.g. 256MB")
    return round(size)


def _sizes_in(value: Any) -> Any:
    """One size or a list of sizes → a list of byte counts (ints)."""
    if isinstance(value, list):
        return [parse_size(v) for v in value]
    return [parse_size(value)]


class CollectiveModel(_Strict):
    """One collective operation, repeated: for bandwidth and algorithm studies (nccl-tests style)."""

    kind: Literal["collective"] = Field(description="a collective-only workload")
    op: Literal[COLLECTIVE_OPS] = Field(  # type: ignore[valid-type]
        description="collective; send_recv = each rank sends to the next (i → i+1 mod ranks), as nccl-tests"
    )
    size_bytes: list[Annotated[int, Field(gt=0, le=MAX_BYTES)]] = Field(
        min_length=1,
        description='total buffer size: bytes, "256MB", "1GiB", or a list of them (one run per size)',
    )
    algorithm: Literal[ALGORITHMS] = Field(  # type: ignore[valid-type]
        description="auto (NCCL's tuner: algorithm and protocol by size and group shape), or all_reduce: "
        "ring|tree (double binary tree)|hierarchical|ps|nvls|hierarchical_sharp; reduce/broadcast: "
        "chain|binomial|ps; all_gather/reduce_scatter: ring; all_to_all/send_recv: direct. Default: the first"
    )
    protocol: Literal["auto", "LL", "LL128", "Simple"] = Field(
        "auto", description="NCCL protocol; auto = the fastest by NCCL's latency/bandwidth model"
    )
    channels: int | None = Field(
        None, ge=1, description="parallel channels; null = the engine's NCCL-like default"
    )
    ranks: int = Field(ge=2, description="GPUs taking part (ids 0..ranks-1); default: all GPUs")
    dtype: Literal["fp32", "fp16", "bf16", "fp8"] = Field("bf16", description="element type (reductions)")
    iterations: int = Field(1, ge=1, description="repetitions of the collective")

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = _strip_none(data, "algorithm")
            if "algorithm" not in data and data.get("op") in COLLECTIVE_ALGORITHMS:
                data["algorithm"] = COLLECTIVE_ALGORITHMS[data["op"]][0]
        return data

    @field_validator("size_bytes", mode="before", json_schema_input_type=int | str | list[int | str])
    @classmethod
    def _sizes(cls, value: Any) -> Any:
        return _sizes_in(value)

    @model_validator(mode="after")
    def _rules(self) -> CollectiveModel:
        allowed = COLLECTIVE_ALGORITHMS[self.op]
        if self.algorithm not in allowed and self.algorithm != "auto":
            raise RuleError(
                "algorithm",
                show(self.algorithm),
                f"{self.op} supports {', '.join(allowed)}",
                f"use algorithm: {allowed[0]}",
            )
        width = DTYPE_BYTES[self.dtype]
        for size in self.size_bytes:
            if size % width:
                raise RuleError(
                    "size_bytes",
                    show(size),
                    f"not a whole number of {self.dtype} elements ({width} bytes each)",
                    f"use a multiple of {width}, e.g. {size - size % width or width}",
                )
        return self


class TransformerModel(_Strict):
    """A decoder-only transformer, by dimensions or by preset name (``preset`` is expanded, ``name`` kept)."""

    kind: Literal["transformer"] = Field(description="a transformer language model")
    preset: str | None = Field(
        None,
        exclude=True,
        description="start from this MODEL_PRESETS entry; other keys override it (input only)",
    )
    hf_config: str | None = Field(
        None,
        exclude=True,
        description="a Hugging Face config.json (or its folder), relative to the scenario's folder; its "
        "dimensions fill the model, other keys override them (input only)",
    )
    name: str | None = Field(None, description="the preset this model came from (a record)")
    layers: int = Field(ge=1, description="transformer blocks")
    hidden: int = Field(ge=1, description="model width (d_model)")
    heads: int = Field(ge=1, description="attention heads")
    ffn_hidden: int = Field(ge=1, description="MLP width; default 4×hidden")
    vocab: int = Field(ge=1, description="vocabulary size")
    seq_len: int = Field(ge=1, description="sequence length, tokens")
    kv_heads: int = Field(ge=1, description="key/value heads (grouped-query attention); default = heads")
    mlp: Literal["gelu", "swiglu"] = Field("gelu", description="MLP type (swiglu has three weight matrices)")
    bias: bool = Field(True, description="linear layers have biases (GPT-3: yes; Llama: no)")
    norm: Literal["layernorm", "rmsnorm"] = Field("layernorm", description="normalisation layer")
    position: Literal["learned", "rope"] = Field("learned", description="position embedding")
    tied_embeddings: bool = Field(True, description="output projection shares the embedding weights")
    attention: Literal[ATTENTION_KINDS] = Field(  # type: ignore[valid-type]
        "flash",
        description="flash: one fused kernel, softmax scores never stored; standard: batched GEMMs around "
        "a softmax (and dropout) kernel over the b·heads·s² scores, kept for backward (Korthikanti et "
        "al.'s 5as/h activation term); default: what training.kernels used",
    )
    experts: int | None = Field(
        None, ge=1, description="mixture of experts: routed experts per layer (null = dense MLP)"
    )
    top_k: int | None = Field(None, ge=1, description="MoE: experts each token uses; default 2")
    expert_ffn_hidden: int | None = Field(
        None, ge=1, description="MoE: one expert's MLP width; default ffn_hidden"
    )
    capacity_factor: float | None = Field(
        None, gt=0, description="MoE: expert buffers padded to this × the fair share; null = dropless"
    )
    load_imbalance: float | None = Field(
        None, ge=1, description="MoE, dropless: busiest GPU's routed tokens / the mean; default 1"
    )
    shared_experts: int | None = Field(
        None, ge=1, description="MoE: shared experts every token uses (width expert_ffn_hidden each), run "
        "as a tensor-parallel MLP beside the routed ones (DeepSeek-MoE style)"
    )

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        data = _strip_none(data, "ffn_hidden", "kv_heads", "preset", "name", "hf_config")
        if isinstance(data.get("hf_config"), str):
            data = _from_hf_config(data, (info.context or {}).get("base_dir"))
        if isinstance(data.get("preset"), str):
            presets = model_presets()
            key = lookup("transformer model", data["preset"], list(presets))
            dims = presets[key]
            base = {f: getattr(dims, f) for f in _DIM_FIELDS if getattr(dims, f, None) is not None}
            base.update(moe_presets().get(key, {}))
            data = {**base, "name": key, **{k: v for k, v in data.items() if k != "preset"}}
        if "ffn_hidden" not in data and isinstance(data.get("hidden"), int):
            data["ffn_hidden"] = 4 * data["hidden"]
        if "kv_heads" not in data and isinstance(data.get("heads"), int):
            data["kv_heads"] = data["heads"]
        return data

    @model_validator(mode="after")
    def _rules(self) -> TransformerModel:
        moe_keys = ("top_k", "expert_ffn_hidden", "capacity_factor", "load_imbalance", "shared_experts")
        if self.experts is None:
            for key in moe_keys:
                if getattr(self, key) is not None:
                    raise RuleError(key, show(getattr(self, key)), "applies to mixture-of-experts models",
                                    "set experts (e.g. experts: 8), or remove it")
        elif (self.top_k or 2) > self.experts:
            raise RuleError("top_k", show(self.top_k), f"a token cannot use more than experts = {self.experts}",
                            f"use top_k ≤ {self.experts}")
        if self.capacity_factor is not None and self.load_imbalance is not None:
            raise RuleError("load_imbalance", show(self.load_imbalance),
                            "a capacity factor pads every expert's buffer, so the load is the capacity",
                            "give capacity_factor (padded) or load_imbalance (dropless), not both")
        if self.hidden % self.heads:
            raise RuleError(
                "hidden",
                show(self.hidden),
                f"hidden must be a multiple of heads = {self.heads}",
                "change hidden or heads",
            )
        if self.kv_heads > self.heads or self.heads % self.kv_heads:
            raise RuleError(
                "kv_heads",
                show(self.kv_heads),
                f"heads = {self.heads} must be a multiple of kv_heads",
                f"use a divisor of {self.heads}, e.g. kv_heads: {self.heads}",
            )
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def num_layers(self) -> int:
        return self.layers

    def to_moe(self) -> Any:
        """The workload's ``MoESpec``, or None for a dense model (imported late)."""
        if self.experts is None:
            return None
        from sim.workload.moe import MoESpec

        return MoESpec(experts=self.experts, top_k=self.top_k or 2,
                       ffn_hidden=self.expert_ffn_hidden or self.ffn_hidden,
                       capacity_factor=self.capacity_factor, load_imbalance=self.load_imbalance or 1.0,
                       shared=self.shared_experts or 0)

    def to_dims(self) -> Any:
        """The workload's ``TransformerDims`` for this model (imported late: schema does not need it)."""
        from sim.workload.transformer import TransformerDims

        return TransformerDims(**{f: getattr(self, f) for f in _DIM_FIELDS})


MOE_FIELDS = ("experts", "top_k", "expert_ffn_hidden", "capacity_factor", "load_imbalance", "shared_experts")
_DIM_FIELDS = tuple(
    f for f in TransformerModel.model_fields
    if f not in ("kind", "preset", "hf_config", "name", "attention", *MOE_FIELDS)
)


def _from_hf_config(data: dict[str, Any], base: Any) -> dict[str, Any]:
    """``hf_config: path`` → the file's dimensions, under the keys given beside it."""
    from sim.workload.hf_config import HFConfigError, read_hf_config

    if "preset" in data:
        raise RuleError("hf_config", show(data["hf_config"]), "give either preset or hf_config, not both",
                        "remove one of them")
    given = Path(data["hf_config"]).expanduser()
    candidates = [given] if given.is_absolute() else (
        ([Path(base) / given] if base is not None else []) + [Path.cwd() / given])
    path = next((c for c in candidates if c.exists()), candidates[0])
    try:
        fields = read_hf_config(path)
    except HFConfigError as e:
        where = f" in {path}" if e.key != "hf_config" else ""
        raise RuleError("hf_config", f"{e.key} = {e.value}{where}", e.rule, e.fix) from None
    rest = {k: v for k, v in data.items() if k != "hf_config"}
    return {**fields, **rest}


class LayerSpec(_Strict):
    """One layer of a layer-list model."""

    name: str = Field(description="layer name (shown in traces)")
    params: int = Field(ge=0, le=MAX_PARAMS, description="parameters")
    forward_flops: float = Field(ge=0, le=MAX_FLOPS, description="forward FLOPs per sample")
    activation_bytes: float = Field(
        ge=0, le=MAX_BYTES, description="activation bytes kept for backward per sample, counted at 16-bit precision"
    )
    in_features: int | None = Field(
        None, ge=1, description="for a linear layer: input width (with out_features, GEMMs get real shapes)"
    )
    out_features: int | None = Field(None, ge=1, description="for a linear layer: output width")

    @model_validator(mode="after")
    def _shape(self) -> LayerSpec:
        if (self.in_features is None) != (self.out_features is None):
            raise RuleError(
                "in_features", show(self.in_features), "give both in_features and out_features or neither",
                "add the missing one",
            )
        if self.in_features is not None:
            expect = 2.0 * self.in_features * self.out_features
            if abs(self.forward_flops - expect) > 0.01 * expect:
                raise RuleError(
                    "forward_flops", show(self.forward_flops),
                    f"a {self.in_features}×{self.out_features} linear layer does 2·in·out = {expect:g} FLOPs "
                    "per sample",
                    f"set forward_flops: {expect:g}",
                )
        return self


class LayersModel(_Strict):
    """An explicit list of layers (e.g. a CNN), or a named preset list."""

    kind: Literal["layers"] = Field(description="a model given layer by layer")
    preset: str | None = Field(
        None, exclude=True, description="start from this LAYER_PRESETS entry (input only)"
    )
    name: str | None = Field(None, description="the preset this model came from (a record)")
    layers: list[LayerSpec] = Field(min_length=1, description="the layers, in order")

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = _strip_none(data, "preset", "name")
            if isinstance(data.get("preset"), str):
                presets = layer_presets()
                key = lookup("layer-list model", data["preset"], list(presets))
                if "layers" in data:
                    raise RuleError(
                        "layers", "(given)", "give either preset or layers, not both", "remove one of them"
                    )
                layers = [_as_dict(x) for x in presets[key]()]
                data = {"name": key, **{k: v for k, v in data.items() if k != "preset"}, "layers": layers}
        return data

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def to_layers(self) -> list[Any]:
        """The workload's ``GenericLayer`` list for this model (imported late)."""
        from sim.workload.layers import GenericLayer

        return [GenericLayer(**{k: v for k, v in layer.model_dump().items() if v is not None})
                for layer in self.layers]


ModelSpec = Annotated[
    SyntheticModel | CollectiveModel | TransformerModel | LayersModel, Field(discriminator="kind")
]
MODEL_KINDS = ("synthetic", "collective", "transformer", "layers")

# Fields required in a validated Scenario but optional in the file (filled from other fields or a preset);
# the JSON Schema of the input form leaves them out of "required".
INPUT_DEFAULTED = {
    "Cluster": ("intra_node", "nics_per_node"),
    "SyntheticModel": ("backward_ms",),
    "TransformerModel": ("ffn_hidden", "kv_heads"),
    "CollectiveModel": ("algorithm", "ranks"),
}
# Fields a `preset:` key supplies: required only when there is no preset.
PRESET_SUPPLIED = {
    "TransformerModel": ("layers", "hidden", "heads", "vocab", "seq_len"),
    "LayersModel": ("layers",),
}


def model_from(value: Any) -> Any:
    """A bare string names a transformer preset; {hf_config: path} is a transformer; other mappings pass
    through to the discriminated union."""
    if isinstance(value, str):
        return {"kind": "transformer", "preset": value}
    if isinstance(value, dict) and "hf_config" in value and "kind" not in value:
        return {"kind": "transformer", **value}
    return value


# ---------------------------------------------------------------------------------------- parallel


class Parallel(_Strict):
    """How the GPUs split the work: data × tensor × pipeline, the pipeline schedule, ZeRO, DDP buckets."""

    data: int = Field(1, ge=1, description="data-parallel replicas")
    tensor: int = Field(1, ge=1, description="tensor-parallel width (Megatron-style; may span nodes)")
    pipeline: int = Field(1, ge=1, description="pipeline stages")
    schedule: Literal[SCHEDULES] = Field("1f1b", description="pipeline schedule")  # type: ignore[valid-type]
    virtual_stages: int = Field(1, ge=1, description="model chunks per GPU (interleaved-1f1b only)")
    sequence_parallel: bool = Field(
        False, description="Megatron sequence parallelism (a no-op when tensor = 1)"
    )
    zero: int = Field(
        0, ge=0, le=3, description="ZeRO stage: 0 = DDP, 1 optimizer, 2 +gradients, 3 +weights (FSDP)"
    )
    bucket_MB: float = Field(25.0, ge=1e-3, le=1e9, description="DDP gradient bucket size, MB (1 kB to 1 PB)")
    overlap_grad_sync: bool = Field(
        True,
        description="overlap the gradient all-reduce with the backward pass; default: what "
        "training.kernels did (Megatron-LM 2021/2022 reduced after the last micro-batch)"
    )
    dp_algorithm: Literal[DP_ALGORITHMS] = Field(  # type: ignore[valid-type]
        "auto",
        description="gradient all-reduce algorithm: auto (NCCL's tuner per collective and size), ring, tree "
        "(double binary tree), hierarchical (intra-node RS, inter-node AR, intra-node AG; SHARP with "
        "in_network_reduction), parameter_server",
    )
    parameter_servers: int = Field(
        1, ge=1, description="parameter_server: how many servers (sharded, BytePS-style, when > 1)"
    )
    parameter_server_placement: Literal["colocated", "dedicated"] = Field(
        "colocated", description="parameter_server: colocated (on worker nodes) or dedicated (extra CPU nodes)"
    )
    expert: int | None = Field(
        None, ge=1, description="expert parallelism: GPUs sharing one layer's experts, carved out of data "
        "(divides data and model.experts); null = 1"
    )
    context: int | None = Field(
        None, ge=1, description="context parallelism: GPUs splitting each sequence (ring attention); the "
        "GPU count is data × context × tensor × pipeline; null = 1"
    )
    context_attention: Literal["ring", "all_gather"] | None = Field(
        None, description="context parallelism: ring (K/V blocks passed around, overlapped; default) or "
        "all_gather (Llama 3: gather K/V, then attend)"
    )
    stage_layers: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        description="layers of each model chunk in pipeline order (virtual stage = chunk × pipeline + stage), "
        "pipeline × virtual_stages entries summing to the model's layers, e.g. fewer on the first and last "
        "stage to balance the embedding and the head; null = as even as possible",
    )

    @model_validator(mode="after")
    def _rules(self) -> Parallel:
        if self.dp_algorithm != "parameter_server" and (
            self.parameter_servers != 1 or self.parameter_server_placement != "colocated"
        ):
            raise RuleError(
                "parameter_servers",
                show(self.parameter_servers),
                f"parameter servers apply to dp_algorithm: parameter_server, not {self.dp_algorithm}",
                "set dp_algorithm: parameter_server or remove parameter_servers/parameter_server_placement",
            )
        if self.parameter_server_placement == "colocated" and self.parameter_servers > self.data:
            raise RuleError(
                "parameter_servers",
                show(self.parameter_servers),
                f"colocated servers sit on the {self.data} data-parallel workers, at most one each",
                f"use parameter_servers: {self.data} or parameter_server_placement: dedicated",
            )
        if self.dp_algorithm == "parameter_server" and self.zero:
            raise RuleError(
                "dp_algorithm",
                show(self.dp_algorithm),
                f"a parameter server syncs whole gradients (all-reduce), ZeRO {self.zero} shards them",
                "use zero: 0 or another dp_algorithm",
            )
        if self.virtual_stages > 1 and self.schedule != "interleaved-1f1b":
            raise RuleError(
                "virtual_stages",
                show(self.virtual_stages),
                f"model chunks per GPU need the interleaved-1f1b schedule, not {self.schedule}",
                "use schedule: interleaved-1f1b or virtual_stages: 1",
            )
        return self

    @property
    def world_size(self) -> int:
        return self.data * self.tensor * self.pipeline * self.cp

    @property
    def ep(self) -> int:
        return self.expert or 1

    @property
    def cp(self) -> int:
        return self.context or 1


# ---------------------------------------------------------------------------------------- training


class LossScaling(_Strict):
    """fp16 loss scaling; overflows (given steps or a probability) skip the step and back off the scale."""

    kind: Literal["none", "static", "dynamic"] = Field("none", description="loss-scaling policy")
    init_scale: float = Field(65536.0, gt=0, description="initial (or static) scale")
    growth_factor: float = Field(
        2.0, gt=1, description="dynamic: scale multiplier after growth_interval clean steps"
    )
    backoff_factor: float = Field(0.5, gt=0, lt=1, description="dynamic: scale multiplier after an overflow")
    growth_interval: int = Field(2000, ge=1, description="dynamic: clean steps before growing the scale")
    overflow_steps: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, description="steps (0-based) whose gradients overflow"
    )
    overflow_probability: float | None = Field(
        None, ge=0, le=1, description="chance that a step overflows (seeded)"
    )

    @field_validator("overflow_steps")
    @classmethod
    def _sorted(cls, steps: list[int]) -> list[int]:
        return sorted(set(steps))

    @model_validator(mode="after")
    def _rules(self) -> LossScaling:
        if self.overflow_steps and self.overflow_probability is not None:
            raise RuleError(
                "overflow_probability",
                show(self.overflow_probability),
                "give overflow_steps or overflow_probability, not both",
                "remove one of them",
            )
        if self.kind == "none" and (self.overflow_steps or self.overflow_probability is not None):
            raise RuleError(
                "kind",
                show(self.kind),
                "overflows need loss scaling",
                "use kind: dynamic (or static), or remove the overflows",
            )
        return self


class Checkpointing(_Strict):
    """Activation checkpointing: none, selective (attention only) or full in blocks of ``every`` layers."""

    kind: Literal["none", "full", "selective"] = Field("none", description="what to recompute in backward")
    every: int = Field(
        1,
        ge=1,
        description="full: keep the input of one layer in `every`, recompute the block (1 = every layer)",
    )

    @model_validator(mode="after")
    def _rules(self) -> Checkpointing:
        if self.every != 1 and self.kind != "full":
            raise RuleError(
                "every",
                show(self.every),
                f"`every` applies to full checkpointing, not {self.kind}",
                "use kind: full",
            )
        return self


def checkpointing_from(value: Any) -> Any:
    """ "full" → {kind: full}; {every: k} → {kind: full, every: k}."""
    if isinstance(value, str):
        return {"kind": value}
    if isinstance(value, dict) and "every" in value and "kind" not in value:
        return {"kind": "full", **value}
    return value


class Compression(_Strict):
    """Gradient compression for the data-parallel all-reduce."""

    kind: Literal["topk"] = Field(description="top-k sparsification")
    ratio: float = Field(gt=0, le=1, description="fraction of gradient elements sent")


class Training(_Strict):
    """The batch, precision and optimizer: what one training step does."""

    global_batch: int = Field(
        ge=1, description="samples (sequences) per optimizer step, all replicas together"
    )
    micro_batch: int = Field(1, ge=1, description="samples per micro-batch per replica")
    precision: Literal[PRECISIONS] = Field("bf16", description="compute dtype")  # type: ignore[valid-type]
    loss_scaling: LossScaling = Field(LossScaling(), description="none | static | dynamic, or a mapping")
    checkpointing: Checkpointing = Field(Checkpointing(), description="none | full | selective | {every: k}")
    optimizer: Literal["adam", "adamw", "sgd"] = Field(
        "adam", description="optimizer (sets optimizer-state memory)"
    )
    gradient_compression: Compression | None = Field(None, description="null, or {kind: topk, ratio}")
    kernels: Literal[KERNEL_SET_NAMES] = Field(  # type: ignore[valid-type]
        DEFAULT_KERNEL_SET,
        description="the software stack's kernel set (sim/workload/kernels.py): which kernels it launched "
        "and fused, e.g. megatron-lm-2021 (bmm attention, fp32 grad-accumulation pass) or "
        "transformer-engine (flash attention, fused kernels)",
    )
    grad_clip: float | None = Field(
        1.0, gt=0, description="gradient-norm clipping threshold (Megatron's --clip-grad, default 1.0): "
        "a norm pass over the gradients and its all-reduce; null = no clipping",
    )
    tokens: float | None = Field(
        None, gt=0, le=1e18, description="total training tokens (time-to-train, at most 1e18); transformer only"
    )
    train_steps: int | None = Field(
        None, gt=0, le=10**12, description="total optimizer steps (time-to-train, at most 1e12)"
    )

    @field_validator(
        "loss_scaling",
        mode="before",
        json_schema_input_type=Literal["none", "static", "dynamic"] | LossScaling,
    )
    @classmethod
    def _loss_scaling(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    @field_validator(
        "checkpointing",
        mode="before",
        json_schema_input_type=Literal["none", "full", "selective"] | Checkpointing,
    )
    @classmethod
    def _checkpointing(cls, value: Any) -> Any:
        return checkpointing_from(value)

    @model_validator(mode="after")
    def _rules(self) -> Training:
        if self.tokens is not None and self.train_steps is not None:
            raise RuleError(
                "train_steps",
                show(self.train_steps),
                "give tokens or train_steps, not both",
                "remove one of them",
            )
        return self


class Simulation(_Strict):
    """How to run: steps to simulate, the random seed, and whether to exploit symmetric ranks."""

    steps: int = Field(1, ge=1, description="training steps (or collective repetitions) to simulate")
    seed: int = Field(0, description="random seed (random stragglers, jitter, overflow probability, "
                      "reliability Monte-Carlo)")
    symmetry: Literal["auto", "on", "off"] = Field(
        "auto", description="simulate identical ranks once; off = every GPU"
    )

    @field_validator("symmetry", mode="before")
    @classmethod
    def _yaml11_bools(cls, value: Any) -> Any:
        """YAML 1.1 readers turn on/off into booleans; take them back."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


# ------------------------------------------------------------------------------------- reliability


class CheckpointPolicy(_Strict):
    """How often and how fast the training state is saved (sets the checkpoint overhead and lost work)."""

    model_config = ConfigDict(**_Strict.model_config, validate_by_name=True, serialize_by_alias=True)

    interval: Literal["auto"] | Annotated[int, Field(ge=1)] = Field(
        "auto", description="training steps between checkpoints, or auto = Young/Daly optimum"
    )
    write_GBps: float = Field(
        gt=0, description="aggregate storage write bandwidth for the checkpoint, GB/s (1e9 bytes)"
    )
    async_: bool = Field(
        False,
        alias="async",
        description="asynchronous checkpoint: training blocks only for the device→host snapshot; the "
        "storage write runs in the background and is lost if a failure strikes before it ends",
    )
    snapshot_GBps: float | None = Field(
        None,
        gt=0,
        description="async: device→host copy bandwidth per GPU, GB/s; default the pcie4 link preset "
        "(31.5 GB/s × 0.8 efficiency)",
    )


class Reliability(_Strict):
    """Failures over the whole run: MTBFs, checkpoints and restarts → goodput and expected time to train."""

    gpu_mtbf_hours: float = Field(gt=0, description="mean time between failures of one GPU, hours")
    node_mtbf_hours: float | None = Field(
        None, gt=0, description="per node (host, PSU, NVSwitch…), hours; null = not counted"
    )
    link_mtbf_hours: float | None = Field(
        None, gt=0, description="per inter-node link (NIC, cable, switch port), hours; null = not counted"
    )
    checkpoint: CheckpointPolicy = Field(description="{interval, write_GBps, async, snapshot_GBps}")
    restart_s: float = Field(ge=0, description="detect + reschedule + reload after a failure, seconds")
    monte_carlo_trials: int = Field(
        200, ge=0, description="seeded Monte-Carlo runs of the whole training (0 = closed forms only)"
    )


# ---------------------------------------------------------------------------------------- scenario


class Scenario(_Strict):
    """A whole scenario: cluster, model, parallel layout, training step and simulation settings."""

    name: str = Field(
        pattern=NAME_PATTERN, max_length=100, description="scenario name; names the results folder"
    )
    description: str = Field("", description="free text")
    cluster: Cluster = Field(description="the hardware")
    model: ModelSpec = Field(
        description="transformer preset name, or a mapping with kind: synthetic|collective|transformer|layers"
    )
    parallel: Parallel | None = Field(
        None, description="parallel layout; required except for collective models"
    )
    training: Training | None = Field(
        None, description="batch, precision, optimizer; required except for collective models"
    )
    simulation: Simulation = Field(Simulation(), description="simulation settings")
    reliability: Reliability | None = Field(
        None, description="failures, checkpoints and restarts over the whole run (goodput); null = none"
    )
    calibration: str | None = Field(
        None,
        description="calibration profile JSON; relative to the scenario's folder, then the working directory",
    )

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        """Defaults known only here, where every section is: a collective's ``ranks`` (all GPUs); a
        transformer's ``attention`` and the gradient-sync overlap (what ``training.kernels`` did)."""
        if not isinstance(data, dict):
            return data
        data = _kernel_defaults(data)
        model, cluster = data.get("model"), data.get("cluster")
        if isinstance(model, dict) and model.get("kind") == "collective" and model.get("ranks") is None:
            if isinstance(cluster, dict) and all(
                type(cluster.get(k)) is int for k in ("nodes", "gpus_per_node")
            ):
                data = {**data, "model": {**model, "ranks": cluster["nodes"] * cluster["gpus_per_node"]}}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value in (".", ".."):
            raise RuleError(
                None, show(value), "not a usable folder name", "use letters and digits, e.g. my-run"
            )
        return value

    @field_validator(
        "model",
        mode="before",
        json_schema_input_type=str | SyntheticModel | CollectiveModel | TransformerModel | LayersModel,
    )
    @classmethod
    def _model(cls, value: Any) -> Any:
        return model_from(value)

    @field_validator("calibration")
    @classmethod
    def _calibration(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        base = (info.context or {}).get("base_dir")
        given = Path(value).expanduser()
        if given.is_absolute():
            candidates = [given]
        else:
            candidates = ([Path(base) / given] if base is not None else []) + [Path.cwd() / given]
        for path in candidates:
            if path.is_file():
                return str(path.resolve())
        where = " or ".join(str(p.parent.resolve()) for p in candidates)
        raise RuleError(
            None,
            show(value),
            f"calibration profile not found (looked in {where})",
            "fix the path, or remove calibration to use the datasheet roofline",
        )

    @model_validator(mode="after")
    def _rules(self) -> Scenario:
        for rule in SCENARIO_RULES:
            rule(self)
        return self

    # -- conveniences for the engine -------------------------------------------------------------

    @property
    def total_gpus(self) -> int:
        return self.cluster.total_gpus

    @property
    def gpu(self) -> GPUSpec:
        return self.cluster.gpu

    @property
    def intra_link(self) -> LinkSpec:
        return self.cluster.intra_node

    @property
    def inter_link(self) -> LinkSpec:
        return self.cluster.inter_node

    @property
    def is_collective(self) -> bool:
        return self.model.kind == "collective"

    @property
    def microbatches(self) -> int:
        """m = global_batch / (data × micro_batch); 0 for collective scenarios without a training section."""
        if self.training is None or self.parallel is None:
            return 0
        return self.training.global_batch // (self.parallel.data * self.training.micro_batch)

    def resolved(self) -> dict[str, Any]:
        """Presets expanded, defaults filled: validates back to an equal Scenario."""
        data = self.model_dump(mode="python")
        for path in OPTIONAL_KEYS:  # absent optional keys stay absent (older resolved files unchanged)
            *parents, key = path
            node = data
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and node.get(key, 0) is None:
                del node[key]
        return data


# Optional keys left out of the resolved form when not given (so resolved files of scenarios that do not
# use them read as before).
OPTIONAL_KEYS = (("reliability",), ("parallel", "stage_layers"), ("parallel", "expert"), ("parallel", "context"),
                 ("parallel", "context_attention"), ("cluster", "jitter"),
                 ("cluster", "random_stragglers"), *(("model", f) for f in MOE_FIELDS))


def _kernel_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """Fill model.attention and parallel.overlap_grad_sync from the kernel set when not given."""
    training = data.get("training")
    name = training.get("kernels", DEFAULT_KERNEL_SET) if isinstance(training, dict) else DEFAULT_KERNEL_SET
    ks = KERNEL_SETS.get(name) if isinstance(name, str) else None
    if ks is None:
        return data  # training.kernels reports its own error
    model = model_from(data.get("model"))
    if isinstance(model, dict) and model.get("kind") == "transformer" and model.get("attention") is None:
        data = {**data, "model": {**model, "attention": ks.attention}}
    parallel = data.get("parallel")
    if isinstance(parallel, dict) and parallel.get("overlap_grad_sync") is None:
        data = {**data, "parallel": {**parallel, "overlap_grad_sync": ks.overlap_grad_reduce}}
    return data


# ------------------------------------------------------------------------------ cross-section rules


def _layout_fix(p: Parallel, n: int) -> str:
    """One change of a single degree that makes data×tensor×pipeline = n, as a --set."""
    if n % (p.tensor * p.pipeline * p.cp) == 0:
        return f"--set parallel.data={n // (p.tensor * p.pipeline * p.cp)}"
    if n % (p.data * p.tensor) == 0:
        return f"--set parallel.pipeline={n // (p.data * p.tensor)}"
    if n % (p.data * p.pipeline) == 0:
        return f"--set parallel.tensor={n // (p.data * p.pipeline)}"
    return f"data: {n}, tensor: 1, pipeline: 1"


def _sections(sc: Scenario) -> None:
    if sc.is_collective:
        return
    examples = {"parallel": f"{{data: {sc.total_gpus}}}", "training": "{global_batch: 8}"}
    for section, example in examples.items():
        if getattr(sc, section) is None:
            raise RuleError(
                section,
                "missing",
                f"a {sc.model.kind} model needs a {section} section",
                f"add {section}: {example}",
            )


def _layout(sc: Scenario) -> None:
    p, c = sc.parallel, sc.cluster
    if p is not None and p.world_size != c.total_gpus:
        raise RuleError(
            "parallel",
            (f"data×tensor×pipeline×context = {p.data}×{p.tensor}×{p.pipeline}×{p.cp} = {p.world_size}"
             if p.cp > 1 else f"data×tensor×pipeline = {p.data}×{p.tensor}×{p.pipeline} = {p.world_size}"),
            f"must equal the GPU count nodes×gpus_per_node = {c.nodes}×{c.gpus_per_node} = {c.total_gpus}",
            f"make the product {c.total_gpus}, e.g. {_layout_fix(p, c.total_gpus)}",
        )


def _stages(sc: Scenario) -> None:
    p, m = sc.parallel, sc.model
    if p is None or isinstance(m, CollectiveModel):
        return
    chunks = p.pipeline * p.virtual_stages
    if m.num_layers < chunks:
        raise RuleError(
            "model.layers",
            f"{m.num_layers} layers",
            f"fewer than pipeline×virtual_stages = {p.pipeline}×{p.virtual_stages} = {chunks} model chunks",
            f"use pipeline ≤ {max(1, m.num_layers // p.virtual_stages)} (adjusting data) or a deeper model",
        )


def _experts(sc: Scenario) -> None:
    p, m = sc.parallel, sc.model
    shared = getattr(m, "shared_experts", None)
    if p is not None and shared and (shared * (m.expert_ffn_hidden or m.ffn_hidden)) % p.tensor:
        raise RuleError("model.shared_experts", show(shared),
                        f"the shared experts' width shared_experts × expert_ffn_hidden must divide by "
                        f"tensor = {p.tensor} (they are split like the dense MLP)", "change tensor or the widths")
    if p is None or p.ep == 1:
        return
    experts = getattr(m, "experts", None)
    if experts is None:
        raise RuleError("parallel.expert", show(p.expert), "expert parallelism needs a mixture-of-experts model",
                        "set model.experts, or remove parallel.expert")
    if experts % p.ep:
        raise RuleError("parallel.expert", show(p.expert), f"must divide model.experts = {experts}",
                        f"use a divisor of {experts}")
    if p.data % p.ep:
        raise RuleError("parallel.expert", show(p.expert),
                        f"expert-parallel GPUs are data-parallel ranks: must divide data = {p.data}",
                        "use a divisor of parallel.data")
    if p.zero == 3:
        raise RuleError("parallel.zero", "3", "ZeRO-3 with expert parallelism is not modelled",
                        "use zero ≤ 2, or expert: 1")


def _context(sc: Scenario) -> None:
    p, m = sc.parallel, sc.model
    if p is None or (p.cp == 1 and p.context_attention is None):
        return
    if p.cp == 1:
        raise RuleError("parallel.context_attention", show(p.context_attention),
                        "applies to context parallelism", "set parallel.context > 1, or remove it")
    if not isinstance(m, TransformerModel):
        raise RuleError("parallel.context", show(p.context), f"splits sequences; a {m.kind} model has none",
                        "use a transformer model, or remove parallel.context")
    if p.ep > 1:
        raise RuleError("parallel.context", show(p.context), "context and expert parallelism together are "
                        "not modelled", "use one of them")
    mb = sc.training.micro_batch if sc.training else 1
    step = p.cp * (p.tensor if p.sequence_parallel and p.tensor > 1 else 1)
    if m.seq_len % p.cp or (m.seq_len // p.cp * mb) % (step // p.cp):
        raise RuleError("model.seq_len", show(m.seq_len),
                        f"context = {p.cp} splits every sequence: seq_len must divide by it (and, with "
                        f"sequence parallelism, seq_len/context × micro_batch by tensor = {p.tensor})",
                        f"use seq_len a multiple of {step}")


def _stage_layers(sc: Scenario) -> None:
    p, m = sc.parallel, sc.model
    if p is None or p.stage_layers is None or isinstance(m, CollectiveModel):
        return
    counts, chunks, n = p.stage_layers, p.pipeline * p.virtual_stages, m.num_layers
    if len(counts) != chunks:
        raise RuleError("parallel.stage_layers", show(counts),
                        f"needs one entry per model chunk: pipeline×virtual_stages = {p.pipeline}×"
                        f"{p.virtual_stages} = {chunks}, not {len(counts)}",
                        f"give {chunks} layer counts, or remove stage_layers for an even split")
    if sum(counts) != n:
        raise RuleError("parallel.stage_layers", show(counts),
                        f"the counts add up to {sum(counts)}, the model has {n} layers",
                        f"make them sum to {n}")
    # The first and last chunks of a transformer also hold the embedding and the head, so they may
    # hold no transformer layer; every other chunk needs one.
    ends = (0, chunks - 1) if isinstance(m, TransformerModel) else ()
    for i, k in enumerate(counts):
        if k == 0 and i not in ends:
            where = "chunks other than the first and last" if ends else "every chunk"
            raise RuleError(f"parallel.stage_layers[{i}]", "0",
                            f"{where} need at least one layer", "move a layer into it")


def _tensor_problem(m: TransformerModel, t: int, sp: bool, micro_batch: int) -> tuple[str, int, str] | None:
    """The first transformer dimension that tensor width ``t`` cannot split, or None.

    kv_heads must divide by t too (Megatron splits key/value groups; replicating them is not modelled)."""
    if m.heads % t:
        return (
            "heads",
            m.heads,
            f"heads must be divisible by tensor = {t} (each tensor rank holds whole heads)",
        )
    if m.kv_heads % t:
        return (
            "kv_heads",
            m.kv_heads,
            f"kv_heads must be divisible by tensor = {t} (each rank holds whole KV groups)",
        )
    if m.ffn_hidden % t:
        return "ffn_hidden", m.ffn_hidden, f"ffn_hidden must be divisible by tensor = {t}"
    if sp and t > 1 and (m.seq_len * micro_batch) % t:
        return (
            "seq_len",
            m.seq_len,
            f"sequence parallelism needs seq_len×micro_batch = {m.seq_len}×{micro_batch} "
            f"divisible by tensor = {t}",
        )
    return None


def _tensor(sc: Scenario) -> None:
    m, p = sc.model, sc.parallel
    if p is None or not isinstance(m, TransformerModel):
        return
    mb = sc.training.micro_batch if sc.training else 1
    problem = _tensor_problem(m, p.tensor, p.sequence_parallel, mb)
    if problem:
        field, value, rule = problem
        n = sc.total_gpus
        ok = [
            t
            for t in range(1, n + 1)
            if n % t == 0 and _tensor_problem(m, t, p.sequence_parallel, mb) is None
        ]
        origin = f" (from {m.name})" if m.name else ""
        raise RuleError(
            f"model.{field}",
            f"{value}{origin}",
            rule,
            f"use parallel.tensor in {ok} and adjust data so data×tensor×pipeline = {n}",
        )


def _batch(sc: Scenario) -> None:
    p, t = sc.parallel, sc.training
    if p is None or t is None:
        return
    step = p.data * t.micro_batch
    if t.global_batch % step:
        low = max(step, t.global_batch // step * step)
        options = f"{low}" if t.global_batch < step else f"{low} or {low + step}"
        raise RuleError(
            "training.global_batch",
            show(t.global_batch),
            f"must be a multiple of data×micro_batch = {p.data}×{t.micro_batch} = {step}",
            f"use global_batch: {options}, or change micro_batch",
        )
    m = t.global_batch // step
    if p.schedule == "interleaved-1f1b" and m % p.pipeline:
        good = step * p.pipeline * math.ceil(m / p.pipeline)
        raise RuleError(
            "training.global_batch",
            show(t.global_batch),
            f"interleaved-1f1b needs the micro-batch count m = global_batch/(data×micro_batch) = {m} "
            f"to be a multiple of pipeline = {p.pipeline}",
            f"use global_batch: {good}, or schedule: 1f1b",
        )


def _precision(sc: Scenario) -> None:
    t, gpu = sc.training, sc.gpu
    if t is None:
        return
    try:
        gpu.peak_flops(t.precision)
    except KeyError:
        have = [d for d in PRECISIONS if d in gpu.peak_tflops or (d == "tf32" and "fp32" in gpu.peak_tflops)]
        fallback = next((d for d in ("bf16", "fp16", "fp32") if d in have), None)
        others = [g for g, spec in GPU_PRESETS.items() if t.precision in spec.peak_tflops]
        alternatives = [f"precision: {fallback}"] * (fallback is not None) + [
            f"cluster.gpu: {g}" for g in others[:1]
        ]
        raise RuleError(
            "training.precision",
            show(t.precision),
            f"GPU {gpu.name} does not support {t.precision} (it supports {', '.join(have) or 'nothing'})",
            f"use {' or '.join(alternatives) or 'a GPU that does'}",
        ) from None


def _tokens(sc: Scenario) -> None:
    t = sc.training
    if t is not None and t.tokens is not None and not isinstance(sc.model, TransformerModel):
        raise RuleError(
            "training.tokens",
            show(t.tokens),
            f"tokens per step need a sequence length, which a {sc.model.kind} model lacks",
            "use train_steps instead",
        )


def _collective(sc: Scenario) -> None:
    m, c = sc.model, sc.cluster
    if not isinstance(m, CollectiveModel):
        return
    if m.ranks > c.total_gpus:
        raise RuleError(
            "model.ranks",
            show(m.ranks),
            f"more ranks than GPUs ({c.nodes}×{c.gpus_per_node} = {c.total_gpus})",
            f"use ranks ≤ {c.total_gpus} (or null for all), or more nodes",
        )
    if m.algorithm in ("hierarchical", "hierarchical_sharp") and m.ranks > c.gpus_per_node and (
        m.ranks % c.gpus_per_node
    ):
        raise RuleError(
            "model.ranks",
            show(m.ranks),
            f"{m.algorithm} needs whole nodes: ranks must be a multiple of gpus_per_node = {c.gpus_per_node}",
            f"use ranks: {m.ranks // c.gpus_per_node * c.gpus_per_node}, or another algorithm",
        )
    if m.algorithm == "nvls" and m.ranks > c.gpus_per_node:
        raise RuleError(
            "model.algorithm",
            show(m.algorithm),
            f"NVLS reduces inside one node's NVSwitch; {m.ranks} ranks span {-(-m.ranks // c.gpus_per_node)} nodes",
            f"use ranks ≤ {c.gpus_per_node}, or algorithm: hierarchical_sharp / auto",
        )
    if m.algorithm == "hierarchical_sharp" and not c.inter_node.sharp:
        raise RuleError(
            "model.algorithm",
            show(m.algorithm),
            f"the inter-node link {c.inter_node.name} does not reduce in the network (hdr, ndr, xdr do)",
            "use inter_node: hdr, or algorithm: hierarchical",
        )
    if m.algorithm == "nvls" and c.intra_node.nvls_efficiency is None:
        raise RuleError(
            "model.algorithm",
            show(m.algorithm),
            f"the intra-node link {c.intra_node.name} has no NVLink SHARP (nvlink4 and nvlink5 do)",
            "use intra_node: nvlink4, or another algorithm",
        )


def _symmetry(sc: Scenario) -> None:
    if sc.simulation.symmetry == "on" and sc.cluster.fixed_stragglers:
        raise RuleError(
            "simulation.symmetry",
            "'on'",
            "stragglers make GPUs differ, so ranks are not symmetric",
            "use symmetry: auto (or off), or remove cluster.stragglers",
        )


def _reliability(sc: Scenario) -> None:
    r, t = sc.reliability, sc.training
    if r is None:
        return
    if sc.is_collective or t is None:
        raise RuleError("reliability", "(given)", "failures and checkpoints apply to training runs",
                        "remove reliability, or simulate a training model")
    if t.tokens is None and t.train_steps is None:
        raise RuleError("reliability", "(given)",
                        "goodput and expected time to train need the run's length",
                        "set training.tokens (transformers) or training.train_steps")


SCENARIO_RULES = (_sections, _layout, _stages, _stage_layers, _experts, _context, _tensor, _batch, _precision, _tokens, _collective, _symmetry,
                  _reliability)
