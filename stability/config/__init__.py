"""Typed, validated configuration and the named scale presets.

Every config is a frozen dataclass checked in ``__post_init__``: a bad value raises
``ConfigError`` naming the field, the value and what was expected, before any
training starts. ``resolve(preset, overrides)`` builds a full ``ExperimentConfig``
from a preset name plus dotted overrides such as ``{"model.d_model": 256}``.

An experiment trains *arms* side by side: the baseline and any number of treatment arms, each a
named ``ArmConfig`` (a gate, QK-norm, z-loss, attention soft-capping) applied on top of the one
shared run. ``NAMED_ARMS`` holds the named arms and ``ARM_SETS`` named groups of them; the override
``arms=gated,gated_floored`` selects arms by name and ``arms.<name>.<field>=VALUE`` defines or
changes one (see docs/arms-and-controls.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import types
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and what was expected."""


def _check(condition: bool, name: str, value: Any, expected: str) -> None:
    if not condition:
        raise ConfigError(f"{name}={value!r} is invalid: expected {expected}")


def _positive_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_strength(value: Any, name: str, what: str) -> None:
    """A stabilizer's strength: a positive finite number, or 0 for off."""
    _check(_is_number(value) and value >= 0, name, value, f"a positive finite {what} (0 turns it off)")


GATE_POSITIONS = ("none", "G1", "G2", "G3", "G4", "G5")
GATE_GRANULARITIES = ("elementwise", "headwise")
GATE_ACTIVATIONS = ("sigmoid", "silu")
GATE_MODES = ("multiplicative", "additive")
BACKENDS = ("torch", "explicit", "triton")
# training formats: fp32, autocast bf16 / fp16, fp8 (recipe: precision.fp8_recipe) and the MX block formats
# (torchao: mxfp8 = e4m3 elements in blocks of 32 with a shared power-of-two scale; mxfp4 = the same with
# e2m1 weights, mxfp8 activations and gradients)
PRECISIONS = ("fp32", "bf16", "fp16", "fp8", "mxfp8", "mxfp4")
# fp8 recipes: torchao.float8's recipe names (Float8LinearRecipeName), and "own", the harness's own
# emulation (per-tensor current or delayed scaling, precision.fp8_scaling)
FP8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp", "own")
FP8_SCALINGS = ("current", "delayed")
LR_SCHEDULES = ("cosine", "constant")
LR_SCALING_RULES = ("none", "linear", "sqrt")
SHOCK_KINDS = ("jump", "no_warmup")
OPTIMIZERS = ("adamw", "adamw8bit")
MODEL_SOURCES = ("harness", "hf")
MODEL_FAMILIES = ("llama", "gpt2")
INITS = ("normal", "pytorch")
# named Hugging Face configs that model.source=hf builds at the harness's sizes (stability.model.hf)
HF_CONFIGS = ("llama", "qwen2", "qwen3")
ROPE_SCALINGS = ("ntk", "none")
BASELINE_ARM = "baseline"  # the reference arm: every other arm is compared with it
# the stress cases of stability.cases.stress, in the order `stability stress` runs them
STRESS_CASES = ("standard", "lr_sweep", "lr_ramp", "batch_ramp", "precision_ladder", "shock")
# post-training quantization schemes (stability.train.quantize evaluates them; kept here to avoid an import cycle)
QUANT_SCHEMES = ("int8", "int8-nooutlier", "nf4", "fp4", "w8a8-tensor", "w8a8-token", "fp8", "torchao-int8wo",
                 "torchao-int4wo", "torchao-fp8dq")


@dataclass(frozen=True)
class GateConfig:
    """Where and how the attention gate acts (Qiu et al. 2025, Table 1 axes).

    position: "none" (baseline), "G1" SDPA output, "G2" value, "G3" key, "G4" query,
    "G5" after the output projection. granularity: "elementwise" (one logit per
    channel) or "headwise" (one logit per head). shared_heads: one set of gate
    logits shared by all heads instead of head-specific ones. floor: the lowest value the
    gate can take, score = floor + (1 - floor) * sigmoid(logit); with floor 0.5 (a gate that cannot
    close below one half) the attention sink came back in the paper's models (its control).
    """

    position: str = "none"
    granularity: str = "elementwise"
    activation: str = "sigmoid"
    mode: str = "multiplicative"
    shared_heads: bool = False
    floor: float = 0.0

    def __post_init__(self) -> None:
        _check(self.position in GATE_POSITIONS, "gate.position", self.position, f"one of {GATE_POSITIONS}")
        _check(self.granularity in GATE_GRANULARITIES, "gate.granularity", self.granularity,
               f"one of {GATE_GRANULARITIES}")
        _check(self.activation in GATE_ACTIVATIONS, "gate.activation", self.activation,
               f"one of {GATE_ACTIVATIONS}")
        _check(self.mode in GATE_MODES, "gate.mode", self.mode, f"one of {GATE_MODES}")
        if self.position == "G5":
            _check(self.granularity == "elementwise" and not self.shared_heads, "gate.position", "G5",
                   "G5 acts after W_o where there are no heads: granularity='elementwise', shared_heads=False")
        _check(_is_number(self.floor) and 0.0 <= self.floor < 1.0, "gate.floor", self.floor,
               "a number in [0, 1) (0: the plain sigmoid)")
        if self.floor:
            _check(self.activation == "sigmoid", "gate.floor", self.floor,
                   f"0 with gate.activation={self.activation!r} (a floor is defined for the sigmoid gate)")

    @property
    def enabled(self) -> bool:
        return self.position != "none"

    @property
    def label(self) -> str:
        if not self.enabled:
            return "baseline"
        parts = [self.position, self.granularity]
        if self.activation != "sigmoid":
            parts.append(self.activation)
        if self.mode != "multiplicative":
            parts.append(self.mode)
        if self.shared_heads:
            parts.append("shared")
        if self.floor:
            parts.append(f"floor{self.floor:g}")
        return "-".join(parts)


