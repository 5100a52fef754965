"""Bad scenarios: every one is a ScenarioError with ONE line naming the field, the value, the rule and a fix.

Each file in tests/data/bad/ starts with ``# expect: <substring of the message>``; optional ``# set: a.b=V``
lines are --set overrides applied when loading it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sim.errors import ScenarioError
from sim.scenario import load_scenario, scenario_from_dict
from sim.scenario.load import MAX_FILE_BYTES, apply_overrides, parse_override

BAD = Path(__file__).parent / "data" / "bad"
BAD_FILES = sorted(BAD.glob("*.yaml"))
# field: value — rule; fix   (the field may be "--set a.b" or "scenario" for file-level problems)
ONE_LINE = re.compile(r"^[^\n]+?: [^\n]+ — [^\n]+; [^\n]+$")


def _header(path: Path) -> tuple[str, list[str]]:
    """(expected substring, --set overrides) from the file's leading comment lines."""
    expect, sets = None, []
    for raw in path.read_bytes().split(b"\n"):
        line = raw.decode("utf-8", errors="replace")
        if not line.startswith("#"):
            break
        key, _, value = line[1:].strip().partition(":")
        if key == "expect":
            expect = value.strip()
        elif key == "set":
            sets.append(value.strip())
    assert expect, f"{path.name} has no '# expect:' line"
    return expect, sets


def _check(err: ScenarioError, expect: str | None = None) -> str:
    text = str(err)
    assert "\n" not in text and "\r" not in text, text
    assert err.field and text.startswith(err.field + ": "), text
    assert ONE_LINE.match(text), f"not 'field: value — rule; fix': {text}"
    if expect is not None:
        assert expect in text, f"expected {expect!r} in {text!r}"
    return text


def test_enough_bad_files():
    assert len(BAD_FILES) >= 15


@pytest.mark.parametrize("path", BAD_FILES, ids=[p.stem for p in BAD_FILES])
def test_bad_file(path: Path):
    expect, sets = _header(path)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, sets)
    _check(info.value, expect)


def test_missing_file(tmp_path: Path):
    with pytest.raises(ScenarioError) as info:
        load_scenario(tmp_path / "nope.yaml")
    assert "no such file" in _check(info.value)
    assert info.value.field == "scenario"


def test_directory(tmp_path: Path):
    with pytest.raises(ScenarioError) as info:
        load_scenario(tmp_path)
    assert "is a directory" in _check(info.value)


