"""Hugging Face causal LMs as arms of a paired run (``model.source=hf``; needs ``pip install -e ".[hf]"``).

``build_hf_model(config, seed)`` builds a randomly initialised ``AutoModelForCausalLM`` from
``config.hf_config``: a named config of ``stability.config.HF_CONFIGS`` ("llama", "qwen2", "qwen3")
sized by the harness's model fields (d_model, n_layers, n_heads, n_kv_heads, head_dim, d_ff,
vocab_size, context, rope_theta, norm_eps, tie_embeddings, bias, init_std), or a local directory
holding a ``config.json`` used as it is. Nothing is downloaded. The model is built under
``torch.manual_seed(seed)`` with the library's own initialisation; the gated arm is the same model
with the G1 gate injected afterwards (``stability.model.inject``), so every parameter the arms share is
identical.

Probes. ``set_probe_observer(model, attention_modules, observer)`` switches the model's attention implementation to
``"stability_probe"``, an eager attention registered in transformers' ``AttentionInterface`` that
hands the scaled scores ("attn_logits", masked with -inf) and the probabilities ("attn_probs") of
each layer to the observer, with the model's own mask (causal, sliding window). ``None`` switches
back to the implementation the model had. The registry suits the probes (they need q and k, which
it receives); it does not suit the gate (which needs the hidden state, which it does not receive).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from stability.config import HF_CONFIGS, ConfigError, ModelConfig

PROBE_IMPLEMENTATION = "stability_probe"
_INSTALL_HINT = 'pip install -e ".[hf]"'


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ConfigError(f"model.source='hf' needs the transformers library: {_INSTALL_HINT}") from None
    return transformers


def _named_config(config: ModelConfig):
    """The transformers config of a named architecture at the harness's sizes."""
    transformers = _transformers()
    unsupported = {"family": ("llama", config.family), "init": ("normal", config.init),
                   "rope_fraction": (1.0, config.rope_fraction), "gate_in_q": (False, config.gate_in_q),
                   "norm_plus_one": (False, config.norm_plus_one), "qk_norm": (False, config.qk_norm)}
    for name, (expected, value) in unsupported.items():
        if value != expected:
            raise ConfigError(f"model.{name}={value!r} is invalid with model.source='hf': expected {expected!r} "
                              f"(it is an option of the harness's own model; the HF architecture fixes it)")
    common = {"vocab_size": config.vocab_size, "hidden_size": config.d_model, "intermediate_size": config.ffn_dim,
              "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
              "num_key_value_heads": config.n_kv_heads, "max_position_embeddings": config.context,
              "rope_parameters": {"rope_type": "default", "rope_theta": float(config.rope_theta)},
              "rms_norm_eps": config.norm_eps, "tie_word_embeddings": config.tie_embeddings,
              "initializer_range": config.init_std, "use_cache": False}
    if config.hf_config == "llama":
        return transformers.LlamaConfig(**common, head_dim=config.head_size, attention_bias=config.bias,
                                        mlp_bias=config.bias)
    if config.hf_config == "qwen2":  # q, k, v biases are part of the architecture
        if config.head_dim and config.head_dim != config.d_model // config.n_heads:
            raise ConfigError(f"model.head_dim={config.head_dim} is invalid with model.hf_config='qwen2': "
                              f"expected 0 (Qwen2's head dim is d_model / n_heads)")
        return transformers.Qwen2Config(**common)
    return transformers.Qwen3Config(**common, head_dim=config.head_size, attention_bias=config.bias)


