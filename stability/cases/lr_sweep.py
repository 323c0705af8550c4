"""The learning-rate sweep (``lr_sweep``; Wortsman et al. 2023): every arm trained at every peak LR of
``stress.sweep_lrs`` for every seed (several runs per arm and seed); LR sensitivity and critical LR per arm,
paired over seeds. On the CPU no preset shows an LR-sensitivity or critical-LR difference between the arms
(reports/effects.md), so no claim is made of them.

* ``critical_lr``: smallest swept peak LR at which the arm diverged. When no LR diverged the value
  is *censored*: one grid step above the largest LR (``critical_lr_censored`` is True), so paired
  statistics and the regression check still see a finite lower bound.
* ``lr_sensitivity``: ``mean_eta [min(L(eta), L_init) - min_eta L(eta)]`` with ``L`` the held-out
  loss after training at peak LR ``eta``, a diverged (or failed) run counting as ``L_init`` (the
  loss at step 0, the same for every LR of an arm and seed).

The ``arms`` entries of the record are the runs at the grid LR nearest ``optim.lr`` (the configured runs);
the other runs are summarised in ``record["results"]["lr_sweep"]``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TypedDict

from stability import config as cfg
from stability.cases.case import CaseRun, StressCase, finite, run_summary
from stability.cases.checks import arm_names, learns, require
from stability.cases.runs import lr_rung
from stability.config.schedules import Standard
from stability.record import CasePlot, Status, add_arm, add_figures, case_result, set_case_result
from stability.record.figures import Figure, Primary
from stability.record.schema import RunSummary

# ----------------------------------------------------------------------------- its results
# record["results"]["lr_sweep"]: checked against these types where the case is registered

class SweepArm(TypedDict, total=False):
    arm: str
    seed: int
    lrs: list[float]
    final_loss: list[float | None]
    status: list[Status]
    lr_sensitivity: float | None
    critical_lr: float | None
    critical_lr_censored: bool
    best_lr: float | None
    best_lr_loss: float | None
    loss_init: float | None


class LrSweep(TypedDict, total=False):
    lrs: list[float]
    reference_lr: float
    per_arm: list[SweepArm]
    runs: list[RunSummary]


def sweep_figures(lrs: list[float], losses: list[float | None], diverged: list[bool], loss_init: float) -> dict:
    """LR sensitivity and critical LR of one arm and seed over a grid (see module docstring).

    ``losses[i]`` is the final (held-out) loss at ``lrs[i]``; a diverged or non-finite entry counts as
    ``loss_init``."""
    counted = [loss_init if (div or not finite(loss)) else min(loss, loss_init)
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


def sweep_runs(case: StressCase, config: cfg.ExperimentConfig) -> list:
    """Its runs: every seed and arm at every peak LR of ``stress.sweep_lrs``, LR by LR (``Standard`` schedule)."""
    return [case.unit(arm, seed, with_lr(config.arm_config(arm, seed), lr), Standard())
            for seed in config.seeds for arm in config.arm_names for lr in config.stress.sweep_lrs]


def describe_sweep(config: cfg.ExperimentConfig) -> str:
    return f"learning-rate sweep over peak LRs {', '.join(f'{v:g}' for v in config.stress.sweep_lrs)}"


def train_sweep(case: CaseRun) -> None:
    """Train every arm at every peak LR of the grid (``config.stress.sweep_lrs``) for every seed.

    ``record["results"]["lr_sweep"]``: the grid, the grid LR nearest ``optim.lr`` (``reference_lr``), per arm
    and seed the final loss per LR and the sweep figures, and a compact summary of every run. The ``arms``
    entries are the configured runs (at that LR), with ``lr_sensitivity``, ``critical_lr`` ... added to
    ``final``."""
    config = case.config
    grid = config.stress.sweep_lrs
    ref = reference_index(grid, config.run.optim.lr)
    per_arm, runs = [], []
    trained = case.train_units(case.declared_units())
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
                     and finite(r["series"]["loss"][0])]
            loss_init = first[0] if first else math.log(config.run.model.vocab_size)
            figures = sweep_figures(list(grid), losses, diverged, loss_init)
            per_arm.append({"arm": arm, "seed": seed, "lrs": list(grid), "final_loss": losses,
                            "status": [r["status"] for r in records], **figures})
            reference = records[ref]
            add_figures(reference, {**figures, "peak_lr": grid[ref]})
            add_arm(case.record, reference)
    set_case_result(case.record, case.name,
                    {"lrs": list(grid), "reference_lr": grid[ref], "per_arm": per_arm, "runs": runs})


# ----------------------------------------------------------------------------- its plot

def sweep_points(record: dict) -> dict[str, list[dict]] | None:
    """Per arm, the sweep points {lr, loss, diverged, seed, loss_init} when the record holds several peak LRs
    (``record["results"]["lr_sweep"]["per_arm"]``, ``run_sweep``), else None."""
    sweep = case_result(record, CASE.name) or {}
    points: dict[str, list[dict]] = {}
    for entry in sweep.get("per_arm") or []:
        statuses = entry.get("status") or [Status.COMPLETED] * len(entry.get("lrs") or [])
        for lr, loss, status in zip(entry.get("lrs") or [], entry.get("final_loss") or [], statuses):
            points.setdefault(entry.get("arm"), []).append({
                "lr": lr, "seed": entry.get("seed"), "diverged": status != Status.COMPLETED,
                "loss": loss if isinstance(loss, (int, float)) and math.isfinite(loss) else None,
                "initial_loss": entry.get("loss_init")})
    if not points or all(len({p["lr"] for p in pts}) < 2 for pts in points.values()):
        return None
    return points


def sweep_plot(record: dict) -> bytes | None:
    """The final loss against the peak LR, per arm (means over seeds; x: a run that diverged, at its initial
    loss); None when the record holds fewer than two LRs."""
    from stability.report.html import arm_color, new_figure, png_bytes  # matplotlib, when a report is made

    points = sweep_points(record)
    if not points:
        return None
    fig, (ax,) = new_figure(5.5, 3.4, 1)
    for arm, pts in sorted(points.items()):
        color = arm_color(arm, record)
        by_lr: dict[float, list] = {}
        for p in pts:
            by_lr.setdefault(p["lr"], []).append(p)
        lrs = sorted(by_lr)
        means = []
        for lr in lrs:
            kept = [p["loss"] for p in by_lr[lr] if not p["diverged"] and p["loss"] is not None]
            means.append(sum(kept) / len(kept) if kept else float("nan"))
        ax.plot(lrs, means, "o-", color=color, label=arm)
        for p in pts:
            if p["diverged"]:
                ax.plot([p["lr"]], [p["initial_loss"] or float("nan")], "x", color=color, ms=9)
    ax.set_xscale("log")
    ax.set(title="LR sweep: final loss vs peak LR (x = diverged)", xlabel="peak learning rate", ylabel="final loss")
    ax.legend(fontsize=7)
    return png_bytes(fig)


# ----------------------------------------------------------------------------- what its record must show

def the_grid_is_fully_trained(record, invariant):
    """Every arm trained every seed at every LR of the grid, each run completed or diverged."""
    grid, seeds = record["config"]["stress"]["sweep_lrs"], record["config"]["seeds"]
    runs = case_result(record, CASE.name)["runs"]
    require(sorted((r["arm"], r["seed"], r["lr"]) for r in runs) == sorted(
        (arm, seed, lr) for arm in arm_names(record) for seed in seeds for lr in grid), "runs missing from the grid")
    require(all(r["status"] in (Status.COMPLETED, Status.DIVERGED) for r in runs),
            f"runs neither completed nor diverged: {[r['stop_reason'] for r in runs]}")


def the_reference_lr_is_finite_and_learns(record, invariant):
    """At the configured LR in fp32 every arm completes with no non-finite event and the loss falls (model
    invariants)."""
    for arm in record["arms"]:
        learns(record, arm, arm["final"]["loss_init"], invariant)


def the_sweep_figures_are_consistent(record, invariant):
    """The LR sensitivity is not negative and the critical LR is the smallest diverged LR of the grid (or
    censored above it); the configured LR lies below the critical LR (a model invariant)."""
    result = case_result(record, CASE.name)
    for entry in result["per_arm"]:
        where = f"{entry['arm']} seed {entry['seed']}"
        require(entry["lr_sensitivity"] >= 0.0, f"{where}: lr_sensitivity {entry['lr_sensitivity']} < 0")
        diverged = [lr for lr, s in zip(entry["lrs"], entry["status"]) if s == Status.DIVERGED]
        if diverged:
            require(entry["critical_lr"] == min(diverged) and not entry["critical_lr_censored"],
                    f"{where}: critical_lr {entry['critical_lr']} against diverged LRs {diverged}")
        else:
            require(entry["critical_lr"] > max(entry["lrs"]) and entry["critical_lr_censored"],
                    f"{where}: critical_lr {entry['critical_lr']} not censored above the grid")
        invariant(record, "reference_lr_below_critical_lr", entry["arm"], entry["seed"],
                  entry["critical_lr"] > result["reference_lr"], entry["critical_lr"], result["reference_lr"],
                  "the smallest LR of the grid that diverged is above the reference LR")


# ----------------------------------------------------------------------------- its figures
# Its figures (``stability.record.figures.Figure``; defined in the docstring above), added to the table when the
# case is registered: only lr_sensitivity is primary, judged in every arm and paired difference.
FIGURES = (
    Figure("lr_sensitivity", "lower", "nats/token",
           "mean over the LR grid of min(L, L_init) - min L; a diverged run counts L_init (Wortsman et al.)",
           kind="run", floor=0.02, rel_floor=0.1,
           primary=(Primary(why="the loss depends more on the learning rate (Wortsman et al. 2023)"),)),
    Figure("critical_lr", "higher", "learning rate", "smallest swept peak LR at which the arm diverged",
           kind="run", rel_floor=0.5),
    Figure("peak_lr", None, "learning rate", "peak LR of the configured run of a sweep", kind="run"),
    Figure("critical_lr_censored", None, "flag", "no swept LR diverged: critical_lr is one grid step above the "
           "largest LR", kind="detail"),
    Figure("best_lr", None, "learning rate", "swept peak LR with the lowest held-out loss", kind="detail"),
    Figure("best_lr_loss", None, "nats/token", "held-out loss at best_lr", kind="detail"),
    Figure("loss_init", None, "nats/token", "loss at step 0 (a diverged sweep run counts it)", kind="detail"),
)


CASE = StressCase("lr_sweep", train_sweep, describe=describe_sweep, figures=FIGURES, rung=lr_rung, result=LrSweep, title="LR sweep",
                  reported=lambda record: ["lr_sensitivity", "critical_lr", "m_act_mean", "f_attn_mean",
                                           "loss_spike_score", "heldout_loss"],
                  checks=(the_grid_is_fully_trained, the_reference_lr_is_finite_and_learns,
                          the_sweep_figures_are_consistent), runs=sweep_runs,
                  plots=(CasePlot("lr_sweep", "Learning rates: sweep or range test", sweep_plot),))
