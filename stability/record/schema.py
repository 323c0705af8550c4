"""The record's layout: every key a case record, an arm record and their entries may hold, with its type.

A record is the one JSON document per stress case that crosses from training to everything after it
(tracking, the merge check, the report). This module is its contract: the schema version, the status
of a run (``Status``), and one ``TypedDict`` per kind of entry. ``stability.record.validate`` checks a
record against these types (an unknown key at any level, a value of another type, a figure the table
``stability.record.figures`` does not know: RecordError); ``stability.record.build`` is the one place
that writes them. Keys starting with "_" (``_path``: the file a record was read from) live in memory
only and are never written.

A case's own results (``results[<case>]``) are typed in the case's own module (``stability.cases.lr_sweep``
...), beside everything else it declares; ``stability.record.cases`` says how they are checked.

``Required`` keys are in every record a reader may be given (the other keys appear when what they
describe happened: a session, a quantization, torchrun, Ray ...). The JSON holds plain values: a status
is its string, NaN and Inf are null.
"""

from enum import StrEnum
from typing import Any, Literal, NewType, Required, TypedDict, get_args

SCHEMA_VERSION = 4   # 3: the reference arm is named "reference"; 4: a case's name and label under "case" and
                     # "case_label" (stability.record.upgrade reads schemas 2 and 3)

Purpose = Literal["regression", "claim", "fault", "selfcheck"]
PURPOSES: tuple[str, ...] = get_args(Purpose)
"""What a record may be used for: "regression" (a stress case or a plain pair run; the only kind the
merge check and a baseline accept), "claim" (evidence for a paper claim, kept apart), "fault" (a
detector proven by injecting a fault), "selfcheck" (the harness testing itself, e.g. a determinism
re-run)."""

TrackingStatus = Literal["live", "tracked", "not tracked"]


class RecordError(ValueError):
    """A record (or a set of records) cannot be used; the message says which and why. Exit code 2."""

    exit_code = 2


class Status(StrEnum):
    """Where a run (an arm at a seed), or a whole case, stands.

    running: training (or the process died while it was: a crash). completed: every planned step.
    diverged: stopped on a non-finite or exploding loss, a result. killed: stopped by Ctrl-C (a case:
    any run killed or left running). error: an exception stopped it (``stop_reason``, ``traceback``)."""

    RUNNING = "running"
    COMPLETED = "completed"
    DIVERGED = "diverged"
    KILLED = "killed"
    ERROR = "error"

    @property
    def usable(self) -> bool:
        """The run trained a model to its end or to its divergence: evaluated after training, compared
        by the merge check."""
        return self in USABLE

    @property
    def unfinished(self) -> bool:
        """The run stopped before its end without a result (Ctrl-C or a crash): ``--resume`` continues it."""
        return self in UNFINISHED


USABLE = frozenset({Status.COMPLETED, Status.DIVERGED})
UNFINISHED = frozenset({Status.RUNNING, Status.KILLED})

FigureName = NewType("FigureName", str)
"""A key that must name a figure of ``stability.record.figures`` (its own entry or a pattern's)."""

FigureValue = float | bool | None
"""A figure's value: a number (int or float), a flag (true/false), or null (not measured, or NaN/Inf)."""

Figures = dict[FigureName, FigureValue]


# ----------------------------------------------------------------------------- what an arm was built from

ModelInfo = TypedDict("ModelInfo", {
    "source": str,                    # "harness", "hf" or "factory" (stability.model.build)
    "class": str,                     # the model's class name
    "family": str,                    # the model family of the harness's own model: "llama" or "gpt2"
    "attention_backend": str,         # the harness's own model: "torch", "explicit" or "triton"
    "what": str,                      # a model the harness did not write: the setting that named it
    "blocks": int,                    # ... its residual blocks
    "attention_modules": int,         # ... its attention modules
    "attention_implementation": str | None,   # ... Hugging Face's attention implementation
    "factory": str,                   # model.factory
    "hf_config": str,                 # model.hf_config
}, total=False)