def test_too_large(tmp_path: Path):
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "# padding\n" * (MAX_FILE_BYTES // 10 + 1))
    with pytest.raises(ScenarioError) as info:
        load_scenario(big)
    assert "limit" in _check(info.value)


@pytest.mark.parametrize(
    "text, expect",
    [
        ("a: &a [*a]\n", "recursive"),
        ("---\nname: a\n---\nname: b\n", "not valid YAML"),
        ("[" * 5000 + "]" * 5000, "nested too deeply"),
        ("name: !!python/object:os.system x\n", "not valid YAML"),
        ("name: x\n\tcluster: 1\n", "not valid YAML"),
        ("just a string\n", "the top level is a str"),
    ],
    ids=["recursive-alias", "two-documents", "deep-nesting", "python-tag", "tab-indent", "scalar-top"],
)
def test_unreadable_yaml(tmp_path: Path, text: str, expect: str):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert expect in _check(info.value)


def test_many_aliases(tmp_path: Path):
    path = tmp_path / "s.yaml"
    path.write_text("a: &a 1\nb: [" + ", ".join(["*a"] * 500) + "]\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert "alias uses" in _check(info.value)


def test_few_aliases_are_fine(tmp_path: Path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: aliases\n"
        "cluster: {nodes: 1, gpus_per_node: &n 4, gpu: A100-80GB}\n"
        "model: {kind: synthetic, layers: 8, forward_ms: 1.0}\n"
        "parallel: {data: *n}\n"
        "training: {global_batch: 8}\n"
    )
    assert load_scenario(path).parallel.data == 4


BASE = {
    "name": "base",
    "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "A100-80GB"},
    "model": {"kind": "synthetic", "layers": 8, "forward_ms": 1.0},
    "parallel": {"pipeline": 4},
    "training": {"global_batch": 8},
}


@pytest.mark.parametrize(
    "setting, expect",
    [
        ("paralel.data=4", "did you mean 'parallel'?"),
        ("parallel.dta=4", "did you mean 'data'?"),
        ("parallel.data.x=4", "parallel.data is a single value"),
        ("parallel.data", "expected a.b.c=VALUE"),
        ("=4", "expected a.b.c=VALUE"),
        ("parallel..data=4", "expected a.b.c=VALUE"),
        ("parallel.data=[1, 2", "not valid YAML"),
        ("model.forward_mss=4", "did you mean 'forward_ms'?"),
        ("model.hidden=4", "unknown key in model; allowed keys: kind, layers, forward_ms"),
        ("cluster.gpu.memory_gb=40", "did you mean 'memory_GB'?"),
        ("cluster.gpu.foo.bar=1", "unknown key in cluster.gpu"),
        ("cluster.gpu=A100-80", "did you mean 'A100-80GB'?"),
        ("cluster.gpu.memory_GB=-1", "must be > 0"),
        ("parallel.data=4", "data×tensor×pipeline = 4×1×4 = 16"),
        ("parallel.data='4'", "remove the quotes"),
    ],
)
def test_bad_override(setting: str, expect: str):
    with pytest.raises(ScenarioError) as info:
        data, origins = apply_overrides(BASE, [setting])
        scenario_from_dict(data, origins=origins)
    text = _check(info.value, expect)
    if "=" in setting and setting.split("=")[0].strip() and ".." not in setting:
        assert setting.split("=")[0] in text  # the line points at the --set


def test_override_error_names_the_setting():
    data, origins = apply_overrides(BASE, ["training.micro_batch=0"])
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data, origins=origins)
    assert "(from --set training.micro_batch=0)" in _check(info.value)


def test_override_error_lists_settings_in_effect():
    data, origins = apply_overrides(BASE, ["training.micro_batch=3", "simulation.steps=2"])
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data, origins=origins)
    assert "(with --set training.micro_batch=3, --set simulation.steps=2)" in _check(info.value)


def test_unknown_gpu_preset_override_into_preset():
    with pytest.raises(ScenarioError) as info:
        apply_overrides({**BASE, "cluster": {**BASE["cluster"], "gpu": "X100"}}, ["cluster.gpu.memory_GB=40"])
    assert "unknown GPU preset" in _check(info.value)


def test_list_index_out_of_range():
    d = {**BASE, "model": {"kind": "collective", "op": "all_reduce", "size_bytes": [1024]}}
    with pytest.raises(ScenarioError) as info:
        apply_overrides(d, ["model.size_bytes.3=2048"])
    assert "no item 3" in _check(info.value)


def test_parse_override_values():
    assert parse_override("a.b.c=4") == (["a", "b", "c"], 4)
    assert parse_override("x=[1024, 2048]") == (["x"], [1024, 2048])
    assert parse_override("x=ndr") == (["x"], "ndr")
    assert parse_override("x=off") == (["x"], "off")  # YAML 1.2: not a boolean
    assert parse_override("x=1e9") == (["x"], 1e9)
    assert parse_override("x={3: 1.5}") == (["x"], {3: 1.5})
    assert parse_override("x.3=2") == (["x", 3], 2)
    assert parse_override("x=") == (["x"], None)


def _with(**sections) -> dict:
    d = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(d.get(key), dict) and key != "model":
            d[key] = {**d[key], **value}
        else:
            d[key] = value
    return d


