"""Full activation checkpointing in layer-list models keeps each layer's input, not its activations."""

from __future__ import annotations

from sim.build import build_job, cost_model_for
from sim.scenario import scenario_from_dict
from sim.workload.layers import GenericLayer, checkpoint_bytes, cnn_preset

B = 32  # images per micro-batch


def _activations(checkpointing: str) -> float:
    sc = scenario_from_dict({
        "name": "resnet50-ckpt",
        "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": "A100-80GB"},
        "model": {"kind": "layers", "preset": "resnet50"},
        "parallel": {"data": 1, "tensor": 1, "pipeline": 1},
        "training": {"global_batch": B, "micro_batch": B, "precision": "bf16", "checkpointing": checkpointing},
    })
    _, info = build_job(sc, cost_model_for(sc))
    return info.memory_by_stage[0]["activations"]


def test_full_every_layer_keeps_the_layer_inputs():
    # Inputs of ResNet-50's groups at 16-bit, by hand (He et al. 2016, Table 1; 224×224 image): the image
    # 3×224², conv2_x 64×56² (after max-pool), conv3_x 256×56², conv4_x 512×28², conv5_x 1024×14², fc 2048.
    inputs = 2 * (3 * 224**2 + 64 * 56**2 + 256 * 56**2 + 512 * 28**2 + 1024 * 14**2 + 2048)
    assert [checkpoint_bytes(g) for g in cnn_preset("resnet50")] == [
        2 * 3 * 224**2, 2 * 64 * 56**2, 2 * 256 * 56**2, 2 * 512 * 28**2, 2 * 1024 * 14**2, 2 * 2048]
    none, full = _activations("none"), _activations("full")
    assert none == B * sum(g.activation_bytes for g in cnn_preset("resnet50"))  # one micro-batch in flight
    # Kept inputs, plus one layer's activations live again while it is recomputed.
    workspace = B * max(g.activation_bytes for g in cnn_preset("resnet50"))
    assert full == B * inputs + workspace
    assert full < 0.5 * none  # before the fix full kept every activation, and the workspace on top


def test_checkpoint_of_a_layer_without_a_known_input_is_its_activations():
    linear = GenericLayer("fc", params=0, forward_flops=2.0 * 8 * 4, activation_bytes=100.0, in_features=8,
                          out_features=4)
    opaque = GenericLayer("blob", params=0, forward_flops=1.0, activation_bytes=100.0)
    assert checkpoint_bytes(linear) == 16.0 and checkpoint_bytes(opaque) == 100.0
