"""The table of figures: every number the harness compares, with its direction, unit and meaning.

One entry per figure (or per pattern: ``quant_*_kl`` is one entry for ``quant_nf4_kl``,
``quant_int8_kl`` ...). The run summary, the stress cases, the paired claims, the regression
check and the report all read this table; nothing else defines a direction. This module declares the
figures of every run (training, probes, evaluation); a stress case declares the figures only it makes,
and the primary rows it is judged by, in its own module (``stability.cases.lr_sweep`` ...), and
registering it adds them here (``stability.cases.stress``, which the check and every command import), as
an extension's probe or case does.

Fields of a ``Figure``:

* ``better``: "lower" or "higher" is the better direction; None for a figure that is shown but
  never judged (the gate score, the peak LR of a run).
* ``kind``: "eval" for a figure of the *trained model* (held-out loss, M-Act ...). The figures of an
  arm that diverged describe a broken model, so the regression check leaves them out and compares
  the arm by its status and divergence step instead. "peak" for a maximum or spike score taken over the
  whole trajectory (largest gradient / update norm, spike scores): in an arm that diverged it measures
  the explosion itself, whose size any change of rounding moves by a factor of several, so it is left
  out the same way; the stress cases' own figures name what happened before the divergence
  (``ramp_spikes``, ``ramp_divergence_lr``). "run" for a figure of the training trajectory that keeps
  its meaning whatever the status (non-finite events, divergence step, the stress-case figures).
  "detail" for a value an arm's ``final`` keeps beside its figures (a flag such as
  ``critical_lr_censored``, the counts behind a spike score, a setting echoed by a stress case): shown,
  never judged and never paired.
* ``floor`` / ``rel_floor``: the smallest change the regression check will call a change, in the
  figure's unit and as a fraction of the baseline value. They stop a deterministic figure (the
  same in every seed, so no spread) from failing on a difference nobody would act on.
* ``quantum``: the resolution of a figure measured on a finite sample, the least it can move
  (``quantum(name, config)`` turns it into a number): "token" one held-out token of the accuracy
  (1 / evaluated tokens), "count" one event, "step" one step, "step_pct" one step as a percentage of
  the run, "seed" one seed's 0/1 outcome, "head" one attention head of all layers, "batch" one step's
  tokens; None for a continuous figure. The regression check never judges a figure at a noise width
  below its quantum, so a figure identical in every baseline run is not judged at zero width.
* ``headline``: a column of the report's per-arm table (a pattern: each figure matching it that an arm has).
* ``primary``: the rows of the merge check's primary family the figure is judged in (``Primary``: the case,
  the arms, the presets, why): only these can fail a job; every other judged figure is advisory. Only a
  figure a case declares carries rows; the rows on the figures of every run are declared by the cases.

Definitions follow docs/figures.md (and the papers cited there).
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Primary:
    """A row of the merge check's primary family: figure ``figure`` (a name or a family pattern) of stress case
    ``case``, for ``arms``: "all" (each arm and each paired difference arm - reference), "arms" (each arm),
    "paired" (the differences only) or "reference" (the reference arm only). Every primary row is judged twice
    inside one family-wise rate: worse by more than its floor (the job REGRESSED), and every seed moved beyond its
    rounding noise the same way, in either direction, floor or not (the job CHANGED: the code computes something
    else). ``floor_only``: the measurement that shows the row's harmless spread is not captured by its rounding
    replicates in every seed at once (a heavy tail shared by the seeds), so it is judged by its floor only
    (empty: judged both ways). ``presets``: the scale presets where the
    row is primary (empty: every preset); elsewhere it is advisory, and the check says why (``elsewhere``).

    A stress case declares the rows it is judged by, in its own module (``stability.cases.case.StressCase``):
    on a figure it declares itself (``Figure(..., primary=(Primary(arms="arms", why=...),))``: the figure left
    out is the declaring one, or a figure matching its pattern) or on a figure of every run (``StressCase(...,
    primary=(Primary(figure="heldout_loss", ...),))``); the case's name left out is the declaring case's.
    Registering the case adds them (``register_primary``)."""

    case: str = ""
    figure: str = ""
    arms: str = "all"
    why: str = ""
    floor_only: str = ""       # why (measured) the row is judged by its floor only; "" judged both ways
    presets: tuple[str, ...] = ()
    elsewhere: str = ""

    def applies(self, preset: str | None) -> bool:
        """Whether the row is primary at ``preset`` (None: any preset)."""
        return not self.presets or preset is None or preset in self.presets

    def __post_init__(self) -> None:
        if self.arms not in ("all", "arms", "paired", "reference"):
            raise ValueError(f"primary row {self.case}/{self.figure}: arms={self.arms!r}, expected 'all', 'arms', "
                             f"'paired' or 'reference'")

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def judged_not_outcome(entry) -> bool:
    """Whether a table entry (or None) can be a primary row: judged, and not an outcome."""
    return entry is not None and entry.better is not None and not entry.outcome


@dataclass(frozen=True)
class Figure:
    name: str
    better: str | None
    unit: str
    meaning: str
    kind: str = "eval"
    floor: float = 0.0
    rel_floor: float = 0.0
    quantum: str | None = None
    outcome: bool = False
    headline: bool = False
    primary: tuple[Primary, ...] = ()

    def __post_init__(self) -> None:
        if self.better not in (None, "lower", "higher"):
            raise ValueError(f"figure {self.name}: better={self.better!r}, expected 'lower', 'higher' or None")
        if self.kind not in KINDS:
            raise ValueError(f"figure {self.name}: kind={self.kind!r}, expected one of {KINDS}")
        if self.kind == "detail" and self.better is not None:
            raise ValueError(f"figure {self.name}: a detail is never judged: expected better=None")
        if self.quantum not in QUANTA:
            raise ValueError(f"figure {self.name}: quantum={self.quantum!r}, expected one of {QUANTA}")
        if self.outcome and self.better is None:
            raise ValueError(f"figure {self.name}: an outcome is judged: expected better='lower' or 'higher'")
        if self.primary and not judged_not_outcome(self):
            raise ValueError(f"figure {self.name}: a primary row needs a judged figure that is not an outcome "
                             f"(outcomes are judged seed by seed)")
        for row in self.primary:
            if row.figure and not (row.figure == self.name or fnmatch.fnmatchcase(row.figure, self.name)):
                raise ValueError(f"figure {self.name}: its primary row names figure {row.figure!r}: expected "
                                 f"{self.name!r} or a figure matching it")

    def rows(self) -> tuple[Primary, ...]:
        """Its primary rows, each naming the figure (this one, or the figure matching its pattern it declared)."""
        return tuple(row if row.figure else replace(row, figure=self.name) for row in self.primary)

    def clean(self, value) -> bool:
        """Whether an outcome's value is its best one (0 / false for "lower", true for "higher")."""
        return bool(value) if self.better == "higher" else not value

    @property
    def needs_completed_arm(self) -> bool:
        """Left out of comparisons for an arm that did not complete (kinds "eval" and "peak")."""
        return self.kind in ("eval", "peak")


