"""The figures of a record: an arm's trajectory figures, a figure as a usable number, and the paired
summary of every treatment arm against the reference arm.

    arm["final"].update(final_figures(arm, steps_planned))     (through stability.record.build.add_figures)
    record["paired"] = paired_summary(record["arms"])          (through stability.record.build.set_paired)
"""

from __future__ import annotations

import math
from typing import Any

import stability.record.figures as fig
from stability.config import REFERENCE_ARM
from stability.record.schema import ArmRecord, PairedFigure, Status
from stability.record.stats import paired_difference


def _finite_mean(values) -> float:
    finite = [v for v in values if v is not None and not isinstance(v, bool) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def early_horizon(steps_planned: int) -> int:
    """The steps of the early horizon: the first tenth of the planned run (at least one step). Over it a
    change of rounding has not yet grown: rounding replicates of a 300-step run agree to about 1e-6 in
    loss and gradient norm there, and drift apart completely by the end."""
    return max(1, steps_planned // 10)


def _median(values) -> float:
    finite = sorted(v for v in values if v is not None and math.isfinite(v))
    if not finite:
        return float("nan")
    middle = len(finite) // 2
    return finite[middle] if len(finite) % 2 else (finite[middle - 1] + finite[middle]) / 2


def trajectory_figures(series: dict, steps_planned: int) -> dict[str, float]:
    """Summaries of the trajectory that a change of rounding does not scramble: the mean loss and mean
    gradient norm over the early horizon, the mean loss and median gradient norm over the last quarter of
    the steps trained (a window instead of one step's value)."""
    losses, grads = series["loss"], series["grad_norm"]
    early = early_horizon(steps_planned)
    late = len(losses) - max(1, len(losses) // 4)
    return {"early_loss": _finite_mean(losses[:early]), "early_grad_norm": _finite_mean(grads[:early]),
            "late_loss": _finite_mean(losses[late:]), "late_grad_norm": _median(grads[late:])}


EXCURSION_WINDOW = 10
"""W: the steps before a step whose median the loss excess and the gradient-norm excursion measure it against."""


def _finite(value) -> bool:
    return value is not None and not isinstance(value, bool) and math.isfinite(value)


def _excursions(values: list, start: int, window: int):
    """(value, running median of the finite values among the ``window`` steps before it) for each step from
    ``start`` (and from ``window`` at the earliest: a full window behind it) whose value is finite and whose
    window holds a finite value."""
    for t in range(max(start, window), len(values)):
        if _finite(values[t]):
            median = _median(values[t - window:t])
            if not math.isnan(median):
                yield values[t], median


def logged_warmup(lrs: list | None, steps: int) -> int:
    """The warmup as the series shows it: the steps before the first one whose logged LR is not above the
    previous step's, or not a number (10 for a 10-step linear warmup, 1 without warmup). A run whose LR rises
    to its end (the LR range test) or that has no LR series (fewer than 2 values) has no warmup to read: its
    first quarter, ``steps // 4``. ``lrs``: the LR of each step, as logged (``series["lr"]``; NaN is null in
    a record read back)."""
    lrs = list(lrs or [])
    return next((t for t in range(1, len(lrs))
                 if not (_finite(lrs[t]) and _finite(lrs[t - 1]) and lrs[t] > lrs[t - 1])), steps // 4)


def loss_excess_max(losses: list, start: int, window: int = EXCURSION_WINDOW) -> float:
    """The largest excess of the training loss over the running median of its ``window`` previous steps,
    ``max_t [loss_t - median(loss_{t-W} ... loss_{t-1})]`` over the steps ``t >= max(start, W)``, in
    nats/token. ``losses``: one value per step (None, NaN and Inf are skipped, in the step and in its window).
    0.0 when no step qualifies or no loss rises above its median (an excess is never negative)."""
    return max([0.0, *(value - median for value, median in _excursions(losses, start, window))])


def grad_norm_excursion(grad_norms: list, start: int, window: int = EXCURSION_WINDOW) -> float:
    """The largest ratio of the global gradient norm to the running median of its ``window`` previous steps,
    ``max_t [g_t / median(g_{t-W} ... g_{t-1})]`` over the steps ``t >= max(start, W)``, unitless (1 for a
    flat series). ``grad_norms``: one value per step (None, NaN and Inf skipped as for the loss; a step whose
    median is 0 is skipped too). 0.0 when no step qualifies."""
    return max([0.0, *(value / median for value, median in _excursions(grad_norms, start, window) if median > 0)])


def excursion_figures(series: dict) -> dict[str, float]:
    """A loss spike and a gradient-norm excursion the run recovered from: ``loss_excess_max`` over the steps
    after warmup (``logged_warmup``), ``grad_norm_excursion`` over the last half of the steps trained."""
    losses, grads = series["loss"], series["grad_norm"]
    return {"loss_excess_max": loss_excess_max(losses, logged_warmup(series.get("lr"), len(losses))),
            "grad_norm_excursion": grad_norm_excursion(grads, len(grads) - len(grads) // 2)}


def spike_score(flags: list[bool]) -> float:
    """Percentage of steps flagged as spikes (0 for no steps)."""
    return 100.0 * sum(flags) / len(flags) if flags else 0.0


def handled(event: dict) -> bool:
    """A non-finite event the precision recipe handled: a gradient overflow whose optimiser step was
    skipped (fp16's loss scaler meets it, skips the step and lowers the scale, as designed)."""
    return event.get("what") == "grad" and bool(event.get("skipped"))


def applied_figures(applied: dict | None) -> dict[str, Any]:
    """The figures that prove the run's stresses and measurements were applied, from its ``applied`` entry
    (``stability.train.applied``; none for a record written before it): ``lr_off_log_steps``,
    ``linear_off_format_calls`` and the share of Linear calls in the format (None where the format states no
    rule), ``probe_steps_missed`` (once the arm stopped) and ``probe_modules_missed`` (the most modules one
    snapshot did not hook)."""
    if not applied:
        return {}
    out: dict[str, Any] = {"lr_off_log_steps": applied.get("lr_off_log_steps", 0),
                           "probe_modules_missed": max((len(m["modules"]) for m in
                                                        applied.get("probe_modules_missed", [])), default=0)}
    calls = applied.get("linear_calls")
    if calls:
        out["linear_off_format_calls"] = sum(entry["calls"] for entry in calls["off_format"].values())
        judged = calls.get("runs_in") is not None and calls["calls"] > 0
        out["linear_in_format_share"] = calls["in_format"] / calls["calls"] if judged else None
    steps_missed = applied.get("probe_steps_missed")
    if steps_missed is not None:   # set once the arm stopped
        out["probe_steps_missed"] = len(steps_missed)
    return out


def final_figures(arm: ArmRecord, steps_planned: int) -> dict[str, Any]:
    """The trajectory figures of a finished (or stopped) arm, and the last probe snapshot's figures."""
    series = arm["series"]
    losses = series["loss"]
    finite_grads = [v for v in series["grad_norm"] if math.isfinite(v)]
    diverged = arm["status"] == Status.DIVERGED
    final = {
        "steps_completed": len(losses),
        "final_train_loss": _finite_mean(losses[-10:]),
        "min_train_loss": min((v for v in losses if math.isfinite(v)), default=float("nan")),
        "loss_spike_score": spike_score(series["loss_spike"]),
        "grad_spike_score": spike_score(series["grad_spike"]),
        "loss_spikes": sum(series["loss_spike"]),
        "grad_spikes": sum(series["grad_spike"]),
        "nonfinite_events": len(arm["events"]),
        "nonfinite_unhandled": sum(not handled(event) for event in arm["events"]),
        "skipped_steps": sum(series["skipped"]),
        "max_grad_norm": max(finite_grads, default=float("nan")),
        "diverged": diverged,
        "divergence_step": arm["diverged_at_step"] if diverged else steps_planned,
        **trajectory_figures(series, steps_planned),
        **excursion_figures(series),
    }
    if "update_norm" in series:  # records written before the update-norm probe have none
        finite_updates = [v for v in series["update_norm"] if v is not None and math.isfinite(v)]
        final.update({"update_spike_score": spike_score(series["update_spike"]),
                      "update_spikes": sum(series["update_spike"]),
                      "max_update_norm": max(finite_updates, default=float("nan"))})
    if arm["probes"]:
        last = arm["probes"][-1]
        final.update({key: value for key, value in last.items() if fig.figure(key) is not None})
    if arm["precision_stats"]:
        stats = arm["precision_stats"]
        final["overflow_fraction"] = _finite_mean([s.get("overflow_fraction") for s in stats])
        final["underflow_fraction"] = _finite_mean([s.get("underflow_fraction") for s in stats])
        final["loss_scale_drops"] = sum(s.get("scale_drops", 0) for s in stats)
    final.update(applied_figures(arm.get("applied")))
    return final


def usable_value(arm: ArmRecord, name: str) -> float | None:
    """An arm's figure as a float for comparisons, or None: missing, non-finite, or an evaluation or
    peak figure of an arm that did not complete (a broken model, or the size of the explosion; see
    ``stability.record.figures``)."""
    value = (arm.get("final") or {}).get(name)
    entry = fig.figure(name)
    if entry is not None and entry.needs_completed_arm and arm.get("status") != Status.COMPLETED:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def arm_names(arms: list[ArmRecord]) -> list[str]:
    """The arms of a record in order of first appearance, the reference arm first."""
    names = list(dict.fromkeys(a["arm"] for a in arms))
    return sorted(names, key=lambda n: n != REFERENCE_ARM)


def paired_summary(arms: list[ArmRecord], reference: str = REFERENCE_ARM) -> dict[str, dict[str, PairedFigure]]:
    """For each arm other than the reference arm, per figure with a table entry: the paired difference
    arm - reference over the seeds where both have a usable value (95% t-interval, sign-flip p).
    ``reference`` names another arm to compare with instead (e.g. the floored gate against the gate);
    the ``reference`` field of each summary then holds that arm's mean."""
    by_seed: dict[int, dict[str, ArmRecord]] = {}
    for arm in arms:
        by_seed.setdefault(arm["seed"], {})[arm["arm"]] = arm
    names = [n for n in arm_names(arms) if n != reference]
    out: dict[str, dict[str, PairedFigure]] = {}
    for name in names:
        seeds = [s for s in sorted(by_seed) if reference in by_seed[s] and name in by_seed[s]]
        present = {k for s in seeds for side in (reference, name) for k in by_seed[s][side].get("final", {})}
        table = {}
        for figure in sorted(present):
            if fig.figure(figure) is None or fig.figure(figure).kind == "detail":
                continue
            pairs = [(s, usable_value(by_seed[s][reference], figure), usable_value(by_seed[s][name], figure))
                     for s in seeds]
            pairs = [(s, b, t) for s, b, t in pairs if b is not None and t is not None]
            if not pairs and all(by_seed[s][side].get("final", {}).get(figure) is None
                                 for s in seeds for side in (reference, name)):
                continue
            summary = paired_difference([b for _, b, _ in pairs], [t for _, _, t in pairs])
            table[figure] = {"n": summary["n"], "reference": summary["reference"], "treatment": summary["treatment"],
                             "difference": summary["difference"], "ci_low": summary["ci_low"],
                             "ci_high": summary["ci_high"], "p_value": summary["p_value"],
                             "better": fig.better(figure), "seeds": [s for s, _, _ in pairs]}
        out[name] = table
    return out
