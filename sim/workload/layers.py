"""Generic (non-transformer) models: CNNs and MLPs as coarse layer groups.

The seeds reason about models as "L layers of M_layer activation each"; a GenericLayer is exactly that
granularity: a parameter count, forward FLOPs per sample and activation bytes per sample. Each becomes
one coarse GEMM-kind op per pass, which the cost model prices by FLOPs (m = n = k = 0: no shape).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import ScenarioError
from sim.units import DTYPE_BYTES
from sim.workload.ops import GEMM, Op, elementwise
from sim.workload.transformer import LayerOps, Segment

_REFERENCE_ACT_BYTES = 2  # GenericLayer.activation_bytes is counted at 16-bit precision
_FLOPS_PER_MAC = 2.0


@dataclass(frozen=True)
class GenericLayer:
    """A layer (or group of layers) of a generic model.

    forward_flops and activation_bytes are per sample; activation_bytes is what backward needs kept,
    counted at 16-bit (2 bytes per element) and scaled to the training dtype by the ops.
    """

    name: str
    params: int
    forward_flops: float
    activation_bytes: float
    in_features: int | None = None  # a linear layer's shape, when known: GEMMs then carry (m, n, k)
    out_features: int | None = None
    input_bytes: float | None = None  # the layer's input per sample at 16-bit: what full checkpointing keeps


def checkpoint_bytes(layer: GenericLayer) -> float:
    """Bytes per sample (16-bit) full checkpointing keeps for ``layer``: its input, from which forward reruns.

    Given ``input_bytes``, else a linear layer's in_features elements; with neither the input is unknown and
    the whole ``activation_bytes`` is the (conservative) checkpoint.
    """
    if layer.input_bytes is not None:
        return layer.input_bytes
    if layer.in_features is not None:
        return float(_REFERENCE_ACT_BYTES * layer.in_features)
    return layer.activation_bytes


def generic_layer_ops(layer: GenericLayer, *, micro_batch: int, dtype: str) -> LayerOps:
    """One coarse op per pass: forward, input-gradient (≈ forward FLOPs), weight-gradient (≈ forward FLOPs).

    Bytes: forward reads the weights and writes the activations; input-gradient reads weights and
    activations and writes gradients; weight-gradient reads activations and writes the weight gradient.
    """
    if micro_batch < 1:
        raise ScenarioError(f"must be >= 1, got {micro_batch}", field="training.micro_batch")
    if dtype not in DTYPE_BYTES:
        raise ScenarioError(f"{dtype!r} is not one of {', '.join(DTYPE_BYTES)}", field="training.precision")
    e = DTYPE_BYTES[dtype]
    flops = layer.forward_flops * micro_batch
    weight_bytes = float(layer.params * e)
    act_bytes = layer.activation_bytes * micro_batch * e / _REFERENCE_ACT_BYTES

    def op(suffix: str, moved: float, shape: tuple[int, int, int]) -> Op:
        m, n, k = shape if layer.in_features else (0, 0, 0)
        return Op(name=f"{layer.name}{suffix}", kind=GEMM, flops=flops, bytes=moved, dtype=dtype, m=m, n=n, k=k)

    b, fin, fout = micro_batch, layer.in_features or 0, layer.out_features or 0
    # Normalisation + activation (+ residual add) after each conv/linear, fused as cuDNN/XLA do: one more
    # read and write of the activations forward, and read activation + gradient, write gradient backward.
    norm_fwd = elementwise(f"{layer.name}.norm_act", 2 * act_bytes, dtype)
    norm_bwd = elementwise(f"{layer.name}.norm_act.bwd", 3 * act_bytes, dtype)
    return LayerOps(
        forward=(Segment(ops=(op("", weight_bytes + act_bytes, (b, fout, fin)), norm_fwd)),),
        backward_input=(Segment(ops=(norm_bwd, op(".dgrad", weight_bytes + 2 * act_bytes, (b, fin, fout)))),),
        backward_weight=(op(".wgrad", 2 * weight_bytes + act_bytes, (fin, fout, b)),),
    )


def mlp_layers(widths: list[int], name: str = "fc") -> list[GenericLayer]:
    """Dense layers widths[0] → widths[1] → …: params in·out + out, 2·in·out FLOPs, output kept."""
    if len(widths) < 2 or any(w < 1 for w in widths):
        raise ScenarioError(f"need at least two positive widths, got {widths}", field="model.widths")
    return [
        GenericLayer(
            name=f"{name}{i}",
            params=w_in * w_out + w_out,
            forward_flops=_FLOPS_PER_MAC * w_in * w_out,
            activation_bytes=float(_REFERENCE_ACT_BYTES * (w_in + w_out)),
            input_bytes=float(_REFERENCE_ACT_BYTES * w_in),
        )
        for i, (w_in, w_out) in enumerate(zip(widths[:-1], widths[1:], strict=True))
    ]


# ------------------------------------------------------------------------------------------------ ResNets


class _Group:
    """Accumulates params, multiply-accumulates and kept activation elements of a group of convolutions."""

    def __init__(self, name: str, in_elems: int) -> None:
        self.name, self.params, self.macs, self.act_elems = name, 0, 0, 0
        self.in_elems = in_elems  # the group's input tensor (what full checkpointing keeps)

    def conv(self, c_in: int, c_out: int, kernel: int, out_hw: int, bn: bool = True) -> None:
        self.params += kernel * kernel * c_in * c_out
        self.macs += kernel * kernel * c_in * c_out * out_hw * out_hw
        out = c_out * out_hw * out_hw
        self.act_elems += out  # conv output (saved for BN / the next conv)
        if bn:
            self.params += 2 * c_out
            self.act_elems += out  # BN+ReLU output

    def layer(self) -> GenericLayer:
        return GenericLayer(
            name=self.name,
            params=self.params,
            forward_flops=_FLOPS_PER_MAC * self.macs,
            activation_bytes=float(_REFERENCE_ACT_BYTES * self.act_elems),
            input_bytes=float(_REFERENCE_ACT_BYTES * self.in_elems),
        )


CNN_PRESETS = {"resnet50": (3, 4, 6, 3), "resnet101": (3, 4, 23, 3), "resnet152": (3, 8, 36, 3)}


def _bottleneck_resnet(blocks: tuple[int, ...], image: int = 224, classes: int = 1000) -> list[GenericLayer]:
    stem = _Group("stem", 3 * image * image)
    hw = image // 2
    stem.conv(3, 64, 7, hw)
    hw //= 2  # max-pool
    stem.act_elems += 64 * hw * hw
    groups = [stem.layer()]
    c_in = 64
    for stage, n_blocks in enumerate(blocks):
        width = 64 * 2**stage
        g = _Group(f"layer{stage + 1}", c_in * hw * hw)
        for i in range(n_blocks):
            stride = 2 if (i == 0 and stage > 0) else 1
            out_hw = hw // stride
            g.conv(c_in, width, 1, hw)
            g.conv(width, width, 3, out_hw)  # torchvision v1.5: stride on the 3x3
            g.conv(width, 4 * width, 1, out_hw)
            if i == 0:
                g.conv(c_in, 4 * width, 1, out_hw)  # projection shortcut
            g.act_elems += 4 * width * out_hw * out_hw  # residual add + ReLU output
            c_in, hw = 4 * width, out_hw
        groups.append(g.layer())
    head = _Group("fc", c_in)
    head.params = c_in * classes + classes
    head.macs = c_in * classes
    head.act_elems = c_in + classes
    groups.append(head.layer())
    return groups


def cnn_preset(name: str) -> list[GenericLayer]:
    """Layer groups of a ResNet (stem, four stages, pooled classifier) for a 224×224 image.

    Computed from the torchvision v1.5 architecture: resnet50 has 25,557,032 parameters and 4.09 G
    multiply-accumulates, i.e. ≈ 8.2 GFLOPs forward per image at 2 FLOPs per MAC (the "4.1 GFLOPs" often
    quoted counts MACs). Activations: conv and BN/ReLU outputs plus residual sums, at 16-bit.
    """
    if name not in CNN_PRESETS:
        raise ScenarioError(
            f"unknown CNN preset {name!r}; known: {', '.join(sorted(CNN_PRESETS))}", field="model"
        )
    return _bottleneck_resnet(CNN_PRESETS[name])
