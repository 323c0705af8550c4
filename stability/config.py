"""Typed, validated configuration and the named scale presets.

Every config is a frozen dataclass checked in ``__post_init__``: a bad value raises
``ConfigError`` naming the field, the value and what was expected, before any
training starts. ``resolve(preset, overrides)`` builds a full ``ExperimentConfig``
from a preset name plus dotted overrides such as ``{"model.d_model": 256}``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and what was expected."""


def _check(condition: bool, name: str, value: Any, expected: str) -> None:
    if not condition:
        raise ConfigError(f"{name}={value!r} is invalid: expected {expected}")


GATE_POSITIONS = ("none", "G1", "G2", "G3", "G4", "G5")
GATE_GRANULARITIES = ("elementwise", "headwise")
GATE_ACTIVATIONS = ("sigmoid", "silu")
GATE_MODES = ("multiplicative", "additive")
BACKENDS = ("torch", "explicit", "triton")
PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
FP8_SCALINGS = ("current", "delayed")
LR_SCHEDULES = ("cosine", "constant")
OPTIMIZERS = ("adamw", "adamw8bit")


@dataclass(frozen=True)
class GateConfig:
    """Where and how the attention gate acts (Qiu et al. 2025, Table 1 axes).

    position: "none" (baseline), "G1" SDPA output, "G2" value, "G3" key, "G4" query,
    "G5" after the output projection. granularity: "elementwise" (one logit per
    channel) or "headwise" (one logit per head). shared_heads: one set of gate
    logits shared by all heads instead of head-specific ones.
    """

    position: str = "none"
    granularity: str = "elementwise"
    activation: str = "sigmoid"
    mode: str = "multiplicative"
    shared_heads: bool = False

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
        return "-".join(parts)


