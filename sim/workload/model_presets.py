"""Public transformer shapes, so scenarios can say ``model: llama3-70b``.

Sources: GPT-3 paper table 2.1 with Megatron-LM's usual head counts (1.3B: 16 heads; 13B: hidden 5120,
40 heads, as Megatron configs round 5140 to a multiple of the heads); Llama 2 and Llama 3 model cards
and ``config.json`` files (RMSNorm, no biases, RoPE, untied embeddings).
"""

from __future__ import annotations

from sim.errors import ScenarioError
from sim.workload.transformer import TransformerDims


def _gpt3(layers: int, hidden: int, heads: int) -> TransformerDims:
    return TransformerDims(
        layers=layers,
        hidden=hidden,
        heads=heads,
        ffn_hidden=4 * hidden,
        vocab=50257,
        seq_len=2048,
        mlp="gelu",
    )


def _llama(
    layers: int, hidden: int, heads: int, kv_heads: int | None, ffn: int, vocab: int, seq: int
) -> TransformerDims:
    return TransformerDims(
        layers=layers,
        hidden=hidden,
        heads=heads,
        ffn_hidden=ffn,
        vocab=vocab,
        seq_len=seq,
        kv_heads=kv_heads,
        mlp="swiglu",
        bias=False,
        norm="rmsnorm",
        position="rope",
        tied_embeddings=False,
        dropout=0.0,  # Llama configs: attention_dropout 0.0, no hidden dropout
    )


MODEL_PRESETS: dict[str, TransformerDims] = {
    "gpt3-1.3b": _gpt3(24, 2048, 16),
    "gpt3-13b": _gpt3(40, 5120, 40),
    "gpt3-175b": _gpt3(96, 12288, 96),
    "llama2-7b": _llama(32, 4096, 32, None, 11008, 32000, 4096),
    "llama2-13b": _llama(40, 5120, 40, None, 13824, 32000, 4096),
    "llama2-70b": _llama(80, 8192, 64, 8, 28672, 32000, 4096),
    "llama3-8b": _llama(32, 4096, 32, 8, 14336, 128256, 8192),
    "llama3-70b": _llama(80, 8192, 64, 8, 28672, 128256, 8192),
    "llama3-405b": _llama(126, 16384, 128, 8, 53248, 128256, 8192),
    # Mixtral 8x7B (Jiang et al. 2024; mistralai/Mixtral-8x7B-v0.1 config.json): Mistral-7B's attention,
    # 8 SwiGLU experts of width 14336 per layer, 2 per token (MOE_PRESETS below).
    "mixtral-8x7b": _llama(32, 4096, 32, 8, 14336, 32000, 32768),
}

# Mixture-of-experts fields of the MoE presets (model.experts, top_k, …).
MOE_PRESETS: dict[str, dict[str, int | float]] = {
    "mixtral-8x7b": {"experts": 8, "top_k": 2},
}

# Parameter counts the models are published under (for sanity checks and reports).
NOMINAL_PARAMS: dict[str, float] = {
    "gpt3-1.3b": 1.3e9,
    "gpt3-13b": 13e9,
    "gpt3-175b": 175e9,
    "llama2-7b": 6.74e9,
    "llama2-13b": 13.0e9,
    "llama2-70b": 69.0e9,
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
    "llama3-405b": 405e9,
    "mixtral-8x7b": 46.7e9,  # total; 12.9e9 active per token (Jiang et al. 2024)
}


def get_model_preset(name: str) -> TransformerDims:
    """The preset called ``name``, or a ScenarioError listing the known ones."""
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise ScenarioError(
            f"unknown model preset {name!r}; known: {', '.join(sorted(MODEL_PRESETS))}", field="model"
        ) from None
