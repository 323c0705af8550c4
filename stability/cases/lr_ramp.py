"""The LR range test (``lr_ramp``): one run per arm and seed whose LR rises exponentially (no warmup) from
``stress.ramp.start_lr`` to ``stress.ramp.end_lr`` until the arm diverges; the LR and step at the onset of
divergence and the spikes on the way.

* ``ramp_divergence_lr``: the LR of the *update* that caused the onset of divergence. The onset is the first
  step of the final run of steps whose loss is non-finite or above ``diverge_factor`` x the initial loss;
  the loss at step t is measured after the updates of steps 0..t-1, so the update to blame is step t-1's
  (its LR is ``lr[t-1]``). The end LR, censored, when the arm never diverged. ``ramp_best_lr``: the LR of
  the update before the lowest smoothed loss.
"""

from __future__ import annotations

import itertools
import math
from typing import TypedDict

from stability.cases.case import CaseRun, StressCase, every_arm, finite
from stability.cases.checks import close, require
from stability.record import Status, set_case_result
from stability.record.figures import Figure, Primary

# ----------------------------------------------------------------------------- its results
# record["results"]["lr_ramp"]: checked against these types where the case is registered

class RampArm(TypedDict, total=False):
    arm: str
    seed: int
    status: Status
    diverged_at_step: int | None
    ramp_divergence_lr: float | None
    ramp_divergence_step: int | None
    ramp_censored: bool
    ramp_spikes: int
    ramp_grad_spikes: int
    ramp_best_lr: float | None
    ramp_best_loss: float | None


class LrRamp(TypedDict, total=False):
    start_lr: float
    end_lr: float
    per_arm: list[RampArm]


def rolling_min_index(values: list[float], width: int) -> int | None:
    """Index of the lowest rolling mean (trailing ``width``) of the finite values; None if none."""
    best, best_index = math.inf, None
    for i in range(len(values)):
        window = [v for v in values[max(0, i - width + 1):i + 1] if finite(v)]
        if len(window) == min(width, i + 1) and window:
            mean = sum(window) / len(window)
            if mean < best:
                best, best_index = mean, i
    return best_index


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
    init = next((v for v in losses if finite(v)), None)
    diverged = arm_record["status"] == Status.DIVERGED
    if diverged:
        onset = arm_record["diverged_at_step"]
        while onset > 0 and not (finite(losses[onset - 1]) and init is not None
                                 and losses[onset - 1] <= diverge_factor * init):
            onset -= 1
        lr, step = lrs[update_before(onset)], onset
    else:
        onset, lr, step = len(losses), end_lr, len(losses)
    best = rolling_min_index(losses[:onset] or losses, smoothing)
    return {"ramp_divergence_lr": lr, "ramp_divergence_step": step, "ramp_censored": not diverged,
            "ramp_spikes": sum(series["loss_spike"][:onset]), "ramp_grad_spikes": sum(series["grad_spike"][:onset]),
            "ramp_best_lr": lrs[update_before(best)] if best is not None else None,
            "ramp_best_loss": (sum(losses[max(0, best - smoothing + 1):best + 1]) / len(
                losses[max(0, best - smoothing + 1):best + 1])) if best is not None else None}


def train_lr_ramp(case: CaseRun) -> None:
    """One LR range test per arm and seed: exponential LR from ``stress.ramp.start_lr`` to ``stress.ramp.end_lr``."""
    stress = case.config.stress
    schedule = stress.ramp
    per_arm = case.train_declared(lambda run, arm_record: (ramp_figures(
        arm_record, run.probes.diverge_factor, stress.recovery_smoothing, schedule.end_lr), {}))
    set_case_result(case.record, case.name, {"start_lr": schedule.start_lr, "end_lr": schedule.end_lr,
                                             "per_arm": per_arm})


# ----------------------------------------------------------------------------- what its record must show

def the_lr_rises_exponentially(record, invariant):
    """Each run's LR starts at the ramp's start LR and grows by the same factor every step."""
    ramp, steps = record["config"]["stress"]["ramp"], record["config"]["run"]["steps"]
    ratio = (ramp["end_lr"] / ramp["start_lr"]) ** (1 / max(1, steps - 1))
    for arm in record["arms"]:
        lrs = arm["series"]["lr"]
        require(close(lrs[0], ramp["start_lr"]), f"{arm['arm']} seed {arm['seed']}: first LR {lrs[0]}")
        require(all(close(b / a, ratio, rel=1e-9) for a, b in itertools.pairwise(lrs)),
                f"{arm['arm']} seed {arm['seed']}: the LR does not grow by {ratio} per step")