@dataclass(frozen=True)
class ModelConfig:
    """A small Llama/Qwen-style decoder: RMSNorm pre-norm, RoPE, SwiGLU, GQA."""

    vocab_size: int = 257
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4
    context: int = 128
    d_ff: int = 0  # 0 means 8/3 * d_model rounded up to a multiple of 32
    qk_norm: bool = False
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    backend: str = "torch"
    gate: GateConfig = field(default_factory=GateConfig)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "context"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, f"model.{name}", value, "a positive integer")
        _check(self.d_model % self.n_heads == 0, "model.n_heads", self.n_heads,
               f"a divisor of model.d_model={self.d_model}")
        _check(self.n_heads % self.n_kv_heads == 0, "model.n_kv_heads", self.n_kv_heads,
               f"a divisor of model.n_heads={self.n_heads}")
        _check((self.d_model // self.n_heads) % 2 == 0, "model.n_heads", self.n_heads,
               "a head dim (d_model / n_heads) that is even, as RoPE needs")
        _check(isinstance(self.d_ff, int) and self.d_ff >= 0, "model.d_ff", self.d_ff,
               "a non-negative integer (0 = automatic)")
        _check(self.backend in BACKENDS, "model.backend", self.backend, f"one of {BACKENDS}")
        _check(self.init_std > 0, "model.init_std", self.init_std, "a positive number")
        _check(self.norm_eps > 0, "model.norm_eps", self.norm_eps, "a positive number")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_dim(self) -> int:
        return self.d_ff or 32 * math.ceil(8 * self.d_model / 3 / 32)


@dataclass(frozen=True)
class DataConfig:
    """Where tokens come from. corpus: "builtin", a text file (bytes) or a ``.bin`` uint16 token file."""

    corpus: str = "builtin"
    batch_size: int = 16
    holdout_fraction: float = 0.1
    builtin_bytes: int = 1_000_000
    bos: bool = True

    def __post_init__(self) -> None:
        _check(isinstance(self.batch_size, int) and self.batch_size > 0, "data.batch_size", self.batch_size,
               "a positive integer")
        _check(0.0 < self.holdout_fraction < 0.5, "data.holdout_fraction", self.holdout_fraction,
               "a fraction in (0, 0.5)")
        _check(self.builtin_bytes >= 10_000, "data.builtin_bytes", self.builtin_bytes, "at least 10000")
        _check(isinstance(self.corpus, str) and self.corpus != "", "data.corpus", self.corpus,
               "'builtin' or a path to a text or .bin token file")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay (to ``min_lr_ratio * lr``) or constant."""

    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 20
    lr_schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # 0 disables clipping
    optimizer: str = "adamw"

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


@dataclass(frozen=True)
class PrecisionConfig:
    """Numeric format of training. fp16 uses dynamic loss scaling unless ``loss_scaling`` is False;
    fp8 uses e4m3 for forward operands and e5m2 for gradients, per-tensor scaled."""

    dtype: str = "fp32"
    loss_scaling: bool = True
    init_loss_scale: float = 2.0 ** 16
    fp8_scaling: str = "current"
    fp8_history: int = 16

    def __post_init__(self) -> None:
        _check(self.dtype in PRECISIONS, "precision.dtype", self.dtype, f"one of {PRECISIONS}")
        _check(self.fp8_scaling in FP8_SCALINGS, "precision.fp8_scaling", self.fp8_scaling,
               f"one of {FP8_SCALINGS}")
        _check(self.init_loss_scale > 0, "precision.init_loss_scale", self.init_loss_scale, "a positive number")
        _check(self.fp8_history >= 1, "precision.fp8_history", self.fp8_history, "a positive integer")


@dataclass(frozen=True)
class ProbeConfig:
    """When and how the probes look. Spike detection: a step is a spike when its value is at least
    ``spike_k`` standard deviations above the mean of the previous ``spike_window`` finite values
    (defaults suit runs of a few hundred steps; OLMo 2 uses k=7, w=1000)."""

    every: int = 50
    probe_batch_size: int = 4
    spike_window: int = 50
    spike_k: float = 6.0
    spike_min_history: int = 10
    diverge_patience: int = 20
    diverge_factor: float = 1.0
    localize_nonfinite: bool = True
    eval_batches: int = 8

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


@dataclass(frozen=True)
class FaultConfig:
    """A deliberate fault, used to prove the detectors: at ``step``, make the output of
    block ``layer`` NaN ("nan") or multiply the learning rate by ``lr_factor`` ("lr_spike")."""

    kind: str = "none"
    step: int = 0
    layer: int = 0
    lr_factor: float = 100.0

    def __post_init__(self) -> None:
        _check(self.kind in ("none", "nan", "inf", "lr_spike"), "fault.kind", self.kind,
               "one of ('none', 'nan', 'inf', 'lr_spike')")
        _check(self.step >= 0 and self.layer >= 0, "fault.step", (self.step, self.layer),
               "a non-negative step and layer")


@dataclass(frozen=True)
class RunConfig:
    """Everything one arm of one seed needs: config in, run record out."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    probes: ProbeConfig = field(default_factory=ProbeConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    steps: int = 200
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        _check(isinstance(self.steps, int) and self.steps > 0, "steps", self.steps, "a positive integer")
        _check(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "a non-negative integer")
        _check(self.device == "cpu" or self.device.startswith("cuda"), "device", self.device,
               "'cpu' or 'cuda[:N]'")
        if self.fault.kind in ("nan", "inf"):
            _check(self.fault.layer < self.model.n_layers, "fault.layer", self.fault.layer,
                   f"a layer index below model.n_layers={self.model.n_layers}")


@dataclass(frozen=True)
class ExperimentConfig:
    """A paired experiment: the same run under a baseline and a gated attention, for several seeds."""

    name: str = "pair"
    preset: str = "custom"
    run: RunConfig = field(default_factory=RunConfig)
    baseline_gate: GateConfig = field(default_factory=GateConfig)
    gated_gate: GateConfig = field(default_factory=lambda: GateConfig(position="G1"))
    seeds: tuple[int, ...] = (0,)
    quant_schemes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check(len(self.seeds) > 0 and len(set(self.seeds)) == len(self.seeds), "seeds", self.seeds,
               "a non-empty tuple of distinct seeds")
        _check(self.gated_gate.enabled, "gated_gate.position", self.gated_gate.position,
               "a gate position other than 'none' for the gated arm")

    def arm_config(self, arm: str, seed: int) -> RunConfig:
        """The run config of one arm ("baseline" or "gated") at one seed."""
        _check(arm in ("baseline", "gated"), "arm", arm, "'baseline' or 'gated'")
        gate = self.baseline_gate if arm == "baseline" else self.gated_gate
        return replace(self.run, seed=seed, model=replace(self.run.model, gate=gate))


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
            steps=60,
        ),
        seeds=(0,),
    )


