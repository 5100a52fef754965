"""Scenario loading: defaults, presets, overrides, the resolved round trip and the JSON Schema."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from sim.hardware.gpu import GPU_PRESETS
from sim.hardware.links import INTER_PRESETS, INTRA_PRESETS
from sim.scenario import (
    COLLECTIVE_ALGORITHMS,
    CollectiveModel,
    LayersModel,
    Scenario,
    SyntheticModel,
    TransformerModel,
    apply_overrides,
    dump_resolved,
    json_schema,
    load_scenario,
    scenario_from_dict,
)
from sim.scenario import model as scenario_model
from sim.scenario.load import StrictLoader
from sim.scenario.schema import parse_size

SEED = """
name: seed-pipeline
cluster:
  nodes: 1
  gpus_per_node: 4
  gpu: A100-80GB
model:
  kind: synthetic
  layers: 8
  forward_ms: 1.0
parallel:
  pipeline: 4
  schedule: gpipe
training:
  global_batch: 8
"""


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@dataclass(frozen=True)
class StubDims:
    """Stands in for sim.workload.transformer.TransformerDims, so these tests don't depend on the presets."""

    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    kv_heads: int | None = None
    mlp: str = "gelu"


@pytest.fixture
def stub_presets(monkeypatch):
    presets = {
        "tiny-gpt": StubDims(layers=8, hidden=256, heads=8, ffn_hidden=1024, vocab=1000, seq_len=128),
        "tiny-llama": StubDims(4, 256, 8, 688, 1000, 256, kv_heads=2, mlp="swiglu"),
    }
    monkeypatch.setattr(scenario_model, "MODEL_PRESETS", presets)
    monkeypatch.setattr(scenario_model, "MOE_PRESETS", {})
    return presets


# ------------------------------------------------------------------------------------------ loading


def test_seed_defaults(tmp_path: Path):
    sc = load_scenario(write(tmp_path, SEED))
    assert isinstance(sc.model, SyntheticModel)
    assert sc.model.backward_ms == 2.0  # default 2×forward
    assert sc.gpu == GPU_PRESETS["A100-80GB"]
    assert sc.intra_link == INTRA_PRESETS["nvlink3"]  # the GPU's nvlink
    assert sc.inter_link == INTER_PRESETS["hdr"]
    assert sc.cluster.nics_per_node == 4  # = gpus_per_node
    assert sc.cluster.topology.kind == "fat-tree" and sc.cluster.topology.nodes_per_leaf == 16
    assert sc.total_gpus == 4 and sc.microbatches == 8
    assert sc.parallel.schedule == "gpipe" and sc.parallel.data == 1
    assert sc.training.precision == "bf16" and sc.training.loss_scaling.kind == "none"
    assert sc.simulation.symmetry == "auto" and sc.calibration is None
    assert not sc.is_collective


def test_scenario_is_frozen(tmp_path: Path):
    sc = load_scenario(write(tmp_path, SEED))
    with pytest.raises(ValidationError):
        sc.parallel.data = 2  # type: ignore[misc]


def test_loading_writes_nothing(tmp_path: Path):
    path = write(tmp_path, SEED)
    before = sorted(tmp_path.rglob("*"))
    load_scenario(path, ["parallel.data=1"])
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    "name, canonical", [("a100-80gb", "A100-80GB"), ("H100", "H100-SXM"), ("h200-sxm", "H200")]
)
def test_gpu_names_case_insensitive_and_aliases(name: str, canonical: str):
    d = yaml.safe_load(SEED)
    d["cluster"]["gpu"] = name
    assert scenario_from_dict(d).gpu.name == canonical


def test_inline_gpu_and_links():
    d = yaml.safe_load(SEED)
    d["cluster"]["gpu"] = {
        "name": "toy",
        "peak_tflops": {"fp32": 10, "bf16": 100},
        "memory_GB": 16,
        "memory_bandwidth_GBps": 500,
    }
    d["cluster"]["inter_node"] = {"bandwidth_Gbps": 100, "latency_us": 3}
    sc = scenario_from_dict(d)
    assert sc.gpu.name == "toy" and sc.gpu.nvlink is None
    assert sc.intra_link == INTRA_PRESETS["pcie4"]  # no nvlink on the GPU
    assert sc.inter_link.rate_Bps == pytest.approx(12.5e9)


