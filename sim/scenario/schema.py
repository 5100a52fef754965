"""The scenario as typed, strict pydantic models: one class per section, cross-field rules included.

Every model forbids unknown keys and uses strict types (a quoted "4" is not an int), so a typo or a
wrong type is an error, never a silent default. Preset names (GPUs, links, transformer models) are
expanded while validating, so a validated ``Scenario`` holds only concrete values: dumping it gives the
resolved form, which validates back to an equal ``Scenario``. Rules raise ``RuleError`` carrying the
field, the value, the rule and a fix; ``sim.scenario.errors_format`` turns them into one-line messages.

The sections live in their own modules (``base``, ``cluster``, ``model``, ``parallel``, ``training``,
``reliability``) and the cross-section rules in ``rules``; this module assembles the ``Scenario`` and
re-exports every name, so ``from sim.scenario.schema import ...`` keeps working.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from sim.errors import ScenarioError
from sim.hardware.gpu import GPUSpec
from sim.hardware.links import LinkSpec
from sim.paths import NO_SUCH_HOME_FIX, no_such_home, unknown_home
from sim.scenario.base import (
    ALGORITHMS,
    COLLECTIVE_ALGORITHMS,
    COLLECTIVE_OPS,
    DP_ALGORITHMS,
    NAME_PATTERN,
    PRECISIONS,
    RuleError,
    _Strict,
    did_you_mean,
    lookup,
    show,
)
from sim.scenario.cluster import (
    Cluster,
    Jitter,
    RandomStragglers,
    Topology,
    gpu_from,
    link_from,
    stragglers_from,
)
from sim.scenario.model import (
    _DIM_FIELDS,
    INPUT_DEFAULTED,
    MODEL_KINDS,
    MOE_FIELDS,
    PRESET_SUPPLIED,
    CollectiveModel,
    LayersModel,
    LayerSpec,
    ModelSpec,
    SyntheticModel,
    TransformerModel,
    layer_presets,
    model_from,
    model_presets,
    moe_presets,
    parse_size,
)
from sim.scenario.parallel import Parallel
from sim.scenario.reliability import CheckpointPolicy, Reliability
from sim.scenario.rules import SCENARIO_RULES
from sim.scenario.training import Checkpointing, Compression, LossScaling, Training, checkpointing_from
from sim.schedules.actions import SCHEDULES
from sim.workload.kernels import DEFAULT_KERNEL_SET, FUSIONS, KERNEL_SETS

__all__ = [
    "_DIM_FIELDS", "ALGORITHMS", "COLLECTIVE_ALGORITHMS", "COLLECTIVE_OPS", "DP_ALGORITHMS", "INPUT_DEFAULTED",
    "MODEL_KINDS", "MOE_FIELDS", "NAME_PATTERN", "OPTIONAL_KEYS", "PRECISIONS", "PRESET_SUPPLIED", "SCHEDULES",
    "CheckpointPolicy", "Checkpointing", "Cluster", "CollectiveModel", "Compression", "Jitter", "LayerSpec",
    "LayersModel", "LossScaling", "Parallel", "RandomStragglers", "Reliability", "RuleError", "Scenario",
    "Simulation", "SyntheticModel", "Topology", "Training", "TransformerModel", "checkpointing_from",
    "did_you_mean", "gpu_from", "layer_presets", "link_from", "lookup", "model_from", "model_presets",
    "moe_presets", "parse_size", "show", "stragglers_from",
]


class Simulation(_Strict):
    """How to run: steps to simulate, the random seed, and whether to exploit symmetric ranks."""

    steps: int = Field(1, ge=1, description="training steps (or collective repetitions) to simulate")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="random seed (random stragglers, jitter, overflow "
                      "probability, reliability Monte-Carlo); numpy's generators take seeds ≥ 0")
    symmetry: Literal["auto", "on", "off"] = Field(
        "auto", description="simulate identical ranks once (one GPU per pipeline stage); off = every GPU; "
        "auto = on from 16 GPUs, or below that when simulating every GPU would take over ~10⁶ engine events, "
        "off with fixed stragglers"
    )

    @field_validator("symmetry", mode="before")
    @classmethod
    def _yaml11_bools(cls, value: Any) -> Any:
        """YAML 1.1 readers turn on/off into booleans; take them back."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value



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
        if not value.strip():
            raise RuleError(None, show(value), "an empty path",
                            "give the profile's path, or remove calibration to use the datasheet roofline")
        base = (info.context or {}).get("base_dir")
        head = unknown_home(value)
        if head is not None:
            raise RuleError(None, show(value), no_such_home(head), NO_SUCH_HOME_FIX)
        given = Path(value).expanduser()
        if given.is_absolute():
            candidates = [given]
        else:
            candidates = ([Path(base) / given] if base is not None else []) + [Path.cwd() / given]
        for path in candidates:
            if path.is_file():
                return str(path.resolve())
        for path in candidates:
            if path.exists():
                raise RuleError(None, show(value), f"{path} is not a file (a calibration profile is one JSON file)",
                                "give the profile's file, e.g. profiles/h100.json")
        where = " or ".join(dict.fromkeys(str(p.parent.resolve()) for p in candidates))
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

    def require_training(self) -> tuple[Parallel, Training]:
        """The parallel and training sections of a training scenario (every model kind but collective:
        the schema's rules require both, so this only narrows their types; it raises on a collective)."""
        if self.parallel is None or self.training is None:
            missing = "parallel" if self.parallel is None else "training"
            raise ScenarioError(
                f"a {self.model.kind} model has no {missing} section (a training step needs one)", missing
            )
        return self.parallel, self.training

    def resolved(self) -> dict[str, Any]:
        """Presets expanded, defaults filled: validates back to an equal Scenario."""
        data = self.model_dump(mode="python")
        for path in OPTIONAL_KEYS:  # absent optional keys stay absent (older resolved files unchanged)
            *parents, key = path
            node: Any = data
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and node.get(key, 0) is None:
                del node[key]
        tr = self.training
        if tr is not None and tr.precision != "fp8" and "fp8_recipe" not in tr.model_fields_set:
            # Without fp8 the recipe does nothing, and given it earns a note at `dtsim run`
            # (sim.training.step_work.stack_notes): a default must not come back from resolved.yaml as given.
            del data["training"]["fp8_recipe"]
        return data