@dataclass(frozen=True)
class ModelConfig:
    """The model an arm trains, and its size.

    source: "harness" (the harness's own decoder, ``stability.model.lm``) or "hf" (a Hugging Face causal LM
    built from ``hf_config``: one of ``HF_CONFIGS``, sized by the fields below, or a local directory
    holding a config.json; random init, nothing downloaded). factory: "package.module:function" that
    builds the model of an arm (``stability.model.build``); when set, it replaces ``source``.

    family (harness source): "llama" (RMSNorm pre-norm, RoPE, SwiGLU, tied head) or "gpt2" (LayerNorm
    with bias, learned absolute positions, GELU MLP, untied head). bias: biases in the attention and MLP
    Linears (never in the gate). init: "normal" (N(0, init_std), output projections scaled by
    1/sqrt(2 n_layers)) or "pytorch" (PyTorch's default layer init), drawn per parameter name.

    Qwen3-Next options: head_dim (0: d_model / n_heads), rope_fraction (the leading fraction of each
    head's dims that RoPE rotates), gate_in_q (the G1 gate's projection interleaved per head inside
    q_proj), norm_plus_one (RMSNorm gains stored as w with the scale (1 + w), w starting at 0).
    """

    vocab_size: int = 257
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4
    context: int = 128
    d_ff: int = 0  # 0 means 8/3 * d_model rounded up to a multiple of 32 (llama) or 4 * d_model (gpt2)
    qk_norm: bool = False
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    backend: str = "torch"
    attn_softcap: float = 0.0  # cap * tanh(score / cap) on the attention scores (Gemma 2: 50); 0 = off
    gate: GateConfig = field(default_factory=GateConfig)
    source: str = "harness"
    family: str = "llama"
    hf_config: str = "llama"
    factory: str = ""
    bias: bool = False
    init: str = "normal"
    head_dim: int = 0
    rope_fraction: float = 1.0
    gate_in_q: bool = False
    norm_plus_one: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "context"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, f"model.{name}", value, "a positive integer")
        _check(self.source in MODEL_SOURCES, "model.source", self.source, f"one of {MODEL_SOURCES}")
        _check(self.family in MODEL_FAMILIES, "model.family", self.family, f"one of {MODEL_FAMILIES}")
        _check(self.init in INITS, "model.init", self.init, f"one of {INITS}")
        _check(isinstance(self.head_dim, int) and self.head_dim >= 0, "model.head_dim", self.head_dim,
               "a non-negative integer (0 = d_model / n_heads)")
        if self.head_dim == 0:
            _check(self.d_model % self.n_heads == 0, "model.n_heads", self.n_heads,
                   f"a divisor of model.d_model={self.d_model} (or set model.head_dim)")
        _check(self.n_heads % self.n_kv_heads == 0, "model.n_kv_heads", self.n_kv_heads,
               f"a divisor of model.n_heads={self.n_heads}")
        _check(isinstance(self.rope_fraction, (int, float)) and 0 < self.rope_fraction <= 1, "model.rope_fraction",
               self.rope_fraction, "a fraction in (0, 1]")
        _check(self.rotary_dim >= 2 and self.rotary_dim % 2 == 0, "model.rope_fraction", self.rope_fraction,
               f"a fraction of the head dim {self.head_size} that RoPE can rotate: an even number of dims >= 2 "
               f"(got {self.rotary_dim})")
        _check(isinstance(self.d_ff, int) and self.d_ff >= 0, "model.d_ff", self.d_ff,
               "a non-negative integer (0 = automatic)")
        _check(self.backend in BACKENDS, "model.backend", self.backend, f"one of {BACKENDS}")
        _check(self.init_std > 0, "model.init_std", self.init_std, "a positive number")
        _check(self.norm_eps > 0, "model.norm_eps", self.norm_eps, "a positive number")
        _check(self.factory == "" or _is_factory_path(self.factory), "model.factory", self.factory,
               "'' or 'package.module:function'")
        _check(not (self.factory and self.source == "hf"), "model.factory", self.factory,
               "'' when model.source='hf' (a factory builds the model itself: leave model.source='harness')")
        if self.family == "gpt2":
            _check(not self.norm_plus_one, "model.norm_plus_one", self.norm_plus_one,
                   "false for model.family='gpt2' (its LayerNorm has a gain and a bias)")
        if self.gate_in_q and self.gate.enabled:
            gate = self.gate
            _check(gate.position == "G1" and gate.granularity == "elementwise" and not gate.shared_heads,
                   "model.gate_in_q", self.gate_in_q,
                   f"false unless the gate is G1, elementwise, per head (this arm's gate is {gate.label})")
        if self.source == "hf" and self.gate.enabled:
            _check(self.gate.position == "G1", "gated_gate.position", self.gate.position,
                   "'G1' with model.source='hf' (the gate is injected before each attention's o_proj)")
        _check_strength(self.attn_softcap, "model.attn_softcap", "cap")
        _check(not self.attn_softcap or (self.source == "harness" and not self.factory), "model.attn_softcap",
               self.attn_softcap, "0 unless the model is the harness's own (model.source='harness', no factory)")
        if self.attn_softcap:
            _check(self.backend != "triton", "model.attn_softcap", self.attn_softcap,
                   "0 with model.backend='triton' (the fused kernel has no soft-cap): use backend 'torch'")

    @property
    def head_size(self) -> int:
        """Width of one attention head: ``head_dim``, or ``d_model / n_heads`` when that is 0."""
        return self.head_dim or self.d_model // self.n_heads

    @property
    def rotary_dim(self) -> int:
        """Dims of each head that RoPE rotates (the leading ones): ``int(head_size * rope_fraction)``."""
        return int(self.head_size * self.rope_fraction)

    @property
    def ffn_dim(self) -> int:
        if self.d_ff:
            return self.d_ff
        return 4 * self.d_model if self.family == "gpt2" else 32 * math.ceil(8 * self.d_model / 3 / 32)


def _is_factory_path(text: str) -> bool:
    module, sep, function = text.partition(":")
    return bool(sep) and all(part.isidentifier() for part in module.split(".")) and function.isidentifier()


