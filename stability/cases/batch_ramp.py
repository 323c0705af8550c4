"""The batch ramp (``batch_ramp``): the batch size doubles every ``stress.batch.double_every`` steps up to
``stress.batch.max_size``, the LR scaled by ``stress.batch.lr_rule`` (none, sqrt, linear); spikes,
divergence and the loss against tokens seen.

* ``batch_off_schedule_steps``: the steps whose logged batch size, or the tokens they added, differ from what
  the ramp's settings give (``scheduled_batch``, computed here from the settings, never by the schedule the
  trainer asked, so that a change to it shows); the first of them in the case's results.
"""

from __future__ import annotations

import itertools
import math
from typing import TypedDict

from stability import config as cfg
from stability.cases.case import CaseRun, StressCase, every_arm, finite
from stability.cases.checks import close, learns, require
from stability.config import RunConfig, from_dict
from stability.config.schedules import warmup_cosine
from stability.record import Status, case_result, set_case_result
from stability.record.figures import GREW, Figure, Primary

# ----------------------------------------------------------------------------- its results
# record["results"]["batch_ramp"]: checked against these types where the case is registered

class BatchOffSchedule(TypedDict, total=False):
    step: int
    batch_size: int                   # logged
    tokens: int                       # tokens the step added (logged tokens seen minus the previous step's)
    expected_batch_size: int          # what the ramp's settings give
    expected_tokens: int


class BatchRampArm(TypedDict, total=False):
    arm: str
    seed: int
    status: Status
    diverged_at_step: int | None
    tokens_seen: int
    final_batch_size: int | None
    loss_vs_tokens: list[list[float | None]]   # [tokens seen, mean loss since the previous point]
    batch_off_schedule_steps: int
    batch_off_schedule: list[BatchOffSchedule]   # the first steps (at most 20) off the ramp's settings


class BatchRamp(TypedDict, total=False):
    lr_rule: str
    double_every: int
    max_batch_size: int
    per_arm: list[BatchRampArm]


def loss_vs_tokens(arm_record: dict, points: int = 50) -> list[list[float]]:
    """[[tokens seen, mean loss of the steps since the previous point], ...] at about ``points`` points."""
    series = arm_record["series"]
    n = len(series["loss"])
    if not n:
        return []
    every = max(1, math.ceil(n / points))
    out = []
    for start in range(0, n, every):
        window = [v for v in series["loss"][start:start + every] if finite(v)]
        out.append([series["tokens"][min(n, start + every) - 1], sum(window) / len(window) if window else None])
    return out