class PrecisionInfo(TypedDict, total=False):
    """The training format (``stability.precision.PrecisionPolicy.describe``)."""

    dtype: str
    library: str                      # "torch", "torchao" or "stability"
    version: str | None
    recipe: str
    emulated: bool                    # the low-precision matmuls are emulated, not run on the hardware
    high_precision_linears: list[str]  # Linears left in high precision by the recipe


class DistributedInfo(TypedDict, total=False):
    """How the arm trained across processes under torchrun (``stability.train.distributed``)."""

    world_size: int
    backend: str
    strategy: str                     # "fsdp" or "ddp"
    param_dtype: str
    reduce_dtype: str
    torch: str


class UnitInfo(TypedDict, total=False):
    """The Ray task that trained the arm (``stability.cases.ray_runner``)."""

    id: str
    name: str
    attempt: int
    pid: int


# ----------------------------------------------------------------------------- what an arm measured

class Series(TypedDict, total=False):
    """Per-step values, one list entry per step trained (``stability.train.step``). A record written
    before a probe existed lacks its list."""

    step: list[int]
    lr: list[float]
    batch_size: list[int]
    tokens: list[int]                 # tokens trained so far, after the step
    loss: list[float | None]          # nats/token, cross-entropy only
    grad_norm: list[float | None]     # global L2 norm before clipping
    layer_grad_norm: list[list[float | None]]
    update_norm: list[float | None]   # ||W_after - W_before||
    layer_update_norm: list[list[float | None]]
    loss_scale: list[float | None]
    loss_spike: list[bool]
    grad_spike: list[bool]
    update_spike: list[bool]
    nonfinite: list[str]              # "" or what went non-finite ("loss", "grad")
    skipped: list[bool]               # the optimiser step was skipped


SERIES_KEYS: tuple[str, ...] = tuple(Series.__annotations__)


class Event(TypedDict, total=False):
    """A step with a non-finite loss or gradient and where it started."""

    step: int
    what: str                         # "loss", "grad" or "activation"
    skipped: bool                     # the optimiser skipped the step
    module: str | None                # the first module whose output went non-finite
    layer: int | None
    grad_params: list[str]            # parameters with non-finite gradients (at most 20)
    rank: int | None                  # under torchrun: the first rank that found the module
    rank_modules: list[str | None]    # ... and every rank's finding


class LinearInput(TypedDict, total=False):
    kurtosis: float | None
    inf_norm: float | None


class ProbeSnapshot(TypedDict, total=False):
    """The heavy probes on the fixed probe batch at one step (``stability.train.probes.heavy_probes``).
    Besides these keys a snapshot holds the model figures of the layer probes and the logit probe
    (``m_act_max``, ``f_attn_mean``, ``logit_max`` ...): figures of the table (``FIGURES_BESIDE``), whatever
    registered them (``stability.train.probes.LAYER_PROBES``)."""

    step: int
    layers: list[dict[str, float | None]]    # per layer: m_act, m_act_ratio, f_attn, sink_rate, ...
    linear_inputs: dict[str, LinearInput]   # per Linear (by module name)
    hooked: list[str]                       # the modules the probes hooked (blocks and Linears), by name


FIGURES_BESIDE = (ProbeSnapshot,)
"""Entries that may hold figures of the table besides their own keys."""


class PrecisionStats(TypedDict, total=False):
    """The low-precision format's counts since the previous snapshot."""

    step: int
    overflow_fraction: float | None
    underflow_fraction: float | None
    scale_drops: float


class LrOffLog(TypedDict, total=False):
    """A step whose optimiser stepped with another LR than the logged one."""

    step: int
    logged: float | None              # the LR the series logs (series.lr)
    stepped: list[float | None] | None   # each parameter group's LR as the optimiser stepped; null: it never stepped


class LinearOffFormat(TypedDict, total=False):
    """The calls of one Linear that did not run in the run's format."""

    calls: int
    first_step: int
    ran_as: str                       # what the first one ran in: its output dtype, or its class (fp8, MX)