KINDS = ("eval", "peak", "run", "detail")
QUANTA = (None, "token", "count", "step", "step_pct", "seed", "head", "batch")


HEAVY_TAILED = ("heavy-tailed over rounding replicates at this preset (one replicate in five far out): its t "
                "statistic is not valid in the tail, and as a primary row it failed harmless calibration arrangements")

SINGLE_STEP = ("a single-step maximum, heavy-tailed over rounding replicates at this preset: the family judges "
               "windows of the trajectory instead")

GREW = "activations or attention logits grew under this stress"


def _table(*figures: Figure) -> dict[str, Figure]:
    return {f.name: f for f in figures}


FIGURES: dict[str, Figure] = _table(
    # the trained model, on the fixed held-out batches
    Figure("heldout_loss", "lower", "nats/token", "mean next-token cross-entropy on the held-out batches",
           floor=0.02, rel_floor=0.005, headline=True),
    Figure("perplexity", "lower", "", "exp(heldout_loss)", floor=0.1, rel_floor=0.01),
    Figure("accuracy", "higher", "fraction", "next-token top-1 accuracy on the held-out batches", floor=0.005, quantum="token"),
    Figure("final_train_loss", "lower", "nats/token", "mean training loss of the last 10 steps",
           floor=0.02, rel_floor=0.005),
    Figure("min_train_loss", "lower", "nats/token", "lowest training loss of the run", floor=0.02,
           rel_floor=0.005),
    # the trajectory
    Figure("loss_spike_score", "lower", "% of steps", "steps whose loss is >= k std above the rolling mean",
           kind="peak", floor=1.0, quantum="step_pct", headline=True),
    Figure("grad_spike_score", "lower", "% of steps", "steps whose gradient norm is >= k std above the rolling mean",
           kind="peak", floor=2.0, quantum="step_pct"),
    Figure("nonfinite_events", "lower", "count", "steps with a NaN/Inf loss or gradient", kind="run", floor=0.5, quantum="count"),
    Figure("nonfinite_unhandled", "lower", "count", "steps with a NaN/Inf loss or gradient that the precision recipe "
           "did not handle (a gradient overflow fp16's loss scaler skipped is handled)", kind="run", quantum="count",
           outcome=True),
    Figure("skipped_steps", "lower", "count", "optimizer steps skipped (fp16 loss-scale overflow)", kind="run",
           floor=0.5, rel_floor=0.1, quantum="count"),
    Figure("diverged", "lower", "fraction of seeds", "the arm stopped on a non-finite or exploding loss",
           kind="run", floor=0.25, quantum="seed", outcome=True),
    Figure("divergence_step", "higher", "step",
           "step at which the arm diverged (the run length when it did not)", kind="run", floor=2.0,
           rel_floor=0.1, quantum="step"),
    Figure("steps_completed", None, "steps", "steps trained before the arm stopped", kind="run", quantum="step"),
    Figure("max_grad_norm", "lower", "L2 norm", "largest global gradient norm before clipping", kind="peak",
           floor=0.5, rel_floor=0.5),
    Figure("update_spike_score", "lower", "% of steps",
           "steps whose optimiser update norm ||W_after - W_before|| is >= k std above the rolling mean",
           kind="peak", floor=2.0, quantum="step_pct"),
    Figure("update_spikes", "lower", "count", "steps flagged by the update-norm spike score", kind="peak",
           floor=2.0, rel_floor=0.5, quantum="count"),
    Figure("max_update_norm", "lower", "L2 norm", "largest global optimiser update norm ||W_after - W_before||",
           kind="peak", floor=0.05, rel_floor=0.5),
    # a loss or gradient spike the model recovers from
    Figure("loss_excess_max", "lower", "nats/token", "largest excess of the training loss over the median of its "
           "10 previous steps, after warmup", kind="peak", floor=0.05, rel_floor=0.5),
    Figure("grad_norm_excursion", "lower", "ratio", "largest ratio of the gradient norm to the median of its 10 "
           "previous steps, over the last half of the steps trained", kind="peak", floor=0.5, rel_floor=0.5),
    # the trajectory summarised where rounding does not scramble it (stability.record.summary)
    Figure("early_loss", "lower", "nats/token", "mean training loss over the early horizon (the first tenth of "
           "the planned steps)", kind="run", rel_floor=5e-4),
    Figure("early_grad_norm", "lower", "L2 norm", "mean global gradient norm (before clipping) over the early "
           "horizon", kind="run", rel_floor=5e-4),
    Figure("late_loss", "lower", "nats/token", "mean training loss over the last quarter of the steps trained",
           kind="peak", floor=0.02, rel_floor=0.005),
    Figure("late_grad_norm", "lower", "L2 norm", "median global gradient norm over the last quarter of the steps "
           "trained", kind="peak", rel_floor=0.05),
    # heavy probes of the final model (probe batch, explicit attention path)
    Figure("m_act_mean", "lower", "|activation|",
           "max |value| of each block's residual output, mean over layers (Qiu et al. Table 4)", floor=1.0,
           rel_floor=0.1, headline=True),
    Figure("m_act_max", "lower", "|activation|", "max |value| of any block's residual output", floor=1.0,
           rel_floor=0.1),
    Figure("f_attn_mean", "lower", "probability",
           "attention on position 0 from query positions >= 1, mean over heads and layers", floor=0.02, headline=True),
    Figure("sink_rate_mean", "lower", "fraction of heads",
           "heads whose mean attention on position 0 exceeds 0.3 (Gu et al. 2025)", floor=0.1, quantum="head", headline=True),
    Figure("max_attn_logit", "lower", "logit", "largest q.k/sqrt(d) of any head and layer (Wortsman et al. 2023)",
           floor=0.5, rel_floor=0.1, headline=True),
    Figure("logit_max", "lower", "logit", "largest |logit| of the LM head", floor=0.5, rel_floor=0.1),
    Figure("log_z_mean", None, "nats", "mean log-partition of the LM head"),
    Figure("gate_score_mean", None, "gate value", "mean gate value over layers (Qiu et al.: 0.116)", headline=True),
    Figure("overflow_fraction", "lower", "fraction", "Linear inputs beyond the low-precision format's range",
           floor=0.001),
    Figure("underflow_fraction", "lower", "fraction", "non-zero Linear inputs flushed to zero", floor=0.001),
    Figure("loss_scale_drops", "lower", "count", "fp16 loss-scale reductions", kind="run", floor=2.0,
           rel_floor=0.5, quantum="count"),
    # what proves the stresses and measurements were applied (stability.train.applied, read from the arm's
    # "applied" entry): outcomes, clean at 0
    Figure("lr_off_log_steps", "lower", "count", "steps at which the optimiser stepped with another LR than the "
           "logged one (read from its parameter groups as it stepped; a step the precision policy skipped is not "
           "counted)", kind="run", quantum="count", outcome=True),
    Figure("linear_off_format_calls", "lower", "count", "Linear calls of the training forwards that did not run in "
           "the run's format, among the Linears the format covers", kind="run", quantum="count", outcome=True),
    Figure("probe_steps_missed", "lower", "count", "steps the config names for the heavy probes (every "
           "probes.every steps, and the last step) that have no probe snapshot", kind="run", quantum="count",
           outcome=True),
    Figure("probe_modules_missed", "lower", "count", "modules of the model (its blocks and Linears) that a heavy "
           "probe snapshot did not hook", kind="run", quantum="count", outcome=True),
    Figure("linear_in_format_share", None, "fraction", "Linear calls of the training forwards that ran in the "
           "run's format, of all Linear calls (the format's high-precision Linears are the rest)", kind="detail"),
    # the counts behind the spike scores
    Figure("loss_spikes", None, "count", "steps flagged by the loss-spike score", kind="detail", quantum="count"),
    Figure("grad_spikes", None, "count", "steps flagged by the gradient-norm spike score", kind="detail",
           quantum="count"),
    # post-training quantization, per scheme (stability.evaluate.quantize)
    Figure("quant_*_damage_loss", "lower", "nats/token", "held-out loss after quantization minus full precision",
           floor=0.02, rel_floor=0.25),
    Figure("quant_*_damage_accuracy", "higher", "fraction", "accuracy after quantization minus full precision",
           floor=0.01, rel_floor=0.25, quantum="token"),
    # the damage of post-training quantization (KL of the next-token distributions, never negative). What a team acts
    # on is the damage relative to its model's own: half again as much (rel_floor), at every preset (smoke's KLs are
    # 1e-5 to 1e-4 nats, ci's 1e-4 to 3e-2); the absolute floor is only where a float32 evaluation stops resolving it
    Figure("quant_*_kl", "lower", "nats", "KL(full || quantized) of the next-token distributions", floor=1e-7,
           rel_floor=0.5),
    # what the scheme replaced (quant.schemes[<scheme>].targeted / .replaced) and whether it changed the model at all
    Figure("quant_*_missed", "lower", "count", "Linears the scheme declares it quantizes that it did not replace",
           quantum="count", outcome=True),
    Figure("quant_*_unchanged", "lower", "flag", "1 when the quantized model's logits on the probe batch are "
           "bit-identical to the full-precision model's (nothing was quantized), else 0", quantum="count",
           outcome=True),
    # the length-extrapolation probe per RoPE and length factor: extrap_<figure>_<plain|ntk>_x<factor>
    Figure("extrap_loss_*", "lower", "nats/token", "held-out loss at this multiple of the training context",
           floor=0.02, rel_floor=0.005),
    Figure("extrap_gap_*", "lower", "nats/token",
           "held-out loss at this multiple of the training context minus the loss at the training context",
           floor=0.02, rel_floor=0.05, headline=True),
    Figure("extrap_f_attn_*", "lower", "probability", "F-Attn at this multiple of the training context",
           floor=0.02),
    Figure("extrap_sink_rate_*", "lower", "fraction of heads", "sink rate at this multiple of the training context",
           floor=0.1, quantum="head"),
)


