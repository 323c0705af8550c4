"""The job's verdict: its rows and failed runs, the family-wise decision over the rows, the exit code, and
the verdict as a table, Markdown, JSON and the lines of its false-alarm rate (``CheckResult``).

``decide`` judges the hypotheses of every row of the primary family (``stability.check.rows``) together by
Holm's step-down procedure at ``alpha`` (default 1%): the chance that a harmless change fails the job through
them is at most alpha whatever their dependence. A rejected *regressed* fails the job (exit 1); a rejected
*changed* alone makes it CHANGED (exit 3): the code computes something else than the baseline's, better or
worse, and a change meant to do so comes with its baseline. Every other row is *advisory*: printed with its
z and p, never failing the job.

Exit codes: 0 nothing regressed or changed; 1 an outcome, a primary row or a test of the job regressed,
whatever else is wrong with the job (the other problems are listed beside it); 3 a primary row or a setting
changed and nothing regressed; 2 the inputs cannot be judged.

The job's false-alarm rate, rows, outcomes and invariants together, is what the baseline's null jobs measured
(harmless jobs: the baseline's code with every run a fresh rounding replicate, ``null_jobs`` in the baseline);
the check prints it with what it rests on (``CheckResult.rate_lines``), the machines the null jobs ran on among
it: a job on another machine (``stability.record.machine``: another CPU, SIMD level, torch or BLAS) is told
that the rate is unmeasured there.

This module reads JSON only: no torch, no MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from stability.check.rows import DOF_RULE, Row, move_fields
from stability.record import figures as fig
from stability.record.stats import binomial_upper_bound, holm
from stability.report.tables import fmt, markdown_text, text_table

DEFAULT_ALPHA = 0.01
METHOD = ("Holm over the primary family, each row worse-by-its-floor and moved-either-way; outcomes per seed; "
          "noise from rounding replicates")


@dataclass
class Outcome:
    """A failure of one run of the job: an outcome not clean where every baseline run of its seed was clean
    (``stability.check.outcomes.OUTCOME_RULE``), a finite figure gone non-finite or absent, an invariant that stopped holding."""

    case_key: str
    arm: str
    seed: str
    figure: str
    reason: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


VERDICT_OF_EXIT = {0: "PASSED", 1: "REGRESSED", 2: "UNUSABLE INPUT", 3: "CHANGED"}
"""The job's verdict by the check's exit code (``CheckResult.exit_code``)."""

VERDICT_MARK = {"ok": "ok", "regressed": "REGRESSED", "changed": "CHANGED", "worse": "worse (advisory)",
                "improved": "improved",
                "new": "new", "missing": "missing", "duplicate": "duplicate"}


@dataclass
class CheckResult:
    rows: list[Row] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    baseline_commit: str | None = None
    preset: str | None = None
    device: str | None = None
    alpha: float = DEFAULT_ALPHA
    replicates: list[int] = field(default_factory=list)   # the baseline's: 0 the unperturbed runs
    calibration: dict | None = None
    null_jobs: dict | None = None   # the baseline's null jobs: {"jobs", "failed", ...} (its measured rate)
    job_machines: dict[str, int] = field(default_factory=dict)   # machine key -> the job's records made on it
    job_machines_unrecorded: int = 0   # the job's records that name no machine (written before records named it)
    suite_failures: list[str] = field(default_factory=list)   # tests of the job's suites that failed
    settings: list[str] = field(default_factory=list)   # per case whose settings differ from the baseline's
    clean_cells: list[int] = field(default_factory=lambda: [0, 0])   # outcome cells judged clean-only, their runs
    invariants_held: int = 0        # invariant lines that held in the baseline, judged
    signatures: dict[int, str] = field(default_factory=dict, repr=False)   # id(row) -> its values as text

    HEADER: ClassVar[list[str]] = ["case", "arm", "figure", "tier", "baseline", "current", "delta", "floor",
                                   "noise", "z", "p", "compared", "verdict"]

    @property
    def regressed(self) -> list[Row]:
        """The primary rows that fail the job: regressed, or changed (moved beyond their noise)."""
        return [row for row in self.rows if row.verdict in ("regressed", "changed")]

    @property
    def primary(self) -> list[Row]:
        return [row for row in self.rows if row.tier == "primary" and row.p is not None]

    @property
    def judged(self) -> int:
        """How many rows the job's verdict rests on (the primary rows with a p-value)."""
        return len(self.primary)

    @property
    def hypotheses(self) -> int:
        """How many hypotheses Holm's procedure judges: two per primary row, one for a row judged by its floor
        only."""
        return sum(len(row.hypotheses) for row in self.primary)

    @property
    def advisory(self) -> int:
        return sum(row.tier == "advisory" and row.p is not None for row in self.rows)

    @property
    def exit_code(self) -> int:
        """0 pass; 1 regressed (an outcome, a primary row or a test of the job failed), whatever else is wrong;
        3 changed (a primary row moved beyond its noise, or a setting differs: the code computes something
        else; accepted only by a new baseline); 2 the inputs cannot be judged (listed beside a 1 or a 3)."""
        if any(row.verdict == "regressed" for row in self.rows) or self.outcomes or self.suite_failures:
            return 1
        if any(row.verdict == "changed" for row in self.rows) or self.settings:
            return 3
        return 2 if self.errors else 0

    @property
    def verdict(self) -> str:
        return VERDICT_OF_EXIT[self.exit_code]

    def method(self) -> str:
        count = max(0, len(self.replicates) - 1)
        floor_only = sum(row.floor_only for row in self.primary)
        return (f"{METHOD}: Holm at alpha = {self.alpha:g} over {self.hypotheses} hypotheses of {self.judged} "
                f"primary rows ({floor_only} judged by their floor only); {self.advisory} advisory rows never fail "
                f"the job; the unperturbed run + {count} rounding replicates per seed")

    def rate(self) -> float | None:
        """The job's false-alarm rate, measured: the 95% upper bound over the baseline's null jobs (None: the
        baseline records none)."""
        jobs = self.null_jobs or {}
        if not jobs.get("jobs"):
            return None
        return binomial_upper_bound(jobs["failed"], jobs["jobs"])

    def rate_lines(self) -> list[str]:
        """The job's false-alarm rate, rows, outcomes and invariants together, and what it rests on."""
        jobs, bound = self.null_jobs or {}, self.rate()
        if bound is None:
            head = ("false-alarm rate of this job: not measured (the baseline records no null jobs); by design at "
                    "most alpha from its rows, plus what its outcome cells and invariants add")
        else:
            head = (f"false-alarm rate of this job (rows, outcomes and invariants together): at most {bound:.1%} at "
                    f"95% confidence: {jobs['failed']} of {jobs['jobs']} null jobs failed (harmless jobs of commit "
                    f"{str(jobs.get('commit'))[:7]}, every run a fresh rounding replicate)")
        curve = self.calibration or {}
        calibrated = (f"; calibrated: {curve['failed'][0]} of {curve['arrangements']} arrangements of the "
                      f"baseline's replicates failed at alpha {curve['alphas'][0]:g}") if curve.get("failed") else ""
        cells, runs = self.clean_cells
        return [head,
                f"  rows: at most alpha = {self.alpha:g} by Holm over {self.hypotheses} hypotheses{calibrated}",
                (f"  outcomes: {cells} cells (case, arm, seed, outcome) whose {runs} baseline runs were all clean "
                 f"fail the job on one run that is not"),
                f"  invariants: {self.invariants_held} that held in the baseline fail the job if one stops holding",
                self.machine_line()]

    def measured_on_job_machine(self) -> bool | None:
        """Whether every machine the job's records name is one the baseline's null jobs ran on (False: the rate
        is unmeasured there); None when either side names no machine, or the baseline records no null jobs."""
        machines = (self.null_jobs or {}).get("machines") if (self.null_jobs or {}).get("jobs") else None
        if not machines or not self.job_machines:
            return None
        return all(key in machines for key in self.job_machines)

    def machine_line(self) -> str:
        """The machines the rate rests on (the null jobs') and the job's, and whether the job's is among them."""
        job = ", ".join(self.job_machines) or "not recorded"
        if self.job_machines and self.job_machines_unrecorded:
            job += f" ({self.job_machines_unrecorded} records name no machine)"
        jobs = self.null_jobs or {}
        measured = self.measured_on_job_machine()
        if measured is False and jobs["jobs"] > sum(jobs["machines"].values()):
            job += " (not among those recorded: the rate may be unmeasured on it)"
        elif measured is False:
            job += " (not among them: the rate is unmeasured on it)"
        elif measured:
            job += " (among them)"
        if not jobs.get("jobs"):
            return f"  this job's machine: {job}"
        machines = jobs.get("machines")
        if machines is None:
            null = "machines not recorded"
        else:
            unrecorded = jobs["jobs"] - sum(machines.values())
            most = sorted(machines.items(), key=lambda item: (-item[1], item[0]))   # the most jobs first
            null = ", ".join([f"{key} ({count} jobs)" for key, count in most]
                             + ([f"not recorded ({unrecorded} jobs kept before jobs named their machine)"]
                                if unrecorded else []))
        return f"  machines of the null jobs: {null}; this job's machine: {job}"

    def failure_lines(self) -> list[str]:
        """One line per reason the job failed (empty when it passed)."""
        lines = [f"error: {e}" for e in self.errors] + [f"failed: {o.reason}" for o in self.outcomes]
        lines += [f"failed: {test}" for test in self.suite_failures]
        lines += [f"changed: {setting}" for setting in self.settings]
        holm_over = f"Holm over {self.hypotheses} hypotheses at alpha {self.alpha:g}"
        return lines + [f"regressed: {r.case_key} {r.arm} {r.figure} worse by more than its floor {fmt(r.floor)} (z "
                        f"{fmt(r.z)}, p {_fmt_p(r.p)}, {holm_over})"
                        if r.verdict == "regressed" else
                        (f"changed: {r.case_key} {r.arm} {r.figure} moved by {fmt(r.delta)} ({_direction(r)}), beyond its "
                         f"rounding noise {fmt(r.noise)} in every seed (p {_fmt_p(r.p_change)}, {holm_over}): the code "
                         f"computes something else than the baseline's; a change meant to do so comes with its "
                         f"baseline (stability baseline make, in the same commit)") for r in self.regressed]

    def cells(self, row: Row) -> list[str]:
        return [row.case_key, row.arm, row.figure, row.tier, fmt(row.baseline), fmt(row.current), fmt(row.delta),
                fmt(row.floor), fmt(row.noise), fmt(row.z), _fmt_p(row.p_judged), row.mode or "-",
                VERDICT_MARK[row.verdict] + (f" ({row.note})" if row.note else "")]

    def summary_line(self) -> str:
        counts = {v: sum(r.verdict == v for r in self.rows) for v in VERDICT_MARK}
        text = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        if self.settings:
            text = f"{len(self.settings)} case(s) with changed settings" + (f", {text}" if text else "")
        if self.outcomes:
            text = f"{len(self.outcomes)} failed outcome(s)" + (f", {text}" if text else "")
        if self.suite_failures:
            text = f"{len(self.suite_failures)} failed test(s)" + (f", {text}" if text else "")
        return (f"stability check: {self.verdict} (exit {self.exit_code}); preset {self.preset}, device "
                f"{self.device}, baseline commit {str(self.baseline_commit)[:12]}; {text or 'no figures compared'}")

    def shown(self, only_changed: bool) -> list[Row]:
        """The rows a table shows: the primary family first, then the advisory rows that moved."""
        rows = sorted(self.rows, key=lambda r: r.tier != "primary")
        return [r for r in rows if not only_changed or r.tier == "primary" or r.verdict not in ("ok", "duplicate")]

    def table(self, only_changed: bool = False) -> str:
        out = [self.summary_line(), self.method()] + self.rate_lines() + self.failure_lines() \
            + [f"warning: {w}" for w in self.warnings] + [f"note: {n}" for n in self.notes]
        rows = self.shown(only_changed)
        return "\n".join(out + (["", text_table([self.HEADER] + [self.cells(r) for r in rows])] if rows else []))

    def markdown(self) -> str:
        icon = {0: ":white_check_mark:", 1: ":x:", 2: ":warning:", 3: ":large_orange_diamond:"}[self.exit_code]
        out = [f"### Stability check: {icon} {self.verdict}", "",
               (f"Preset {markdown_text(self.preset)}, device {markdown_text(self.device)}, baseline from "
                f"commit {markdown_text(str(self.baseline_commit)[:12])}. The job fails when a run diverges, meets an "
                f"unhandled non-finite value or does not apply what its case applies where every baseline run of its "
                f"seed was clean, or when a row of the primary family got worse by more than its floor; it is "
                f"CHANGED when a primary row moved beyond its rounding noise either way, or a setting differs from "
                f"the baseline's; Holm at alpha = {self.alpha:g} over {self.hypotheses} hypotheses of "
                f"{self.judged} rows. {self.advisory} advisory rows are shown, never failing the job. Noise: the "
                f"spread of {max(0, len(self.replicates) - 1)} rounding replicates per seed (z: standard errors "
                f"beyond the floor)."), ""]
        out += [f"- {markdown_text(line.strip())}" for line in self.rate_lines()]
        out += [f"- **{markdown_text(line.partition(': ')[0])}:** {markdown_text(line.partition(': ')[2])}"
                for line in self.failure_lines()]
        out += [f"- warning: {markdown_text(w)}" for w in self.warnings]
        out += [f"- note: {markdown_text(n)}" for n in self.notes]
        rows = self.shown(only_changed=True)
        if rows:
            out += ["", "| " + " | ".join(self.HEADER) + " |", "|" + "---|" * len(self.HEADER)]
            for row in rows:
                cells = [markdown_text(c) for c in self.cells(row)]
                if row.verdict in ("regressed", "changed"):
                    cells[-1] = f"**{cells[-1]}**"
                out.append("| " + " | ".join(cells) + " |")
        return "\n".join(out) + "\n"

    def to_dict(self) -> dict:
        return {"exit_code": self.exit_code, "verdict": self.verdict, "errors": self.errors,
                "outcomes": [o.as_dict() for o in self.outcomes], "notes": self.notes, "warnings": self.warnings,
                "settings": self.settings, "baseline_commit": self.baseline_commit, "alpha": self.alpha,
                "method": METHOD, "dof_rule": DOF_RULE, "primary_family": [p.as_dict() for p in fig.primary_rows()],
                "rows_judged": self.judged, "hypotheses": self.hypotheses, "rows_advisory": self.advisory,
                "replicates": self.replicates, "calibration": self.calibration, "null_jobs": self.null_jobs,
                "rate": self.rate(),
                "machines": {"job": self.job_machines, "job_records_unrecorded": self.job_machines_unrecorded,
                             "null_jobs": (self.null_jobs or {}).get("machines"),
                             "measured_on_job_machine": self.measured_on_job_machine()},
                "clean_cells": self.clean_cells, "invariants_held": self.invariants_held,
                "suite_failures": self.suite_failures, "rows": [self.row_dict(r) for r in self.rows]}

    def row_dict(self, row: Row) -> dict:
        """A row of the JSON; a primary row with its smallest failing move and change
        (``stability.check.rows.move_fields``: how far it must move to fail the job alone)."""
        if row.tier != "primary":
            return row.as_dict()
        return {**row.as_dict(), **move_fields(row, self.hypotheses, self.alpha)}


