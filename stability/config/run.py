"""The per-run configs: gate, model, data, optimiser, precision, probes, fault, distributed training,
checkpoints, and ``RunConfig``, everything one arm of one seed trains with.

Each is a frozen dataclass checked in ``__post_init__`` (a bad value is a ``ConfigError`` naming the
field, the value and what was expected). Names that a registry defines (the training format
``precision.dtype``: ``stability.precision.FORMATS``) are checked by that registry, once, before any
work (``stability.cli.options``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stability.config.errors import check, check_strength, is_number, positive_finite

GATE_POSITIONS = ("none", "G1", "G2", "G3", "G4", "G5")
GATE_GRANULARITIES = ("elementwise", "headwise")
GATE_ACTIVATIONS = ("sigmoid", "silu")
GATE_MODES = ("multiplicative", "additive")
BACKENDS = ("torch", "explicit", "triton")
# fp8 recipes: torchao.float8's recipe names (Float8LinearRecipeName), and "own", the harness's own
# emulation (per-tensor current or delayed scaling, precision.fp8_scaling)
FP8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp", "own")
FP8_SCALINGS = ("current", "delayed")
LR_SCHEDULES = ("cosine", "constant")
NAMED_CORPORA = ("builtin", "stdlib", "backcopy")  # data.corpus names that are not files
OPTIMIZERS = ("adamw", "adamw8bit")
MODEL_SOURCES = ("harness", "hf")
MODEL_FAMILIES = ("llama", "gpt2")
INITS = ("normal", "pytorch")
# named Hugging Face configs that model.source=hf builds at the harness's sizes (stability.model.hf)
HF_CONFIGS = ("llama", "qwen2", "qwen3")
UNGATED = "ungated"  # the variant label of a model without a gate (GateConfig.label)


@dataclass(frozen=True)
class GateConfig:
    """Where and how the attention gate acts (Qiu et al. 2025, Table 1 axes).

    position: "none" (no gate), "G1" SDPA output, "G2" value, "G3" key, "G4" query,
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
        check(self.position in GATE_POSITIONS, "gate.position", self.position, f"one of {GATE_POSITIONS}")
        check(self.granularity in GATE_GRANULARITIES, "gate.granularity", self.granularity,
              f"one of {GATE_GRANULARITIES}")
        check(self.activation in GATE_ACTIVATIONS, "gate.activation", self.activation,
              f"one of {GATE_ACTIVATIONS}")
        check(self.mode in GATE_MODES, "gate.mode", self.mode, f"one of {GATE_MODES}")
        if self.position == "G5":
            check(self.granularity == "elementwise" and not self.shared_heads, "gate.position", "G5",
                  "G5 acts after W_o where there are no heads: granularity='elementwise', shared_heads=False")
        check(is_number(self.floor) and 0.0 <= self.floor < 1.0, "gate.floor", self.floor,
              "a number in [0, 1) (0: the plain sigmoid)")
        if self.floor:
            check(self.activation == "sigmoid", "gate.floor", self.floor,
                  f"0 with gate.activation={self.activation!r} (a floor is defined for the sigmoid gate)")

    @property
    def enabled(self) -> bool:
        return self.position != "none"

    @property
    def label(self) -> str:
        if not self.enabled:
            return UNGATED
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
    treatments: tuple[str, ...] = ()  # registered mechanisms applied to the built model (stability.model.treatments)

    def __post_init__(self) -> None:
        check(all(isinstance(t, str) and t.strip() for t in self.treatments)
              and len(set(self.treatments)) == len(self.treatments), "model.treatments", self.treatments,
              "distinct names of treatments (stability.model.treatments.TREATMENTS)")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "context"):
            value = getattr(self, name)
            check(isinstance(value, int) and value > 0, f"model.{name}", value, "a positive integer")
        check(self.source in MODEL_SOURCES, "model.source", self.source, f"one of {MODEL_SOURCES}")
        check(self.family in MODEL_FAMILIES, "model.family", self.family, f"one of {MODEL_FAMILIES}")
        check(self.init in INITS, "model.init", self.init, f"one of {INITS}")
        check(isinstance(self.head_dim, int) and self.head_dim >= 0, "model.head_dim", self.head_dim,
              "a non-negative integer (0 = d_model / n_heads)")
        if self.head_dim == 0:
            check(self.d_model % self.n_heads == 0, "model.n_heads", self.n_heads,
                  f"a divisor of model.d_model={self.d_model} (or set model.head_dim)")
        check(self.n_heads % self.n_kv_heads == 0, "model.n_kv_heads", self.n_kv_heads,
              f"a divisor of model.n_heads={self.n_heads}")
        check(isinstance(self.rope_fraction, (int, float)) and 0 < self.rope_fraction <= 1, "model.rope_fraction",
              self.rope_fraction, "a fraction in (0, 1]")
        check(self.rotary_dim >= 2 and self.rotary_dim % 2 == 0, "model.rope_fraction", self.rope_fraction,
              f"a fraction of the head dim {self.head_size} that RoPE can rotate: an even number of dims >= 2 "
              f"(got {self.rotary_dim})")
        check(isinstance(self.d_ff, int) and self.d_ff >= 0, "model.d_ff", self.d_ff,
              "a non-negative integer (0 = automatic)")
        check(self.backend in BACKENDS, "model.backend", self.backend, f"one of {BACKENDS}")
        check(self.init_std > 0, "model.init_std", self.init_std, "a positive number")
        check(self.norm_eps > 0, "model.norm_eps", self.norm_eps, "a positive number")
        check(self.factory == "" or _is_factory_path(self.factory), "model.factory", self.factory,
              "'' or 'package.module:function'")
        check(not (self.factory and self.source == "hf"), "model.factory", self.factory,
              "'' when model.source='hf' (a factory builds the model itself: leave model.source='harness')")
        if self.family == "gpt2":
            check(not self.norm_plus_one, "model.norm_plus_one", self.norm_plus_one,
                  "false for model.family='gpt2' (its LayerNorm has a gain and a bias)")
        if self.gate_in_q and self.gate.enabled:
            gate = self.gate
            check(gate.position == "G1" and gate.granularity == "elementwise" and not gate.shared_heads,
                  "model.gate_in_q", self.gate_in_q,
                  f"false unless the gate is G1, elementwise, per head (this arm's gate is {gate.label})")
        if self.source == "hf" and self.gate.enabled:
            check(self.gate.position == "G1", "gated_gate.position", self.gate.position,
                  "'G1' with model.source='hf' (the gate is injected before each attention's o_proj)")
        check_strength(self.attn_softcap, "model.attn_softcap", "cap")
        check(not self.attn_softcap or self.kind == "harness", "model.attn_softcap",
              self.attn_softcap, "0 unless the model is the harness's own (model.source='harness', no factory)")
        if self.attn_softcap:
            check(self.backend != "triton", "model.attn_softcap", self.attn_softcap,
                  "0 with model.backend='triton' (the fused kernel has no soft-cap): use backend 'torch'")

    @property
    def kind(self) -> str:
        """Which model this is: "harness" (the harness's own, ``stability.model.lm``), "hf" (a Hugging Face
        causal LM) or "factory" (``model.factory`` builds it)."""
        return "factory" if self.factory else self.source

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

    corpus: "builtin" (generated text), "stdlib" (the Python standard library's source files),
    "backcopy" (synthetic back-copy documents, where most positions have nothing to attend to, beside
    the generated text: ``stability.data.backcopy``), a text file (bytes), a ``.bin`` uint16 token file,
    or, with ``tokenizer`` set, a text / JSONL / Parquet file to tokenize. builtin_bytes: the size of
    "builtin" and "backcopy". text_fraction: the share of "backcopy"'s bytes that is generated text
    (0: synthetic only); no other corpus reads it. tokenizer: a local Hugging Face tokenizer directory (holding tokenizer.json).
    text_field: the JSONL key / Parquet column holding the text. token_dir: where tokenized files are
    written once (then memory-mapped)."""

    corpus: str = "builtin"
    batch_size: int = 16
    holdout_fraction: float = 0.1
    builtin_bytes: int = 1_000_000
    text_fraction: float = 0.5
    bos: bool = True
    tokenizer: str = ""
    text_field: str = "text"
    token_dir: str = "data/tokens"

    def __post_init__(self) -> None:
        check(isinstance(self.batch_size, int) and self.batch_size > 0, "data.batch_size", self.batch_size,
              "a positive integer")
        check(0.0 < self.holdout_fraction < 0.5, "data.holdout_fraction", self.holdout_fraction,
              "a fraction in (0, 0.5)")
        check(self.builtin_bytes >= 10_000, "data.builtin_bytes", self.builtin_bytes, "at least 10000")
        check(isinstance(self.corpus, str) and self.corpus != "", "data.corpus", self.corpus,
              "'builtin', 'stdlib', 'backcopy' or a path to a text or .bin token file")
        check(is_number(self.text_fraction) and 0.0 <= self.text_fraction <= 1.0, "data.text_fraction",
              self.text_fraction, "a fraction in [0, 1] (the share of the backcopy corpus that is text)")
        if self.tokenizer:
            check(self.corpus not in NAMED_CORPORA and not self.corpus.endswith(".bin"), "data.corpus",
                  self.corpus, "a text, .jsonl or .parquet file when data.tokenizer is set")
        check(self.text_field != "", "data.text_field", self.text_field, "a JSONL key or Parquet column name")


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
        check(isinstance(self.lr, (int, float)) and self.lr > 0 and math.isfinite(self.lr), "optim.lr",
              self.lr, "a positive finite learning rate")
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optim.betas", self.betas,
              "two numbers in [0, 1)")
        check(self.eps > 0, "optim.eps", self.eps, "a positive number")
        check(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "a non-negative number")
        check(isinstance(self.warmup_steps, int) and self.warmup_steps >= 0, "optim.warmup_steps",
              self.warmup_steps, "a non-negative integer")
        check(self.lr_schedule in LR_SCHEDULES, "optim.lr_schedule", self.lr_schedule, f"one of {LR_SCHEDULES}")
        check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", self.min_lr_ratio, "a number in [0, 1]")
        check(self.grad_clip >= 0, "optim.grad_clip", self.grad_clip, "a non-negative number (0 = off)")
        check(self.optimizer in OPTIMIZERS, "optim.optimizer", self.optimizer, f"one of {OPTIMIZERS}")
        check_strength(self.z_loss, "optim.z_loss", "coefficient")


@dataclass(frozen=True)
class PrecisionConfig:
    """Numeric format of training (``stability.precision``).

    dtype: the name of a training format (``stability.precision.FORMATS``: fp32, bf16, fp16, fp8, mxfp8,
    mxfp4 and any registered there; the registry checks the name before any work). fp16 scales the loss with ``torch.amp.GradScaler`` unless
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
        check(isinstance(self.dtype, str) and self.dtype != "", "precision.dtype", self.dtype,
              "the name of a training format (stability.precision.FORMATS)")
        check(self.fp8_recipe in FP8_RECIPES, "precision.fp8_recipe", self.fp8_recipe,
              f"one of {FP8_RECIPES} (torchao.float8's recipe names, or 'own' for the harness's emulation)")
        check(self.fp8_scaling in FP8_SCALINGS, "precision.fp8_scaling", self.fp8_scaling,
              f"one of {FP8_SCALINGS}")
        check(positive_finite(self.init_loss_scale), "precision.init_loss_scale", self.init_loss_scale,
              "a positive finite number")
        check(positive_finite(self.growth_factor) and self.growth_factor > 1, "precision.growth_factor",
              self.growth_factor, "a finite number above 1")
        check(positive_finite(self.backoff_factor) and self.backoff_factor < 1, "precision.backoff_factor",
              self.backoff_factor, "a number in (0, 1)")
        check(isinstance(self.growth_interval, int) and not isinstance(self.growth_interval, bool)
              and self.growth_interval > 0, "precision.growth_interval", self.growth_interval,
              "a positive integer (clean steps before the loss scale grows)")
        check(isinstance(self.fp8_history, int) and self.fp8_history >= 1, "precision.fp8_history",
              self.fp8_history, "a positive integer")


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
        check(isinstance(self.every, int) and self.every > 0, "probes.every", self.every, "a positive integer")
        check(self.probe_batch_size > 0, "probes.probe_batch_size", self.probe_batch_size, "a positive integer")
        check(self.spike_window >= 2, "probes.spike_window", self.spike_window, "an integer >= 2")
        check(self.spike_k > 0, "probes.spike_k", self.spike_k, "a positive number")
        check(2 <= self.spike_min_history <= self.spike_window, "probes.spike_min_history",
              self.spike_min_history, f"an integer in [2, spike_window={self.spike_window}]")
        check(self.diverge_patience > 0, "probes.diverge_patience", self.diverge_patience, "a positive integer")
        check(self.diverge_factor > 0, "probes.diverge_factor", self.diverge_factor, "a positive number")
        check(self.eval_batches > 0, "probes.eval_batches", self.eval_batches, "a positive integer")
        check(isinstance(self.cast_every, int) and self.cast_every > 0, "probes.cast_every", self.cast_every,
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
        check(self.kind in FAULT_KINDS, "fault.kind", self.kind, f"one of {FAULT_KINDS}")
        check(self.step >= 0 and self.layer >= 0, "fault.step", (self.step, self.layer),
              "a non-negative step and layer")
        check(isinstance(self.rank, int) and not isinstance(self.rank, bool) and self.rank >= -1, "fault.rank",
              self.rank, "a process rank >= 0, or -1 for every process")
        if self.kind == "kill":
            check(self.rank >= 0, "fault.rank", self.rank, "the rank >= 0 of the process that fault.kind='kill' "
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
        check(self.strategy in DISTRIBUTED_STRATEGIES, "distributed.strategy", self.strategy,
              f"one of {DISTRIBUTED_STRATEGIES}")
        check(isinstance(self.reshard_after_forward, bool), "distributed.reshard_after_forward",
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
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 0, f"checkpoint.{name}",
                  value, "a non-negative integer")


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
    replicate: int = 0  # 0: the unperturbed run; r >= 1: rounding replicate r (stability.model.rounding)

    def __post_init__(self) -> None:
        check(isinstance(self.steps, int) and self.steps > 0, "steps", self.steps, "a positive integer")
        check(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "a non-negative integer")
        check(isinstance(self.replicate, int) and not isinstance(self.replicate, bool) and self.replicate >= 0,
              "replicate", self.replicate, "a non-negative integer (0: the unperturbed run, r: rounding replicate r)")
        check(self.device == "cpu" or self.device.startswith("cuda"), "device", self.device,
              "'cpu' or 'cuda[:N]'")
        if self.fault.kind in ("nan", "inf"):
            check(self.fault.layer < self.model.n_layers, "fault.layer", self.fault.layer,
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