ADDED_PRIMARY: list[Primary] = []   # every row declared (``add``, ``register_primary``), in the order declared


def add(entry: Figure) -> Figure:
    """Add a figure to the table (a name not in it yet): its direction, unit and meaning for every reader, and
    its primary rows to the family after those declared before (each must name its case)."""
    if entry.name in FIGURES:
        raise ValueError(f"figure {entry.name!r} is in the table already")
    rows = entry.rows()
    for row in rows:
        _check_row(row)
    FIGURES[entry.name] = entry
    ADDED_PRIMARY.extend(rows)
    return entry


def figure(name: str) -> Figure | None:
    """The table entry of ``name``: its own, else the first pattern it matches; None if unknown."""
    if name in FIGURES:
        return FIGURES[name]
    return next((f for key, f in FIGURES.items() if "*" in key and fnmatch.fnmatchcase(name, key)), None)


def is_divergence(name: str) -> bool:
    """Whether ``name`` is the outcome that says the run diverged (every other outcome counts a diverged run
    as not clean too)."""
    return name == "diverged"


def better(name: str) -> str | None:
    """"lower", "higher" or None (not judged, or unknown)."""
    entry = figure(name)
    return entry.better if entry else None


def _table_position(name: str) -> tuple[int, str]:
    """Where a known name sorts: its entry's row of the table (a figure matching a pattern at its pattern's), then its name."""
    return (list(FIGURES).index(figure(name).name), name)