class LinearCalls(TypedDict, total=False):
    """The Linear calls of the training forwards against the run's format (``stability.train.applied``)."""

    runs_in: str | None               # what a call in the format must run in ("bfloat16", "Float8Linear" ...), as
                                      # stability.precision.rules states it; null: no rule, no call judged
    linears: int                      # the model's nn.Linear modules
    high_precision: list[str]         # those the format declares it leaves in high precision (never judged)
    calls: int                        # Linear calls of the training forwards
    in_format: int                    # ... that ran in the format
    off_format: dict[str, LinearOffFormat]   # per Linear the format covers, the calls that did not


class ProbeModulesMissed(TypedDict, total=False):
    step: int
    modules: list[str]                # modules of the model the snapshot of that step did not hook


class Applied(TypedDict, total=False):
    """What proves the run's stresses and measurements were applied (``stability.train.applied``); the run's
    figures ``lr_off_log_steps``, ``linear_off_format_calls``, ``probe_steps_missed`` and ``probe_modules_missed``
    are read from it."""

    lr_off_log_steps: int             # steps whose optimiser LR was not the logged one
    lr_off_log: list[LrOffLog]        # ... the first 20 of them
    linear_calls: LinearCalls
    probe_steps_missed: list[int]     # steps the config names for the heavy probes without a snapshot
    probe_modules_missed: list[ProbeModulesMissed]   # snapshots that hooked fewer modules than the model has


class HeldOut(TypedDict, total=False):
    heldout_loss: float | None
    perplexity: float | None
    accuracy: float | None


class LinearDamage(TypedDict, total=False):
    kurtosis: float | None
    inf_norm: float | None
    damage: float | None              # relative output error of this Linear alone


class QuantScheme(TypedDict, total=False):
    """One post-training quantization scheme (``stability.evaluate.quantize``): figures, or why it was skipped."""

    skipped: str
    library: str
    version: str | None
    method: str
    heldout_loss: float | None
    perplexity: float | None
    accuracy: float | None
    damage_loss: float | None
    damage_perplexity: float | None
    damage_accuracy: float | None
    kl: float | None
    compute_dtype: str
    threshold: float
    note: str
    blocksize: int
    fp8_format: str
    activation_zeroed_fraction: float | None
    overflow_fraction: float | None
    underflow_fraction: float | None
    per_linear: dict[str, LinearDamage]
    per_linear_error: str
    targeted: list[str]               # the Linears the scheme declares it quantizes (from the model's blocks)
    replaced: list[str]               # ... those the quantized copy holds a quantized module for
    unchanged: bool                   # the quantized model's logits on the probe batch equal the full model's
    seconds: float


class Quant(TypedDict, total=False):
    full_precision: HeldOut
    reference_dtype: str
    head_quantized: bool
    embeddings_quantized: bool
    eval_batches: int
    per_linear_damage: str | None     # what the per-Linear damage is
    schemes: dict[str, QuantScheme]


class ExtrapolationPoint(TypedDict, total=False):
    factor: float
    length: int
    rope: str                         # "plain" or "ntk"
    theta: float
    heldout_loss: float | None
    f_attn: float | None
    sink_rate: float | None
    seconds: float


class Extrapolation(TypedDict, total=False):
    """The length-extrapolation probe (``stability.evaluate.extrapolation``)."""

    scaling: str
    factors: list[float]
    points: list[ExtrapolationPoint]
    seconds: float


class ArmTiming(TypedDict, total=False):
    wall_seconds: float
    train_seconds: float
    probe_seconds: float
    eval_seconds: float
    tokens: int
    tokens_per_second: float
    started_at: float                 # seconds since the epoch
    ended_at: float
    resumed_at_step: int              # the first step of the call that resumed the arm


