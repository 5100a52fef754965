"""FLOPs per training iteration as each source counts them, so TFLOP/s converts to seconds its way.

A published "TFLOP/s per GPU" is FLOPs per iteration ÷ (iteration time × GPUs) under the *source's*
formula; converting it with another formula (dtsim's own, say) moves the implied iteration time by
several percent. Each function below is one source's formula, named in the published-figures set.

Symbols: B global batch (sequences), s sequence length, l layers, h hidden size, V vocabulary (as the
source pads it), a attention heads, g key/value heads, f MLP width.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.scenario.schema import TransformerModel
from sim.workload.transformer import model_params


def narayanan_2021_eq4(m: TransformerModel, batch: int) -> float:
    """Narayanan et al., SC'21, §5.1 Eq. 4 (Appendix: Floating-point operations):
    F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)). Counts the recomputed forward pass of full activation
    recomputation (4 passes of the layer GEMMs, 3 of the logit GEMM), so it is hardware FLOPs there."""
    b, s, n, h, v = batch, m.seq_len, m.layers, m.hidden, m.vocab
    return 96.0 * b * s * n * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * n * h))


def narayanan_2021_model(m: TransformerModel, batch: int) -> float:
    """Eq. 4 of Narayanan et al. without the recomputed forward pass: the model FLOPs (3 passes of the layer
    GEMMs and attention matmuls, 3 of the logit GEMM) that Megatron papers' MFU counts,
    F = 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)), whatever recomputation the run did."""
    b, s, n, h, v = batch, m.seq_len, m.layers, m.hidden, m.vocab
    return 72.0 * b * s * n * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * n * h))


def matmul_params(m: TransformerModel) -> float:
    """Parameters that multiply activations: every layer's projections plus the output (logit) layer.
    The input embedding is a lookup, not a matmul, so it is left out."""
    h, f = m.hidden, m.ffn_hidden
    kv = m.kv_heads * m.head_dim
    attention = 2.0 * h * h + 2.0 * h * kv  # q, o; k, v
    mlp = (3.0 if m.mlp == "swiglu" else 2.0) * h * f
    return m.layers * (attention + mlp) + float(m.vocab) * h


def palm_model_flops(m: TransformerModel, batch: int) -> float:
    """Model FLOPs as MFU defines them (Chowdhery et al., "PaLM", 2022, Appendix B), which Llama 3's
    "BF16 MFU" cites: per token 6·N + 12·l·h·s (N matmul parameters; attention scores and values over
    the full, non-causal s×s), times the B·s tokens of the batch. No recomputation is counted."""
    tokens = float(batch) * m.seq_len
    return tokens * (6.0 * matmul_params(m) + 12.0 * m.layers * m.hidden * m.seq_len)


def megatron_2024(m: TransformerModel, batch: int) -> float:
    """Megatron-LM's ``num_floating_point_operations`` before it halved causal attention, as NeMo's 2024
    performance summary (NeMo 24.07, docs/source/performance/performance_summary.md) counts:
    12·B·s·l·h²·((1 + g/a + s/h)·q/h + (f/h)·(3/2 if SwiGLU) + V/(2·l·h)), q = a·head_dim: the full s×s
    of the attention scores and values. It reproduces that table's tokens/s ↔ model TFLOP/s pairs to
    0.5 % (tests/test_published.py)."""
    b, s, n, h, v = batch, m.seq_len, m.layers, m.hidden, m.vocab
    q_ratio = m.heads * m.head_dim / h
    gated = 1.5 if m.mlp == "swiglu" else 1.0
    attention = (1.0 + m.kv_heads / m.heads + s / h) * q_ratio
    return 12.0 * b * s * n * h * h * (attention + (m.ffn_hidden / h) * gated + v / (2.0 * n * h))


def megatron_causal_2025(m: TransformerModel, batch: int) -> float:
    """Megatron-LM's ``num_floating_point_operations`` as NVIDIA's Megatron-Bridge/NeMo performance
    summaries use it (2025, causal attention counts half the s×s work):
    12·B·s·l·h²·((1 + g/a + s/(2h))·q/h + (f/h)·(3/2 if SwiGLU) + V/(2·l·h)), q = a·head_dim.
    It reproduces those tables' tokens/s ↔ model TFLOP/s pairs to 0.1 % (tests/test_published.py)."""
    b, s, n, h, v = batch, m.seq_len, m.layers, m.hidden, m.vocab
    q_ratio = m.heads * m.head_dim / h
    gated = 1.5 if m.mlp == "swiglu" else 1.0
    attention = (1.0 + m.kv_heads / m.heads + s / (2.0 * h)) * q_ratio
    return 12.0 * b * s * n * h * h * (attention + (m.ffn_hidden / h) * gated + v / (2.0 * n * h))


def llm_foundry_mfu(m: TransformerModel, batch: int) -> float:
    """MosaicML llm-foundry's MFU numerator (scripts/train/benchmarking/README.md, "MFU"): per token
    6·N + 12·l·h·s, N every parameter of the model (its NumParams column), no recomputation."""
    tokens = float(batch) * m.seq_len
    return tokens * (6.0 * model_params(m.to_dims()) + 12.0 * m.layers * m.hidden * m.seq_len)


FLOP_FORMULAS: dict[str, Callable[[TransformerModel, int], float]] = {
    "narayanan-2021-eq4": narayanan_2021_eq4,
    "narayanan-2021-model": narayanan_2021_model,
    "palm-model-flops": palm_model_flops,
    "megatron-2024": megatron_2024,
    "megatron-causal-2025": megatron_causal_2025,
    "llm-foundry-mfu": llm_foundry_mfu,
}
