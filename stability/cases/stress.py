"""The registry of stress cases: ``CASES``, each case declared once, in its own module of this package.

    run_case(case, config)          a case by name; ``register(StressCase(name, train, ...))`` adds one

    standard            the plain pair at the preset's settings (what `stability run` runs), quantized after
    lr_sweep            every arm at every peak LR of ``stress.sweep_lrs``: LR sensitivity, critical LR
    lr_ramp             LR range test, exponential LR until the arm diverges
    batch_ramp          batch doubling every N steps, LR scaled by a rule
    precision_ladder    the same run in fp32, bf16, fp16 (+GradScaler), fp8, mxfp8, mxfp4
    shock               LR jump by a factor mid-run (or no warmup)

Importing the registry imports no torch (the pytest plugin names the cases while it collects, before any
test imports torch): a case's training imports it when the case runs. What a case is and declares:
``stability.cases.case.StressCase``; each module above holds one case's
training, its figures (their definitions in its docstring; the others in docs/figures.md) and the checks
its record must pass. Nothing keeps state between calls: the config (including its ``stress`` settings) is
the whole input, so a case runs the same in-process, in a pytest-xdist worker or as a cluster task. Each
case lists its runs as ``stability.cases.runs.Unit`` s and reads their arm records back in that order
(``stability.cases.experiment.train_units``): trained here one after the other, or, with a ``runner``,
elsewhere (``stability.cases.ray_runner.RayRunner``: one Ray task per run), with the same figures. CPU
intra-op threads are set from ``stress.threads`` for the duration of a case and restored.

Every case trains every arm of the config (``config.arm_names``: the reference arm and the treatment arms,
``arms=...``), seed by seed. Every record is a ``stability.record`` case record: ``arms`` (one entry per arm
and seed, with ``arm``, ``seed``, ``status``, ``final`` ...) and ``paired`` (per treatment arm and figure:
reference, treatment, difference, 95% interval, p). The case-specific results sit under a key named after
the case (``record["results"]["lr_sweep"]`` ...), and the key figures of each case are added to the arms'
``final`` and so to ``paired`` (directions, units and meanings in ``stability.record.figures``). For the
multi-run cases (sweep, ladder) the ``arms`` entry of an arm and seed is its *reference* run (the grid LR
nearest ``optim.lr``; fp32), and the other runs are summarised in its results.
"""

from __future__ import annotations

from stability import config as cfg
from stability.cases import batch_ramp, lr_ramp, lr_sweep, precision_ladder, shock, standard
from stability.cases.case import CaseRun, StressCase, cpu_threads, every_arm
from stability.record import declare
from stability.record import figures as fig

__all__ = ["CASES", "CaseRun", "StressCase", "check_cases", "cpu_threads", "every_arm", "register", "run_case"]

# every stress case, in the order `stability stress` runs them; ``register`` adds one
CASES: dict[str, StressCase] = {}


def register(case: StressCase) -> StressCase:
    """Add ``case`` to ``CASES`` (a name not taken; ``stability stress`` runs it after the others) and what it
    declares to the tables the record and the check read: the type of its results (``declare``), its figures
    and its primary rows (``stability.record.figures``), so every process that imports the registry checks its
    results and judges its figures; and its own settings to the config (``cfg.declare_case_settings``).
    ValueError, before anything is added, for a name taken, a figure already in the table, a row
    ``register_primary`` would refuse or settings declared already (or not a frozen dataclass)."""
    if case.name in CASES:
        raise ValueError(f"stress case {case.name!r} is registered already")
    figures = case.declared_figures()
    taken = [entry.name for entry in figures if entry.name in fig.FIGURES]
    if taken:
        raise ValueError(f"stress case {case.name!r} declares figure {taken[0]!r}, which the table holds already")
    for row in case.declared_rows():
        fig.check_primary(row)
    if case.settings is not None:
        cfg.declare_case_settings(case.name, case.settings)
    declare(case.recorded)
    for entry in figures:
        fig.add(entry)
    for row in case.declared_rows():
        fig.register_primary(row)
    CASES[case.name] = case
    return case


for _module in (standard, lr_sweep, lr_ramp, batch_ramp, precision_ladder, shock):
    register(_module.CASE)


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