def test_stragglers_map_and_list():
    d = yaml.safe_load(SEED)
    d["cluster"]["stragglers"] = [{"gpu": 3, "factor": 1.5}, {"gpu": 0, "factor": 2}]
    assert scenario_from_dict(d).cluster.stragglers == {3: 1.5, 0: 2.0}
    d["cluster"]["stragglers"] = {"3": 1.5}  # JSON-style keys
    assert scenario_from_dict(d).cluster.stragglers == {3: 1.5}


def test_yaml12_scalars(tmp_path: Path):
    """`off` stays a string (not False) and `3e11` is a float (PyYAML's YAML 1.1 reads it as a string)."""
    text = (
        SEED.replace("  global_batch: 8", "  global_batch: 8\n  train_steps: 100")
        + "simulation: {symmetry: off}\n"
    )
    sc = load_scenario(write(tmp_path, text))
    assert sc.simulation.symmetry == "off"
    d = yaml.safe_load(SEED)
    d["simulation"] = {"symmetry": False}  # a YAML 1.1 reader's view of `off`
    assert scenario_from_dict(d).simulation.symmetry == "off"


def test_exponent_floats(tmp_path: Path, stub_presets):
    text = SEED.replace("model:\n  kind: synthetic\n  layers: 8\n  forward_ms: 1.0", "model: tiny-gpt")
    text = text.replace("  global_batch: 8", "  global_batch: 8\n  tokens: 3e11")
    assert load_scenario(write(tmp_path, text)).training.tokens == 3e11


def test_training_forms():
    d = yaml.safe_load(SEED)
    d["training"].update(
        loss_scaling="dynamic",
        checkpointing={"every": 2},
        optimizer="sgd",
        gradient_compression={"kind": "topk", "ratio": 0.01},
    )
    t = scenario_from_dict(d).training
    assert t.loss_scaling.kind == "dynamic" and t.loss_scaling.init_scale == 65536
    assert (t.checkpointing.kind, t.checkpointing.every) == ("full", 2)
    assert t.gradient_compression.ratio == 0.01
    d["training"].update(
        loss_scaling={"kind": "static", "overflow_steps": [5, 2, 5]}, checkpointing="selective"
    )
    t = scenario_from_dict(d).training
    assert t.loss_scaling.overflow_steps == [2, 5] and t.checkpointing.kind == "selective"


def test_interleaved_ok():
    d = yaml.safe_load(SEED)
    d["parallel"].update(schedule="interleaved-1f1b", virtual_stages=2)
    sc = scenario_from_dict(d)
    assert sc.parallel.virtual_stages == 2 and sc.microbatches % sc.parallel.pipeline == 0


# ------------------------------------------------------------------------------------------- models


def test_transformer_preset_expanded(stub_presets):
    d = yaml.safe_load(SEED)
    d["model"] = "TINY-LLAMA"
    sc = scenario_from_dict(d)
    m = sc.model
    assert isinstance(m, TransformerModel)
    assert (m.name, m.layers, m.hidden, m.kv_heads, m.ffn_hidden, m.mlp) == (
        "tiny-llama",
        4,
        256,
        2,
        688,
        "swiglu",
    )
    assert m.head_dim == 32 and m.tied_embeddings


def test_transformer_preset_with_overrides_and_defaults(stub_presets):
    d = yaml.safe_load(SEED)
    d["model"] = {"kind": "transformer", "preset": "tiny-gpt", "layers": 4, "seq_len": 64}
    m = scenario_from_dict(d).model
    assert (m.name, m.layers, m.seq_len, m.hidden, m.kv_heads) == ("tiny-gpt", 4, 64, 256, 8)
    assert "preset" not in scenario_from_dict(d).resolved()["model"]
    d["model"] = {"kind": "transformer", "layers": 4, "hidden": 64, "heads": 4, "vocab": 10, "seq_len": 8}
    m = scenario_from_dict(d).model
    assert m.ffn_hidden == 256 and m.kv_heads == 4 and m.name is None