def load_hf_config(config: ModelConfig):
    """The transformers config ``config.hf_config`` names, checked to be a causal LM the harness can train."""
    transformers = _transformers()
    if config.hf_config in HF_CONFIGS:
        hf_config = _named_config(config)
    else:
        where = Path(config.hf_config)
        if not (where / "config.json").is_file():
            raise ConfigError(f"model.hf_config={config.hf_config!r} is invalid: expected one of {HF_CONFIGS} or a "
                              f"local directory holding a config.json")
        try:
            model_type = json.loads((where / "config.json").read_text()).get("model_type")
        except (OSError, json.JSONDecodeError) as error:
            raise ConfigError(f"model.hf_config={config.hf_config!r}: its config.json cannot be read ({error})") \
                from None
        causal = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        if model_type not in causal:
            raise ConfigError(f"model.hf_config={config.hf_config!r} is not a causal LM: its model_type "
                              f"{model_type!r} has no AutoModelForCausalLM class (expected e.g. llama, qwen2, qwen3)")
        hf_config = transformers.AutoConfig.from_pretrained(where, local_files_only=True)
        vocab = getattr(hf_config, "vocab_size", None)
        if vocab != config.vocab_size:
            raise ConfigError(f"model.vocab_size={config.vocab_size} does not match model.hf_config="
                              f"{config.hf_config!r}, whose vocab_size is {vocab}: expected model.vocab_size={vocab}")
        positions = getattr(hf_config, "max_position_embeddings", None)
        if positions is not None and positions < config.context:
            raise ConfigError(f"model.context={config.context} exceeds the max_position_embeddings={positions} of "
                              f"model.hf_config={config.hf_config!r}: expected model.context <= {positions}")
        hf_config.use_cache = False
    hf_config._attn_implementation = "sdpa"
    return hf_config


def build_hf_model(config: ModelConfig, seed: int) -> nn.Module:
    """A randomly initialised causal LM (fp32, train mode) with, for a gated arm, the G1 gate injected."""
    from stability.model.inject import inject_gate

    transformers = _transformers()
    hf_config = load_hf_config(config)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).train()
    if config.gate.enabled:
        inject_gate(model, config.gate, seed, n_heads=getattr(hf_config, "num_attention_heads", None),
                    init_std=config.init_std, what=f"model.hf_config={config.hf_config!r}")
    return model


def is_hf_model(model: nn.Module) -> bool:
    """Whether ``model`` is a transformers model (without importing transformers when it is not loaded)."""
    return any(cls.__module__.startswith("transformers.") for cls in type(model).__mro__)


# ----------------------------------------------------------------------------- probes

def _probe_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Eager attention that shows its scores and probabilities to ``module.stability_observer``.

    q: (B, H, S, D), k, v: (B, Hkv, S, D), attention_mask: additive (B, 1, S, S) or None (causal)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = (query.float() @ key.float().transpose(-1, -2)) * scaling
    seq_q, seq_k = scores.shape[-2:]
    if attention_mask is None:
        allowed = torch.ones(seq_q, seq_k, dtype=torch.bool, device=scores.device).tril(seq_k - seq_q)
    else:
        mask = attention_mask[..., :seq_k]
        allowed = mask if mask.dtype == torch.bool else mask == 0
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = scores.softmax(dim=-1)
    observer = getattr(module, "stability_observer", None)
    if observer is not None:
        observer("attn_logits", scores)
        observer("attn_probs", probs)
    output = (probs @ value.float()).to(query.dtype)
    return output.transpose(1, 2).contiguous(), probs


def _register_probe_attention() -> None:
    transformers = _transformers()
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    transformers.AttentionInterface.register(PROBE_IMPLEMENTATION, _probe_attention)
    AttentionMaskInterface.register(PROBE_IMPLEMENTATION, eager_mask)


def set_probe_observer(model: nn.Module, attention: list[nn.Module], observer) -> None:
    """Route each attention module's scores and probabilities to ``observer(layer, name, tensor)``
    through the probe attention implementation; ``observer=None`` restores the model's own."""
    if observer is None:
        for module in attention:
            module.__dict__.pop("stability_observer", None)
        previous = model.__dict__.pop("_stability_attention", None)
        if previous is not None:
            model.set_attn_implementation(previous)
        return
    _register_probe_attention()
    if "_stability_attention" not in model.__dict__:
        model.__dict__["_stability_attention"] = model.config._attn_implementation
    model.set_attn_implementation(PROBE_IMPLEMENTATION)
    for layer, module in enumerate(attention):
        module.__dict__["stability_observer"] = (lambda name, tensor, layer=layer: observer(layer, name, tensor))