class ArmRecord(TypedDict, total=False):
    """One arm at one seed (one run of a case)."""

    arm: Required[str]                # its name; "reference" is the reference arm
    variant: str                      # the gate variant ("G1-elementwise", "ungated" ...)
    seed: Required[int]
    schedule: str
    status: Required[Status]
    diverged_at_step: int | None
    stop_reason: str | None
    traceback: str                    # status "error": where the exception came from
    num_parameters: int
    gate_parameters: int
    layer_names: list[str]
    model: ModelInfo
    precision: PrecisionInfo
    distributed: DistributedInfo
    series: Series
    events: list[Event]
    probes: list[ProbeSnapshot]
    precision_stats: list[PrecisionStats]
    applied: Applied                  # what proves its stresses and measurements were applied
    final: Figures                    # the figures of the run (directions and meanings in the table)
    quant: Quant
    extrapolation: Extrapolation
    timing: ArmTiming
    run_name: str                     # arm, seed and the swept LR or precision: the MLflow child run's name
    run_key: str                      # the run's per-step file and checkpoint name
    unit: UnitInfo


# ----------------------------------------------------------------------------- the case

class PairedFigure(TypedDict):
    """One figure of one treatment arm against the reference arm, paired by seed."""

    n: int
    reference: float | None           # the reference arm's mean over the paired seeds
    treatment: float | None           # the arm's mean over the same seeds
    difference: float | None          # mean of (arm - reference) per seed
    ci_low: float | None              # 95% t-interval of the difference
    ci_high: float | None
    p_value: float | None             # exact two-sided sign-flip p
    better: str | None
    seeds: list[int]


class Git(TypedDict, total=False):
    commit: str | None
    branch: str | None
    dirty: bool | None


class ExtensionInfo(TypedDict, total=False):
    """One loaded extension (``stability.config.extensions.Extension``)."""

    name: str
    spec: str
    source: str                       # "entry point" or "config"
    version: str | None


class MachineTorch(TypedDict, total=False):
    """The torch build a record's runs used (``stability.record.machine.describe``)."""

    version: str
    cuda: str | None                  # torch.version.cuda; null: a CPU-only build
    blas: str | None                  # BLAS_INFO of torch.__config__.show() ("mkl", "open" ...)
    lapack: str | None                # LAPACK_INFO
    onednn: str | None                # the oneDNN (MKL-DNN) version of the build
    mkldnn_available: bool


class Machine(TypedDict, total=False):
    """The machine a record was made on (``stability.record.machine.describe``; its key: ``machine_key``)."""

    cpu: str                          # /proc/cpuinfo's model name (else platform.processor())
    isa: list[str] | None             # the SIMD flags present that change rounding or kernels; null: unknown
    cpu_capability: str | None        # the level torch's CPU kernels dispatch to ("AVX2", "AVX512" ...)
    torch: MachineTorch
    gpu: str | None                   # the CUDA device's name; null: the runs trained on the CPU


class Env(TypedDict, total=False):
    python: str
    torch: str
    triton: str | None
    bitsandbytes: str | None
    mlflow: str | None
    transformers: str | None
    torchao: str | None
    device: str
    device_name: str
    threads: int
    extensions: list[ExtensionInfo]   # what this process had loaded (stability.config.extensions)
    machine: Machine                  # the machine (absent in records written before records named it)


class CorpusInfo(TypedDict, total=False):
    """What the tokens are (``stability.data``): the keys of each corpus kind."""

    kind: str                         # "builtin", "stdlib", "backcopy", "bytes", "tokens" or "tokenized"
    name: str
    description: str
    split: str
    train_tokens: int
    heldout_tokens: int
    bytes: int
    path: str
    tokens: int
    max_id: int
    text_fraction: float              # backcopy: the share of its bytes that is generated text
    python: str                       # stdlib: the Python whose library it is
    implementation: str
    root: str
    excluded_dirs: list[str]
    files: int
    train_files: int
    heldout_files: int
    train_bytes: int
    heldout_bytes: int
    train_sha256: str
    heldout_sha256: str
    source: str                       # tokenized: the text file and the tokenizer
    tokenizer: str
    text_field: str
    tokenizer_vocab_size: int
    eos_id: int | None
    documents: int
    format_version: int


