"""The LR shock (``shock``): the learning rate jumps by ``stress.shock.factor`` at ``stress.shock.at_step``
for the rest of training ("jump"), or starts at the peak with no warmup ("no_warmup"); the loss excess it
causes, the spikes and the steps to get back to the pre-shock loss. The suites train it twice, and require
the same figures (the determinism the baseline relies on).

* ``shock_peak_excess``: highest loss after the shock minus the pre-shock loss (the mean of the
  ``recovery_smoothing`` losses up to the shock step; the loss at step 0 for "no_warmup").
  ``shock_recovery_steps``: steps after the shock until the rolling mean (``recovery_smoothing``
  post-shock losses) is back at or below the pre-shock loss; censored at the steps left when it
  never is (``shock_recovered`` False).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TypedDict

from stability import config as cfg
from stability.cases.case import CaseRun, StressCase, every_arm, finite
from stability.cases.checks import close, require
from stability.config import RunConfig, from_dict
from stability.config.schedules import warmup_cosine
from stability.record import Status, set_case_result
from stability.record.figures import SINGLE_STEP, Figure, Primary

# ----------------------------------------------------------------------------- its results
# record["results"]["shock"]: checked against these types where the case is registered

class ShockArm(TypedDict, total=False):
    arm: str
    seed: int
    status: Status
    diverged_at_step: int | None
    shock_step: int
    shock_pre_loss: float | None
    shock_peak_excess: float | None
    shock_recovery_steps: int | None
    shock_recovered: bool
    shock_spikes: int


class Shock(TypedDict, total=False):
    kind: str                         # "jump" or "no_warmup"
    step: int
    factor: float
    per_arm: list[ShockArm]


def shock_figures(losses: list[float], spikes: list[bool], shock_step: int, smoothing: int,
                  status: str) -> dict:
    """Peak excess, steps to recover and spikes after an LR shock at ``shock_step`` (see module docstring)."""
    if len(losses) <= shock_step:
        return {"shock_step": shock_step, "shock_pre_loss": None, "shock_peak_excess": None,
                "shock_recovery_steps": None, "shock_recovered": False, "shock_spikes": 0}
    before = [v for v in losses[max(0, shock_step - smoothing + 1):shock_step + 1] if finite(v)]
    pre = sum(before) / len(before) if before else None
    after = losses[shock_step + 1:]
    recovery = None
    if pre is not None:
        for i in range(len(after)):
            window = after[max(0, i - smoothing + 1):i + 1]
            if len(window) == min(smoothing, len(after)) and all(finite(v) for v in window) \
                    and sum(window) / len(window) <= pre:
                recovery = i + 1
                break
    horizon = after[:recovery] if recovery else after
    finite_after = [v for v in horizon if finite(v)]
    peak = max(finite_after) if finite_after else None
    if any(not finite(v) for v in horizon):
        peak = math.inf
    recovered = recovery is not None and status != Status.DIVERGED
    return {"shock_step": shock_step, "shock_pre_loss": pre,
            "shock_peak_excess": (peak - pre) if peak is not None and pre is not None else None,
            "shock_recovery_steps": recovery if recovered else len(after),
            "shock_recovered": recovered, "shock_spikes": sum(spikes[shock_step + 1:])}


def describe_shock(config: cfg.ExperimentConfig) -> str:
    """What the record says it trains; a ConfigError, before anything is trained, for a shock past the run."""
    schedule = config.stress.shock
    if schedule.shock_step >= config.run.steps:
        raise cfg.ConfigError(f"stress.shock.at_step={schedule.at_step!r} is invalid: expected a step below "
                              f"steps={config.run.steps}")
    return schedule.describe()


def train_shock(case: CaseRun) -> None:
    """An LR shock: ``stress.shock.factor`` x the LR from ``stress.shock.at_step`` on ("jump"), or no warmup
    ("no_warmup")."""
    stress = case.config.stress
    schedule = stress.shock
    per_arm = case.train_declared(lambda run, arm_record: (shock_figures(
        arm_record["series"]["loss"], arm_record["series"]["loss_spike"], schedule.shock_step,
        stress.recovery_smoothing, arm_record["status"]), {}))
    set_case_result(case.record, case.name, {"kind": schedule.kind, "step": schedule.shock_step,
                                             "factor": schedule.factor, "per_arm": per_arm})


# ----------------------------------------------------------------------------- what its record must show

def shocked_lr(step: int, run: RunConfig, kind: str, at_step: int, factor: float) -> float:
    """The LR the shock's settings give at ``step``, stated here from the settings and the standard warmup-cosine
    LR, never by the schedule the trainer asked (``stability.config.schedules.Shock.lr_at``), so that a change to
    it shows: "jump", the standard LR times ``factor`` from ``at_step`` to the end; "no_warmup", the standard LR
    of the run without its warmup."""
    if kind == "no_warmup":
        return warmup_cosine(step, replace(run, optim=replace(run.optim, warmup_steps=0)))
    return warmup_cosine(step, run) * (factor if step >= at_step else 1.0)


def the_shock_is_applied_as_configured(record, invariant):
    """Every step's LR is what the shock's settings give (``shocked_lr``): a jump multiplies the warmup-cosine LR
    by its factor from its step to the end, no warmup starts at the peak."""
    run = from_dict(RunConfig, record["config"]["run"])
    shock = record["config"]["stress"]["shock"]
    for arm in record["arms"]:
        where = f"{arm['arm']} seed {arm['seed']}"
        for step, lr in zip(arm["series"]["step"], arm["series"]["lr"]):
            expected = shocked_lr(step, run, shock["kind"], shock["at_step"], shock["factor"])
            require(close(lr, expected), f"{where} step {step}: LR {lr}, expected {expected}")


def the_loss_is_finite_before_the_shock_and_its_figures_defined(record, invariant):
    """The loss is finite up to the shock (a model invariant); when it is, the shock's figures are defined and
    consistent (assertions)."""
    for arm in record["arms"]:
        final = arm["final"]
        s = final["shock_step"]
        before = arm["series"]["loss"][:s + 1]
        ok = len(before) == s + 1 and all(v is not None and math.isfinite(v) for v in before)
        if not invariant(record, "finite_before_shock", arm["arm"], arm["seed"], ok, len(before), s + 1,
                         "steps with a finite loss up to the shock"):
            continue
        where = f"{arm['arm']} seed {arm['seed']}"
        require(final["shock_pre_loss"] is not None and math.isfinite(final["shock_pre_loss"]),
                f"{where}: shock_pre_loss {final['shock_pre_loss']}")
        require(final["shock_peak_excess"] is not None, f"{where}: no shock_peak_excess")
        require(1 <= final["shock_recovery_steps"] <= record["config"]["run"]["steps"] - s,
                f"{where}: shock_recovery_steps {final['shock_recovery_steps']}")
        require(not final["shock_recovered"] or arm["status"] != Status.DIVERGED, f"{where}: recovered and diverged")


# ----------------------------------------------------------------------------- its figures
# Its figures (``stability.record.figures.Figure``), added to the table when the case is registered. The peak
# excess is paired at smoke only, chosen on smoke's own evidence after a held-out zoo entry was missed through
# exactly this row (weight decay on the norm gains, z 231): its catch is in-sample.
FIGURES = (
    Figure("shock_peak_excess", "lower", "nats/token", "highest loss after the LR shock minus the pre-shock loss",
           kind="run", floor=0.1, rel_floor=0.25,
           primary=(Primary(arms="paired", presets=("smoke",), elsewhere=SINGLE_STEP,
                            why="the LR shock throws the gated arm's loss further up than the reference arm's"),
                    Primary(arms="arms", why="an LR shock throws the loss further up"))),
    Figure("shock_recovery_steps", "lower", "steps", "steps until the smoothed loss is back at its pre-shock level",
           kind="run", floor=3.0, rel_floor=0.25, quantum="step"),
    Figure("shock_spikes", "lower", "count", "loss spikes after the LR shock", kind="run", floor=2.0,
           rel_floor=0.5, quantum="count"),
    Figure("shock_recovered", "higher", "fraction of seeds", "the loss came back to its pre-shock level",
           kind="run", floor=0.25, quantum="seed"),
    Figure("shock_step", None, "step", "step of the LR shock", kind="detail"),
    Figure("shock_pre_loss", None, "nats/token", "mean loss of the steps up to the shock", kind="detail"),
)


CASE = StressCase("shock", train_shock, describe=describe_shock, figures=FIGURES, result=Shock, title="LR shock", rerun=True,
                  qualifier=lambda config: config.stress.shock.kind,
                  reported=lambda record: ["shock_peak_excess", "shock_recovery_steps", "shock_spikes",
                                           "loss_spike_score", "m_act_mean", "f_attn_mean"],
                  checks=(the_shock_is_applied_as_configured,
                          the_loss_is_finite_before_the_shock_and_its_figures_defined),
                  runs=lambda case, config: every_arm(case, config, config.stress.shock))