@dataclass(frozen=True)
class DataConfig:
    """Where tokens come from (``stability.data``).

    corpus: "builtin" (generated text), "stdlib" (the Python standard library's source files), a text
    file (bytes), a ``.bin`` uint16 token file, or, with ``tokenizer`` set, a text / JSONL / Parquet
    file to tokenize. tokenizer: a local Hugging Face tokenizer directory (holding tokenizer.json).
    text_field: the JSONL key / Parquet column holding the text. token_dir: where tokenized files are
    written once (then memory-mapped)."""

    corpus: str = "builtin"
    batch_size: int = 16
    holdout_fraction: float = 0.1
    builtin_bytes: int = 1_000_000
    bos: bool = True
    tokenizer: str = ""
    text_field: str = "text"
    token_dir: str = "data/tokens"

    def __post_init__(self) -> None:
        _check(isinstance(self.batch_size, int) and self.batch_size > 0, "data.batch_size", self.batch_size,
               "a positive integer")
        _check(0.0 < self.holdout_fraction < 0.5, "data.holdout_fraction", self.holdout_fraction,
               "a fraction in (0, 0.5)")
        _check(self.builtin_bytes >= 10_000, "data.builtin_bytes", self.builtin_bytes, "at least 10000")
        _check(isinstance(self.corpus, str) and self.corpus != "", "data.corpus", self.corpus,
               "'builtin', 'stdlib' or a path to a text or .bin token file")
        if self.tokenizer:
            _check(self.corpus not in ("builtin", "stdlib") and not self.corpus.endswith(".bin"), "data.corpus",
                   self.corpus, "a text, .jsonl or .parquet file when data.tokenizer is set")
        _check(self.text_field != "", "data.text_field", self.text_field, "a JSONL key or Parquet column name")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay (to ``min_lr_ratio * lr``) or constant.

    z_loss: coefficient of the auxiliary loss ``z_loss * mean(log Z)^2`` on the LM head's
    log-partition ``log Z = logsumexp(logits)`` (PaLM, Chowdhery et al. 2022, used 1e-4); it keeps
    the output logits from drifting. The logged loss stays the plain cross-entropy."""

    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 20
    lr_schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # 0 disables clipping
    optimizer: str = "adamw"
    z_loss: float = 0.0  # + z_loss * mean(log Z)^2 of the LM head (PaLM: 1e-4); 0 = off

    def __post_init__(self) -> None:
        _check(isinstance(self.lr, (int, float)) and self.lr > 0 and math.isfinite(self.lr), "optim.lr",
               self.lr, "a positive finite learning rate")
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optim.betas", self.betas,
               "two numbers in [0, 1)")
        _check(self.eps > 0, "optim.eps", self.eps, "a positive number")
        _check(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "a non-negative number")
        _check(isinstance(self.warmup_steps, int) and self.warmup_steps >= 0, "optim.warmup_steps",
               self.warmup_steps, "a non-negative integer")
        _check(self.lr_schedule in LR_SCHEDULES, "optim.lr_schedule", self.lr_schedule, f"one of {LR_SCHEDULES}")
        _check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", self.min_lr_ratio, "a number in [0, 1]")
        _check(self.grad_clip >= 0, "optim.grad_clip", self.grad_clip, "a non-negative number (0 = off)")
        _check(self.optimizer in OPTIMIZERS, "optim.optimizer", self.optimizer, f"one of {OPTIMIZERS}")
        _check_strength(self.z_loss, "optim.z_loss", "coefficient")


@dataclass(frozen=True)
class PrecisionConfig:
    """Numeric format of training (``stability.precision``).

    dtype: one of PRECISIONS. fp16 scales the loss with ``torch.amp.GradScaler`` unless
    ``loss_scaling`` is False: it starts at ``init_loss_scale``, multiplies the scale by
    ``backoff_factor`` (and skips the step) when the gradients hold an inf/NaN, and by
    ``growth_factor`` after ``growth_interval`` clean steps in a row. fp8: ``fp8_recipe`` names a
    torchao.float8 recipe ("tensorwise": per-tensor scales, e4m3 forward / e5m2 gradients;
    "rowwise": per-row scales, e4m3 throughout; "rowwise_with_gw_hp": rowwise with the weight
    gradient in high precision), or "own", the harness's emulation with per-tensor ``fp8_scaling``
    "current" or "delayed" (the max over the last ``fp8_history`` amaxes)."""

    dtype: str = "fp32"
    loss_scaling: bool = True
    init_loss_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 200
    fp8_recipe: str = "tensorwise"
    fp8_scaling: str = "current"
    fp8_history: int = 16

    def __post_init__(self) -> None:
        _check(self.dtype in PRECISIONS, "precision.dtype", self.dtype, f"one of {PRECISIONS}")
        _check(self.fp8_recipe in FP8_RECIPES, "precision.fp8_recipe", self.fp8_recipe,
               f"one of {FP8_RECIPES} (torchao.float8's recipe names, or 'own' for the harness's emulation)")
        _check(self.fp8_scaling in FP8_SCALINGS, "precision.fp8_scaling", self.fp8_scaling,
               f"one of {FP8_SCALINGS}")
        _check(_positive_finite(self.init_loss_scale), "precision.init_loss_scale", self.init_loss_scale,
               "a positive finite number")
        _check(_positive_finite(self.growth_factor) and self.growth_factor > 1, "precision.growth_factor",
               self.growth_factor, "a finite number above 1")
        _check(_positive_finite(self.backoff_factor) and self.backoff_factor < 1, "precision.backoff_factor",
               self.backoff_factor, "a number in (0, 1)")
        _check(isinstance(self.growth_interval, int) and not isinstance(self.growth_interval, bool)
               and self.growth_interval > 0, "precision.growth_interval", self.growth_interval,
               "a positive integer (clean steps before the loss scale grows)")
        _check(isinstance(self.fp8_history, int) and self.fp8_history >= 1, "precision.fp8_history",
               self.fp8_history, "a positive integer")

    @property
    def uses_torchao(self) -> bool:
        """Whether this format is trained through torchao (fp8 with a torchao recipe, the MX formats)."""
        return self.dtype in ("mxfp8", "mxfp4") or (self.dtype == "fp8" and self.fp8_recipe != "own")


@dataclass(frozen=True)
class ProbeConfig:
    """When and how the probes look. Spike detection: a step is a spike when its value is at least
    ``spike_k`` standard deviations above the mean of the previous ``spike_window`` finite values
    (defaults suit runs of a few hundred steps; OLMo 2 uses k=7, w=1000). cast_every: the
    low-precision overflow / underflow counters (``stability.precision``) count on every N-th
    training step; counting torchao's casts repeats them, which costs about as much again."""

    every: int = 50
    probe_batch_size: int = 4
    spike_window: int = 50
    spike_k: float = 6.0
    spike_min_history: int = 10
    diverge_patience: int = 20
    diverge_factor: float = 1.0
    localize_nonfinite: bool = True
    eval_batches: int = 8
    cast_every: int = 1

    def __post_init__(self) -> None:
        _check(isinstance(self.every, int) and self.every > 0, "probes.every", self.every, "a positive integer")
        _check(self.probe_batch_size > 0, "probes.probe_batch_size", self.probe_batch_size, "a positive integer")
        _check(self.spike_window >= 2, "probes.spike_window", self.spike_window, "an integer >= 2")
        _check(self.spike_k > 0, "probes.spike_k", self.spike_k, "a positive number")
        _check(2 <= self.spike_min_history <= self.spike_window, "probes.spike_min_history",
               self.spike_min_history, f"an integer in [2, spike_window={self.spike_window}]")
        _check(self.diverge_patience > 0, "probes.diverge_patience", self.diverge_patience, "a positive integer")
        _check(self.diverge_factor > 0, "probes.diverge_factor", self.diverge_factor, "a positive number")
        _check(self.eval_batches > 0, "probes.eval_batches", self.eval_batches, "a positive integer")
        _check(isinstance(self.cast_every, int) and self.cast_every > 0, "probes.cast_every", self.cast_every,
               "a positive integer (count low-precision overflow / underflow on every N-th step)")