class CaseTiming(TypedDict, total=False):
    wall_seconds: float
    run_wall_seconds: float
    train_seconds: float
    probe_seconds: float
    eval_seconds: float
    tokens: float
    runs: int
    setup_seconds: float
    tracking_seconds: float


class RunEntry(TypedDict, total=False):
    """A run a session trained (``stability.session.session``), in order."""

    run_key: str | None
    name: str | None
    arm: str
    seed: int
    status: Status
    steps: int
    started_at: float | None
    ended_at: float | None
    final: Figures | None
    steps_file: str                   # its per-step file, relative to the run directory ("": not kept)


class ReplayBundle(TypedDict, total=False):
    run_key: str
    step: int
    reasons: list[str]
    severity: float | None
    path: str
    kept_as: str                      # "first" or "worst"


class ResumedFrom(TypedDict, total=False):
    status: Status                    # the interrupted record's status
    runs: int                         # ... and how many runs it had finished


class Tracking(TypedDict, total=False):
    """Where the record went in MLflow (``stability.track``)."""

    status: Required[TrackingStatus]
    uri: str | None
    error: str
    experiment: str | None
    experiment_id: str
    parent_run_id: str | None
    child_run_ids: dict[str, str]
    params_logged: bool
    complete_children: list[str]


class RayUnit(TypedDict, total=False):
    id: str
    name: str
    attempts: int | None


class RayInfo(TypedDict, total=False):
    """The Ray tasks that trained the case's runs (``stability.cases.ray_runner``)."""

    address: str
    task_resources: dict[str, float]
    max_retries: int
    units: list[RayUnit]
    retries: int


class RunSummary(TypedDict, total=False):
    """A compact copy of one run of a multi-run case (``stability.cases.case.run_summary``)."""

    lr: float                         # the sweep's peak LR
    precision: str                    # the ladder's rung
    arm: str
    seed: int
    variant: str
    status: Status
    diverged_at_step: int | None
    stop_reason: str | None
    final: Figures
    events: list[Event]
    applied: Applied
    timing: ArmTiming
    loss: list[float | None]


# the keys under which records written before the results slot kept their case's results (checked as
# results.<case> is)
RESULTS_BEFORE_THE_SLOT = ("lr_sweep", "lr_ramp", "batch_ramp", "precision_ladder", "shock")


class CaseRecord(TypedDict, total=False):
    """One stress case (or a plain pair run): every arm at every seed, and their paired summary."""

    schema_version: Required[int]
    id: str                           # 8 hex digits, kept when a case is resumed
    created_at: str                   # ISO 8601, UTC
    name: Required[str]
    preset: Required[str]
    case: Required[str]               # the stress case's name ("standard": the plain pair)
    case_label: Required[str]         # its name, then its qualifier where it has one ("batch_ramp-sqrt")
    run_steps: int                    # the steps one run of the case trains (its case declares it)
    purpose: Purpose
    description: str
    status: Status
    git: Git
    env: Env
    config: Required[dict[str, Any]]  # the resolved ExperimentConfig (its own schema: stability.config)
    corpus: CorpusInfo
    arms: Required[list[ArmRecord]]   # one per arm and seed; of a multi-run case, the configured runs
    paired: dict[str, dict[FigureName, PairedFigure]]   # per treatment arm, per figure
    timing: CaseTiming
    # the case's own results, under its name, of the type its case declares in its module (stability.cases)
    results: dict[str, Any]
    # where records written before the results slot kept them (RESULTS_BEFORE_THE_SLOT)
    lr_sweep: dict[str, Any]
    lr_ramp: dict[str, Any]
    batch_ramp: dict[str, Any]
    precision_ladder: dict[str, Any]
    shock: dict[str, Any]
    # written by a training command (stability.session.session, pipeline, ray_runner)
    runs: list[RunEntry]
    replay_bundles: list[ReplayBundle]
    checkpoint_dir: str               # relative to the run directory when inside it
    resumed_from: ResumedFrom
    tracking: Tracking
    record_path: str                  # where the record was written
    ray: RayInfo

