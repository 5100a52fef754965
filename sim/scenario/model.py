"""The model section: synthetic layers, one collective, a transformer (preset, dimensions or HF config),
or a layer list."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from sim.scenario.base import (
    ALGORITHMS,
    COLLECTIVE_ALGORITHMS,
    COLLECTIVE_OPS,
    MAX_BYTES,
    MAX_EXPERTS,
    MAX_FLOPS,
    MAX_OP_MS,
    MAX_PARAMS,
    RuleError,
    _as_dict,
    _Strict,
    _strip_none,
    lookup,
    show,
)
from sim.units import DTYPE_BYTES, GiB, KiB, MiB
from sim.workload import layers as layer_models
from sim.workload.hf_config import HFConfigError, read_hf_config
from sim.workload.kernels import ATTENTION_KINDS
from sim.workload.model_presets import MODEL_PRESETS, MOE_PRESETS
from sim.workload.moe import MoESpec
from sim.workload.transformer import TransformerDims


def model_presets() -> dict[str, Any]:
    """The transformer presets (sim/workload/model_presets.py) by name."""
    return dict(MODEL_PRESETS)


def moe_presets() -> dict[str, dict[str, Any]]:
    """MoE fields of the mixture-of-experts presets."""
    return dict(MOE_PRESETS)


def layer_presets() -> dict[str, Any]:
    """Layer-list presets (resnet50, …) → a function giving their layers."""
    return {name: (lambda n=name: layer_models.cnn_preset(n)) for name in layer_models.CNN_PRESETS}


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
    """ "1GiB", "256MB", "1.5 KB", 4096, 6.8e9 → bytes (int); units are bytes (B), decimal (KB) or binary
    (KiB). A float is taken when it is a whole number of bytes (``--set`` and YAML give 6.8e9 as one)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RuleError(None, show(value), "not a finite size", "write e.g. 256MB")
        if value != int(value):
            raise RuleError(None, show(value), "not a whole number of bytes",
                            f"write a whole number or a size with a unit, e.g. {round(value)} or '1.5GB'")
        return int(value)
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

    @field_validator("size_bytes", mode="before",
                     json_schema_input_type=int | float | str | list[int | float | str])
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
    mlp: Literal["gelu", "swiglu", "squared_relu"] = Field(
        "gelu", description="MLP type: gelu, swiglu (three weight matrices) or squared_relu (Nemotron's relu(x)², "
        "two matrices, one compiled activation kernel each way)")
    bias: bool = Field(True, description="linear layers have biases (GPT-3: yes; Llama: no)")
    norm: Literal["layernorm", "rmsnorm"] = Field("layernorm", description="normalisation layer")
    position: Literal["learned", "rope", "alibi"] = Field(
        "learned", description="position embedding: learned (a seq_len × hidden table), rope (rotary: no "
        "weights) or alibi (a bias on the attention scores, no weights; BLOOM, MPT)")
    tied_embeddings: bool = Field(True, description="output projection shares the embedding weights")
    dropout: float = Field(
        0.1, ge=0.0, lt=1.0, description="hidden and attention dropout probability (Megatron's default 0.1; "
        "Llama and MPT train without: 0). With 0 no dropout kernel runs (PyTorch launches none for p = 0)",
    )
    attention: Literal[ATTENTION_KINDS] = Field(  # type: ignore[valid-type]
        "flash",
        description="flash: one fused kernel, softmax scores never stored; standard: batched GEMMs around "
        "a softmax (and dropout) kernel over the b·heads·s² scores, kept for backward (Korthikanti et "
        "al.'s 5as/h activation term); default: what training.kernels used",
    )
    experts: int | None = Field(
        None, ge=1, le=MAX_EXPERTS, description="mixture of experts: routed experts per layer (null = dense MLP)"
    )
    top_k: int | None = Field(None, ge=1, le=MAX_EXPERTS, description="MoE: experts each token uses; default 2")
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
        None, ge=1, le=MAX_EXPERTS, description="MoE: shared experts every token uses (width expert_ffn_hidden each), run "
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
        """The workload's ``MoESpec``, or None for a dense model."""
        if self.experts is None:
            return None
        return MoESpec(experts=self.experts, top_k=self.top_k or 2,
                       ffn_hidden=self.expert_ffn_hidden or self.ffn_hidden,
                       capacity_factor=self.capacity_factor, load_imbalance=self.load_imbalance or 1.0,
                       shared=self.shared_experts or 0)

    def to_dims(self) -> Any:
        """The workload's ``TransformerDims`` for this model."""
        return TransformerDims(**{f: getattr(self, f) for f in _DIM_FIELDS})


MOE_FIELDS = ("experts", "top_k", "expert_ffn_hidden", "capacity_factor", "load_imbalance", "shared_experts")
_DIM_FIELDS = tuple(
    f for f in TransformerModel.model_fields
    if f not in ("kind", "preset", "hf_config", "name", "attention", *MOE_FIELDS)
)


def _from_hf_config(data: dict[str, Any], base: Any) -> dict[str, Any]:
    """``hf_config: path`` → the file's dimensions, under the keys given beside it."""
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
    input_bytes: float | None = Field(
        None, ge=0, le=MAX_BYTES, description="the layer's input bytes per sample at 16-bit: what full "
        "checkpointing keeps; default 2·in_features for a linear layer, else activation_bytes (no saving)"
    )

    @model_validator(mode="after")
    def _shape(self) -> LayerSpec:
        if (self.in_features is None) != (self.out_features is None):
            raise RuleError(
                "in_features", show(self.in_features), "give both in_features and out_features or neither",
                "add the missing one",
            )
        if self.in_features is not None and self.out_features is not None:
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
                    given = data["layers"]
                    what = f"{len(given)} layer(s)" if isinstance(given, list) else show(given)
                    raise RuleError(
                        "layers", f"{what} beside preset {show(data['preset'])}",
                        "give either preset or layers, not both (the preset supplies the layers)",
                        "remove one of them",
                    )
                layers = [_as_dict(x) for x in presets[key]()]
                data = {"name": key, **{k: v for k, v in data.items() if k != "preset"}, "layers": layers}
        return data

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def to_layers(self) -> list[Any]:
        """The workload's ``GenericLayer`` list for this model."""
        return [layer_models.GenericLayer(**{k: v for k, v in layer.model_dump().items() if v is not None})
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