def scheduled_batch(step: int, base: int, double_every: int, max_size: int) -> int:
    """The batch the ramp's settings give at ``step``: ``base`` doubled every ``double_every`` steps, at most
    ``max_size``."""
    return min(max_size, base * 2 ** (step // double_every))


def scheduled_lr_factor(rule: str, growth: float) -> float:
    """The LR multiplier the ramp's ``lr_rule`` gives a batch ``growth`` times the base one, stated here, never
    by the function the schedule applies (``stability.config.schedules.lr_scale``), so that a change to it shows:
    "none" 1, "linear" the growth, "sqrt" its square root."""
    return {"none": 1.0, "linear": float(growth), "sqrt": math.sqrt(growth)}[rule]


def off_schedule(series: dict, base: int, context: int, double_every: int, max_size: int) -> list[dict]:
    """The steps of ``series`` (from step 0) whose logged batch size, or the tokens they added (tokens seen minus
    the previous step's), differ from ``scheduled_batch`` (tokens: that batch x ``context``)."""
    off = []
    steps, batches, tokens = series["step"], series["batch_size"], series["tokens"]
    for index, (step, batch) in enumerate(zip(steps, batches)):
        expected = scheduled_batch(step, base, double_every, max_size)
        added = tokens[index] - (tokens[index - 1] if index else 0)
        if batch != expected or added != expected * context:
            off.append({"step": step, "batch_size": batch, "tokens": added, "expected_batch_size": expected,
                        "expected_tokens": expected * context})
    return off


def describe_batch_ramp(config: cfg.ExperimentConfig) -> str:
    """What the record says it trains; a ConfigError, before anything is trained, for a ramp that starts above
    its top."""
    schedule = config.stress.batch
    if schedule.max_size < config.run.data.batch_size:
        raise cfg.ConfigError(f"stress.batch.max_size={schedule.max_size!r} is invalid: expected at least "
                              f"data.batch_size={config.run.data.batch_size}")
    return schedule.describe()


def train_batch_ramp(case: CaseRun) -> None:
    """Batch doubling every ``stress.batch.double_every`` steps up to ``stress.batch.max_size``, LR by
    ``stress.batch.lr_rule``."""
    schedule = case.config.stress.batch

    def figures_of(run, arm_record):
        series = arm_record["series"]
        off = off_schedule(series, run.data.batch_size, run.model.context, schedule.double_every,
                           schedule.max_size)
        figures = {"tokens_seen": series["tokens"][-1] if series["tokens"] else 0,
                   "final_batch_size": series["batch_size"][-1] if series["batch_size"] else None,
                   "batch_off_schedule_steps": len(off)}
        return figures, {"loss_vs_tokens": loss_vs_tokens(arm_record), "batch_off_schedule": off[:20]}

    per_arm = case.train_declared(figures_of)
    set_case_result(case.record, case.name, {"lr_rule": schedule.lr_rule, "double_every": schedule.double_every,
                                             "max_batch_size": schedule.max_size, "per_arm": per_arm})


# ----------------------------------------------------------------------------- what its record must show

def the_batch_doubles_and_the_lr_follows_its_rule(record, invariant):
    """At every step the batch is the base batch doubled every ``double_every`` steps (capped,
    ``scheduled_batch``), the LR the warmup-cosine LR scaled by the rule (``scheduled_lr_factor``), and the tokens
    seen add up."""
    ramp = record["config"]["stress"]["batch"]
    run = from_dict(RunConfig, record["config"]["run"])
    base = run.data.batch_size
    for arm in record["arms"]:
        series, where = arm["series"], f"{arm['arm']} seed {arm['seed']}"
        for step, batch, lr in zip(series["step"], series["batch_size"], series["lr"]):
            expected = scheduled_batch(step, base, ramp["double_every"], ramp["max_size"])
            require(batch == expected, f"{where} step {step}: batch {batch}, expected {expected}")
            scaled = warmup_cosine(step, run) * scheduled_lr_factor(ramp["lr_rule"], batch / base)
            require(close(lr, scaled), f"{where} step {step}: LR {lr}, expected {scaled}")
        tokens = [b * run.model.context for b in series["batch_size"]]
        require(series["tokens"][-1] == sum(tokens) == arm["final"]["tokens_seen"], f"{where}: tokens seen")


def the_ramp_stays_trainable(record, invariant):
    """No non-finite event, no divergence, the loss falls (model invariants)."""
    for arm in record["arms"]:
        learns(record, arm, arm["series"]["loss"][0], invariant)


def the_loss_against_tokens_is_recorded(record, invariant):
    """Each arm's loss-against-tokens curve is recorded, its tokens increasing up to the tokens seen."""
    for entry in case_result(record, CASE.name)["per_arm"]:
        curve = entry["loss_vs_tokens"]
        require(curve and all(a[0] < b[0] for a, b in itertools.pairwise(curve))
                and curve[-1][0] == entry["tokens_seen"], f"{entry['arm']} seed {entry['seed']}: curve {curve}")


# ----------------------------------------------------------------------------- its figures
# Its figures (``stability.record.figures.Figure``), added to the table when the case is registered.
FIGURES = (
    Figure("tokens_seen", "higher", "tokens", "tokens trained before the batch ramp stopped", kind="run",
           rel_floor=0.05, quantum="batch"),
    Figure("final_batch_size", None, "sequences", "batch size at the end of the batch ramp", kind="detail"),
    Figure("batch_off_schedule_steps", "lower", "count", "steps whose logged batch size, or the tokens they added, "
           "differ from what the ramp's settings give", kind="run", quantum="count", outcome=True),
)

# Its rows on the figures of every run: the batch ramp trains to its end, so a job that judges only this case
# still sees the model's loss, activations and logits.
PRIMARY = (
    Primary(figure="heldout_loss", arms="arms", why="the model trained with growing batches got worse"),
    Primary(figure="m_act_max", arms="arms", why=GREW),
    Primary(figure="max_attn_logit", arms="arms", why=GREW),
)


CASE = StressCase("batch_ramp", train_batch_ramp, describe=describe_batch_ramp, figures=FIGURES, primary=PRIMARY, result=BatchRamp, title="batch ramp",
                  qualifier=lambda config: config.stress.batch.lr_rule,
                  reported=lambda record: ["loss_spike_score", "grad_spike_score", "final_train_loss",
                                           "m_act_mean", "f_attn_mean"],
                  checks=(the_batch_doubles_and_the_lr_follows_its_rule, the_ramp_stays_trainable,
                          the_loss_against_tokens_is_recorded),
                  runs=lambda case, config: every_arm(case, config, config.stress.batch))
