"""Model presets land on their published parameter counts."""

from __future__ import annotations

import pytest

from sim.errors import ScenarioError
from sim.workload.layers import GenericLayer, cnn_preset, generic_layer_ops, mlp_layers
from sim.workload.model_presets import MODEL_PRESETS, get_model_preset
from sim.workload.ops import GEMM
from sim.workload.transformer import model_params

# Sizes the models are published under (papers / model cards), written here independently of the module.
PUBLISHED = {
    "gpt3-1.3b": 1.3e9,
    "gpt3-13b": 13e9,
    "gpt3-175b": 175e9,
    "llama2-7b": 6.74e9,  # "7B" rounds 6.74B (model card), 3.7% away
    "llama2-70b": 70e9,
    "llama3-8b": 8e9,
    "llama3-70b": 70e9,
    "llama3-405b": 405e9,
}

# Exact counts from the Hugging Face checkpoints (sum of tensor sizes).
EXACT = {"llama2-7b": 6_738_415_616, "llama2-70b": 68_976_648_192, "llama3-8b": 8_030_261_248}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_model_params_within_3_percent_of_nominal(name):
    assert model_params(MODEL_PRESETS[name]) == pytest.approx(PUBLISHED[name], rel=0.03)


@pytest.mark.parametrize("name", sorted(EXACT))
def test_llama_counts_exact(name):
    assert model_params(MODEL_PRESETS[name]) == EXACT[name]


def test_public_dimensions():
    d = MODEL_PRESETS["llama3-405b"]
    assert (d.layers, d.hidden, d.heads, d.n_kv_heads, d.ffn_hidden, d.vocab, d.seq_len) == (
        126, 16384, 128, 8, 53248, 128256, 8192,
    )  # fmt: skip
    g = MODEL_PRESETS["gpt3-175b"]
    assert (g.layers, g.hidden, g.heads, g.vocab, g.seq_len, g.mlp) == (96, 12288, 96, 50257, 2048, "gelu")
    assert MODEL_PRESETS["llama2-70b"].n_kv_heads == 8 and MODEL_PRESETS["llama2-7b"].n_kv_heads == 32


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ScenarioError, match="llama3-8b"):
        get_model_preset("gpt5")
    assert get_model_preset("gpt3-13b") is MODEL_PRESETS["gpt3-13b"]


# ------------------------------------------------------------------------------------ generic models


def test_resnet50_matches_torchvision():
    groups = cnn_preset("resnet50")
    assert sum(g.params for g in groups) == 25_557_032  # torchvision resnet50
    # 4.09 G multiply-accumulates per 224² image (often quoted as "4.1 GFLOPs"), 2 FLOPs each.
    assert sum(g.forward_flops for g in groups) == pytest.approx(2 * 4.1e9, rel=0.01)
    assert [g.name for g in groups] == ["stem", "layer1", "layer2", "layer3", "layer4", "fc"]
    assert sum(g.params for g in cnn_preset("resnet101")) == 44_549_160
    with pytest.raises(ScenarioError):
        cnn_preset("alexnet")


def test_generic_layer_ops():
    layer = GenericLayer(name="block", params=1000, forward_flops=5e6, activation_bytes=4000.0)
    ops = generic_layer_ops(layer, micro_batch=8, dtype="fp32")
    fwd, norm = ops.forward[0].ops
    act = 8 * 4000 * 4 / 2  # activation_bytes counted at 16-bit
    assert fwd.kind == GEMM and (fwd.m, fwd.n, fwd.k) == (0, 0, 0)
    assert fwd.flops == 8 * 5e6
    assert fwd.bytes == pytest.approx(1000 * 4 + act)
    # the fused normalisation + activation reads and writes the activations once more
    assert norm.kind == "elementwise" and norm.bytes == pytest.approx(2 * act)
    assert ops.backward_input_flops == ops.backward_weight_flops == fwd.flops
    assert all(seg.comm is None for seg in (*ops.forward, *ops.backward_input))


def test_mlp_layers():
    layers = mlp_layers([784, 256, 10])
    assert [g.params for g in layers] == [784 * 256 + 256, 256 * 10 + 10]
    assert [g.forward_flops for g in layers] == [2 * 784 * 256, 2 * 256 * 10]