def _direction(row: Row) -> str:
    """"worse" or "better" for a row's move."""
    worse = row.delta > 0 if row.better == "lower" else row.delta < 0
    return "worse, under its floor" if worse else "better"


def _fmt_p(p: float | None) -> str:
    return "-" if p is None else (f"{p:.1e}" if p < 1e-3 else f"{p:.3f}")


def decide(result: CheckResult) -> None:
    """Holm over the hypotheses of the primary rows (each row: worse by more than its floor; every seed moved
    beyond its noise the same way, either way, unless judged by its floor only): a row whose first is rejected regressed, one whose
    second alone is rejected changed. Advisory rows: "worse" where Holm over their regression p-values would
    reject (shown, never failing the job); improvements at alpha / rows."""
    primary = [(row, kind, p) for row in result.rows if row.tier == "primary" for kind, p in row.hypotheses]
    for (row, kind, _), rejected in zip(primary, holm([p for _, _, p in primary], result.alpha)):
        if rejected and (kind == "regressed" or row.verdict != "regressed"):
            row.verdict = kind
    advisory = [row for row in result.rows if row.tier == "advisory" and row.p is not None]
    for row, rejected in zip(advisory, holm([row.p for row in advisory], result.alpha)):
        if rejected:
            row.verdict = "worse"
        elif row.p_improved is not None and row.p_improved <= result.alpha / max(1, len(advisory)):
            row.verdict = "improved"
