"""Typed, validated configuration and the named scale presets.

Every config is a frozen dataclass checked in ``__post_init__``: a bad value raises
``ConfigError`` naming the field, the value and what was expected, before any
training starts. ``resolve(preset, overrides)`` builds a full ``ExperimentConfig``
from a preset name plus dotted overrides such as ``{"model.d_model": 256}``.
"""

from __future__ import annotations

import dataclasses
import itertools
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
LR_SCALING_RULES = ("none", "linear", "sqrt")
SHOCK_KINDS = ("jump", "no_warmup")
OPTIMIZERS = ("adamw", "adamw8bit")
# the stress cases of stability.stress, in the order `stability stress` runs them
STRESS_CASES = ("standard", "lr_sweep", "lr_ramp", "batch_ramp", "precision_ladder", "shock")
# post-training quantization schemes (stability.quantize evaluates them; kept here to avoid an import cycle)
QUANT_SCHEMES = ("int8", "int8-nooutlier", "nf4", "fp4", "w8a8-tensor", "w8a8-token", "fp8")


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
    """Settings of the stress cases (``stability.stress``) and their schedules (``stability.schedules``).

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
    stress: StressConfig = field(default_factory=StressConfig)

    def __post_init__(self) -> None:
        _check(len(self.seeds) > 0 and len(set(self.seeds)) == len(self.seeds), "seeds", self.seeds,
               "a non-empty tuple of distinct seeds")
        _check(self.gated_gate.enabled, "gated_gate.position", self.gated_gate.position,
               "a gate position other than 'none' for the gated arm")
        unknown = [s for s in self.quant_schemes if s not in QUANT_SCHEMES]
        _check(not unknown, "quant_schemes", self.quant_schemes,
               f"names from {QUANT_SCHEMES} (unknown: {unknown})")

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
            checkpoint=CheckpointConfig(every=50),
            steps=60,
        ),
        seeds=(0, 1, 2),  # the fewest a regression baseline takes (its noise comes from the seed spread)
        # decade grid around the reference LR 3e-3 up to one that diverges; a ramp that crosses
        # LR 1 a third of the way before the end; two batch doublings; a x10 jump at mid-run
        stress=StressConfig(sweep_lrs=(3e-4, 3e-3, 3e-2, 3e-1, 3.0), ramp_start_lr=1e-3, ramp_end_lr=1e4,
                            batch_double_every=20, batch_max_size=32, shock_step=30, shock_factor=10.0,
                            ladder_steps=30, threads=1),
    )


def _ci() -> ExperimentConfig:
    """CPU, about 10 s per arm on one thread: the stress suites in about 15 minutes on 2 cores.

    The smoke model trained 5x longer, three seeds, in the regime where the CPU-scale search
    (reports/effects.md) found the arms to differ: peak LR 1e-2, no weight decay, beta2 0.999,
    no gradient clipping (the knobs the literature links to sinks and massive activations)."""
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
                            threads=1),
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


def override(config: Any, dotted: str, value: Any, _prefix: str = "") -> Any:
    """Return ``config`` with the field at ``dotted`` (e.g. "run.model.d_model") set to ``value``.

    A path may skip the leading "run." ("model.d_model" works on an ExperimentConfig). Errors name the
    full dotted field."""
    head, _, rest = dotted.partition(".")
    names = {f.name for f in fields(config)}
    if head not in names and "run" in names:
        return override(config, "run." + dotted, value, _prefix)
    full = f"{_prefix}{dotted}"
    if head not in names:
        raise ConfigError(f"{full!r} is not a config field: expected one of "
                          f"{sorted(_prefix + n for n in names)}")
    if (_prefix + head) == "run.model.gate" or (_prefix + head).endswith("model.gate"):
        raise ConfigError(f"{full!r} is not settable: each arm's gate comes from its arm definition; set "
                          f"gated_gate.{rest or 'position'} (or baseline_gate.*) instead")
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


def flatten(mapping: dict, prefix: str = "") -> dict[str, Any]:
    """{"run": {"model": {"d_model": 64}}} -> {"run.model.d_model": 64} (nested dicts to dotted keys)."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
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
