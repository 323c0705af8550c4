"""What a stress case is: its declaration (``StressCase``) and the bookkeeping every case shares while it
trains (``CaseRun``).

Each built-in case is one module of this package that declares everything about it in one ``StressCase``
(``standard.py``, ``lr_sweep.py``, ``lr_ramp.py``, ``batch_ramp.py``, ``precision_ladder.py``,
``shock.py``): its name, its training function, its rung, the type of its results (declared in the module)
and its run length, the figures only it makes and the primary rows it is judged by, the figures its suite
reports and the checks its record must pass.
``stability.cases.stress`` gathers them into the registry ``CASES``; an extension declares its own the
same way and registers it there.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from stability import config as cfg
from stability.cases.runs import Rung, Unit
from stability.config.schedules import Standard
from stability.record import (
    CasePlot,
    CaseTable,
    RecordedCase,
    add_arm,
    add_figures,
    case_result,
    finish_case,
    new_case_record,
    set_corpus,
)
from stability.record.figures import Figure, Primary


@contextlib.contextmanager
def cpu_threads(threads: int):
    """Run the block with ``threads`` CPU intra-op threads (0: unchanged), then restore."""
    if threads <= 0:
        yield
        return
    import torch  # here, not at the top: the registry of cases imports without torch (the plugin reads it)

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def finite(value) -> bool:
    """A number (not a bool) that is neither NaN nor infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_summary(arm_record: dict, **extra) -> dict:
    """A compact copy of one run for the case key: status, final figures, what proves its stresses were applied
    (which step or Linear was not), timing, loss curve."""
    return {**extra, "arm": arm_record["arm"], "seed": arm_record["seed"], "variant": arm_record["variant"],
            "status": arm_record["status"], "diverged_at_step": arm_record["diverged_at_step"],
            "stop_reason": arm_record["stop_reason"], "final": dict(arm_record["final"]),
            "events": arm_record["events"], **({"applied": arm_record["applied"]} if "applied" in arm_record else {}),
            "timing": arm_record["timing"], "loss": list(arm_record["series"]["loss"])}


class CaseRun:
    """The bookkeeping every stress case shares while it trains: the record, the corpus, the per-run
    timings, the session (``stability.cases.experiment.train_arm``: record on disk after every run, resume,
    Ctrl-C), the runner (None: train here; see ``stability.cases.experiment.train_units``).

    ``CaseRun(case, config, description, session, runner, purpose)``: ``case`` is the ``StressCase`` being run
    (its registry entry: its name and label, which key its record, and its rung), handed to its function by
    ``StressCase.run``; ``train_each_arm`` trains every arm and seed, ``finish()`` returns the record."""

    def __init__(self, case: StressCase, config: cfg.ExperimentConfig, description: str, session=None,
                 runner=None, purpose: str = "regression"):
        from stability.cases.experiment import load_inputs  # training imports torch when a case runs

        self.started = time.perf_counter()
        self.case = case
        self.config = config
        self.session = session
        self.runner = runner
        self.record = new_case_record(config, case.label(config), description, case=case.name,
                                      purpose=purpose, run_steps=case.run_steps(config))
        self.corpus = load_inputs(config)
        set_corpus(self.record, self.corpus.info)
        self.runs: list[dict] = []  # timing dicts of every run trained

    @property
    def name(self) -> str:
        """The case's name (its entry's)."""
        return self.case.name

    def unit(self, arm: str, seed: int, run: cfg.RunConfig, schedule) -> Unit:
        """One run of the case, its rung as the case declares it."""
        return self.case.unit(arm, seed, run, schedule)

    def train_units(self, units: list[Unit]):
        """Yield the arm record of each unit, in order (trained here or by the runner)."""
        from stability.cases.experiment import train_units  # training imports torch when a case runs

        for arm_record in train_units(self.record, self.config, units, self.corpus, self.session, self.runner):
            self.runs.append(arm_record["timing"])
            yield arm_record

    def train_each_arm(self, schedule, figures_of) -> list[dict]:
        """Train every seed and arm under ``schedule``. ``figures_of(run, arm_record)`` returns
        (figures added to the arm's ``final``, extra entries for its summary). Returns one summary
        per arm: arm, seed, status, diverged_at_step, the figures and the extras."""
        return self.train_runs(every_arm(self.case, self.config, schedule), figures_of)

    def declared_units(self) -> list[Unit]:
        """The runs the case declares on this run's (prepared) config, in training order."""
        return self.case.units_of_prepared(self.config)

    def train_declared(self, figures_of) -> list[dict]:
        """``train_each_arm`` over the runs the case declares (``StressCase.units``: one per arm and seed)."""
        return self.train_runs(self.declared_units(), figures_of)

    def train_runs(self, units: list[Unit], figures_of) -> list[dict]:
        """Train ``units`` (one per arm and seed) and add ``figures_of(run, arm_record)`` to each (see
        ``train_each_arm``)."""
        per_arm = []
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