def the_ramp_finds_divergence(record, invariant):
    """Within the ramp every arm diverges (a ramp that never diverges measured nothing), after the loss first
    fell: the best loss on the way is below the initial loss (model invariants). Where it diverged, the
    figures of the onset are consistent (assertions)."""
    for arm in record["arms"]:
        final, name, seed = arm["final"], arm["arm"], arm["seed"]
        diverged = arm["status"] == Status.DIVERGED and not final["ramp_censored"]
        invariant(record, "ramp_diverges", name, seed, diverged, message=arm["stop_reason"])
        invariant(record, "loss_falls_before_divergence", name, seed,
                  final["ramp_best_loss"] is not None and final["ramp_best_loss"] < arm["series"]["loss"][0],
                  final["ramp_best_loss"], arm["series"]["loss"][0])
        if not diverged:
            continue
        where = f"{name} seed {seed}"
        require(final["ramp_divergence_step"] <= arm["diverged_at_step"], f"{where}: onset after the divergence")
        # the LR of the update after which the loss first went bad (the update before the onset step)
        require(arm["series"]["lr"][final["ramp_divergence_step"] - 1] == final["ramp_divergence_lr"],
                f"{where}: ramp_divergence_lr is not the LR of the update before the onset")
        require(final["ramp_best_lr"] < final["ramp_divergence_lr"], f"{where}: best LR not below the onset's")


def the_loss_is_finite_until_divergence(record, invariant):
    """Every loss before the onset of divergence is finite."""
    for arm in record["arms"]:
        onset = arm["final"]["ramp_divergence_step"]
        require(all(math.isfinite(v) for v in arm["series"]["loss"][:onset]),
                f"{arm['arm']} seed {arm['seed']}: a non-finite loss before the onset at step {onset}")


# ----------------------------------------------------------------------------- its figures
# Its figures (``stability.record.figures.Figure``; defined in the docstring above), added to the table when the
# case is registered. ramp_divergence_lr is not primary: the smallest drop that fails a job alone is 130-146% of
# its mean at ci and 265-540% at smoke (stability baseline calibrate, docs/figures.md): a learning rate cannot lose
# that much, so the row counted in m and guarded nothing; the range test stays watched by its early rows below and
# its outcomes.
FIGURES = (
    Figure("ramp_divergence_lr", "higher", "learning rate",
           "LR of the update after which the LR range test started to diverge", kind="run", rel_floor=0.3),
    Figure("ramp_divergence_step", "higher", "step", "step at which the LR range test started to diverge",
           kind="run", floor=2.0, rel_floor=0.05, quantum="step"),
    Figure("ramp_best_lr", None, "learning rate", "LR of the update before the lowest smoothed ramp loss",
           kind="run"),
    Figure("ramp_spikes", "lower", "count", "loss spikes before the ramp diverged", kind="run", floor=2.0,
           rel_floor=0.5, quantum="count"),
    Figure("ramp_grad_spikes", "lower", "count", "gradient-norm spikes before the ramp diverged", kind="run",
           floor=2.0, rel_floor=0.5, quantum="count"),
    Figure("ramp_censored", None, "flag", "the LR range test never diverged (ramp_divergence_lr is the end LR)",
           kind="detail"),
    Figure("ramp_best_loss", None, "nats/token", "lowest smoothed loss of the LR range test", kind="detail"),
)

# Its rows on the figures of every run: the same model's early horizon under a second schedule (no warmup, the LR
# rising from its smallest value): a change of the arithmetic that makes the plain pair's early training look
# better can make this one worse.
PRIMARY = (
    Primary(figure="early_loss", arms="arms",
            why="the model computes something else: the loss over the range test's early horizon moved"),
    Primary(figure="early_grad_norm", arms="arms",
            why="the model computes something else: the gradient norm over the range test's early horizon moved"),
)


CASE = StressCase("lr_ramp", train_lr_ramp, describe=lambda config: config.stress.ramp.describe(), figures=FIGURES, primary=PRIMARY, result=LrRamp, title="LR range test",
                  reported=lambda record: ["ramp_divergence_lr", "ramp_divergence_step", "ramp_spikes",
                                           "m_act_mean", "f_attn_mean"],
                  checks=(the_lr_rises_exponentially, the_ramp_finds_divergence,
                          the_loss_is_finite_until_divergence),
                  runs=lambda case, config: every_arm(case, config, config.stress.ramp))
