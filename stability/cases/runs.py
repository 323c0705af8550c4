"""Units: the independent training runs a stress case is made of, each named and keyed here, and only here.

A case (``stability.cases.stress``) is a list of runs: one per seed and arm, times the LRs of a sweep or
the precisions of a ladder. A ``Unit`` is one of them: the case, the arm, the seed, the whole
``RunConfig`` it trains (the LR or precision included), the schedule and, in a multi-run case, its
``Rung`` (what tells it apart from the other runs of its arm and seed; the case's registry entry
declares it). A run has one identifier, its key, and a name for people (docs/words.md):

    unit.key           "gated-seed0-lr0.01-<8 hex digits of hash_run>": the run's one identifier, what its
                       record entry, per-step file, checkpoint and MLflow child run say; the same run of
                       the same case has the same key in every process and on every machine
    unit.run_name      "gated-seed0-lr0.01": the key without its digits (the MLflow child run's name,
                       progress lines), unique within one case record
    unit.identity(id)  which run this is with its config, as its per-step file, checkpoints and bundles keep it

A Ray task that trains a unit has an id and a name of its own (``stability.cases.ray_runner``).

The runs are independent (every run builds its own model and reads its own batches from the seed),
so a runner may train them in any order and in parallel; the case reads the results back in the
order of its list (``stability.cases.experiment.train_units``). Training them one after the other in this
process is the default; ``stability.cases.ray_runner.RayRunner`` sends each to a Ray task.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, TypedDict

from stability import config as cfg


class RunIdentity(TypedDict):
    """Which run a per-step file, checkpoint or replay bundle belongs to (``Unit.identity``)."""

    run_key: str
    name: str
    arm: str
    seed: int
    run_hash: str
    case: str
    case_id: str
    config: dict[str, Any]
    schedule: str


@dataclasses.dataclass(frozen=True)
class Rung:
    """What tells a run apart from the other runs of its arm and seed in a multi-run case.

    name: in the unit's name and id ("lr=0.01", "precision=bf16"). label: in the run's name, after the arm
    and seed ("lr0.01", "bf16")."""

    name: str
    label: str


def lr_rung(run: cfg.RunConfig) -> Rung:
    """The rung of a run of a learning-rate sweep: its peak LR."""
    return Rung(f"lr={run.optim.lr:g}", f"lr{run.optim.lr:g}")


def precision_rung(run: cfg.RunConfig) -> Rung:
    """The rung of a run of a precision ladder: its training format."""
    return Rung(f"precision={run.precision.dtype}", run.precision.dtype)


# Run fields added after runs were first hashed, each with the value every earlier run had: left out of
# the run hash while they hold it, so that a run keeps its key (its per-step file, checkpoints, MLflow run)
# across the upgrade, and an interrupted run resumes.
LATER_FIELDS = (("model", "treatments", ()),)


def hash_run(run: cfg.RunConfig, schedule: str) -> str:
    """Identity of one run (its whole RunConfig and schedule): a checkpoint resumes only the run it came from."""
    fields = dataclasses.asdict(run)
    for section, name, before in LATER_FIELDS:
        if fields[section].get(name) == before:
            del fields[section][name]
    text = json.dumps({"run": fields, "schedule": schedule}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Unit:
    """One run of a case. ``case``: the stress case's name (``stability.cases.stress.CASES``: "standard",
    "lr_sweep" ...); ``schedule``: a
    schedule (``stability.config.schedules``; picklable: plain dataclasses); ``rung``: None outside the
    multi-run cases."""

    case: str
    arm: str
    seed: int
    run: cfg.RunConfig
    schedule: object
    rung: Rung | None = None

    @property
    def run_name(self) -> str:
        """The run's name for people: arm, seed and rung ("gated-seed0-lr0.01")."""
        return f"{self.arm}-seed{self.seed}" + (f"-{self.rung.label}" if self.rung else "")

    @property
    def key(self) -> str:
        """The run's one identifier: its name and 8 hex digits of its whole run config and schedule."""
        return f"{self.run_name}-{hash_run(self.run, self.schedule.name)[:8]}"

    def identity(self, case_id: str) -> RunIdentity:
        """Which run this is, as its per-step file, checkpoints and replay bundles state it (``case_id``: the
        case record's id)."""
        return {"run_key": self.key, "name": self.run_name, "arm": self.arm, "seed": self.seed,
                "run_hash": hash_run(self.run, self.schedule.name), "case": self.case, "case_id": case_id,
                "config": dataclasses.asdict(self.run), "schedule": self.schedule.name}


def check_unique(units: list[Unit]) -> None:
    """ValueError when two units of a case share a key (the case would train one run twice)."""
    seen: set[str] = set()
    for unit in units:
        if unit.key in seen:
            raise ValueError(f"two units of case {unit.case!r} are the same run {unit.key!r}")
        seen.add(unit.key)