FAULT_KINDS = ("none", "nan", "inf", "lr_spike", "kill")


@dataclass(frozen=True)
class FaultConfig:
    """A deliberate fault, used to prove the detectors: at ``step``, make the output of
    block ``layer`` NaN ("nan") or multiply the learning rate by ``lr_factor`` ("lr_spike").
    Under torchrun: ``rank`` limits a "nan"/"inf" fault to that process (-1: every process), and
    "kill" makes process ``rank`` die at once (SIGKILL) at ``step``, to prove a lost process stops
    the job with the steps so far on disk."""

    kind: str = "none"
    step: int = 0
    layer: int = 0
    lr_factor: float = 100.0
    rank: int = -1

    def __post_init__(self) -> None:
        _check(self.kind in FAULT_KINDS, "fault.kind", self.kind, f"one of {FAULT_KINDS}")
        _check(self.step >= 0 and self.layer >= 0, "fault.step", (self.step, self.layer),
               "a non-negative step and layer")
        _check(isinstance(self.rank, int) and not isinstance(self.rank, bool) and self.rank >= -1, "fault.rank",
               self.rank, "a process rank >= 0, or -1 for every process")
        if self.kind == "kill":
            _check(self.rank >= 0, "fault.rank", self.rank, "the rank >= 0 of the process that fault.kind='kill' "
                   "kills (it is meant for runs under torchrun)")


DISTRIBUTED_STRATEGIES = ("fsdp", "ddp")


@dataclass(frozen=True)
class DistributedConfig:
    """How one arm trains when the command runs under torchrun (``WORLD_SIZE`` > 1); ignored otherwise.

    strategy: "fsdp" shards every block and the root with FSDP2 (``torch.distributed.fsdp.fully_shard``);
        "ddp" keeps a full replica per process (``DistributedDataParallel``).
    reshard_after_forward: FSDP2 frees the gathered parameters of a block after its forward (less memory,
        one more all-gather in the backward); False keeps them until the backward.
    """

    strategy: str = "fsdp"
    reshard_after_forward: bool = True

    def __post_init__(self) -> None:
        _check(self.strategy in DISTRIBUTED_STRATEGIES, "distributed.strategy", self.strategy,
               f"one of {DISTRIBUTED_STRATEGIES}")
        _check(isinstance(self.reshard_after_forward, bool), "distributed.reshard_after_forward",
               self.reshard_after_forward, "true or false")


@dataclass(frozen=True)
class CheckpointConfig:
    """How a long run is kept safe; none of it changes a measured figure (the regression check ignores it).

    every: write a checkpoint of the arm (model, optimiser, loss scaler, data position, RNG states, the
        record so far) every ``every`` steps, and always when the arm is stopped (Ctrl-C); 0 = only then.
    replay_first / replay_worst: replay bundles of flagged steps (loss spike, gradient spike, non-finite)
        per case: the first ``replay_first`` and the worst ``replay_worst`` of the rest (0 and 0: none).
    replay_optimizer: also put the optimiser state into a bundle (about twice the model's size again), so
        the replay applies the update too and reports its norm.
    """

    every: int = 200
    replay_first: int = 2
    replay_worst: int = 2
    replay_optimizer: bool = False

    def __post_init__(self) -> None:
        for name in ("every", "replay_first", "replay_worst"):
            value = getattr(self, name)
            _check(isinstance(value, int) and not isinstance(value, bool) and value >= 0, f"checkpoint.{name}",
                   value, "a non-negative integer")


@dataclass(frozen=True)
class StressConfig:
    """Settings of the stress cases (``stability.cases.stress``) and their schedules (``stability.train.schedules``).

    sweep_lrs: peak LRs of the learning-rate sweep, increasing (a log grid; Wortsman et al. 2023 use
        3e-4 ... 3e-1). ramp_start_lr / ramp_end_lr: the LR range test rises exponentially from start to
        end over ``run.steps`` (no warmup) until the arm diverges. batch_double_every / batch_max_size /
        batch_lr_rule: the batch ramp doubles the batch every N steps up to the cap and scales the LR by
        the batch growth ("none"), its square root ("sqrt") or linearly ("linear"). shock_kind "jump"
        multiplies the LR by ``shock_factor`` from ``shock_step`` to the end; "no_warmup" starts at the
        peak LR with no warmup (shock at step 0). recovery_smoothing: steps of the rolling mean used to
        decide that the loss is back to its pre-shock level. precisions: the rungs of the precision
        ladder, fp32 first (the gaps are measured against it). ladder_steps: steps of each rung (0: the
        run's ``steps``; fewer keep a CPU ladder affordable). threads: CPU intra-op threads while a
        stress case runs (fixed so CPU figures are reproducible; 0 leaves torch's setting alone).
    """

    sweep_lrs: tuple[float, ...] = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
    ramp_start_lr: float = 1e-4
    ramp_end_lr: float = 10.0
    batch_double_every: int = 50
    batch_max_size: int = 256
    batch_lr_rule: str = "sqrt"
    shock_kind: str = "jump"
    shock_step: int = 100
    shock_factor: float = 10.0
    recovery_smoothing: int = 5
    precisions: tuple[str, ...] = PRECISIONS
    ladder_steps: int = 0
    threads: int = 0

    def __post_init__(self) -> None:
        lrs = self.sweep_lrs
        _check(len(lrs) > 0 and all(isinstance(v, (int, float)) and 0 < v and math.isfinite(v) for v in lrs)
               and all(a < b for a, b in itertools.pairwise(lrs)), "stress.sweep_lrs", lrs,
               "a non-empty, strictly increasing tuple of positive finite learning rates")
        _check(isinstance(self.ramp_start_lr, (int, float)) and 0 < self.ramp_start_lr, "stress.ramp_start_lr",
               self.ramp_start_lr, "a positive learning rate")
        _check(isinstance(self.ramp_end_lr, (int, float)) and self.ramp_start_lr < self.ramp_end_lr
               and math.isfinite(self.ramp_end_lr), "stress.ramp_end_lr", self.ramp_end_lr,
               f"a finite learning rate above stress.ramp_start_lr={self.ramp_start_lr!r}")
        _check(isinstance(self.batch_double_every, int) and self.batch_double_every > 0,
               "stress.batch_double_every", self.batch_double_every, "a positive integer")
        _check(isinstance(self.batch_max_size, int) and self.batch_max_size > 0, "stress.batch_max_size",
               self.batch_max_size, "a positive integer")
        _check(self.batch_lr_rule in LR_SCALING_RULES, "stress.batch_lr_rule", self.batch_lr_rule,
               f"one of {LR_SCALING_RULES}")
        _check(self.shock_kind in SHOCK_KINDS, "stress.shock_kind", self.shock_kind, f"one of {SHOCK_KINDS}")
        _check(isinstance(self.shock_step, int) and self.shock_step >= 0, "stress.shock_step", self.shock_step,
               "a non-negative integer")
        _check(isinstance(self.shock_factor, (int, float)) and 0 < self.shock_factor
               and math.isfinite(self.shock_factor), "stress.shock_factor", self.shock_factor,
               "a positive finite factor")
        _check(isinstance(self.recovery_smoothing, int) and self.recovery_smoothing > 0,
               "stress.recovery_smoothing", self.recovery_smoothing, "a positive integer")
        _check(len(self.precisions) > 0 and self.precisions[0] == "fp32"
               and all(p in PRECISIONS for p in self.precisions)
               and len(set(self.precisions)) == len(self.precisions), "stress.precisions", self.precisions,
               f"distinct entries of {PRECISIONS}, starting with 'fp32'")
        _check(isinstance(self.ladder_steps, int) and self.ladder_steps >= 0, "stress.ladder_steps",
               self.ladder_steps, "a non-negative integer (0 = the run's steps)")
        _check(isinstance(self.threads, int) and self.threads >= 0, "stress.threads", self.threads,
               "a non-negative integer (0 = leave torch's setting)")


