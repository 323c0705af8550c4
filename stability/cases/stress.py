"""Stress cases: each a pure function of a resolved ``ExperimentConfig`` -> a pair record.

    run_case(case, config)          a case by name: ``CASES``, the registry of stress cases, in which
                                    each is declared once (``register(StressCase(name, train, ...))``
                                    adds one; ``train(case, config, session, runner)`` is handed its entry)

    lr_sweep            run_sweep: every arm at every peak LR of ``stress.sweep_lrs`` (several runs per
                        arm): LR sensitivity and critical LR (Wortsman et al. 2023)
    lr_ramp             run_lr_ramp: LR range test, exponential LR until the arm diverges
    batch_ramp          run_batch_ramp: batch doubling every N steps, LR scaled by a rule
    precision_ladder    run_precision_ladder: the same run in fp32, bf16, fp16 (+GradScaler), fp8, mxfp8, mxfp4
    shock               run_shock: LR jump by a factor mid-run (or no warmup)
    standard            run_standard: the plain pair at the preset's settings (what `stability run` runs)

Nothing here keeps state between calls: the config (including its ``stress`` settings) is the
whole input, so a case runs the same in-process, in a pytest-xdist worker or as a cluster task.
Each case lists its runs as ``stability.cases.runs.Unit`` s and reads their arm records back in that
order (``stability.cases.experiment.train_units``): trained here one after the other, or, with a
``runner``, elsewhere (``stability.cases.ray_runner.RayRunner``: one Ray task per run), with the same
figures.
CPU intra-op threads are set from ``stress.threads`` for the duration of a case and restored.

Every case trains every arm of the config (``config.arm_names``: the baseline and its treatment arms,
``arms=...``), seed by seed. Every record is a ``stability.record`` case record: ``arms`` (one entry
per arm and seed, with
``arm``, ``seed``, ``status``, ``final`` ...) and ``paired`` (per treatment arm and figure: baseline,
treatment, difference, 95% interval, p). The case-specific results sit under a key named after the
case (``record["results"]["lr_sweep"]`` ...), and the key figures of each case are added to the arms' ``final``
and so to ``paired`` (directions, units and meanings in ``stability.record.figures``). For the multi-run cases (sweep, ladder) the ``arms`` entry of
an arm and seed is its *reference* run (the grid LR nearest ``optim.lr``; fp32), and the other
runs are summarised in its results.

Figure definitions (the stress-case ones; the others are in docs/figures.md):

* ``critical_lr``: smallest swept peak LR at which the arm diverged. When no LR diverged the value
  is *censored*: one grid step above the largest LR (``critical_lr_censored`` is True), so paired
  statistics and the regression check still see a finite lower bound.
* ``lr_sensitivity``: ``mean_eta [min(L(eta), L_init) - min_eta L(eta)]`` with ``L`` the held-out
  loss after training at peak LR ``eta``, a diverged (or failed) run counting as ``L_init`` (the
  loss at step 0, the same for every LR of an arm and seed).
* ``ramp_divergence_lr``: in the LR range test, the LR of the *update* that caused the onset of
  divergence. The onset is the first step of the final run of steps whose loss is non-finite or above
  ``diverge_factor`` x the initial loss; the loss at step t is measured after the updates of steps
  0..t-1, so the update to blame is step t-1's (its LR is ``lr[t-1]``). The end LR, censored, when the
  arm never diverged. ``ramp_best_lr``: the LR of the update before the lowest smoothed loss.
* ``shock_peak_excess``: highest loss after the shock minus the pre-shock loss (the mean of the
  ``recovery_smoothing`` losses up to the shock step; the loss at step 0 for "no_warmup").
  ``shock_recovery_steps``: steps after the shock until the rolling mean (``recovery_smoothing``
  post-shock losses) is back at or below the pre-shock loss; censored at the steps left when it
  never is (``shock_recovered`` False).
* ``loss_gap_<p>``: held-out loss at precision ``p`` minus held-out loss in fp32, same arm and seed.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from stability import config as cfg
from stability import precision
from stability.cases.experiment import load_inputs, run_pair, train_units
from stability.cases.runs import Rung, Unit, lr_rung, precision_rung
from stability.config.schedules import Standard
from stability.precision import ao
from stability.record import (
    RecordedCase,
    Status,
    add_arm,
    add_figures,
    case_result,
    declare,
    finish_case,
    new_case_record,
    set_case_result,
    set_corpus,
)
from stability.record.cases import ladder_steps
from stability.record.schema import BatchRamp, LrRamp, LrSweep, PrecisionLadder, Shock

# ----------------------------------------------------------------------------- helpers

@contextlib.contextmanager
def cpu_threads(threads: int):
    """Run the block with ``threads`` CPU intra-op threads (0: unchanged), then restore."""
    if threads <= 0:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _rolling_min_index(values: list[float], width: int) -> int | None:
    """Index of the lowest rolling mean (trailing ``width``) of the finite values; None if none."""
    best, best_index = math.inf, None
    for i in range(len(values)):
        window = [v for v in values[max(0, i - width + 1):i + 1] if _finite(v)]
        if len(window) == min(width, i + 1) and window:
            mean = sum(window) / len(window)
            if mean < best:
                best, best_index = mean, i
    return best_index


def run_summary(arm_record: dict, **extra) -> dict:
    """A compact copy of one run for the case key: status, final figures, timing, loss curve."""
    return {**extra, "arm": arm_record["arm"], "seed": arm_record["seed"], "variant": arm_record["variant"],
            "status": arm_record["status"], "diverged_at_step": arm_record["diverged_at_step"],
            "stop_reason": arm_record["stop_reason"], "final": dict(arm_record["final"]),
            "events": arm_record["events"], "timing": arm_record["timing"],
            "loss": list(arm_record["series"]["loss"])}


class CaseRun:
    """The bookkeeping every stress case shares while it trains: the record, the corpus, the per-run
    timings, the session (``stability.cases.experiment.train_arm``: record on disk after every run, resume,
    Ctrl-C), the runner (None: train here; see ``stability.cases.experiment.train_units``).

    ``CaseRun(case, config, schedule_name, description, session, runner)``: ``case`` is the ``StressCase`` being
    run (its registry entry: the name its records say under "stress", its rung), handed to its function by
    ``StressCase.run``; ``train_each_arm`` trains every arm and seed, ``finish()`` returns the record."""

    def __init__(self, case: StressCase, config: cfg.ExperimentConfig, schedule_name: str, description: str,
                 session=None, runner=None):
        self.started = time.perf_counter()
        self.case = case
        self.config = config
        self.session = session
        self.runner = runner
        self.record = new_case_record(config, schedule_name, description, stress=case.name)
        self.corpus = load_inputs(config)
        set_corpus(self.record, self.corpus.info)
        self.runs: list[dict] = []  # timing dicts of every run trained

    @property
    def name(self) -> str:
        """The case's name (its entry's)."""
        return self.case.name

    def unit(self, arm: str, seed: int, run: cfg.RunConfig, schedule) -> Unit:
        """One run of the case, its rung as the case declares it."""
        return Unit(self.name, arm, seed, run, schedule, self.case.rung(run) if self.case.rung else None)

    def train_units(self, units: list[Unit]):
        """Yield the arm record of each unit, in order (trained here or by the runner)."""
        for arm_record in train_units(self.record, self.config, units, self.corpus, self.session, self.runner):
            self.runs.append(arm_record["timing"])
            yield arm_record

    def train_each_arm(self, schedule, figures_of) -> list[dict]:
        """Train every seed and arm under ``schedule``. ``figures_of(run, arm_record)`` returns
        (figures added to the arm's ``final``, extra entries for its summary). Returns one summary
        per arm: arm, seed, status, diverged_at_step, the figures and the extras."""
        per_arm = []
        units = [self.unit(arm, seed, self.config.arm_config(arm, seed), schedule)
                 for seed in self.config.seeds for arm in self.config.arm_names]
        for unit, arm_record in zip(units, self.train_units(units)):
            figures, extras = figures_of(unit.run, arm_record)
            add_figures(arm_record, figures)
            add_arm(self.record, arm_record)
            per_arm.append({"arm": unit.arm, "seed": unit.seed, "status": arm_record["status"],
                            "diverged_at_step": arm_record["diverged_at_step"], **figures, **extras})
        return per_arm

    def finish(self) -> dict:
        record = self.record
        finish_case(record, self.runs, time.perf_counter() - self.started,
                    [run["status"] for run in (case_result(record, self.name) or {}).get("runs", [])])
        return record


# ----------------------------------------------------------------------------- the learning-rate sweep

def sweep_figures(lrs: list[float], losses: list[float | None], diverged: list[bool], loss_init: float) -> dict:
    """LR sensitivity and critical LR of one arm and seed over a grid (see module docstring).

    ``losses[i]`` is the final (held-out) loss at ``lrs[i]``; a diverged or non-finite entry counts as
    ``loss_init``."""
    counted = [loss_init if (div or not _finite(loss)) else min(loss, loss_init)
               for loss, div in zip(losses, diverged)]
    best = min(counted)
    sensitivity = sum(c - best for c in counted) / len(counted)
    failing = [lr for lr, div in zip(lrs, diverged) if div]
    if failing:
        critical, censored = min(failing), False
    else:
        step = lrs[-1] / lrs[-2] if len(lrs) > 1 else 2.0
        critical, censored = lrs[-1] * step, True
    best_index = counted.index(best)
    return {"lr_sensitivity": sensitivity, "critical_lr": critical, "critical_lr_censored": censored,
            "best_lr": lrs[best_index], "best_lr_loss": best, "loss_init": loss_init}


def with_lr(run: cfg.RunConfig, lr: float) -> cfg.RunConfig:
    return replace(run, optim=replace(run.optim, lr=lr))


def reference_index(lrs: tuple[float, ...], lr: float) -> int:
    """Index of the grid LR nearest ``lr`` on a log scale."""
    return min(range(len(lrs)), key=lambda i: abs(math.log(lrs[i]) - math.log(lr)))


def run_sweep(stress_case: StressCase, config: cfg.ExperimentConfig, lrs=None, session=None, runner=None) -> dict:
    """Train every arm at every peak LR of the grid (``lrs`` or ``config.stress.sweep_lrs``) for every seed.

    ``record["results"]["lr_sweep"]``: the grid, the reference LR, per arm and seed the final loss per LR and the
    sweep figures, and a compact summary of every run. The ``arms`` entries are the runs at the grid
    LR nearest ``optim.lr``, with ``lr_sensitivity``, ``critical_lr`` ... added to ``final``."""
    if lrs is not None:
        config = replace(config, stress=replace(config.stress, sweep_lrs=tuple(float(v) for v in lrs)))
    grid = config.stress.sweep_lrs
    ref = reference_index(grid, config.run.optim.lr)
    with cpu_threads(config.stress.threads):
        case = CaseRun(stress_case, config, "lr_sweep",
                     f"learning-rate sweep over peak LRs {', '.join(f'{v:g}' for v in grid)}", session, runner)
        per_arm, runs = [], []
        units = [case.unit(arm, seed, with_lr(config.arm_config(arm, seed), lr), Standard())
                 for seed in config.seeds for arm in config.arm_names for lr in grid]
        trained = case.train_units(units)
        for seed in config.seeds:
            for arm in config.arm_names:
                records = []
                for lr in grid:
                    arm_record = next(trained)
                    records.append(arm_record)
                    runs.append(run_summary(arm_record, lr=lr))
                losses = [r["final"].get("heldout_loss") for r in records]
                diverged = [r["status"] != Status.COMPLETED for r in records]
                first = [r["series"]["loss"][0] for r in records if r["series"]["loss"]
                         and _finite(r["series"]["loss"][0])]
                loss_init = first[0] if first else math.log(config.run.model.vocab_size)
                figures = sweep_figures(list(grid), losses, diverged, loss_init)
                per_arm.append({"arm": arm, "seed": seed, "lrs": list(grid), "final_loss": losses,
                                "status": [r["status"] for r in records], **figures})
                reference = records[ref]
                add_figures(reference, {**figures, "peak_lr": grid[ref]})
                add_arm(case.record, reference)
        set_case_result(case.record, case.name,
                        {"lrs": list(grid), "reference_lr": grid[ref], "per_arm": per_arm, "runs": runs})
        return case.finish()


# ----------------------------------------------------------------------------- the LR range test

def update_before(step: int) -> int:
    """The step whose update produced the weights the loss of ``step`` was measured on (step 0: itself,
    the initial weights, has no update before it; its own LR is the nearest)."""
    return max(0, step - 1)


def ramp_figures(arm_record: dict, diverge_factor: float, smoothing: int, end_lr: float) -> dict:
    """Divergence LR and step, spikes on the way, and the best LR of one LR-range-test run."""
    series = arm_record["series"]
    losses, lrs = series["loss"], series["lr"]
    if not losses:
        return {}
    init = next((v for v in losses if _finite(v)), None)
    diverged = arm_record["status"] == Status.DIVERGED
    if diverged:
        onset = arm_record["diverged_at_step"]
        while onset > 0 and not (_finite(losses[onset - 1]) and init is not None
                                 and losses[onset - 1] <= diverge_factor * init):
            onset -= 1
        lr, step = lrs[update_before(onset)], onset
    else:
        onset, lr, step = len(losses), end_lr, len(losses)
    best = _rolling_min_index(losses[:onset] or losses, smoothing)
    return {"ramp_divergence_lr": lr, "ramp_divergence_step": step, "ramp_censored": not diverged,
            "ramp_spikes": sum(series["loss_spike"][:onset]), "ramp_grad_spikes": sum(series["grad_spike"][:onset]),
            "ramp_best_lr": lrs[update_before(best)] if best is not None else None,
            "ramp_best_loss": (sum(losses[max(0, best - smoothing + 1):best + 1]) / len(
                losses[max(0, best - smoothing + 1):best + 1])) if best is not None else None}


def run_lr_ramp(stress_case: StressCase, config: cfg.ExperimentConfig, session=None, runner=None) -> dict:
    """One LR range test per arm and seed: exponential LR from ``stress.ramp.start_lr`` to ``stress.ramp.end_lr``."""
    stress = config.stress
    schedule = stress.ramp
    with cpu_threads(stress.threads):
        case = CaseRun(stress_case, config, "lr_ramp", schedule.describe(), session, runner)
        per_arm = case.train_each_arm(schedule, lambda run, arm_record: (ramp_figures(
            arm_record, run.probes.diverge_factor, stress.recovery_smoothing, schedule.end_lr), {}))
        set_case_result(case.record, case.name, {"start_lr": schedule.start_lr, "end_lr": schedule.end_lr,
                                                 "per_arm": per_arm})
        return case.finish()


# ----------------------------------------------------------------------------- the batch ramp

def loss_vs_tokens(arm_record: dict, points: int = 50) -> list[list[float]]:
    """[[tokens seen, mean loss of the steps since the previous point], ...] at about ``points`` points."""
    series = arm_record["series"]
    n = len(series["loss"])
    if not n:
        return []
    every = max(1, math.ceil(n / points))
    out = []
    for start in range(0, n, every):
        window = [v for v in series["loss"][start:start + every] if _finite(v)]
        out.append([series["tokens"][min(n, start + every) - 1], sum(window) / len(window) if window else None])
    return out


def run_batch_ramp(stress_case: StressCase, config: cfg.ExperimentConfig, session=None, runner=None) -> dict:
    """Batch doubling every ``stress.batch.double_every`` steps up to ``stress.batch.max_size``, LR by
    ``stress.batch.lr_rule``."""
    stress = config.stress
    schedule = stress.batch
    if schedule.max_size < config.run.data.batch_size:
        raise cfg.ConfigError(f"stress.batch.max_size={schedule.max_size!r} is invalid: expected at least "
                              f"data.batch_size={config.run.data.batch_size}")
    with cpu_threads(stress.threads):
        case = CaseRun(stress_case, config, f"batch_ramp-{schedule.lr_rule}", schedule.describe(), session,
                     runner)

        def figures_of(_run, arm_record):
            series = arm_record["series"]
            figures = {"tokens_seen": series["tokens"][-1] if series["tokens"] else 0,
                       "final_batch_size": series["batch_size"][-1] if series["batch_size"] else None}
            return figures, {"loss_vs_tokens": loss_vs_tokens(arm_record)}

        per_arm = case.train_each_arm(schedule, figures_of)
        set_case_result(case.record, case.name, {"lr_rule": schedule.lr_rule, "double_every": schedule.double_every,
                                                    "max_batch_size": schedule.max_size, "per_arm": per_arm})
        return case.finish()


# ----------------------------------------------------------------------------- the precision ladder

def ladder_skips(config: cfg.ExperimentConfig) -> dict[str, str]:
    """{rung: reason} for the rungs of ``stress.precisions`` that cannot train here because torchao
    cannot be imported. Any other reason a rung cannot train (an fp8 recipe the installed torchao
    does not know, MX on a torch / torchao without it) is a ConfigError, raised before any training."""
    skipped = {}
    tokens = config.run.data.batch_size * config.run.model.context
    for p in config.stress.precisions:
        try:
            precision.check(replace(config.run.precision, dtype=p), config.run.device, tokens)
        except ao.TorchaoMissing as error:
            skipped[p] = f"{p} trains through torchao: {error}"
    return skipped


def at_precision(run: cfg.RunConfig, dtype: str, ladder_steps: int) -> cfg.RunConfig:
    """``run`` in ``dtype`` for ``ladder_steps`` steps (0: the run's own)."""
    return replace(run, precision=replace(run.precision, dtype=dtype), steps=ladder_steps or run.steps)


def run_precision_ladder(stress_case: StressCase, config: cfg.ExperimentConfig, session=None, runner=None) -> dict:
    """The same run (reference LR, Standard schedule) at every precision of ``stress.precisions``.

    The ``arms`` entries are the fp32 runs; ``final`` gains, per lower precision p, ``loss_gap_<p>``,
    ``nonfinite_events_<p>``, ``nonfinite_unhandled_<p>``, ``diverged_<p>``, ``overflow_fraction_<p>``, ``underflow_fraction_<p>``,
    ``loss_scale_drops_<p>`` and ``loss_spike_score_<p>``. ``record["results"]["precision_ladder"]`` holds the
    rungs, per rung the library, version and recipe that trained it (``sources``), the rungs skipped
    with their reason (torchao not installed), and a summary of every run."""
    skipped = ladder_skips(config)
    precisions = [p for p in config.stress.precisions if p not in skipped]
    with cpu_threads(config.stress.threads):
        case = CaseRun(stress_case, config, "precision_ladder",
                     f"the same run in {', '.join(precisions)}"
                     + (f" ({', '.join(skipped)} skipped: torchao missing)" if skipped else ""), session, runner)
        runs, sources = [], {}
        units = [case.unit(arm, seed, at_precision(config.arm_config(arm, seed), p, config.stress.ladder_steps),
                           Standard()) for seed in config.seeds for arm in config.arm_names for p in precisions]
        trained = case.train_units(units)
        for seed in config.seeds:
            for arm in config.arm_names:
                by_precision = {}
                for p in precisions:
                    arm_record = next(trained)
                    by_precision[p] = arm_record
                    sources.setdefault(p, arm_record.get("precision"))
                    runs.append(run_summary(arm_record, precision=p))
                reference = by_precision[cfg.REFERENCE_PRECISION]
                ref_loss = reference["final"].get("heldout_loss")
                for p, rec in by_precision.items():
                    if p == cfg.REFERENCE_PRECISION:
                        continue
                    final = rec["final"]
                    loss = final.get("heldout_loss")
                    add_figures(reference, {
                        f"loss_gap_{p}": (loss - ref_loss) if _finite(loss) and _finite(ref_loss) and
                        rec["status"] == Status.COMPLETED else None,
                        f"nonfinite_events_{p}": final.get("nonfinite_events"),
                        f"nonfinite_unhandled_{p}": final.get("nonfinite_unhandled"),
                        f"diverged_{p}": rec["status"] != Status.COMPLETED,
                        f"overflow_fraction_{p}": final.get("overflow_fraction"),
                        f"underflow_fraction_{p}": final.get("underflow_fraction"),
                        f"loss_scale_drops_{p}": final.get("loss_scale_drops"),
                        f"loss_spike_score_{p}": final.get("loss_spike_score"),
                    })
                add_arm(case.record, reference)
        set_case_result(case.record, case.name,
                        {"precisions": precisions, "sources": sources, "skipped": skipped, "runs": runs})
        return case.finish()


# ----------------------------------------------------------------------------- the shock

def shock_figures(losses: list[float], spikes: list[bool], shock_step: int, smoothing: int,
                  status: str) -> dict:
    """Peak excess, steps to recover and spikes after an LR shock at ``shock_step`` (see module docstring)."""
    if len(losses) <= shock_step:
        return {"shock_step": shock_step, "shock_pre_loss": None, "shock_peak_excess": None,
                "shock_recovery_steps": None, "shock_recovered": False, "shock_spikes": 0}
    before = [v for v in losses[max(0, shock_step - smoothing + 1):shock_step + 1] if _finite(v)]
    pre = sum(before) / len(before) if before else None
    after = losses[shock_step + 1:]
    recovery = None
    if pre is not None:
        for i in range(len(after)):
            window = after[max(0, i - smoothing + 1):i + 1]
            if len(window) == min(smoothing, len(after)) and all(_finite(v) for v in window) \
                    and sum(window) / len(window) <= pre:
                recovery = i + 1
                break
    horizon = after[:recovery] if recovery else after
    finite_after = [v for v in horizon if _finite(v)]
    peak = max(finite_after) if finite_after else None
    if any(not _finite(v) for v in horizon):
        peak = math.inf
    recovered = recovery is not None and status != Status.DIVERGED
    return {"shock_step": shock_step, "shock_pre_loss": pre,
            "shock_peak_excess": (peak - pre) if peak is not None and pre is not None else None,
            "shock_recovery_steps": recovery if recovered else len(after),
            "shock_recovered": recovered, "shock_spikes": sum(spikes[shock_step + 1:])}


def run_shock(stress_case: StressCase, config: cfg.ExperimentConfig, session=None, runner=None) -> dict:
    """An LR shock: ``stress.shock.factor`` x the LR from ``stress.shock.at_step`` on ("jump"), or no warmup
    ("no_warmup")."""
    stress = config.stress
    schedule = stress.shock
    if schedule.shock_step >= config.run.steps:
        raise cfg.ConfigError(f"stress.shock.at_step={schedule.at_step!r} is invalid: expected a step below "
                              f"steps={config.run.steps}")
    with cpu_threads(stress.threads):
        case = CaseRun(stress_case, config, f"shock-{schedule.kind}", schedule.describe(), session, runner)
        per_arm = case.train_each_arm(schedule, lambda run, arm_record: (shock_figures(
            arm_record["series"]["loss"], arm_record["series"]["loss_spike"], schedule.shock_step,
            stress.recovery_smoothing, arm_record["status"]), {}))
        set_case_result(case.record, case.name, {"kind": schedule.kind, "step": schedule.shock_step,
                                               "factor": schedule.factor, "per_arm": per_arm})
        return case.finish()


# ----------------------------------------------------------------------------- the plain pair

def run_standard(stress_case: StressCase, config: cfg.ExperimentConfig, session=None, runner=None) -> dict:
    """The plain pair (every arm of the config) at the preset's settings: what ``stability run`` and
    ``stability stress standard`` run."""
    with cpu_threads(config.stress.threads):
        return run_pair(quantized_by_default(config), session=session, runner=runner)


def quantized_by_default(config: cfg.ExperimentConfig) -> cfg.ExperimentConfig:
    """The plain pair of the harness's own model is quantized after training with every registered scheme
    (``stability.evaluate.quantize.SCHEMES``) unless the config names its schemes: the damage per scheme
    and arm is in every baseline and job (docs/quantization.md). A repository's own model (a factory or a
    Hugging Face config) is left as it is."""
    if config.quant_schemes or config.run.model.kind != "harness":
        return config
    from stability.evaluate.quantize import SCHEMES

    return replace(config, quant_schemes=tuple(SCHEMES))


# ----------------------------------------------------------------------------- the registry

@dataclass(frozen=True)
class StressCase:
    """A stress case, declared once: everything the harness knows about it.

    name: what ``stability stress NAME`` calls it, what its records say under "stress". train:
    ``train(case, config, session=None, runner=None)`` trains it and returns its case record; it is handed
    this entry (``CaseRun(case, ...)`` takes its name and rung from it: the name is never written twice).
    rung: for a case of several runs per arm and seed, what tells them apart (``rung(run) ->
    stability.cases.runs.Rung``: it names the runs and keys their files); None for one run per arm and seed.
    result: the type (a TypedDict) of its own results, ``record["results"][name]``; None for none. steps:
    the run length of one of its runs, from a record's config dict (None: ``run.steps``), what the merge
    check reads. ``result`` and ``steps`` go into the record's table of cases (``stability.record.cases``),
    which the check and the report read without torch."""

    name: str
    train: Callable[..., dict]
    rung: Callable[[cfg.RunConfig], Rung] | None = None
    result: type | None = None
    steps: Callable[[dict], int] | None = None

    @property
    def recorded(self) -> RecordedCase:
        """What records know of the case (``stability.record.cases.RecordedCase``)."""
        return RecordedCase(self.name, self.result, self.steps)

    def run(self, config: cfg.ExperimentConfig, session=None, runner=None) -> dict:
        """Train the case on ``config``; its case record."""
        return self.train(self, config, session=session, runner=runner)


# every stress case, in the order `stability stress` runs them; ``register`` adds one. The record's table of
# cases declares the same result types and run lengths for the readers without torch; ``declare`` refuses
# an entry that disagrees with it.
CASES: dict[str, StressCase] = {case.name: case for case in (
    StressCase("standard", run_standard),
    StressCase("lr_sweep", run_sweep, rung=lr_rung, result=LrSweep),
    StressCase("lr_ramp", run_lr_ramp, result=LrRamp),
    StressCase("batch_ramp", run_batch_ramp, result=BatchRamp),
    StressCase("precision_ladder", run_precision_ladder, rung=precision_rung, result=PrecisionLadder,
               steps=ladder_steps),
    StressCase("shock", run_shock, result=Shock),
)}
for _case in CASES.values():
    declare(_case.recorded)


def register(case: StressCase) -> StressCase:
    """Add ``case`` to ``CASES`` (a name not taken) and its result type and run length to the record's table
    of cases: ``stability stress`` runs it after the others."""
    if case.name in CASES:
        raise ValueError(f"stress case {case.name!r} is registered already")
    declare(case.recorded)
    CASES[case.name] = case
    return case


def check_cases(names) -> tuple[str, ...]:
    """The names as a tuple; ConfigError naming the first that is not a registered case."""
    names = tuple(names)
    for name in names:
        if name not in CASES:
            raise cfg.ConfigError(f"stress case {name!r} is unknown: expected one of {tuple(CASES)}")
    return names


def run_case(case: str, config: cfg.ExperimentConfig, session=None, runner=None) -> dict:
    """Run the stress case ``case`` (one of ``CASES``) on ``config`` and return its record. ``session``:
    record after every run, per-step files, checkpoints, resume (``stability.cases.experiment.train_arm``);
    ``runner``: who trains the runs (None: this process; ``stability.cases.experiment.train_units``)."""
    check_cases((case,))
    return CASES[case].run(config, session=session, runner=runner)