@pytest.mark.parametrize(
    "d, expect",
    [
        (_with(cluster={"gpu": {"peak_tflops": {"bf16": 100}}}), "cluster.gpu.memory_GB: missing"),
        (
            _with(
                cluster={"gpu": {"memory_GB": 8, "memory_bandwidth_GBps": 1, "peak_tflops": {}, "colour": 1}}
            ),
            "cluster.gpu.colour: 1 — unknown key in cluster.gpu",
        ),
        (
            _with(cluster={"intra_node": {"bandwidth_GBps": 100, "bandwidth_Gbps": 800}}),
            "give exactly one of",
        ),
        (_with(cluster={"topology": {"kind": "single-switch", "oversubscription": 2}}), "fat-tree only"),
        (_with(cluster={"topology": "torus"}), "must be one of fat-tree, single-switch"),
        (_with(cluster={"topology": {"nodes_per_leaf": 4, "nodes_per_pod": 6}}),
         "cluster.topology.nodes_per_pod: 6 — a pod holds whole leaves of nodes_per_leaf = 4 nodes; use a multiple of 4"),
        (_with(cluster={"topology": {"pod_oversubscription": 7}}),
         "cluster.topology.pod_oversubscription: 7.0 — applies to the link between pods"),
        (_with(cluster={"topology": {"kind": "single-switch", "nodes_per_pod": 4}}), "pods apply to fat-tree only"),
        (
            _with(cluster={"stragglers": [{"gpu": 1, "factor": 0.5}]}),
            "cluster.stragglers.1: 0.5 — must be ≥ 1",
        ),
        (_with(cluster={"stragglers": [{"gpu": 1}]}), "a mapping with gpu and factor"),
        (
            _with(cluster={"stragglers": [{"gpu": 1, "factor": 2}, {"gpu": 1, "factor": 3}]}),
            "GPU listed twice",
        ),
        (_with(cluster={"nics_per_node": 0}), "cluster.nics_per_node: 0 — must be ≥ 1"),
        (_with(model={"kind": "synthetc"}), "did you mean 'synthetic'?"),
        (
            _with(model={"kind": "synthetic", "layers": 8, "forward_ms": -1.0}),
            "model.forward_ms: -1.0 — must be ≥ 0",
        ),
        (
            _with(model={"kind": "collective", "op": "allreduce", "size_bytes": 8}),
            "did you mean 'all_reduce'?",
        ),
        (
            _with(model={"kind": "collective", "op": "all_reduce", "size_bytes": 3}),
            "whole number of bf16 elements",
        ),
        (
            _with(model={"kind": "collective", "op": "all_reduce", "size_bytes": "lots"}),
            "not a size in bytes",
        ),
        (
            _with(model={"kind": "collective", "op": "all_reduce", "size_bytes": [2048, 7.5]}),
            "model.size_bytes: 7.5 — not a whole number of bytes; write a whole number or a size with a unit, "
            "e.g. 8 or '1.5GB'",
        ),
        (
            _with(model={"kind": "collective", "op": "all_reduce", "size_bytes": float("inf")}),
            "model.size_bytes: inf — not a finite size",
        ),
        (
            _with(parallel={"pipeline": 4, "stage_layers": [1, 1.5, 1, 1]}),
            "parallel.stage_layers.1: 1.5 — must be a whole number; write a whole number, e.g. stage_layers: [4]",
        ),
        (_with(model={"kind": "collective", "op": "all_reduce", "size_bytes": 8, "ranks": 1}), "must be ≥ 2"),
        (
            {
                **_with(
                    model={
                        "kind": "collective",
                        "op": "all_reduce",
                        "size_bytes": 8,
                        "ranks": 6,
                        "algorithm": "hierarchical",
                    }
                ),
                "cluster": {"nodes": 2, "gpus_per_node": 4, "gpu": "H100"},
                "parallel": None,
                "training": None,
            },
            "hierarchical needs whole nodes",
        ),
        (
            _with(
                model={
                    "kind": "transformer",
                    "layers": 4,
                    "hidden": 100,
                    "heads": 3,
                    "vocab": 8,
                    "seq_len": 8,
                }
            ),
            "model.hidden: 100 — hidden must be a multiple of heads = 3",
        ),
        (
            _with(
                model={
                    "kind": "transformer",
                    "layers": 4,
                    "hidden": 96,
                    "heads": 12,
                    "kv_heads": 5,
                    "vocab": 8,
                    "seq_len": 8,
                }
            ),
            "model.kv_heads: 5",
        ),
        (_with(model={"kind": "layers", "layers": []}), "model.layers: [] — needs at least 1 item"),
        (
            _with(model={"kind": "layers", "layers": [{"name": "a", "params": 1, "forward_flops": 1}]}),
            "model.layers.0.activation_bytes: missing",
        ),
        (_with(model={"kind": "layers", "preset": "resnet5"}), "did you mean 'resnet50'?"),
        (_with(training={"loss_scaling": "dynamik"}), "did you mean 'dynamic'?"),
        (
            _with(training={"loss_scaling": {"kind": "none", "overflow_steps": [3]}}),
            "overflows need loss scaling",
        ),
        (
            _with(
                training={
                    "loss_scaling": {"kind": "dynamic", "overflow_steps": [3], "overflow_probability": 0.1}
                }
            ),
            "not both",
        ),
        (_with(training={"loss_scaling": {"kind": "dynamic", "backoff_factor": 1.5}}), "must be < 1"),
        (
            _with(training={"checkpointing": {"kind": "selective", "every": 2}}),
            "applies to full checkpointing",
        ),
        (_with(training={"checkpointing": {"every": 0}}), "training.checkpointing.every: 0 — must be ≥ 1"),
        (_with(training={"gradient_compression": {"kind": "topk", "ratio": 0}}), "must be > 0"),
        (_with(training={"tokens": 1.0e9}), "use train_steps instead"),
        (_with(training={"tokens": 1.0e9, "train_steps": 10}), "give tokens or train_steps, not both"),
        (_with(training={"precision": "bf17"}), "did you mean 'bf16'?"),
        (_with(training={"optimizer": "Adam"}), "did you mean 'adam'?"),
        (
            _with(training={"precision": "fp16", "grad_reduce_dtype": "bf16"}),
            "training.grad_reduce_dtype: 'bf16' — bf16 gradient reduction needs bf16 or fp8 compute",
        ),
        (
            _with(training={"precision": "fp32", "optimizer_state_dtype": "bf16"}),
            "training.optimizer_state_dtype: 'bf16' — a bf16 optimizer state needs bf16 or fp8 compute",
        ),
        (_with(training={"grad_reduce_dtype": "fp16"}), "training.grad_reduce_dtype"),
        (
            _with(simulation={"symmetry": "on"}, cluster={"stragglers": {1: 2.0}}),
            "stragglers make GPUs differ",
        ),
        (_with(simulation={"steps": 0}), "simulation.steps: 0 — must be ≥ 1"),
        (_with(name=".."), "not a usable folder name"),
        (_with(name=None), "name: null — must be a string"),
        (_with(cluster="big"), "cluster: 'big' — must be a mapping"),
        (_with(training=None), "training: missing — a synthetic model needs a training section"),
        (_with(model={"kind": "synthetic", "layers": 8, "forward_ms": "1ms"}), "must be a finite number"),
        (_with(parallel={"zero": 4}), "parallel.zero: 4 — must be ≤ 3"),
        (
            _with(parallel={"zero": 2}, training={"gradient_compression": {"kind": "topk", "ratio": 0.01}}),
            "parallel.zero: 2 — gradient compression all-gathers",
        ),
        (_with(parallel={"bucket_MB": 0}), "must be ≥ 0.001"),
    ],
)
def test_bad_dict(d: dict, expect: str):
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(d)
    _check(info.value, expect)