@dataclass(frozen=True)
class RunConfig:
    """Everything one arm of one seed needs: config in, run record out."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    probes: ProbeConfig = field(default_factory=ProbeConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    steps: int = 200
    seed: int = 0
    device: str = "cpu"
    replicate: int = 0  # 0: the reference run; r >= 1: rounding replicate r (stability.model.rounding)

    def __post_init__(self) -> None:
        _check(isinstance(self.steps, int) and self.steps > 0, "steps", self.steps, "a positive integer")
        _check(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "a non-negative integer")
        _check(isinstance(self.replicate, int) and not isinstance(self.replicate, bool) and self.replicate >= 0,
               "replicate", self.replicate, "a non-negative integer (0: the reference run, r: rounding replicate r)")
        _check(self.device == "cpu" or self.device.startswith("cuda"), "device", self.device,
               "'cpu' or 'cuda[:N]'")
        if self.fault.kind in ("nan", "inf"):
            _check(self.fault.layer < self.model.n_layers, "fault.layer", self.fault.layer,
                   f"a layer index below model.n_layers={self.model.n_layers}")

    @property
    def variant(self) -> str:
        """The gate label plus the stabilizers in use, e.g. "G1-elementwise+qk_norm+z_loss0.0001"."""
        parts = [self.model.gate.label]
        if self.model.qk_norm:
            parts.append("qk_norm")
        if self.optim.z_loss:
            parts.append(f"z_loss{self.optim.z_loss:g}")
        if self.model.attn_softcap:
            parts.append(f"softcap{self.model.attn_softcap:g}")
        return "+".join(parts)


@dataclass(frozen=True)
class ArmConfig:
    """One arm of an experiment: what it changes on top of the shared run.

    gate: the arm's attention gate (position "none": no gate). qk_norm, z_loss, attn_softcap:
    the arm's stabilizers, each None to keep the shared run's ``model.qk_norm``,
    ``optim.z_loss`` and ``model.attn_softcap``. Everything else (model shape, data, optimiser,
    seeds) is shared, so arms of a seed read the same batches and start from the same values in
    every parameter they have in common.
    """

    name: str
    gate: GateConfig = field(default_factory=GateConfig)
    qk_norm: bool | None = None
    z_loss: float | None = None
    attn_softcap: float | None = None

    def __post_init__(self) -> None:
        _check(isinstance(self.name, str) and ARM_NAME.fullmatch(self.name) is not None, "arm name", self.name,
               "letters, digits and '_', starting with a letter (it names records, rows and MLflow runs)")
        _check(self.name not in ARM_SETS, "arm name", self.name,
               f"a name that is not an arm set ({', '.join(ARM_SETS)})")
        if self.z_loss is not None:
            _check_strength(self.z_loss, f"arms.{self.name}.z_loss", "coefficient")
        if self.attn_softcap is not None:
            _check_strength(self.attn_softcap, f"arms.{self.name}.attn_softcap", "cap")

    def apply(self, run: RunConfig) -> RunConfig:
        """``run`` with this arm's gate and stabilizers."""
        model = replace(run.model, gate=self.gate,
                        qk_norm=run.model.qk_norm if self.qk_norm is None else self.qk_norm,
                        attn_softcap=run.model.attn_softcap if self.attn_softcap is None else self.attn_softcap)
        optim = run.optim if self.z_loss is None else replace(run.optim, z_loss=self.z_loss)
        return replace(run, model=model, optim=optim)


ARM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
PAPER_GATE = GateConfig(position="G1")  # Qiu et al.'s recommendation: elementwise, head-specific, sigmoid
Z_LOSS = 1e-4      # PaLM's z-loss coefficient
SOFTCAP = 50.0     # Gemma 2's attention-logit soft-cap

# named groups of treatment arms: ``arms=controls`` trains the baseline and these
ARM_SETS: dict[str, tuple[str, ...]] = {
    "pair": ("gated",),
    "controls": ("gated", "gated_headwise", "gated_floored", "gated_value"),
    "stabilizers": ("gated", "qk_norm", "z_loss", "softcap"),
    "stabilizers_gated": ("gated", "gated_qk_norm", "gated_z_loss", "gated_softcap"),
}