def judged(names) -> list[str]:
    """The names with a direction, in table order (patterns after the position of the figures matching them)."""
    return sorted((n for n in names if better(n) is not None), key=_table_position)


def headline(names) -> list[str]:
    """The distinct names that are headline figures (their own entry or their pattern's), in table order."""
    return sorted((n for n in set(names) if (entry := figure(n)) is not None and entry.headline),
                  key=_table_position)


def quantum(name: str, config: dict, steps: int) -> float:
    """The least ``name`` can move, as a number, for a run of ``steps`` steps of ``config`` (a flattened
    config: dotted keys, as ``stability.record.comparable_config`` gives); 0.0 for a continuous or unknown
    figure."""
    entry = figure(name)
    kind = entry.quantum if entry else None
    if kind is None:
        return 0.0
    if kind in ("count", "step", "seed"):
        return 1.0
    batch, context = config.get("run.data.batch_size", 1), config.get("run.model.context", 1)
    if kind == "token":
        return 1.0 / (config.get("run.probes.eval_batches", 1) * batch * context)
    if kind == "batch":
        return float(batch * context)
    if kind == "head":
        return 1.0 / (config.get("run.model.n_heads", 1) * config.get("run.model.n_layers", 1))
    return 100.0 / max(1, steps)   # "step_pct"



