"""Units: the independent training runs a stress case is made of, each with a stable id.

A case (``stability.cases.stress``) is a list of runs: one per seed and arm, times the LRs of a sweep or
the precisions of a ladder. A ``Unit`` is one of them: the arm, the seed, the whole ``RunConfig``
it trains (the LR or precision included) and the schedule. Its ``id`` is a hash of the case, the
arm, the seed, the LR / precision rung and the run's fingerprint (its whole config and schedule),
so the same run of the same case has the same id in every process and on every machine: a
runner that trains it twice (a retried task) keeps one result under that id, never two.

The runs are independent (every run builds its own model and reads its own batches from the seed),
so a runner may train them in any order and in parallel; the case reads the results back in the
order of its list (``stability.cases.experiment.train_units``). Training them one after the other in this
process is the default; ``stability.cases.ray_runner.RayRunner`` sends each to a Ray task.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from stability import config as cfg


@dataclasses.dataclass(frozen=True)
class Unit:
    """One run of a case. ``case``: the stress kind ("pair" for the plain pair); ``schedule``: a
    ``stability.train.schedules`` schedule (picklable: plain dataclasses)."""

    case: str
    arm: str
    seed: int
    run: cfg.RunConfig
    schedule: object

    @property
    def rung(self) -> str:
        """What tells this run apart from the others of its arm and seed ("lr=0.01", "precision=bf16", "")."""
        if self.case == "lr_sweep":
            return f"lr={self.run.optim.lr:g}"
        if self.case == "precision_ladder":
            return f"precision={self.run.precision.dtype}"
        return ""

    @property
    def id(self) -> str:
        """16 hex digits, the same for the same run of the same case wherever it is computed."""
        # imported here: checkpoint imports torch, and the attempts actor of a Ray run imports units without it
        from stability.train.checkpoint import run_fingerprint

        fingerprint = run_fingerprint(dataclasses.asdict(self.run), self.schedule.name)
        text = json.dumps({"case": self.case, "arm": self.arm, "seed": self.seed, "rung": self.rung,
                           "run": fingerprint}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def name(self) -> str:
        return f"{self.case}/{self.arm}/seed{self.seed}" + (f"/{self.rung}" if self.rung else "")


def check_unique(units: list[Unit]) -> None:
    """ValueError when two units of a case share an id (the case would train one run twice)."""
    seen: dict[str, str] = {}
    for unit in units:
        if unit.id in seen:
            raise ValueError(f"units {seen[unit.id]!r} and {unit.name!r} have the same id {unit.id}")
        seen[unit.id] = unit.name