NAMED_ARMS: dict[str, ArmConfig] = {arm.name: arm for arm in (
    ArmConfig(BASELINE_ARM),
    # the gate and the paper's controls (Qiu et al. 2025: G1 elementwise; headwise; floored; G2 value gate)
    ArmConfig("gated", gate=PAPER_GATE),
    ArmConfig("gated_headwise", gate=GateConfig(position="G1", granularity="headwise")),
    ArmConfig("gated_floored", gate=GateConfig(position="G1", floor=0.5)),
    ArmConfig("gated_value", gate=GateConfig(position="G2")),
    # the usual stabilizers, alone and with the gate
    ArmConfig("qk_norm", qk_norm=True),
    ArmConfig("z_loss", z_loss=Z_LOSS),
    ArmConfig("softcap", attn_softcap=SOFTCAP),
    ArmConfig("gated_qk_norm", gate=PAPER_GATE, qk_norm=True),
    ArmConfig("gated_z_loss", gate=PAPER_GATE, z_loss=Z_LOSS),
    ArmConfig("gated_softcap", gate=PAPER_GATE, attn_softcap=SOFTCAP),
)}
@dataclass(frozen=True)
class ExtrapolationConfig:
    """The length-extrapolation probe, run on every arm after training (off while ``factors`` is empty).

    factors: evaluation lengths as multiples of ``model.context`` (1 is always evaluated; 2 and 4
    are the usual). At each length the held-out loss, F-Attn and sink rate are measured with the
    plain rotary tables extended to that length, and (``scaling="ntk"``) with NTK-aware scaled RoPE
    (base ``theta * s ** (d / (d - 2))`` for factor s and head dim d; Peng et al. 2023, YaRN, sec. 3.1).
    eval_batches: held-out batches of ``data.batch_size`` sequences per length.
    """

    factors: tuple[float, ...] = ()
    scaling: str = "ntk"
    eval_batches: int = 4

    def __post_init__(self) -> None:
        _check(all(_is_number(f) and f >= 1 for f in self.factors), "extrapolation.factors", self.factors,
               "factors >= 1 (multiples of model.context; 1 is the training context)")
        _check(len(set(self.factors)) == len(self.factors), "extrapolation.factors", self.factors,
               "distinct factors")
        _check(self.scaling in ROPE_SCALINGS, "extrapolation.scaling", self.scaling, f"one of {ROPE_SCALINGS}")
        _check(isinstance(self.eval_batches, int) and self.eval_batches > 0, "extrapolation.eval_batches",
               self.eval_batches, "a positive integer")

    @property
    def enabled(self) -> bool:
        return bool(self.factors)

    def lengths(self, context: int) -> list[tuple[float, int]]:
        """(factor, sequence length) of every evaluated length, 1 first."""
        return [(f, round(context * f)) for f in sorted({1.0, *map(float, self.factors)})]


def _default_arms() -> tuple[ArmConfig, ...]:
    return NAMED_ARMS[BASELINE_ARM], NAMED_ARMS["gated"]


@dataclass(frozen=True)
class ExperimentConfig:
    """A paired experiment: the same run under each arm (baseline first), for several seeds."""

    name: str = "pair"
    preset: str = "custom"
    run: RunConfig = field(default_factory=RunConfig)
    arms: tuple[ArmConfig, ...] = field(default_factory=_default_arms)
    seeds: tuple[int, ...] = (0,)
    quant_schemes: tuple[str, ...] = ()
    extrapolation: ExtrapolationConfig = field(default_factory=ExtrapolationConfig)
    stress: StressConfig = field(default_factory=StressConfig)
    replicates: int = 4  # rounding replicates per run of a regression baseline (stability baseline make)

    def __post_init__(self) -> None:
        _check(isinstance(self.replicates, int) and not isinstance(self.replicates, bool) and self.replicates >= 2,
               "replicates", self.replicates, "an integer >= 2 (rounding replicates per run of a baseline)")
        _check(len(self.seeds) > 0 and len(set(self.seeds)) == len(self.seeds), "seeds", self.seeds,
               "a non-empty tuple of distinct seeds")
        unknown = [s for s in self.quant_schemes if s not in QUANT_SCHEMES]
        _check(not unknown, "quant_schemes", self.quant_schemes,
               f"names from {QUANT_SCHEMES} (unknown: {unknown})")
        model = self.run.model
        _check(not self.quant_schemes or (model.source == "harness" and not model.factory), "quant_schemes",
               self.quant_schemes, "() unless the model is the harness's own (model.source='harness', no factory)")
        rope_model = model.source == "harness" and not model.factory and model.family == "llama"
        _check(not self.extrapolation.enabled or rope_model, "extrapolation.factors", self.extrapolation.factors,
               "() unless the model is the harness's own RoPE model (model.source='harness', no factory, "
               "model.family='llama')")
        names = self.arm_names
        _check(len(names) >= 2 and names[0] == BASELINE_ARM, "arms", names,
               f"the {BASELINE_ARM!r} arm first and at least one treatment arm")
        twice = sorted({n for n in names if names.count(n) > 1})
        _check(not twice, "arms", names, f"distinct arm names (used twice: {', '.join(twice)})")
        for arm in self.arms:  # every arm's run must be valid on its own (e.g. no soft-cap with triton)
            try:
                arm.apply(self.run)
            except ConfigError as error:
                raise ConfigError(f"arm {arm.name!r}: {error}") from None

    @property
    def arm_names(self) -> tuple[str, ...]:
        return tuple(arm.name for arm in self.arms)

    def arm(self, name: str) -> ArmConfig:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ConfigError(f"arm={name!r} is invalid: expected one of this experiment's arms {self.arm_names}")

    def arm_config(self, arm: str, seed: int) -> RunConfig:
        """The run config of one arm (by name) at one seed."""
        return replace(self.arm(arm).apply(self.run), seed=seed)