def test_real_presets_match_the_workload():
    presets = pytest.importorskip("sim.workload.model_presets").MODEL_PRESETS
    d = yaml.safe_load(SEED)
    d["cluster"]["gpus_per_node"] = 8
    d["parallel"] = {"tensor": 8}
    for name, dims in presets.items():
        d["model"] = name
        m = scenario_from_dict(d).model
        got = m.to_dims()
        for field in (
            "layers",
            "hidden",
            "heads",
            "ffn_hidden",
            "vocab",
            "seq_len",
            "mlp",
            "bias",
            "norm",
            "position",
            "tied_embeddings",
            "n_kv_heads",
        ):
            assert getattr(got, field) == getattr(dims, field), (name, field)


def test_collective_model():
    d = {
        "name": "ar",
        "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "H100"},
        "model": {"kind": "collective", "op": "all_reduce", "size_bytes": ["256MB", "1GiB", 4096]},
    }
    sc = scenario_from_dict(d)
    m = sc.model
    assert isinstance(m, CollectiveModel) and sc.is_collective
    assert m.size_bytes == [256_000_000, 2**30, 4096]
    assert (m.algorithm, m.ranks, m.channels, m.dtype, m.iterations) == ("ring", 16, None, "bf16", 1)
    assert sc.parallel is None and sc.training is None and sc.microbatches == 0
    d["model"] = {"kind": "collective", "op": "broadcast", "size_bytes": "1 MiB", "ranks": 4}
    m = scenario_from_dict(d).model
    assert (m.algorithm, m.size_bytes, m.ranks) == ("chain", [2**20], 4)


@pytest.mark.parametrize(
    "text, size",
    [("1GiB", 2**30), ("256MB", 256 * 10**6), ("1.5 KB", 1500), ("4096", 4096), ("1_024B", 1024), (512, 512),
     (6.8e9, 6_800_000_000)],
)
def test_parse_size(text, size):
    got = parse_size(text)
    assert got == size and type(got) is int


def test_every_algorithm_the_schema_accepts_builds_transfers():
    """The schema takes its algorithm names from the engine's registry: each one builds a non-empty run."""
    from sim.engine.collective_algorithms import build

    for op, algs in COLLECTIVE_ALGORITHMS.items():
        for alg in algs:
            rbn = [[0, 1, 2, 3]] if alg == "nvls" else [[0, 1], [2, 3]]
            assert build(op, alg, 4, 4096.0, ranks_by_node=rbn).n > 0, (op, alg)


def test_layers_model():
    d = yaml.safe_load(SEED)
    d["model"] = {
        "kind": "layers",
        "layers": [
            {"name": f"l{i}", "params": 1000, "forward_flops": 1e6, "activation_bytes": 2e3} for i in range(4)
        ],
    }
    m = scenario_from_dict(d).model
    assert isinstance(m, LayersModel) and m.num_layers == 4


def test_layers_preset():
    layers = pytest.importorskip("sim.workload.layers")
    d = yaml.safe_load(SEED)
    d["model"] = {"kind": "layers", "preset": "ResNet50"}
    d["parallel"] = {"data": 4}
    m = scenario_from_dict(d).model
    assert m.name == "resnet50"
    assert [x.name for x in m.to_layers()] == [x.name for x in layers.cnn_preset("resnet50")]
    assert m.to_layers() == layers.cnn_preset("resnet50")


# ---------------------------------------------------------------------------------------- overrides


def test_overrides(tmp_path: Path):
    path = write(tmp_path, SEED.replace("gpus_per_node: 4", "gpus_per_node: 8"))
    sc = load_scenario(
        path,
        [
            "parallel.data=2",
            "cluster.inter_node=ndr",
            "training.global_batch=16",
            "cluster.stragglers.3=1.5",
            "simulation.symmetry=off",
        ],
    )
    assert sc.parallel.data == 2 and sc.inter_link.name == "ndr" and sc.training.global_batch == 16
    assert sc.cluster.stragglers == {3: 1.5} and sc.simulation.symmetry == "off"


def test_override_collective_sizes(tmp_path: Path):
    text = (
        "name: c\ncluster: {nodes: 1, gpus_per_node: 8, gpu: H100}\n"
        "model: {kind: collective, op: all_reduce, size_bytes: 1GiB}\n"
    )
    sc = load_scenario(write(tmp_path, text), ["model.size_bytes=[1024, 2048]", "model.algorithm=tree"])
    assert sc.model.size_bytes == [1024, 2048] and sc.model.algorithm == "tree"


