"""Units: the independent training runs a stress case is made of, each named and keyed here, and only here.

A case (``stability.cases.stress``) is a list of runs: one per seed and arm, times the LRs of a sweep or
the precisions of a ladder. A ``Unit`` is one of them: the case, the arm, the seed, the whole
``RunConfig`` it trains (the LR or precision included), the schedule and, in a multi-run case, its
``Rung`` (what tells it apart from the other runs of its arm and seed; the case's registry entry
declares it). The unit gives the run every name it is known by:

    unit.run_hash      16 hex digits of the whole run config and the schedule's name
    unit.id            16 hex digits of the case, arm, seed, rung and run hash: the same run of the
                       same case has the same id in every process and on every machine, so a runner
                       that trains it twice (a retried Ray task) keeps one result under that id
    unit.name          "lr_sweep/gated/seed0/lr=0.01": the unit in a Ray record and in messages
    unit.run_name      "gated-seed0-lr0.01": the run's MLflow child run (arm, seed, rung)
    unit.key           "gated-seed0-lr0.01-<run hash 8>": its per-step file and its checkpoint
    unit.label         "[lr_sweep] gated-seed0-lr0.01": the run in progress lines
    unit.identity(id)  all of that with the run config, as its per-step file, checkpoints and bundles keep it

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
    def run_hash(self) -> str:
        return hash_run(self.run, self.schedule.name)

    @property
    def id(self) -> str:
        """16 hex digits, the same for the same run of the same case wherever it is computed."""
        text = json.dumps({"case": self.case, "arm": self.arm, "seed": self.seed,
                           "rung": self.rung.name if self.rung else "", "run": self.run_hash}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def name(self) -> str:
        return f"{self.case}/{self.arm}/seed{self.seed}" + (f"/{self.rung.name}" if self.rung else "")

    @property
    def run_name(self) -> str:
        return f"{self.arm}-seed{self.seed}" + (f"-{self.rung.label}" if self.rung else "")

    @property
    def key(self) -> str:
        return f"{self.run_name}-{self.run_hash[:8]}"

    @property
    def label(self) -> str:
        return f"[{self.case}] {self.run_name}"

    def identity(self, case_id: str) -> RunIdentity:
        """Which run this is, as its per-step file, checkpoints and replay bundles state it (``case_id``: the
        case record's id)."""
        return {"run_key": self.key, "name": self.run_name, "arm": self.arm, "seed": self.seed,
                "run_hash": self.run_hash, "case": self.case, "case_id": case_id,
                "config": dataclasses.asdict(self.run), "schedule": self.schedule.name}


def check_unique(units: list[Unit]) -> None:
    """ValueError when two units of a case share an id (the case would train one run twice)."""
    seen: dict[str, str] = {}
    for unit in units:
        if unit.id in seen:
            raise ValueError(f"units {seen[unit.id]!r} and {unit.name!r} have the same id {unit.id}")
        seen[unit.id] = unit.name