def select_arms(config: ExperimentConfig, value: Any, custom: tuple[str, ...] = ()) -> ExperimentConfig:
    """``config`` with the arms named in ``value`` ("gated,gated_floored", an arm set such as "controls",
    or a list); the baseline is added first when not named. Names come from the config's own arms, then
    ``NAMED_ARMS``; names in ``custom`` (defined by ``arms.<name>.<field>`` overrides) start blank."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in (str(x).strip() for x in items):
        if item:
            names.extend(ARM_SETS.get(item, (item,)))
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"arms={value!r} is invalid: arm name(s) {', '.join(map(repr, twice))} used twice: "
                          f"expected distinct arms")
    if BASELINE_ARM not in names:
        names.insert(0, BASELINE_ARM)
    names.sort(key=lambda n: n != BASELINE_ARM)
    own = {arm.name: arm for arm in config.arms}
    arms = []
    for name in names:
        if name in own:
            arms.append(own[name])
        elif name in NAMED_ARMS:
            arms.append(NAMED_ARMS[name])
        elif name in custom:
            arms.append(ArmConfig(name))
        else:
            raise ConfigError(f"arms={value!r} is invalid: {name!r} is not a named arm: expected names from "
                              f"{tuple(NAMED_ARMS)} or the sets {tuple(ARM_SETS)}, or define it with "
                              f"arms.{name}.<field>=VALUE")
    return replace(config, arms=tuple(arms))


# ----------------------------------------------------------------------------- presets

def _smoke() -> ExperimentConfig:
    """CPU, seconds per arm: proves the machinery, says little about stability."""
    return ExperimentConfig(
        name="smoke", preset="smoke",
        run=RunConfig(
            model=ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, context=64),
            data=DataConfig(batch_size=8, builtin_bytes=300_000),
            optim=OptimConfig(lr=3e-3, warmup_steps=10),
            probes=ProbeConfig(every=25, spike_window=30, diverge_patience=15, eval_batches=4),
            checkpoint=CheckpointConfig(every=50),
            steps=60,
        ),
        seeds=(0, 1, 2),  # the fewest a regression baseline takes (its noise comes from the seed spread)
        # decade grid around the reference LR 3e-3 up to one that diverges; a ramp that crosses
        # LR 1 a third of the way before the end; two batch doublings; a x10 jump at mid-run
        stress=StressConfig(sweep_lrs=(3e-4, 3e-3, 3e-2, 3e-1, 3.0), ramp_start_lr=1e-3, ramp_end_lr=1e4,
                            batch_double_every=20, batch_max_size=32, shock_step=30, shock_factor=10.0,
                            ladder_steps=20, threads=1),
    )


def _ci() -> ExperimentConfig:
    """CPU, about 10 s per arm on one thread: the stress suites in about 5 minutes on 2 idle cores.

    The smoke model trained 5x longer, three seeds, in the regime where the CPU-scale search
    (reports/effects.md) found the arms to differ: peak LR 1e-2, no weight decay, beta2 0.999,
    no gradient clipping (the knobs the literature links to sinks and massive activations). The
    precision ladder trains its rungs for half the run and leaves out mxfp8: the emulated rungs cost
    most of the job (fp16 about 7x an fp32 step on the CPU, mxfp8 6x), and mxfp8's e4m3 elements and MX
    block scales are each measured by another rung (fp8, mxfp4)."""
    return ExperimentConfig(
        name="ci", preset="ci",
        run=RunConfig(
            model=ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, context=64),
            data=DataConfig(batch_size=8, builtin_bytes=1_000_000),
            optim=OptimConfig(lr=1e-2, warmup_steps=30, weight_decay=0.0, betas=(0.9, 0.999), grad_clip=0.0),
            probes=ProbeConfig(every=100, spike_window=50, eval_batches=8),
            checkpoint=CheckpointConfig(every=100),
            steps=300,
        ),
        seeds=(0, 1, 2),  # three seeds: intervals over seeds, and what a regression baseline needs
        # half-decade grid from the reference LR to one that diverges; LR 1 crossed at ~40% of the
        # ramp; two batch doublings; a x10 jump at mid-run
        stress=StressConfig(sweep_lrs=(1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0), ramp_start_lr=1e-3, ramp_end_lr=1e4,
                            batch_double_every=100, batch_max_size=32, shock_step=150, shock_factor=10.0,
                            precisions=("fp32", "bf16", "fp16", "fp8", "mxfp4"), ladder_steps=150, threads=1),
    )


def _full() -> ExperimentConfig:
    """GPU: a 76M-parameter byte-level model (83M gated), bf16, the Triton kernel, on the Python standard library's
    source files (real text every machine has). A tokenized corpus is an override: data.corpus=<file.bin>
    (or a text/JSONL/Parquet file with data.tokenizer=<dir>) and model.vocab_size to match."""
    return ExperimentConfig(
        name="full", preset="full",
        run=RunConfig(
            model=ModelConfig(vocab_size=257, d_model=768, n_layers=12, n_heads=12, n_kv_heads=4,
                              context=1024, backend="triton"),
            data=DataConfig(corpus="stdlib", batch_size=32),
            optim=OptimConfig(lr=1e-3, warmup_steps=200),
            precision=PrecisionConfig(dtype="bf16"),
            probes=ProbeConfig(every=250, spike_window=200, spike_k=6.0, eval_batches=32, probe_batch_size=8),
            checkpoint=CheckpointConfig(every=500),
            steps=5000,
            device="cuda",
        ),
        seeds=(0, 1, 2),
        # Wortsman et al.'s grid plus 1.0; the ramp crosses 1e-2 at mid-run; batch 32 -> 128
        stress=StressConfig(sweep_lrs=(3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0), ramp_start_lr=1e-5,
                            ramp_end_lr=10.0, batch_double_every=1000, batch_max_size=128, shock_step=2500,
                            shock_factor=10.0, threads=0),
    )


PRESETS = {"smoke": _smoke, "ci": _ci, "full": _full}


def preset(name: str) -> ExperimentConfig:
    """The named preset ("smoke", "ci" or "full")."""
    if name not in PRESETS:
        raise ConfigError(f"preset={name!r} is unknown: expected one of {tuple(PRESETS)}")
    return PRESETS[name]()


# ----------------------------------------------------------------------------- overrides

def _coerce(value: Any, hint: Any, name: str) -> Any:
    """Turn a command-line string (or JSON value) into the type a field expects."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):  # ``X | None``: "none" (or null) is None, else an X
        if value is None or str(value).strip().lower() in ("none", "null"):
            return None
        return _coerce(value, next(a for a in get_args(hint) if a is not type(None)), name)
    if origin is tuple:
        items = value.split(",") if isinstance(value, str) else list(value)
        args = get_args(hint)
        item_type = args[0] if args else str
        items = [x for x in items if str(x).strip() != ""] if isinstance(value, str) else items
        return tuple(_coerce(x.strip() if isinstance(x, str) else x, item_type, name) for x in items)
    if hint is bool:
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}={value!r} is invalid: expected true or false")
    try:
        if hint is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if hint is float:
            return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r} is invalid: expected {'an' if hint is int else 'a'} "
                          f"{'integer' if hint is int else 'number'}") from None
    return value if not isinstance(value, str) else str(value)


# the spelling before arms existed: gated_gate.X is arms.gated.gate.X, baseline_gate.X is arms.baseline.gate.X
GATE_ALIASES = {"gated_gate": "gated", "baseline_gate": BASELINE_ARM}