def test_override_inside_presets(stub_presets):
    d = yaml.safe_load(SEED)
    d["model"] = "tiny-gpt"
    out, _ = apply_overrides(
        d,
        [
            "model.layers=4",
            "cluster.gpu.memory_GB=40",
            "cluster.intra_node.latency_us=1",
            "training.loss_scaling.growth_interval=100",
            "training.checkpointing.every=4",
        ],
    )
    assert d["model"] == "tiny-gpt" and d["cluster"]["gpu"] == "A100-80GB"  # the input is not touched
    sc = scenario_from_dict(out)
    assert (sc.model.name, sc.model.layers, sc.model.hidden) == ("tiny-gpt", 4, 256)
    assert sc.gpu.memory_GB == 40 and sc.gpu.name == "A100-80GB" and sc.gpu.sm_count == 108
    assert sc.intra_link.latency_us == 1 and sc.intra_link.bandwidth_GBps == 300
    assert sc.training.loss_scaling.growth_interval == 100
    assert (sc.training.checkpointing.kind, sc.training.checkpointing.every) == ("full", 4)


def test_override_creates_sections():
    d = yaml.safe_load(SEED)
    del d["training"]
    out, origins = apply_overrides(d, ["training.global_batch=4", "training.micro_batch=2"])
    sc = scenario_from_dict(out)
    assert sc.training.global_batch == 4 and sc.microbatches == 2
    assert origins == {
        "training.global_batch": "--set training.global_batch=4",
        "training.micro_batch": "--set training.micro_batch=2",
    }


def test_override_later_wins():
    d = yaml.safe_load(SEED)
    out, _ = apply_overrides(d, ["simulation.steps=2", "simulation.steps=5"])
    assert scenario_from_dict(out).simulation.steps == 5


# ---------------------------------------------------------------------------------------- round trip

ROUND_TRIP = {
    "seed": SEED,
    "everything": """
name: everything.v1
description: "all the knobs"
cluster:
  nodes: 4
  gpus_per_node: 8
  gpu: h100
  intra_node: nvlink4
  inter_node: {name: my-ib, bandwidth_Gbps: 400, latency_us: 4, efficiency: 0.9}
  nics_per_node: 4
  topology: {kind: fat-tree, oversubscription: 2.0, nodes_per_leaf: 2}
  stragglers: [{gpu: 31, factor: 1.25}]
model: {kind: transformer, layers: 16, hidden: 1024, heads: 16, kv_heads: 4, vocab: 32000, seq_len: 2048,
        mlp: swiglu,
        tied_embeddings: false, bias: false, norm: rmsnorm, position: rope}
parallel: {data: 2, tensor: 4, pipeline: 4, schedule: interleaved-1f1b, virtual_stages: 2,
           sequence_parallel: true, zero: 1, bucket_MB: 40.5, overlap_grad_sync: false}
training:
  global_batch: 64
  micro_batch: 2
  precision: fp8
  loss_scaling: {kind: dynamic, overflow_probability: 0.001, growth_interval: 1000}
  checkpointing: selective
  optimizer: adamw
  gradient_compression: {kind: topk, ratio: 0.1}
  tokens: 1.0e12
simulation: {steps: 3, seed: 42, symmetry: "off"}
""",
    "collective": """
name: ar-sweep
cluster: {nodes: 2, gpus_per_node: 8, gpu: B200, topology: single-switch}
model: {kind: collective, op: all_reduce, size_bytes: [1MiB, 64MiB, 1GiB], algorithm: hierarchical,
        channels: 4,
        dtype: fp32, iterations: 5}
""",
    "layers": """
name: mlp
cluster: {nodes: 1, gpus_per_node: 2, gpu: V100}
model: {kind: layers, layers: [{name: fc1, params: 100, forward_flops: 200, activation_bytes: 8},
                               {name: fc2, params: 100, forward_flops: 200.5, activation_bytes: 8}]}
parallel: {pipeline: 2}
training: {global_batch: 4, precision: fp16, loss_scaling: {kind: static, overflow_steps: [1, 3]},
           train_steps: 10}
""",
}


