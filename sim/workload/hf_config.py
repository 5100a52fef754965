"""Read a Hugging Face ``config.json`` (local file, no network) into the transformer model's fields.

Key names and defaults follow the ``transformers`` configuration classes of each family (LlamaConfig,
MistralConfig, MixtralConfig, Qwen2Config, GPT2Config, GPTNeoXConfig, FalconConfig, BloomConfig, and
MosaicML's MPTConfig): where a config file leaves a key out, the library's default applies, so it does here. Architecture details dtsim does not
model are mapped to the nearest modelled form and said so below (they change few parameters/FLOPs):
Qwen2's q/k/v biases (bias: false — the MLP and output projection have none), GPT-NeoX/Falcon parallel
attention+MLP (computed one after the other), partial rotary (rope).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Fields of the transformer model this reader fills (the schema validates them as usual).
Fields = dict[str, Any]


class HFConfigError(ValueError):
    """A config the reader cannot use: the key (or value) at fault, the rule and a fix."""

    def __init__(self, key: str, value: str, rule: str, fix: str):
        self.key, self.value, self.rule, self.fix = key, value, rule, fix
        super().__init__(f"{key}: {value} — {rule}; {fix}")


def _need(cfg: dict, *keys: str) -> Any:
    """The first of ``keys`` present in ``cfg`` (aliases of one field), or an error naming the first."""
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    raise HFConfigError(keys[0], "missing", f"config.json of a {cfg.get('model_type', '?')} model needs it",
                        f"add \"{keys[0]}\" to the file (see the model's public config.json)")


def _int(cfg: dict, *keys: str) -> int:
    value = _need(cfg, *keys)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise HFConfigError(keys[0], repr(value), "must be a positive integer", "fix the value in config.json")
    return value


def _llama_like(cfg: dict) -> Fields:
    """Llama, Mistral, Mixtral, Qwen2: SwiGLU MLP, RMSNorm, RoPE, GQA, untied embeddings by default."""
    heads = _int(cfg, "num_attention_heads")
    out = {
        "layers": _int(cfg, "num_hidden_layers"),
        "hidden": _int(cfg, "hidden_size"),
        "heads": heads,
        "kv_heads": cfg.get("num_key_value_heads") or heads,
        "ffn_hidden": _int(cfg, "intermediate_size"),
        "vocab": _int(cfg, "vocab_size"),
        "seq_len": _int(cfg, "max_position_embeddings"),
        "mlp": "swiglu",
        "bias": bool(cfg.get("attention_bias", False)) and bool(cfg.get("mlp_bias", False)),
        "norm": "rmsnorm",
        "position": "rope",
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "dropout": _dropout(cfg),
    }
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts:
        out["experts"] = experts
        out["top_k"] = _int(cfg, "num_experts_per_tok")
    return out


def _gpt2(cfg: dict) -> Fields:
    """GPT-2: learned positions, LayerNorm, GELU MLP of n_inner (default 4·n_embd), biases, tied head."""
    hidden = _int(cfg, "n_embd", "hidden_size")
    return {
        "layers": _int(cfg, "n_layer", "num_hidden_layers"),
        "hidden": hidden,
        "heads": _int(cfg, "n_head", "num_attention_heads"),
        "ffn_hidden": cfg.get("n_inner") or 4 * hidden,
        "vocab": _int(cfg, "vocab_size"),
        "seq_len": _int(cfg, "n_positions", "n_ctx", "max_position_embeddings"),
        "mlp": "gelu",
        "bias": True,
        "norm": "layernorm",
        "position": "learned",
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "dropout": _dropout(cfg),
    }


def _gpt_neox(cfg: dict) -> Fields:
    """GPT-NeoX / Pythia: rotary positions, LayerNorm, GELU MLP, biases, untied head by default."""
    return {
        "layers": _int(cfg, "num_hidden_layers"),
        "hidden": _int(cfg, "hidden_size"),
        "heads": _int(cfg, "num_attention_heads"),
        "ffn_hidden": _int(cfg, "intermediate_size"),
        "vocab": _int(cfg, "vocab_size"),
        "seq_len": _int(cfg, "max_position_embeddings"),
        "mlp": "gelu",
        "bias": True,
        "norm": "layernorm",
        "position": "rope",
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "dropout": _dropout(cfg),
    }


def _falcon(cfg: dict) -> Fields:
    """Falcon: multi-query (7B) or grouped KV (new_decoder_architecture), GELU MLP of 4h, tied head."""
    hidden = _int(cfg, "hidden_size", "n_embed")
    heads = _int(cfg, "num_attention_heads", "n_head")
    if cfg.get("new_decoder_architecture"):
        kv = _int(cfg, "num_kv_heads")
    elif cfg.get("multi_query", True):
        kv = 1
    else:
        kv = heads
    return {
        "layers": _int(cfg, "num_hidden_layers", "n_layer"),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv,
        "ffn_hidden": cfg.get("ffn_hidden_size") or 4 * hidden,
        "vocab": _int(cfg, "vocab_size"),
        "seq_len": cfg.get("max_position_embeddings") or 2048,  # FalconConfig's default
        "mlp": "gelu",
        "bias": bool(cfg.get("bias", False)),
        "norm": "layernorm",
        "position": "alibi" if cfg.get("alibi") else "rope",  # FalconConfig.alibi (default False): rotary
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "dropout": _dropout(cfg),
    }


def _bloom(cfg: dict) -> Fields:
    """BLOOM (BloomConfig): ALiBi, LayerNorm, GELU MLP of 4h, biases, tied head. ALiBi has no position
    table to size, so BloomConfig has no length; BigScience's files name the training length
    ``seq_length``, and without it ``model.seq_len`` beside ``hf_config`` gives it."""
    hidden = _int(cfg, "hidden_size", "n_embed")
    return {
        "layers": _int(cfg, "n_layer", "num_hidden_layers"),
        "hidden": hidden,
        "heads": _int(cfg, "n_head", "num_attention_heads"),
        "ffn_hidden": 4 * hidden,
        "vocab": _int(cfg, "vocab_size"),
        **({"seq_len": _int(cfg, "seq_length")} if "seq_length" in cfg else {}),  # else model.seq_len beside
        "mlp": "gelu",
        "bias": True,
        "norm": "layernorm",
        "position": "alibi",
        "tied_embeddings": True,
        "dropout": _dropout(cfg),
    }


def _mpt(cfg: dict) -> Fields:
    """MPT (MosaicML's MPTConfig): ALiBi unless ``attn_config.alibi`` is false (then learned positions),
    LayerNorm, GELU MLP of expansion_ratio·d_model, biases unless ``no_bias``, tied head."""
    hidden = _int(cfg, "d_model")
    attn = cfg.get("attn_config") or {}
    drops = [attn.get("attn_pdrop"), cfg.get("resid_pdrop"), cfg.get("emb_pdrop")]
    return {
        "layers": _int(cfg, "n_layers"),
        "hidden": hidden,
        "heads": _int(cfg, "n_heads"),
        "ffn_hidden": int(cfg.get("expansion_ratio", 4) * hidden),
        "vocab": _int(cfg, "vocab_size"),
        "seq_len": _int(cfg, "max_seq_len"),
        "mlp": "gelu",
        "bias": not cfg.get("no_bias", False),
        "norm": "layernorm",
        "position": "alibi" if attn.get("alibi", False) else "learned",
        "tied_embeddings": True,
        "dropout": float(max((d for d in drops if isinstance(d, (int, float))), default=0.0)),
    }


def _dropout(cfg: dict) -> float:
    """The largest dropout probability the config names (transformers' per-family keys and defaults: GPT-2
    resid/attn/embd_pdrop 0.1; Llama, Mistral, Qwen2, GPT-NeoX, Falcon 0.0)."""
    keys = ("resid_pdrop", "attn_pdrop", "embd_pdrop", "hidden_dropout", "attention_dropout")
    default = 0.1 if cfg.get("model_type") == "gpt2" or "GPT2LMHeadModel" in (cfg.get("architectures") or []) else 0.0
    values = [cfg[k] for k in keys if isinstance(cfg.get(k), (int, float)) and not isinstance(cfg.get(k), bool)]
    return float(max(values)) if values else default


FAMILIES: dict[str, Callable[[dict], Fields]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "mixtral": _llama_like,
    "qwen2": _llama_like,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "falcon": _falcon,
    "bloom": _bloom,
    "mpt": _mpt,
}
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
    "FalconForCausalLM": "falcon",
    "RWForCausalLM": "falcon",  # Falcon's original remote-code class
    "BloomForCausalLM": "bloom",
    "MPTForCausalLM": "mpt",
}


def config_path(path: str | Path) -> Path:
    """A config.json, or a model folder holding one."""
    p = Path(path).expanduser()
    return p / "config.json" if p.is_dir() else p


def family_of(cfg: dict) -> str:
    """The family key from ``model_type``, else from ``architectures``; an error naming both if unknown."""
    mt = cfg.get("model_type")
    if mt in FAMILIES:
        return mt
    for arch in cfg.get("architectures") or []:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    what = mt if mt is not None else (cfg.get("architectures") or ["missing"])[0]
    key = "model_type" if mt is not None or not cfg.get("architectures") else "architectures"
    raise HFConfigError(key, repr(what), f"not a supported architecture (supported model_type: "
                        f"{', '.join(FAMILIES)})", "describe the model with kind: transformer and its dimensions")


def read_hf_config(path: str | Path) -> Fields:
    """The transformer fields of the model in ``path`` (plus ``name``: its folder or file name)."""
    p = config_path(path)
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if Path(path).expanduser().is_dir():
            raise HFConfigError("hf_config", repr(str(path)), "a folder with no config.json in it",
                                "give a Hugging Face model folder or the path of its config.json") from None
        raise HFConfigError("hf_config", repr(str(path)), "file not found",
                            "give the path of a config.json (relative to the scenario's folder)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFConfigError("hf_config", repr(str(path)), f"not a readable JSON file ({e.__class__.__name__})",
                            "give a Hugging Face config.json") from None
    if not isinstance(cfg, dict):
        raise HFConfigError("hf_config", repr(str(path)), "a config.json is a JSON object",
                            "give a Hugging Face config.json")
    fields = FAMILIES[family_of(cfg)](cfg)
    fields["name"] = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    return fields