def _override_arm(config: ExperimentConfig, dotted: str, value: Any) -> ExperimentConfig:
    """``arms.<name>.<field>=value``: change arm <name>, adding it (from NAMED_ARMS, else blank) when absent."""
    name, _, path = dotted.partition(".")[2].partition(".")
    if not name or not path:
        raise ConfigError(f"{dotted!r} is not a config field: expected arms=NAMES or arms.<name>.<field>=VALUE")
    if path.partition(".")[0] == "name":
        raise ConfigError(f"{dotted!r} is not settable: an arm's name is its key in arms.<name>.<field>")
    arms = list(config.arms)
    index = next((i for i, arm in enumerate(arms) if arm.name == name), None)
    if index is None:
        arms.append(NAMED_ARMS.get(name) or ArmConfig(name))
        index = len(arms) - 1
    arms[index] = override(arms[index], path, value, f"arms.{name}.")
    return replace(config, arms=tuple(arms))


def override(config: Any, dotted: str, value: Any, _prefix: str = "") -> Any:
    """Return ``config`` with the field at ``dotted`` (e.g. "run.model.d_model") set to ``value``.

    A path may skip the leading "run." ("model.d_model" works on an ExperimentConfig). On an
    ExperimentConfig, "arms" selects arms by name (``select_arms``) and "arms.<name>.<field>" changes
    (or adds) one arm. Errors name the full dotted field."""
    head, _, rest = dotted.partition(".")
    if isinstance(config, ExperimentConfig):
        if head in GATE_ALIASES:
            return override(config, f"arms.{GATE_ALIASES[head]}.gate{dotted[len(head):]}", value)
        if dotted == "arms":
            return select_arms(config, value)
        if head == "arms":
            return _override_arm(config, dotted, value)
    names = {f.name for f in fields(config)}
    if head not in names and "run" in names:
        return override(config, "run." + dotted, value, _prefix)
    full = f"{_prefix}{dotted}"
    if head not in names:
        raise ConfigError(f"{full!r} is not a config field: expected one of "
                          f"{sorted(_prefix + n for n in names)}")
    if (_prefix + head) == "run.model.gate" or (_prefix + head).endswith("model.gate"):
        raise ConfigError(f"{full!r} is not settable: each arm's gate comes from its arm definition; set "
                          f"arms.gated.gate.{rest or 'position'} (or arms.<arm>.gate.*) instead")
    current = getattr(config, head)
    if rest:
        if not is_dataclass(current):
            raise ConfigError(f"{full!r}: field {_prefix + head!r} has no sub-fields")
        return replace(config, **{head: override(current, rest, value, f"{_prefix}{head}.")})
    hint = get_type_hints(type(config))[head]
    if is_dataclass(current):
        if not isinstance(value, dict):
            raise ConfigError(f"{full}={value!r} is invalid: expected a mapping of its fields")
        for key, item in value.items():
            current = override(current, key, item, f"{_prefix}{head}.")
        return replace(config, **{head: current})
    return replace(config, **{head: _coerce(value, hint, full)})


def _named_items(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(item, dict) and isinstance(item.get("name"), str) for item in value)


def flatten(mapping: dict, prefix: str = "") -> dict[str, Any]:
    """{"run": {"model": {"d_model": 64}}} -> {"run.model.d_model": 64} (nested dicts to dotted keys).

    A list of named mappings (the arms; a TOML array of tables) becomes the list of names and each
    one's fields keyed by its name: {"arms": [{"name": "baseline"}, {"name": "gated", "z_loss": 0.1}]}
    -> {"arms": "baseline,gated", "arms.gated.z_loss": 0.1}."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        elif _named_items(value):
            out[f"{prefix}{key}"] = ",".join(item["name"] for item in value)
            for item in value:
                out.update(flatten({k: v for k, v in item.items() if k != "name"}, f"{prefix}{key}.{item['name']}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def load_overrides(path: str | Path) -> dict[str, Any]:
    """Read overrides from a JSON or TOML file (nested tables or dotted keys)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist: expected a JSON or TOML file")
    text = path.read_text()
    if path.suffix == ".toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"config file {str(path)!r} is not valid TOML: {error}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(f"config file {str(path)!r} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of fields")
    return flatten(data)


def resolve(preset_name: str = "smoke", overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """A preset with overrides applied, fully validated.

    The arm selection ``arms`` is applied first, wherever it stands. The other overrides are applied in
    order; one that is invalid only until another is applied (model.d_model=64 before model.n_heads=4 on
    a 12-head preset) is retried after the others, so their order does not matter (``arms.<name>.<field>``
    changes a selected arm, or adds a new one). An override that stays invalid raises its error; several
    that stay invalid raise one error naming each with its reason. Every treatment arm must train a run
    other than the baseline's."""
    config = preset(preset_name)
    overrides = dict(overrides or {})
    if "arms" in overrides:
        defined = tuple(key.split(".")[1] for key in overrides if key.startswith("arms.") and key.count(".") >= 2)
        config = select_arms(config, overrides.pop("arms"), custom=defined)
    pending = list(overrides.items())
    while pending:
        failed: list[tuple[str, Any, ConfigError]] = []
        for dotted, value in pending:
            try:
                config = override(config, dotted, value)
            except ConfigError as error:
                failed.append((dotted, value, error))
        if len(failed) == len(pending) == 1:
            raise failed[0][2]
        if len(failed) == len(pending):
            reasons = "; ".join(f"{dotted}={value!r} ({error})" for dotted, value, error in failed)
            raise ConfigError(f"these overrides cannot hold together: {reasons}")
        pending = [(dotted, value) for dotted, value, _ in failed]
    baseline = config.arm_config(BASELINE_ARM, 0)
    for name in config.arm_names[1:]:
        if config.arm_config(name, 0) == baseline:
            raise ConfigError(f"arms.{name} is invalid: it trains the same run as the baseline (same gate and "
                              f"stabilizers): expected an arm that differs in its gate, qk_norm, z_loss or "
                              f"attn_softcap")
    return config


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready nested dict of a config."""
    return dataclasses.asdict(config)


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild a config dataclass from ``to_dict`` output (nested dataclasses and tuples)."""
    hints = get_type_hints(cls)
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value, hint = data[f.name], hints[f.name]
        if is_dataclass(hint):
            value = from_dict(hint, value)
        elif get_origin(hint) is tuple:
            item = (get_args(hint) or (None,))[0]
            value = tuple(from_dict(item, v) if is_dataclass(item) else v for v in value)
        kwargs[f.name] = value
    return cls(**kwargs)