def _ci() -> ExperimentConfig:
    """CPU, about a minute per arm on 2 cores: the largest CPU run that still says something."""
    return ExperimentConfig(
        name="ci", preset="ci",
        run=RunConfig(
            model=ModelConfig(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, context=128),
            data=DataConfig(batch_size=16, builtin_bytes=2_000_000),
            optim=OptimConfig(lr=3e-3, warmup_steps=30),
            probes=ProbeConfig(every=100, spike_window=50, eval_batches=8),
            steps=400,
        ),
        seeds=(0, 1, 2),
    )


def _full() -> ExperimentConfig:
    """GPU: a ~100M-parameter model, bf16, the Triton kernel, a user-supplied token file."""
    return ExperimentConfig(
        name="full", preset="full",
        run=RunConfig(
            model=ModelConfig(vocab_size=50304, d_model=768, n_layers=12, n_heads=12, n_kv_heads=4,
                              context=1024, backend="triton"),
            data=DataConfig(corpus="data/train.bin", batch_size=32),
            optim=OptimConfig(lr=1e-3, warmup_steps=200),
            precision=PrecisionConfig(dtype="bf16"),
            probes=ProbeConfig(every=250, spike_window=200, spike_k=6.0, eval_batches=32, probe_batch_size=8),
            steps=5000,
            device="cuda",
        ),
        seeds=(0, 1, 2),
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
        raise ConfigError(f"{name}={value!r} is invalid: expected a {hint.__name__}") from None
    return value if not isinstance(value, str) else str(value)


def override(config: Any, dotted: str, value: Any) -> Any:
    """Return ``config`` with the field at ``dotted`` (e.g. "run.model.d_model") set to ``value``.

    A path may skip the leading "run." ("model.d_model" works on an ExperimentConfig)."""
    head, _, rest = dotted.partition(".")
    names = {f.name for f in fields(config)}
    if head not in names and "run" in names:
        return override(config, "run." + dotted, value)
    if head not in names:
        raise ConfigError(f"{dotted!r} is not a config field: expected one of {sorted(names)}")
    current = getattr(config, head)
    if rest:
        if not is_dataclass(current):
            raise ConfigError(f"{dotted!r}: field {head!r} has no sub-fields")
        return replace(config, **{head: override(current, rest, value)})
    hint = get_type_hints(type(config))[head]
    if is_dataclass(current):
        if not isinstance(value, dict):
            raise ConfigError(f"{dotted}={value!r} is invalid: expected a mapping of its fields")
        for key, item in value.items():
            current = override(current, key, item)
        return replace(config, **{head: current})
    return replace(config, **{head: _coerce(value, hint, dotted)})


def _flatten(mapping: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
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
        data = tomllib.loads(text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(f"config file {str(path)!r} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of fields")
    return _flatten(data)


def resolve(preset_name: str = "smoke", overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """A preset with overrides applied, fully validated."""
    config = preset(preset_name)
    for dotted, value in (overrides or {}).items():
        config = override(config, dotted, value)
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
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)