@pytest.mark.parametrize("key", list(ROUND_TRIP))
def test_round_trip(tmp_path: Path, key: str):
    calib = tmp_path / "profile.json"
    calib.write_text("{}")
    text = ROUND_TRIP[key] + ("calibration: profile.json\n" if key == "seed" else "")
    sc = load_scenario(write(tmp_path, text))
    dumped = dump_resolved(sc)
    again = scenario_from_dict(yaml.safe_load(dumped))
    assert again == sc
    assert dump_resolved(again) == dumped  # idempotent
    # the resolved file loads back from anywhere, with our own loader too
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert load_scenario(write(other, dumped, "resolved.yaml")) == sc
    resolved = sc.resolved()
    assert isinstance(resolved["cluster"]["gpu"], dict) and isinstance(
        resolved["cluster"]["intra_node"], dict
    )
    if key == "seed":
        assert resolved["calibration"] == str(calib.resolve())


def test_round_trip_transformer_preset(stub_presets):
    d = yaml.safe_load(SEED)
    d["model"] = "tiny-llama"
    sc = scenario_from_dict(d)
    resolved = yaml.safe_load(dump_resolved(sc))
    assert resolved["model"]["kind"] == "transformer" and resolved["model"]["name"] == "tiny-llama"
    assert resolved["cluster"]["gpu"]["name"] == "A100-80GB"
    assert scenario_from_dict(resolved) == sc


def test_calibration_lookup(tmp_path: Path, monkeypatch):
    scen_dir, cwd = tmp_path / "scen", tmp_path / "cwd"
    scen_dir.mkdir()
    cwd.mkdir()
    (cwd / "p.json").write_text("{}")
    monkeypatch.chdir(cwd)
    sc = load_scenario(write(scen_dir, SEED + "calibration: p.json\n"))  # not next to the file: the cwd
    assert sc.calibration == str((cwd / "p.json").resolve())
    (scen_dir / "p.json").write_text("{}")
    sc = load_scenario(write(scen_dir, SEED + "calibration: p.json\n"))  # the file's folder wins
    assert sc.calibration == str((scen_dir / "p.json").resolve())


# ------------------------------------------------------------------------------------------- schema


def test_json_schema():
    schema = json_schema()
    json.dumps(schema)
    assert schema["$schema"].startswith("https://json-schema.org/")
    props = schema["properties"]
    assert {"name", "cluster", "model", "parallel", "training", "simulation", "calibration"} <= set(props)
    assert set(schema["required"]) == {"name", "cluster", "model"}
    defs = schema["$defs"]
    for name in ("Cluster", "Parallel", "Training", "SyntheticModel", "CollectiveModel", "TransformerModel"):
        assert defs[name]["additionalProperties"] is False, name
        assert all("description" in p for p in defs[name]["properties"].values()), name
    gpu = json.dumps(defs["Cluster"]["properties"]["gpu"])
    assert "A100-80GB" in gpu and "GPUSpec" in gpu  # a preset name or an inline mapping
    assert "gpipe" in json.dumps(defs["Parallel"]["properties"]["schedule"])
    assert "1GiB" in defs["CollectiveModel"]["properties"]["size_bytes"]["description"]


def test_json_schema_lists_model_presets(stub_presets):
    model = json.dumps(json_schema()["properties"]["model"])
    assert "tiny-gpt" in model and "tiny-llama" in model


def test_schema_validates_the_examples():
    """The JSON Schema accepts what the loader accepts (checked with jsonschema when installed)."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema()
    for text in ROUND_TRIP.values():
        jsonschema.validate(yaml.load(text, Loader=StrictLoader), schema)  # YAML 1.2, as editors read it
    d = yaml.safe_load(SEED)
    d["model"] = {"kind": "transformer", "preset": "gpt3-175b", "layers": 8}
    jsonschema.validate(d, schema)
    d["model"] = {"kind": "transformer", "layers": 8}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(d, schema)


def test_scenario_class_is_the_public_type(tmp_path: Path):
    assert isinstance(load_scenario(write(tmp_path, SEED)), Scenario)


def test_validation_does_not_touch_its_input(stub_presets):
    d = yaml.safe_load(SEED)
    d["model"] = {"kind": "transformer", "preset": "tiny-gpt"}
    d["cluster"]["stragglers"] = [{"gpu": 1, "factor": 2.0}]
    before = json.dumps(d, sort_keys=True)
    scenario_from_dict(d)
    assert json.dumps(d, sort_keys=True) == before


SHIPPED = sorted((Path(__file__).parent.parent / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_scenarios_round_trip(path: Path):
    sc = load_scenario(path)
    assert scenario_from_dict(yaml.safe_load(dump_resolved(sc))) == sc