def test_tensor_rule_suggests_valid_sizes(monkeypatch):
    d = _with(
        cluster={"gpus_per_node": 8},
        model={"kind": "transformer", "layers": 8, "hidden": 768, "heads": 12, "vocab": 8, "seq_len": 64},
        parallel={"tensor": 8, "pipeline": 1},
    )
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(d)
    assert "use parallel.tensor in [1, 2, 4]" in _check(info.value)


def test_sequence_parallel_rule():
    d = _with(
        cluster={"gpus_per_node": 4},
        model={"kind": "transformer", "layers": 4, "hidden": 64, "heads": 4, "vocab": 8, "seq_len": 6},
        parallel={"tensor": 4, "pipeline": 1, "sequence_parallel": True},
        training={"global_batch": 1},
    )
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(d)
    assert "sequence parallelism needs seq_len×micro_batch = 6×1" in _check(info.value)


def test_not_a_mapping():
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict([1, 2])  # type: ignore[arg-type]
    _check(info.value, "a scenario is a mapping")


def test_several_problems_are_counted():
    d = _with(cluster={"nodes": 0, "gpus_per_node": 0})
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(d)
    assert "(and 2 more problems)" in _check(info.value)


def test_every_bad_file_is_yaml_or_meant_not_to_be():
    """The bad files fail for the stated reason, not by accident: the rest parse as plain YAML."""
    unreadable = {"not_yaml_binary", "not_yaml_garbage", "alias_bomb", "duplicate_key"}
    for path in BAD_FILES:
        if path.stem not in unreadable:
            yaml.safe_load(path.read_text())