# Optional keys left out of the resolved form when not given (so resolved files of scenarios that do not
# use them read as before).
OPTIONAL_KEYS = (("reliability",), ("parallel", "stage_layers"), ("parallel", "bucket_MB"), ("parallel", "expert"), ("parallel", "context"),
                 ("parallel", "context_attention"), ("cluster", "jitter"),
                 ("cluster", "random_stragglers"), *(("model", f) for f in MOE_FIELDS))


def _kernel_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """Fill model.attention, parallel.overlap_grad_sync, parallel.scatter_gather and training.fusion's
    switches from the kernel set when not given."""
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
    parallel = data.get("parallel")
    if isinstance(parallel, dict) and parallel.get("scatter_gather") is None:
        data = {**data, "parallel": {**parallel, "scatter_gather": ks.scatter_gather_p2p}}
    parallel = data.get("parallel")
    if ks.bf16_optimizer_shards and isinstance(parallel, dict) and isinstance(training, dict) \
            and training.get("precision", "bf16") == "bf16" and parallel.get("zero", 0) == 0 \
            and isinstance(parallel.get("data", 1), int) and parallel.get("data", 1) > 1 \
            and parallel.get("dp_algorithm") != "parameter_server":
        # DeepSpeed runs bf16 with ZeRO stage 0 in its config through its BF16_Optimizer, which partitions the
        # fp32 master weights and optimizer state over the data-parallel ranks and all-gathers the updated
        # bf16 weights (deepspeed/runtime/engine.py `_configure_optimizer`, runtime/bf16_optimizer.py
        # `update_lp_params`, v0.6.4-0.8; its pipeline engine raises NotImplementedError for bf16 with ZeRO-1):
        # what dtsim calls ZeRO-1, with the full fp32 all-reduce the kernel set already prices.
        data = {**data, "parallel": {**parallel, "zero": 1}}
    fusion = training.get("fusion") if isinstance(training, dict) else None
    if isinstance(training, dict) and (fusion is None or isinstance(fusion, (dict, bool))):
        own = {"bias_gelu": ks.bias_gelu_fusion, "bias_dropout_add": ks.bias_dropout_fusion,
               "masked_softmax": ks.masked_softmax_fusion, "cross_entropy": ks.fused_cross_entropy,
               "gradient_accumulation": ks.gradient_accumulation_fusion}
        # the true/false shorthand switches the kernel fusions, not gradient accumulation (Megatron's own flag)
        given = (dict.fromkeys(FUSIONS, fusion) if isinstance(fusion, bool)
                 else {k: v for k, v in (fusion or {}).items() if v is not None})
        data = {**data, "training": {**training, "fusion": {**own, **given}}}
    return data

