"""Hugging Face config.json → transformer dimensions: presets agree, parameter counts match the models'
published sizes, unsupported input gets one line naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.errors import ScenarioError
from sim.scenario import scenario_from_dict
from sim.scenario.schema import _DIM_FIELDS, TransformerModel
from sim.workload import transformer as tf

HF = Path(__file__).parent / "data" / "hf"
FAMILIES = {"llama3-8b": "llama", "mistral-7b": "mistral", "qwen2-7b": "qwen2", "gpt2": "gpt2",
            "gpt-neox-20b": "gpt_neox", "falcon-7b": "falcon", "mixtral-8x7b": "mixtral"}


def _model(**kw) -> TransformerModel:
    return TransformerModel.model_validate({"kind": "transformer", **kw}, context={"base_dir": HF})


def test_at_least_five_families_ship():
    found = {json.loads((HF / d / "config.json").read_text())["model_type"] for d in FAMILIES}
    assert found == set(FAMILIES.values()) and len(found) >= 5


@pytest.mark.parametrize("folder, preset", [("llama3-8b", "llama3-8b"), ("llama2-7b", "llama2-7b"),
                                            ("llama2-70b", "llama2-70b")])
def test_config_loads_to_the_preset_dims(folder, preset):
    from_hf, from_preset = _model(hf_config=f"{folder}/config.json"), _model(preset=preset)
    assert {f: getattr(from_hf, f) for f in _DIM_FIELDS} == {f: getattr(from_preset, f) for f in _DIM_FIELDS}
    assert from_hf.name == folder


# Parameter counts published for each checkpoint (the hub's safetensors totals / the model papers).
PUBLISHED_PARAMS = {
    "gpt2": 124_439_808,          # GPT-2 small, tied head
    "gpt2-xl": 1_557_611_200,     # GPT-2 XL
    "llama3-8b": 8_030_261_248,   # Meta-Llama-3-8B
    "mistral-7b": 7_241_732_096,  # Mistral-7B-v0.1
    "qwen2-7b": 7_615_616_512,    # Qwen2-7B (q/k/v biases, 0.002 %, not modelled)
    "gpt-neox-20b": 20_554_567_680,  # Black et al. 2022, GPT-NeoX-20B
    "falcon-7b": 6_921_720_704,   # tiiuae/falcon-7b
}


@pytest.mark.parametrize("folder", sorted(PUBLISHED_PARAMS))
def test_parameter_count_matches_the_published_size(folder):
    d = _model(hf_config=folder).to_dims()  # a folder holding config.json works too
    assert tf.model_params(d) == pytest.approx(PUBLISHED_PARAMS[folder], rel=2e-3)


def test_family_specific_fields():
    gpt2 = _model(hf_config="gpt2")
    assert (gpt2.ffn_hidden, gpt2.mlp, gpt2.norm, gpt2.position, gpt2.tied_embeddings, gpt2.bias) == (
        3072, "gelu", "layernorm", "learned", True, True)
    falcon = _model(hf_config="falcon-7b")
    assert (falcon.kv_heads, falcon.ffn_hidden, falcon.seq_len, falcon.tied_embeddings) == (1, 4 * 4544, 2048, True)
    qwen = _model(hf_config="qwen2-7b", seq_len=4096)  # keys beside hf_config override the file
    assert (qwen.kv_heads, qwen.seq_len, qwen.vocab) == (4, 4096, 152064)


def _one_line_error(tmp_path: Path, cfg: dict | str) -> str:
    path = tmp_path / "config.json"
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    d = {"name": "hf", "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": "A100-80GB"},
         "model": {"hf_config": str(path)}, "parallel": {}, "training": {"global_batch": 1}}
    with pytest.raises(ScenarioError) as e:
        scenario_from_dict(d)
    msg = str(e.value)
    assert "\n" not in msg and "model.hf_config" in msg
    return msg


def test_unknown_architecture_and_missing_fields_are_one_line(tmp_path):
    msg = _one_line_error(tmp_path, {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]})
    assert "model_type = 't5'" in msg and "supported" in msg
    cfg = json.loads((HF / "llama3-8b" / "config.json").read_text())
    del cfg["hidden_size"]
    assert "hidden_size = missing" in _one_line_error(tmp_path, cfg)
    moe = json.loads((HF / "mixtral-8x7b" / "config.json").read_text())
    del moe["num_experts_per_tok"]
    assert "num_experts_per_tok = missing" in _one_line_error(tmp_path, moe)
    assert "not a readable JSON" in _one_line_error(tmp_path, "{not json")
    with pytest.raises(ValueError, match="file not found"):
        _model(hf_config="nope/config.json")


def test_scenario_from_hf_config_runs_and_resolves(tmp_path):
    from sim.api import simulate
    from sim.scenario import load_scenario
    from sim.scenario.load import dump_resolved

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text((HF / "gpt2" / "config.json").read_text())
    (tmp_path / "s.yaml").write_text(
        "name: hf-gpt2\ncluster: {nodes: 1, gpus_per_node: 2, gpu: A100-80GB}\n"
        "model: {hf_config: m/config.json}\nparallel: {data: 2}\ntraining: {global_batch: 4}\n")
    sc = load_scenario(tmp_path / "s.yaml")  # the path is relative to the scenario's folder
    assert sc.model.hidden == 768 and sc.model.name == "m"
    assert simulate(sc).summary["step_time_s"] > 0
    text = dump_resolved(sc)
    assert "hf_config" not in text
    (tmp_path / "r.yaml").write_text(text)
    assert load_scenario(tmp_path / "r.yaml") == sc


def test_alibi_families_read_as_alibi(tmp_path):
    """BLOOM and MPT configs (the keys of their public config.json files, dimensions here of BLOOM-176B
    and MPT-7B) read as ALiBi models: no position table, so the embedding holds V·h parameters."""
    from sim.workload import transformer as tf

    bloom = {"model_type": "bloom", "n_layer": 70, "hidden_size": 14336, "n_head": 112, "vocab_size": 250880,
             "seq_length": 2048, "hidden_dropout": 0.0, "attention_dropout": 0.0}
    mpt = {"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "expansion_ratio": 4,
           "max_seq_len": 2048, "vocab_size": 50432, "no_bias": True,
           "attn_config": {"alibi": True, "attn_pdrop": 0.0}, "resid_pdrop": 0.0, "emb_pdrop": 0.0}
    for cfg, expect in ((bloom, (70, 4 * 14336, True)), (mpt, (32, 4 * 4096, False))):
        folder = tmp_path / cfg["model_type"]
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
        m = _model(hf_config=str(folder))
        assert (m.layers, m.ffn_hidden, m.bias) == expect
        assert m.position == "alibi" and m.dropout == 0.0
        d = tf.TransformerDims(layers=m.layers, hidden=m.hidden, heads=m.heads, ffn_hidden=m.ffn_hidden,
                               vocab=m.vocab, seq_len=m.seq_len, position=m.position)
        assert tf.embedding_params(d) == m.vocab * m.hidden
    # BloomConfig itself has no length (ALiBi has no table to size): without seq_length, seq_len beside.
    del bloom["seq_length"]
    (tmp_path / "bloom" / "config.json").write_text(json.dumps(bloom))
    assert _model(hf_config=str(tmp_path / "bloom"), seq_len=4096).seq_len == 4096