def register_primary(entry: Primary) -> Primary:
    """Declare a row primary: the figure ``entry.figure`` of the case ``entry.case`` joins the primary family the merge
    check fails a job through, after the rows declared before. Registering a case calls it for the rows the
    case declares on figures declared elsewhere (``StressCase(..., primary=...)``); an extension may call it
    for a row on a case it does not declare. A baseline made or calibrated before records another primary family: it is
    stale until calibrated again (``stability.check.coverage``)."""
    check_primary(entry)
    ADDED_PRIMARY.append(entry)
    return entry


def check_primary(entry: Primary) -> None:
    """ValueError for a row ``register_primary`` refuses: on a figure the table cannot judge (unknown, never
    judged, or an outcome), naming no case, or declared already."""
    if not judged_not_outcome(figure(entry.figure)):
        raise ValueError(f"primary row {entry.case}/{entry.figure}: expected a judged figure of the table that "
                         f"is not an outcome (outcomes are judged seed by seed)")
    _check_row(entry)


def _check_row(entry: Primary) -> None:
    """ValueError for a row that names no case, or one declared already (the same case, figure and arms)."""
    if not entry.case:
        raise ValueError(f"primary row on {entry.figure!r}: expected the name of the case it judges")
    key = (entry.case, entry.figure, entry.arms)
    if any((p.case, p.figure, p.arms) == key for p in primary_rows()):
        raise ValueError(f"primary row {entry.case}/{entry.figure}[{entry.arms}] is declared already")


def primary_rows() -> tuple[Primary, ...]:
    """The primary family of this process, in the order declared: the rows of each figure added to the table
    and each row registered (``add``, ``register_primary``: registering the built-in cases declares theirs,
    case by case), then those of a figure placed in the table without ``add``."""
    return (*ADDED_PRIMARY,
            *(row for entry in FIGURES.values() for row in entry.rows() if row not in ADDED_PRIMARY))


def primary_family() -> list[dict]:
    """The primary family as {case, figure, arms} entries: what a calibration records of the rule it measured
    (the ``why`` texts left out, so that rewording one does not make a calibration stale)."""
    return [{"case": p.case, "figure": p.figure, "arms": p.arms, "floor_only": bool(p.floor_only),
             **({"presets": list(p.presets)} if p.presets else {})} for p in primary_rows()]


def same_family(recorded: list[dict] | None, now: list[dict]) -> bool:
    """Whether a primary family a baseline recorded is ``now``'s: the same rows, in any order (a family is a set: Holm's
    procedure orders rows by p, never by declaration)."""
    def canonical(family):
        return sorted(json.dumps(row, sort_keys=True) for row in family or [])
    return recorded is not None and canonical(recorded) == canonical(now)