def every_arm(case: StressCase, config: cfg.ExperimentConfig, schedule) -> list[Unit]:
    """One run per seed and arm, each at its arm's run config, under ``schedule``: the runs of most cases."""
    return [case.unit(arm, seed, config.arm_config(arm, seed), schedule)
            for seed in config.seeds for arm in config.arm_names]


@dataclass(frozen=True, kw_only=True)
class StressCase:
    """A stress case, declared once: everything the harness knows about it, in four groups.

    ``StressCase(name, train, ...)``: the name (what ``stability stress NAME`` calls it, a record's "case")
    and its training, ``train(case_run)``, which trains the case's runs into the ``CaseRun`` it is handed and
    sets its results; the frame around it (the CPU threads, the ``CaseRun``, its finish) is ``run``'s, never
    the case's. Every other field is given by name and has a default:

    * **What it trains** (each ``None``: the plain pair's way): its runs, ``runs(case, config) -> [Unit]`` in
      training order (``every_arm`` for one per arm and seed under a schedule; what ``stability plan`` counts);
      ``rung(run) -> Rung`` telling apart several runs of one arm and seed; ``steps(config)``, one run's length
      (the record's "run_steps"); ``prepare(config) -> config``, the config ``run`` trains; ``describe(config)``,
      what its record says it trains; ``qualifier(config) -> str``, for settings whose records are never
      compared with each other (the batch ramp's LR rule): with the name it makes the case's label
      (``label``: "batch_ramp-sqrt", a record's "case_label"); ``settings``, a frozen dataclass instance, its
      own settings at their defaults (``--set stress.case_settings.<name>.<setting>=VALUE``, read with
      ``config.stress.settings_of(name)``).
    * **What the merge check judges**: ``result``, the type (a TypedDict of its module) of
      ``record["results"][name]``; ``figures``, the figures only it makes (``Figure`` s, with the primary rows
      each declares); ``primary``, its primary rows on figures declared elsewhere. The case's name is left
      out of its rows: registering it (``stability.cases.stress.register``) names them, and declares the
      figures, rows, result type and settings to the tables every command reads (no torch).
    * **What its suite does** (``suites/test_stress_cases.py``): ``title`` and ``reported(record)``, the
      heading and figures of its paired table (reported, never asserted); ``checks``, the properties its
      record must show, each ``check(record, invariant)``: a property of the harness raises ``CheckFailed``
      (``stability.cases.checks.require``), one of the model is recorded through ``invariant(...)`` and
      judged by ``stability check``; ``rerun``: train it twice and require the same figures.
    * **What only it shows**: ``tables`` (``CaseTable``) under ``stability stress`` and in the HTML report,
      ``plots`` (``CasePlot``) in the HTML report."""

    name: str = field(kw_only=False)
    train: Callable[[CaseRun], None] = field(kw_only=False)
    # what it trains
    runs: Callable[[StressCase, cfg.ExperimentConfig], list[Unit]] | None = None
    rung: Callable[[cfg.RunConfig], Rung] | None = None
    steps: Callable[[cfg.ExperimentConfig], int] | None = None
    prepare: Callable[[cfg.ExperimentConfig], cfg.ExperimentConfig] | None = None
    describe: Callable[[cfg.ExperimentConfig], str] | None = None
    qualifier: Callable[[cfg.ExperimentConfig], str] | None = None
    settings: object | None = None
    # what the merge check judges
    result: type | None = None
    figures: tuple[Figure, ...] = ()
    primary: tuple[Primary, ...] = ()
    # what its suite does
    title: str = ""
    reported: Callable[[dict], list[str]] | None = None
    checks: tuple[Callable[..., None], ...] = ()
    rerun: bool = False
    # what only it shows
    tables: tuple[CaseTable, ...] = ()
    plots: tuple[CasePlot, ...] = ()

    @property
    def recorded(self) -> RecordedCase:
        """What records know of the case (``stability.record.cases.RecordedCase``)."""
        return RecordedCase(self.name, self.result, self.tables, self.plots)

    def declared_figures(self) -> tuple[Figure, ...]:
        """Its figures, each row naming this case (a row's case left out is this one)."""
        return tuple(replace(entry, primary=self._named(entry.primary)) for entry in self.figures)

    def declared_rows(self) -> tuple[Primary, ...]:
        """Its rows on figures declared elsewhere, each naming this case."""
        return self._named(self.primary)

    def _named(self, rows: tuple[Primary, ...]) -> tuple[Primary, ...]:
        return tuple(row if row.case else replace(row, case=self.name) for row in rows)

    def label(self, config: cfg.ExperimentConfig) -> str:
        """What its records on ``config`` say under "case_label": its name, then its qualifier ("batch_ramp-sqrt")."""
        return self.name if self.qualifier is None else f"{self.name}-{self.qualifier(config)}"

    def unit(self, arm: str, seed: int, run: cfg.RunConfig, schedule) -> Unit:
        """One run of the case, named by its rung where the case declares one."""
        return Unit(self.name, arm, seed, run, schedule, self.rung(run) if self.rung else None)

    def units(self, config: cfg.ExperimentConfig) -> list[Unit]:
        """The runs ``run(config)`` trains, in the order it trains them (``prepare`` d where the case declares it;
        ``runs``; without, one run per seed and arm under the standard schedule). Nothing is built or
        trained: the plan counts these."""
        return self.units_of_prepared(self.prepared(config))

    def units_of_prepared(self, config: cfg.ExperimentConfig) -> list[Unit]:
        """``units`` of a config already ``prepared`` (the one a ``CaseRun`` holds)."""
        if self.runs is not None:
            return self.runs(self, config)
        return every_arm(self, config, Standard())

    def prepared(self, config: cfg.ExperimentConfig) -> cfg.ExperimentConfig:
        """The config ``run`` trains: ``prepare(config)`` where the case declares it, else ``config``."""
        return self.prepare(config) if self.prepare is not None else config

    def run_steps(self, config: cfg.ExperimentConfig) -> int:
        """The steps one of its runs trains on ``config``."""
        return self.steps(config) if self.steps is not None else config.run.steps

    def description(self, config: cfg.ExperimentConfig) -> str:
        """What its record says it trains on ``config`` (``describe``; without, the standard schedule's)."""
        return self.describe(config) if self.describe is not None else Standard().describe()

    def record(self, config: cfg.ExperimentConfig, session=None, runner=None, purpose: str = "regression") -> dict:
        """The frame every case trains in, on ``config`` as it is: a ``CaseRun`` (the record, the corpus, the
        session and the runner), the case's own training (``train(case_run)``), and its finish; the case
        record."""
        case_run = CaseRun(self, config, self.description(config), session, runner, purpose)
        self.train(case_run)
        return case_run.finish()

    def run(self, config: cfg.ExperimentConfig, session=None, runner=None) -> dict:
        """Train the case on ``config`` (``prepare`` d where it declares it) with its CPU threads
        (``stress.threads``); its case record."""
        config = self.prepared(config)
        with cpu_threads(config.stress.threads):
            return self.record(config, session, runner)
