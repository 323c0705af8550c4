"""``StressConfig``: the settings of the stress cases (``stability.cases.stress``); the settings of the
lr_ramp, batch_ramp and shock cases are their schedules themselves (``stability.config.schedules``).

The built-in cases' settings are fields of ``StressConfig``. Any other case declares its own with itself
(``StressCase(..., settings=...)``, a frozen dataclass at its defaults): registering the case hands them to
``declare_case_settings``, they are set with ``stress.case_settings.<case>.<name>=VALUE`` and read with
``config.stress.settings_of(case)``."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, is_dataclass, replace

from stability.config.errors import ConfigError, check
from stability.config.schedules import BatchRamp, ExponentialRamp, Shock

# the precision ladder's rungs unless stress.precisions says otherwise: every training format the harness
# ships (stability.precision.FORMATS), fp32 first
REFERENCE_PRECISION = "fp32"   # the precision ladder's fp32 rung: every other rung is measured against it
LADDER = (REFERENCE_PRECISION, "bf16", "fp16", "fp8", "mxfp8", "mxfp4")

# The schedules' settings by the flat names they had before they were sub-configs (stress.ramp_end_lr is
# stress.ramp.end_lr): still accepted in overrides and read in older records' configs, and the names
# the merge check compares configs by (so baselines made with them keep matching).
FLAT_NAMES = {
    "ramp_start_lr": ("ramp", "start_lr"), "ramp_end_lr": ("ramp", "end_lr"),
    "batch_double_every": ("batch", "double_every"), "batch_max_size": ("batch", "max_size"),
    "batch_lr_rule": ("batch", "lr_rule"),
    "shock_kind": ("shock", "kind"), "shock_step": ("shock", "at_step"), "shock_factor": ("shock", "factor"),
}


# The settings each case that declares its own holds (``declare_case_settings``), at their defaults, by case name.
DECLARED_SETTINGS: dict[str, object] = {}


def declare_case_settings(case: str, defaults: object) -> None:
    """Declare the settings of the stress case ``case``: ``defaults``, an instance of a frozen dataclass (its
    settings at their defaults). Registering the case calls it (``stability.cases.stress.register``).
    ValueError for a case that declared its settings already, or defaults that are no frozen dataclass."""
    if case in DECLARED_SETTINGS:
        raise ValueError(f"stress case {case!r} declares its settings already")
    if not is_dataclass(defaults) or isinstance(defaults, type) or not type(defaults).__dataclass_params__.frozen:
        raise ValueError(f"stress case {case!r}: settings={defaults!r} is invalid: expected an instance of a frozen "
                         f"dataclass (its settings at their defaults)")
    DECLARED_SETTINGS[case] = defaults


def declared_settings(case: str) -> object:
    """The settings the stress case ``case`` declares, at their defaults; ConfigError for a case that declares
    none (or that this process has not registered)."""
    if case not in DECLARED_SETTINGS:
        raise ConfigError(f"stress.case_settings.{case} is unknown: {case!r} is not a registered stress case that "
                          f"declares settings: expected one of {tuple(DECLARED_SETTINGS)}")
    return DECLARED_SETTINGS[case]


def nested_names(stress: dict) -> dict:
    """A stress section of a config dict (an older record's, a file's) with its flat names moved into the
    sub-configs: {"ramp_end_lr": 5.0} -> {"ramp": {"end_lr": 5.0}}."""
    out = {k: v for k, v in stress.items() if k not in FLAT_NAMES}
    for flat, (section, name) in FLAT_NAMES.items():
        if flat in stress:
            out[section] = {**(out.get(section) or {}), name: stress[flat]}
    return out


def flat_names(config: dict) -> dict:
    """A flattened config (dotted keys) with the schedules' settings under their flat names:
    "stress.ramp.end_lr" -> "stress.ramp_end_lr"."""
    dotted = {f"stress.{section}.{name}": f"stress.{flat}" for flat, (section, name) in FLAT_NAMES.items()}
    return {dotted.get(k, k): v for k, v in config.items()}


@dataclass(frozen=True)
class StressConfig:
    """Settings of the stress cases (``stability.cases.stress``).

    sweep_lrs: peak LRs of the learning-rate sweep, increasing (a log grid; Wortsman et al. 2023 use
        3e-4 ... 3e-1). ramp: the LR range test (``ExponentialRamp``: the LR rises exponentially from
        ``start_lr`` to ``end_lr`` over ``run.steps``, no warmup, until the arm diverges). batch: the batch
        ramp (``BatchRamp``: the batch doubles every ``double_every`` steps up to ``max_size`` and the LR is
        scaled by the batch growth ("linear"), its square root ("sqrt") or not at all ("none")). shock:
        the LR shock (``Shock``: "jump" multiplies the LR by ``factor`` from ``at_step`` to the end;
        "no_warmup" starts at the peak LR with no warmup, shock at step 0). recovery_smoothing: steps of
        the rolling mean used to decide that the loss is back to its pre-shock level (and the ramp's best
        LR). precisions: the rungs of the precision ladder, fp32 first, each a training format of
        ``stability.precision.FORMATS`` (the gaps are measured against it). ladder_steps: steps of each
        rung (0: the run's ``steps``; fewer keep a CPU ladder affordable). threads: CPU intra-op threads
        while a stress case runs (fixed so CPU figures are reproducible; 0 leaves torch's setting alone).
        case_settings: the settings of the cases that declare their own (``declare_case_settings``), by case
        name, each an instance of the dataclass the case declares; only those that differ from its defaults
        are held, so a config that sets none flattens (and fingerprints) as it did before the field. Set with
        ``stress.case_settings.<case>.<name>=VALUE``; read with ``settings_of(case)``.
    """

    sweep_lrs: tuple[float, ...] = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
    ramp: ExponentialRamp = field(default_factory=ExponentialRamp)
    batch: BatchRamp = field(default_factory=BatchRamp)
    shock: Shock = field(default_factory=Shock)
    recovery_smoothing: int = 5
    precisions: tuple[str, ...] = LADDER
    ladder_steps: int = 0
    threads: int = 0
    case_settings: dict[str, object] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        lrs = self.sweep_lrs
        check(len(lrs) > 0 and all(isinstance(v, (int, float)) and 0 < v and math.isfinite(v) for v in lrs)
              and all(a < b for a, b in itertools.pairwise(lrs)), "stress.sweep_lrs", lrs,
              "a non-empty, strictly increasing tuple of positive finite learning rates")
        check(isinstance(self.recovery_smoothing, int) and self.recovery_smoothing > 0,
              "stress.recovery_smoothing", self.recovery_smoothing, "a positive integer")
        check(len(self.precisions) > 0 and self.precisions[0] == REFERENCE_PRECISION
              and all(isinstance(p, str) and p != "" for p in self.precisions)
              and len(set(self.precisions)) == len(self.precisions), "stress.precisions", self.precisions,
              f"distinct training formats (stability.precision.FORMATS), starting with {REFERENCE_PRECISION!r}")
        check(isinstance(self.ladder_steps, int) and self.ladder_steps >= 0, "stress.ladder_steps",
              self.ladder_steps, "a non-negative integer (0 = the run's steps)")
        check(isinstance(self.threads, int) and self.threads >= 0, "stress.threads", self.threads,
              "a non-negative integer (0 = leave torch's setting)")
        check(isinstance(self.case_settings, dict), "stress.case_settings", self.case_settings,
              "a mapping of stress case names to their settings")
        for case, settings in self.case_settings.items():
            kind = type(declared_settings(case))
            check(type(settings) is kind, f"stress.case_settings.{case}", settings,
                  f"a {kind.__name__} (the settings stress case {case!r} declares)")

    def settings_of(self, case: str) -> object:
        """The settings of the stress case ``case`` (the dataclass it declares): this config's, else its defaults."""
        return self.case_settings.get(case, declared_settings(case))

    def with_settings(self, case: str, settings: object) -> StressConfig:
        """This config with ``settings`` for the stress case ``case`` (held only where they differ from its
        defaults)."""
        held = {name: value for name, value in self.case_settings.items() if name != case}
        if settings != declared_settings(case):
            held[case] = settings
        return replace(self, case_settings=held)
