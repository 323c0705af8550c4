"""The merge check: the records of one job against a recorded baseline -> one verdict, an exit code.

A baseline (``stability.check.baseline``) holds, per stress case, arm, seed and judged figure, the values
of the seed's unperturbed run and of its rounding replicates; their spread is the noise a harmless change
has to be told from. ``check(records, baseline)`` judges the job in four parts:

1. **Fail closed.** What cannot be judged fails the job with exit 2 and the reason: a record left
   unfinished (status "running" or "killed"), a case, arm or seed the baseline judged and the job lacks
   (``cases`` narrows the baseline's cases on purpose, and the verdict says so), a job of other seeds
   than the baseline's (each seed is paired with its own baseline runs), another preset or device, runs
   that cannot be compared (part 4), a figure value that is not a number.
2. **Outcomes, seed by seed.** A figure the table marks as an *outcome* (the run diverged, met a
   non-finite value its precision recipe did not handle, or did not apply what its case says it applies:
   ``Figure.outcome``) not clean in a run of the job is judged against the n baseline runs of that seed that
   report it: k of them not clean (a run that diverged counts as not clean for every outcome: a non-finite
   value on the way to a divergence is part of it). The run fails the job where k = 0, every baseline run of
   the seed clean, with one line naming case, arm, seed, what happened (the divergence step), k and n; where
   k > 0 the replicates already showed it, and a note says so with its rank p = (k + 1) / (n + 1), not failing
   the job. A figure finite in every baseline run of a seed that is non-finite or absent in the job's run of
   that seed (when that run should report it) fails the same way: a NaN is a result, and the result is a
   regression.
3. **Rows.** Every other judged figure of every case and arm, and the paired difference ``<arm> -
   reference`` of each treatment arm, is a row: ``delta = mean_s(current_s - m_s)`` over the seeds, where
   ``m_s`` and ``v_s`` are the mean and variance of seed s's baseline runs (never below the figure's
   resolution squared), standard error ``sqrt(sum_s v_s (1 + 1/n_s)) / n``, degrees of freedom by
   ``DOF_RULE`` (the fewest of any seed). Each row of the *primary family*
   (``stability.record.figures.primary_rows()``) is two hypotheses: *regressed*, the p-value of "worse by
   more than the floor" (``floor = max(floor, rel_floor * |baseline|)``, the figure table), and *changed*,
   the two-sided p-value of "moved at all" (no floor), left out for a row declared ``floor_only`` (its
   harmless spread is heavier-tailed than its replicates show). All of them are judged together by Holm's
   step-down procedure at ``alpha`` (default 1%): the chance that a harmless change fails the job through
   them is at most alpha whatever their dependence. A rejected *regressed* fails the job (exit 1); a
   rejected *changed* alone makes it CHANGED (exit 3): the code computes something else than the baseline's,
   better or worse, and a change meant to do so comes with its baseline. Every other row is *advisory*:
   printed with its z and p, never failing the job. A row whose runs are the same runs as an earlier row's
   (identical values in the baseline and in the job) is judged once.
4. **Settings.** A case whose config differs from the baseline's in a setting (the optimiser, the precision
   recipe, the gate, a stress schedule's knobs: ``stability.record.setting_changes``) is judged like any
   other, its settings listed, and the job is CHANGED at least (REGRESSED where a row or outcome is); a case
   whose runs cannot be compared (another model shape, data, run length or set of runs) is unusable input.

Exit codes: 0 nothing regressed or changed; 1 an outcome, a primary row or a test of the job regressed,
whatever else is wrong with the job (the other problems are listed beside it); 3 a primary row or a setting
changed and nothing regressed; 2 the inputs cannot be judged.
Seeds whose baseline runs did not all end the same way (some completed, some diverged) have their outcomes
judged by the rule above like any seed, and their other figures by an explicit rule, stated in the
verdict's notes: the evaluation and peak figures of such a seed are judged against its completed runs when
the job's run completed, and left out when it diverged too.

The job's false-alarm rate, rows, outcomes and invariants together, is what the baseline's null jobs measured
(harmless jobs: the baseline's code with every run a fresh rounding replicate, ``null_jobs`` in the baseline);
the check prints it with what it rests on (``CheckResult.rate_lines``).

This module reads JSON only: no torch, no MLflow.
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from stability.check.baseline import (
    case_values,
    default_baseline_path,
    regression_records,
    validate_baseline,
)
from stability.check.coverage import reported, stale
from stability.record import (
    REFERENCE_ARM,
    RecordError,
    Status,
    arm_names,
    case_key,
    config_diff,
    config_fingerprint,
    record_device,
    setting_changes,
    where,
)
from stability.record import figures as fig
from stability.record.io import check_size
from stability.record.stats import binomial_upper_bound, holm, t_upper_tail
from stability.report.tables import fmt, markdown_text, text_table

DEFAULT_ALPHA = 0.01
TOLERANCE_KEYS = ("floor", "rel_floor")
DOF_RULE = "min"
"""How a row's degrees of freedom are counted: "min" (the smallest n_s - 1 of any seed: valid when one seed is
noisier than the others) or "welch" (Welch-Satterthwaite over the seeds' variance estimates, which understates
p in the tail when one seed dominates the variance). Chosen by calibration on the committed ci baseline: with
Welch the closest of 125 arrangements came within 6.5x of failing (one chaotic seed's early gradient norm),
with "min" within 15x; the power of the early-horizon rows (z in the thousands) does not depend on it."""
OUTCOME_RULE = "fails where every baseline run of the seed was clean (k = 0)"
"""The per-seed outcome rule. Under a harmless change the job's run of a seed is one more replicate of that seed,
exchangeable with its n baseline replicates; if k of them are not clean for an outcome figure, the chance that
one more replicate is not clean by rank is p = (k + 1) / (n + 1), exactly (a permutation p-value,
``outcome_p``). A run not clean fails the job only where k = 0: a flip that no replicate of the seed showed.
Where k > 0 the replicates already showed it: a note with its p. Its share of the job's false-alarm rate is the
chance that a harmless run flips a cell whose replicates never did, which the calibration (an arrangement
whose replicate flipped such a cell fails) and the null jobs (every run of a harmless job) measure; the
applied-stress and measurement outcomes (``lr_off_log_steps`` ...) are exact, and never flip by rounding."""
METHOD = ("Holm over the primary family, each row worse-by-its-floor and moved-either-way; outcomes per seed; "
          "noise from rounding replicates")


def paired_arm(arm: str) -> str:
    """The name of the paired-difference rows of a treatment arm."""
    return f"{arm}-{REFERENCE_ARM}"


# ----------------------------------------------------------------------------- tolerances

def resolve_tolerances(overrides: dict | None = None) -> dict[str, dict]:
    """Per-figure overrides of ``floor`` and ``rel_floor``; an unknown figure or key is an error."""
    table: dict[str, dict] = {}
    for name, entry in (overrides or {}).items():
        if fig.figure(name) is None or fig.better(name) is None:
            raise RecordError(f"tolerance for unknown figure {name!r}: known figures and families are "
                              f"{', '.join(k for k, f in fig.FIGURES.items() if f.better)}")
        if not isinstance(entry, dict):
            raise RecordError(f"tolerance for {name!r} must be a table of {TOLERANCE_KEYS}, got {entry!r}")
        for key, value in entry.items():
            if key not in TOLERANCE_KEYS:
                raise RecordError(f"tolerance {name}.{key} is unknown: expected one of {TOLERANCE_KEYS}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
                    or not math.isfinite(value):
                raise RecordError(f"tolerance {name}.{key}={value!r}: expected a finite number >= 0")
        table[name] = dict(entry)
    return table


def load_tolerances(path) -> dict:
    """Read a JSON or TOML tolerance file ({figure: {floor, rel_floor}}) and validate it."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"tolerance file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as error:  # tomllib.TOMLDecodeError, json.JSONDecodeError
        raise RecordError(f"tolerance file {str(path)!r} cannot be parsed: {error}") from None
    if not isinstance(data, dict):
        raise RecordError(f"tolerance file {str(path)!r} must hold a table of figures")
    resolve_tolerances(data)
    return data


# ----------------------------------------------------------------------------- one row

@dataclass
class Row:
    case: str
    arm: str
    figure: str
    better: str
    baseline: float | None      # mean of the baseline runs (the seeds' means)
    current: float | None       # mean of the current values
    delta: float | None         # the mean over seeds of (current - the seed's baseline mean)
    floor: float | None         # the smallest change worth acting on
    noise: float | None         # root mean replicate variance over the seeds (at least the resolution)
    se: float | None            # standard error of delta under the noise
    z: float | None             # (worse - floor) / se: the evidence, in standard errors beyond the floor
    p: float | None             # P(T > z) under the row's degrees of freedom: worse by more than the floor
    verdict: str                # ok | regressed | changed | worse | improved | new | missing
    mode: str = ""              # "n=3 df=12"
    note: str = ""
    p_improved: float | None = None   # better by more than the floor
    p_change: float | None = None     # two-sided, no floor: moved at all
    tier: str = "advisory"      # primary | advisory | duplicate
    floor_only: bool = False    # a primary row judged by its floor only (no change hypothesis)

    @property
    def hypotheses(self) -> list[tuple[str, float]]:
        """What the family-wise decision judges of a primary row: ("regressed", p), and ("changed", p_change)
        unless the row is judged by its floor only."""
        if self.p is None:
            return []
        moved = [] if self.floor_only or self.p_change is None else [("changed", self.p_change)]
        return [("regressed", self.p)] + moved

    @property
    def p_judged(self) -> float | None:
        """The smallest p-value of the row's hypotheses (what comes closest to failing it)."""
        return min((p for _, p in self.hypotheses), default=self.p)

    def as_dict(self) -> dict:
        return {**self.__dict__, "p_judged": self.p_judged}


@dataclass
class Outcome:
    """A failure of one run of the job: an outcome not clean where every baseline run of its seed was clean
    (``OUTCOME_RULE``), a finite figure gone non-finite or absent, an invariant that stopped holding."""

    case: str
    arm: str
    seed: str
    figure: str
    reason: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


VERDICT_OF_EXIT = {0: "PASS", 1: "REGRESSED", 2: "UNUSABLE INPUT", 3: "CHANGED"}
"""The job's verdict by the check's exit code (``CheckResult.exit_code``)."""

VERDICT_MARK = {"ok": "ok", "regressed": "REGRESSED", "changed": "CHANGED", "worse": "worse (advisory)",
                "improved": "improved",
                "new": "new", "missing": "missing", "duplicate": "duplicate"}


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def _tail(statistic: float, se: float, dof: float) -> float:
    """P(T > statistic / se) under Student's t with ``dof`` degrees of freedom (rounded down to a whole
    number, at least 1; the normal tail for infinite dof); a zero standard error decides by the sign."""
    if se <= 0:
        return 0.0 if statistic > 0 else 1.0
    if not math.isfinite(dof) or dof > 1000:
        return 0.5 * math.erfc(statistic / se / math.sqrt(2))
    return t_upper_tail(statistic / se, max(1, int(dof)))


def two_sided(delta: float, se: float, dof: float) -> float:
    """P(|T| >= |delta| / se): the chance that rounding noise alone moves a row this far, either way (1 for no
    move, 0 for any move where the noise is exactly zero)."""
    if delta == 0:
        return 1.0
    return min(1.0, 2 * _tail(abs(delta), se, dof))


def seed_noise(groups: dict[str, list[float]], quantum: float) -> dict[str, tuple[float, float]]:
    """Per seed: (variance of one run, its degrees of freedom) from the seed's baseline runs, never below
    ``quantum``^2 (a variance at the quantum is a fixed resolution: infinite degrees of freedom). A seed
    with one run takes the mean variance of the others."""
    noise = {}
    for seed, values in groups.items():
        if len(values) >= 2:
            mean = sum(values) / len(values)
            noise[seed] = (sum((v - mean) * (v - mean) for v in values) / (len(values) - 1), len(values) - 1)
    if noise:
        pooled = sum(v for v, _ in noise.values()) / len(noise)
        dof = sum(d for _, d in noise.values())
    else:
        pooled, dof = 0.0, math.inf
    out = {}
    for seed in groups:
        variance, df = noise.get(seed, (pooled, dof))
        out[seed] = (variance, df) if variance > quantum ** 2 else (quantum ** 2, math.inf)
    return out


def welch_dof(terms: list[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variance estimates (value, dof each)."""
    total = sum(v for v, _ in terms)
    spread = sum(v * v / d for v, d in terms if math.isfinite(d) and d > 0)
    return total * total / spread if spread > 0 else math.inf


def row_dof(terms: list[tuple[float, float]], rule: str = DOF_RULE) -> float:
    """The degrees of freedom of a row's standard error under ``rule`` ("welch" or "min")."""
    if rule == "min":
        return min((d for _, d in terms), default=math.inf)
    return welch_dof(terms)


def judge(baseline: dict, current: dict, name: str, quantum: float = 0.0, tolerance: dict | None = None,
          dof_rule: str = DOF_RULE) -> dict:
    """The statistics of one row: ``baseline`` maps seed -> {replicate: value or None}, ``current`` maps
    seed -> value (seeds of the job that have no finite value are left out of ``current``). Returns the
    fields of ``Row`` from ``baseline`` to ``p_change`` (see the module docstring for the rule)."""
    entry = fig.figure(name)
    tolerance = tolerance or {}
    groups = {s: [v for v in runs.values() if v is not None] for s, runs in baseline.items()}
    groups = {s: g for s, g in groups.items() if g}
    cur = {s: v for s, v in current.items() if v is not None}
    out = {"baseline": None, "current": _mean(cur.values()), "delta": None, "floor": None, "noise": None,
           "se": None, "z": None, "p": None, "mode": "", "note": "", "p_improved": None, "p_change": None}
    if not groups:
        return out
    centers = {s: sum(g) / len(g) for s, g in groups.items()}
    out["baseline"] = base_mean = sum(centers.values()) / len(centers)
    common = sorted(set(cur) & set(groups))
    if not common:
        return out
    noise = seed_noise({s: groups[s] for s in common}, quantum)
    terms = [(noise[s][0] * (1 + 1 / len(groups[s])), noise[s][1]) for s in common]
    delta = sum(cur[s] - centers[s] for s in common) / len(common)
    se = math.sqrt(sum(v for v, _ in terms)) / len(common)
    dof = row_dof(terms, dof_rule)
    floor = max(tolerance.get("floor", entry.floor), tolerance.get("rel_floor", entry.rel_floor) * abs(base_mean))
    worse = delta if entry.better == "lower" else -delta
    z = (worse - floor) / se if se > 0 else (math.inf if worse > floor else -math.inf)
    out.update(current=_mean(cur[s] for s in common), delta=delta, floor=floor,
               noise=math.sqrt(sum(noise[s][0] for s in common) / len(common)), se=se, z=z,
               mode=f"n={len(common)} df={dof:.3g}", p=_tail(worse - floor, se, dof),
               p_improved=_tail(-worse - floor, se, dof), p_change=two_sided(delta, se, dof))
    return out


# ----------------------------------------------------------------------------- the job's verdict

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
                    f"95% confidence: {jobs['failed']} of {jobs['jobs']} null jobs failed (harmless jobs of the "
                    f"baseline's code, every run a fresh rounding replicate)")
        curve = self.calibration or {}
        calibrated = (f"; calibrated: {curve['failed'][0]} of {curve['arrangements']} arrangements of the "
                      f"baseline's replicates failed at alpha {curve['alphas'][0]:g}") if curve.get("failed") else ""
        cells, runs = self.clean_cells
        return [head,
                f"  rows: at most alpha = {self.alpha:g} by Holm over {self.hypotheses} hypotheses{calibrated}",
                (f"  outcomes: {cells} cells (case, arm, seed, outcome) whose {runs} baseline runs were all clean "
                 f"fail the job on one run that is not"),
                f"  invariants: {self.invariants_held} that held in the baseline fail the job if one stops holding"]

    def failure_lines(self) -> list[str]:
        """One line per reason the job failed (empty when it passed)."""
        lines = [f"error: {e}" for e in self.errors] + [f"failed: {o.reason}" for o in self.outcomes]
        lines += [f"failed: {test}" for test in self.suite_failures]
        lines += [f"changed: {setting}" for setting in self.settings]
        holm_over = f"Holm over {self.hypotheses} hypotheses at alpha {self.alpha:g}"
        return lines + [f"regressed: {r.case} {r.arm} {r.figure} worse by more than its floor {fmt(r.floor)} (z "
                        f"{fmt(r.z)}, p {_fmt_p(r.p)}, {holm_over})"
                        if r.verdict == "regressed" else
                        (f"changed: {r.case} {r.arm} {r.figure} moved by {fmt(r.delta)} ({_direction(r)}), beyond its "
                         f"rounding noise {fmt(r.noise)} (two-sided p {_fmt_p(r.p_change)}, {holm_over}): the code "
                         f"computes something else than the baseline's; a change meant to do so comes with its "
                         f"baseline (stability baseline make, in the same commit)") for r in self.regressed]

    def cells(self, row: Row) -> list[str]:
        return [row.case, row.arm, row.figure, row.tier, fmt(row.baseline), fmt(row.current), fmt(row.delta),
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
                "rate": self.rate(), "clean_cells": self.clean_cells, "invariants_held": self.invariants_held,
                "suite_failures": self.suite_failures, "rows": [r.as_dict() for r in self.rows]}


def _direction(row: Row) -> str:
    """"worse" or "better" for a row's move."""
    worse = row.delta > 0 if row.better == "lower" else row.delta < 0
    return "worse, under its floor" if worse else "better"


def _fmt_p(p: float | None) -> str:
    return "-" if p is None else (f"{p:.1e}" if p < 1e-3 else f"{p:.3f}")


def in_primary_family(stress: str, arm: str, figure: str, preset: str | None = None) -> fig.Primary | None:
    """The primary-family entry that declares the row (stress case, arm or "<arm>-reference", figure) primary
    at ``preset`` (None: at any); None for an advisory row."""
    paired = arm.endswith(f"-{REFERENCE_ARM}")
    arms_match = {"all": True, "arms": not paired, "paired": paired, "reference": arm == REFERENCE_ARM}
    for entry in fig.primary_rows():
        if entry.case == stress and fnmatch.fnmatchcase(figure, entry.figure) and arms_match[entry.arms] \
                and entry.applies(preset):
            return entry
    return None


def advisory_here(preset: str, stresses: set[str]) -> list[str]:
    """Notes naming the primary rows of the judged stress cases that are advisory at ``preset``, and why."""
    return [f"{entry.case} {entry.figure} is advisory at {preset} (primary at {', '.join(entry.presets)}): "
            f"{entry.elsewhere}" for entry in fig.primary_rows() if entry.case in stresses and not entry.applies(preset)]


# ----------------------------------------------------------------------------- one case

def single_replicate(case: dict, key: str) -> dict:
    """The job's values, seed -> value: one replicate per arm and seed (a check judges one job)."""
    arms = {}
    for arm, entry in case["arms"].items():
        for seed, runs in entry["status"].items():
            if len(runs) > 1:
                raise RecordError(f"case {key} arm {arm} seed {seed}: the records hold {len(runs)} runs "
                                  f"(replicates {sorted(runs, key=int)}): a check judges one job's records; pass "
                                  f"the run directory of one job")
        arms[arm] = {"status": {s: next(iter(d.values())) for s, d in entry["status"].items()},
                     "diverged_at_step": {s: next(iter(d.values())) for s, d in entry["diverged_at_step"].items()},
                     "figures": {name: {s: next(iter(d.values())) for s, d in values.items()}
                                 for name, values in entry["figures"].items()}}
    return arms


def paired_values(arms: dict, arm: str, name: str, nested: bool) -> dict:
    """seed (-> replicate) -> (arm - baseline) of one figure, where both arms report it (None when either is
    None)."""
    ref = arms.get(REFERENCE_ARM, {}).get("figures", {}).get(name, {})
    own = arms.get(arm, {}).get("figures", {}).get(name, {})

    def minus(a, b):
        return a - b if a is not None and b is not None else None
    if not nested:
        return {s: minus(own[s], ref[s]) for s in own if s in ref}
    return {s: {d: minus(own[s][d], ref[s][d]) for d in own[s] if d in ref[s]} for s in own if s in ref}


def reports(name: str, status: str) -> bool:
    """Whether a run of this status reports figure ``name`` (evaluation and peak figures: completed runs)."""
    entry = fig.figure(name)
    return status == Status.COMPLETED or not entry.needs_completed_arm


def outcome_p(k: int, n: int, held_out: int = 0) -> float:
    """The chance that one more replicate exchangeable with a seed's n baseline replicates, k of them not
    clean, is not clean by rank: (k + 1) / (n + 1) (a permutation p-value, printed beside a note).
    ``held_out``: replicates of the baseline left out of the n to play the job (the calibration: 1); the rank
    is then taken among all the baseline's replicates, (k + 1) / (n + held_out + 1)."""
    return (k + 1) / (n + held_out + 1)


def _not_clean(name: str) -> str:
    return "diverged" if fig.is_divergence(name) else f"diverged or had {name} not clean"


def outcomes_of_arm(key: str, arm: str, base: dict, cur: dict, notes: list[str] | None = None,
                    held_out: int = 0, tally: list[int] | None = None) -> list[Outcome]:
    """The per-seed failures of one arm. An outcome figure not clean in the job's run of a seed is judged
    against the seed's baseline runs that report the figure, n of them: k are not clean, a run that diverged
    counting as not clean for every outcome (a NaN on the way to a divergence, in the LR range test, is part
    of the divergence, judged by ``diverged``). k = 0 fails the job with a line naming case, arm, seed, what
    happened and n (``OUTCOME_RULE``); k > 0 goes to ``notes`` with its p = ``outcome_p(k, n, held_out)``,
    judged and not failing. A figure finite in every baseline run of the seed that is non-finite or absent now
    fails the job too. ``tally``: [cells, runs] to add the outcome cells whose baseline runs were all clean to
    (what the job's outcome rule rests on)."""
    found = []
    for seed, status in sorted(cur["status"].items()):
        base_status = base["status"].get(seed, {})
        for name, values in base["figures"].items():
            entry = fig.figure(name)
            baseline_runs = values.get(seed, {})
            if not baseline_runs or not reports(name, status):
                continue   # no baseline run of the seed reports the figure, or this run cannot report it
            value = cur["figures"].get(name, {}).get(seed, "absent")
            if entry.outcome:
                k = sum(v is None or not entry.clean(v) or base_status.get(r) != Status.COMPLETED
                        for r, v in baseline_runs.items())
                n = len(baseline_runs)
                if tally is not None and k == 0:
                    tally[0], tally[1] = tally[0] + 1, tally[1] + n
                if value == "absent" or value is None or entry.clean(value):
                    continue
                step = cur["diverged_at_step"].get(seed)
                shown = ("true" if value else "false") if entry.quantum == "seed" else fmt(value)
                what = f"{name} = {shown}" + (f" (diverged at step {step})" if step is not None else "")
                if k == 0:
                    found.append(Outcome(key, arm, seed, name, f"case {key} arm {arm} seed {seed}: {what}; every "
                                                               f"one of the {n} baseline runs of this seed was clean"))
                elif notes is not None:
                    notes.append(f"case {key} arm {arm} seed {seed}: {what}; {k} of the {n} baseline runs of this "
                                 f"seed {_not_clean(name)} (p {outcome_p(k, n, held_out):.3f} that one more replicate "
                                 f"would): judged, not failing the job ({OUTCOME_RULE})")
            elif len(baseline_runs) >= len(base_status) and all(v is not None for v in baseline_runs.values()) \
                    and (value == "absent" or value is None):
                found.append(Outcome(key, arm, seed, name, f"case {key} arm {arm} seed {seed}: {name} is "
                                                           f"{'absent' if value == 'absent' else 'non-finite'} "
                                                           f"now; finite in every one of the "
                                                           f"{len(baseline_runs)} baseline runs of this seed"))
    return found


def mixed_status_notes(key: str, arm: str, base: dict, cur: dict) -> list[str]:
    """The explicit rule for the evaluation and peak figures of seeds whose baseline runs did not all end the
    same way (their outcomes are judged by ``outcomes_of_arm``, whose note gives the divergence's p)."""
    notes = []
    for seed, status in sorted(cur["status"].items()):
        ends = list(base["status"].get(seed, {}).values())
        completed = sum(s == Status.COMPLETED for s in ends)
        if 0 < completed < len(ends):
            judged = (f"its evaluation and peak figures are judged against the {completed} completed ones"
                      if status == Status.COMPLETED else "this run diverged as they did: its evaluation and peak "
                                                         "figures are left out")
            notes.append(f"case {key} arm {arm} seed {seed}: {len(ends) - completed} of {len(ends)} baseline "
                         f"runs diverged; {judged}")
    return notes


def rows_of_case(result: CheckResult, key: str, base: dict, case: dict, tolerances: dict,
                 dof_rule: str = DOF_RULE, advisory: bool = True, held_out: int = 0) -> None:
    """The outcomes, notes and rows of one case (its arms and seeds must match the baseline's); without
    ``advisory``, the primary rows only; ``held_out``: see ``outcome_p``."""
    current = single_replicate(case, key)
    config, steps = base.get("config") or case["config"], base.get("steps") or case["steps"]
    stress = base.get("stress") or case.get("stress") or ""
    missing_arms = sorted(set(base["arms"]) - set(current))
    if missing_arms:
        result.errors.append(f"case {key}: arm(s) {', '.join(missing_arms)} of the baseline are not in the job's "
                             f"records: a job must train every arm the baseline judged")
        return
    for arm in arm_names([{"arm": a} for a in current]):
        if arm not in base["arms"]:
            result.notes.append(f"case {key}: arm {arm} is not in the baseline (new arm): not compared")
            continue
        base_arm, cur_arm = base["arms"][arm], current[arm]
        base_seeds, cur_seeds = set(base_arm["status"]), set(cur_arm["status"])
        if not base_seeds & cur_seeds:
            result.errors.append(f"case {key} arm {arm}: the job's seeds {_seeds(cur_seeds)} are not the baseline's "
                                 f"{_seeds(base_seeds)}: the check pairs each seed with its own baseline runs; "
                                 f"train the baseline's seeds, or make a baseline of these")
            return
        if base_seeds - cur_seeds:
            result.errors.append(f"case {key} arm {arm}: seed(s) {_seeds(base_seeds - cur_seeds)} of the baseline "
                                 f"are not in the job's records (it has {_seeds(cur_seeds)}): a job must train "
                                 f"every seed the baseline judged")
            return
        if cur_seeds - base_seeds:
            result.notes.append(f"case {key} arm {arm}: seed(s) {_seeds(cur_seeds - base_seeds)} are not in the "
                                f"baseline: left out")
        result.outcomes += outcomes_of_arm(key, arm, base_arm, cur_arm, result.notes, held_out, result.clean_cells)
        result.notes += mixed_status_notes(key, arm, base_arm, cur_arm)
    for arm in arm_names([{"arm": a} for a in base["arms"]]):
        base_arm, cur_arm = base["arms"][arm], current[arm]
        names = [n for n in fig.judged(set(base_arm["figures"]) | set(cur_arm["figures"]))
                 if not fig.figure(n).outcome]
        for name in names:
            if not advisory and not in_primary_family(stress, arm, name, result.preset):
                continue
            values = (base_arm["figures"].get(name, {}), cur_arm["figures"].get(name, {}))
            _add_row(result, key, stress, arm, name, *values, fig.quantum(name, config, steps), tolerances, dof_rule)
        if arm == REFERENCE_ARM:
            continue
        for name in names:
            if not advisory and not in_primary_family(stress, paired_arm(arm), name, result.preset):
                continue
            values = (paired_values(base["arms"], arm, name, True), paired_values(current, arm, name, False))
            if any(v is not None for runs in values[0].values() for v in runs.values()) \
                    or any(v is not None for v in values[1].values()):
                _add_row(result, key, stress, paired_arm(arm), name, *values, fig.quantum(name, config, steps),
                         tolerances, dof_rule)


def _seeds(seeds) -> str:
    return ", ".join(sorted(seeds, key=int))


def _add_row(result: CheckResult, key: str, stress: str, arm: str, name: str, baseline: dict, current: dict,
             quantum: float, tolerances: dict, dof_rule: str) -> None:
    """One row before the family-wise decision (ok, new, or missing when the job has no value), with the
    signature of its values (empty for a row whose baseline runs all agree: a constant cannot be told
    apart from another)."""
    stats = judge(baseline, current, name, quantum, tolerances.get(name), dof_rule)
    verdict = "ok"
    if stats["baseline"] is None:
        verdict = "new" if stats["current"] is not None else "ok"
    elif stats["p"] is None:
        verdict, stats["note"] = "missing", "no finite value now (see the failed outcomes)"
    entry = in_primary_family(stress, arm, name, result.preset)
    row = Row(key, arm, name, fig.better(name), verdict=verdict, tier="primary" if entry else "advisory",
              floor_only=bool(entry and entry.floor_only), **stats)
    result.rows.append(row)
    spread = {v for runs in baseline.values() for v in runs.values()}
    result.signatures[id(row)] = json.dumps([baseline, current], sort_keys=True) if len(spread) > 1 else ""


def mark_duplicates(rows: list[Row], values: dict[int, str]) -> None:
    """A row whose values (every baseline run and the job's) repeat another row's of the same arm and
    figure is the same runs judged twice (the sweep's configured runs are the plain pair's): tier
    "duplicate", left out of the family; a primary row keeps the judgement. ``values``: id(row) -> a
    canonical text of its values, or "" for a row that cannot be told apart from a constant."""
    seen: dict[tuple[str, str, str], Row] = {}
    for row in sorted(rows, key=lambda r: r.tier != "primary"):
        if row.p is None or not values.get(id(row)):
            continue
        first = seen.setdefault((row.arm, row.figure, values[id(row)]), row)
        if first is not row:
            row.tier, row.verdict, row.note = "duplicate", "duplicate", f"the same runs as {first.case}"


def check(records: list[dict], baseline: dict, tolerances: dict | None = None, alpha: float = DEFAULT_ALPHA,
          cases: list[str] | None = None, dof_rule: str = DOF_RULE, invariants: list[dict] | None = None,
          baseline_path: str | None = None) -> CheckResult:
    """Judge one job's records against a baseline at family-wise false-alarm rate ``alpha``. ``cases``:
    the stress cases (names, e.g. "standard") of the baseline to judge; None: every case the baseline
    holds. ``invariants``: the model invariants the job's suites recorded (None: the suites did not run).
    A baseline that does not cover what the job's code judges (``stability.check.coverage``) is unusable
    input, named with the command that remakes it (``baseline_path`` its file), beside the rows judged on
    what it covers: a job whose rows regressed is still REGRESSED. Unusable inputs give exit_code 2 with ``errors`` (never a silent pass); an invalid tolerance table
    raises RecordError."""
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise RecordError(f"alpha={alpha!r} is invalid: expected a false-alarm rate in (0, 1), e.g. 0.01")
    tolerances = resolve_tolerances(tolerances)
    result = CheckResult(alpha=alpha)
    try:
        validate_baseline(baseline, "baseline")
    except RecordError as error:
        result.errors.append(str(error))
        return result
    result.baseline_commit, result.preset, result.device = baseline.get("commit"), baseline["preset"], \
        baseline["device"]
    result.replicates = list(baseline.get("replicates") or [])
    result.calibration, result.null_jobs = baseline.get("calibration"), baseline.get("null_jobs")
    result.warnings += calibration_warnings(baseline)
    records, notes, errors = regression_records(records)
    result.notes += notes
    result.errors += errors
    if not records and not errors:
        result.errors.append("no regression records to check")
    for index, record in enumerate(records):
        if record["preset"] != baseline["preset"]:
            result.errors.append(f"{where(record, index)}: preset differs: baseline preset {baseline['preset']!r}, "
                                 f"record preset {record['preset']!r}; compare with "
                                 f"{default_baseline_path(record['preset'], record_device(record))}")
        if record_device(record) != baseline["device"]:
            result.errors.append(f"{where(record, index)}: device differs: baseline device "
                                 f"{baseline['device']!r}, record device {record_device(record)!r}")
    if result.errors:
        return result
    base_cases = select_cases(baseline["cases"], cases, result)
    if result.errors:
        return result
    files: dict[str, list[str]] = {}   # case key -> its records, as messages name them (one config per case)
    for index, record in enumerate(records):
        files.setdefault(case_key(record), []).append(where(record, index))
    try:
        job_cases = case_values(records)
        judge_cases(result, job_cases, base_cases, tolerances, dof_rule, named=files)
    except RecordError as error:
        result.errors.append(str(error))
        return result
    result.errors += stale(baseline, job_cases, reported(records), invariants, set(base_cases), baseline_path, cases)
    judge_invariants(result, baseline.get("invariants"), invariants, set(base_cases))
    result.notes += advisory_here(baseline["preset"], {case.get("stress") for case in base_cases.values()})
    decide(result)
    return result


def judge_invariants(result: CheckResult, held_before: list[dict] | None, now: list[dict] | None,
                     cases: set[str]) -> None:
    """Model invariants judged like the model's figures: one that held in the baseline's run and does not
    now fails the job (a line naming case, arm, seed, value and bound); one the baseline already showed
    failing is noted, never failing the job again; one the baseline holds that the job's suites did not
    evaluate is unusable input. ``now`` None: the job ran no suites (a note). ``held_before`` None: the
    baseline's run recorded none (a job that recorded some finds it stale: ``stability.check.coverage``)."""
    def key(line):
        return line["case"], line["name"], line["arm"], line["seed"]
    if held_before is None:
        return   # a job's invariants the baseline lacks make it stale (stability.check.coverage)
    before = {key(line): line for line in held_before if line["case"] in cases}
    if now is None:
        if before:
            result.notes.append(f"the job recorded no model invariants (its suites did not run): the baseline's "
                                f"{len(before)} are not judged")
        return
    after = {key(line): line for line in now if line["case"] in cases}
    result.invariants_held += sum(line["held"] for line in before.values())
    for k, line in sorted(before.items(), key=lambda item: str(item[0])):
        who = f"case {line['case']} arm {line['arm']}" + (f" seed {line['seed']}" if line["seed"] is not None else "")
        current = after.get(k)
        if current is None:
            result.errors.append(f"{who}: the job's suites did not evaluate model invariant {line['name']}, which the "
                                 f"baseline holds: a job must evaluate what the baseline judged")
        elif line["held"] and not current["held"]:
            result.outcomes.append(Outcome(line["case"], str(line["arm"]), str(line["seed"]), line["name"],
                                           f"{who}: model invariant {line['name']} no longer holds "
                                           f"({_value(current)}); it held in the baseline ({_value(line)})"))
        elif not line["held"]:
            state = "holds now" if current["held"] else "still fails"
            result.notes.append(f"{who}: model invariant {line['name']} did not hold in the baseline ({_value(line)}) "
                                f"and {state} ({_value(current)}): not judged")


def _value(line: dict) -> str:
    return f"value {fmt(line['value'])} against bound {fmt(line['bound'])}" if line["value"] is not None \
        else ("held" if line["held"] else "failed")


def select_cases(base_cases: dict, names: list[str] | None, result: CheckResult) -> dict:
    """The baseline's cases to judge: all, or those of the stress cases ``names`` (an unknown name is an
    error; the others are noted as left out on purpose)."""
    if names is None:
        return base_cases
    known = sorted({c.get("stress") for c in base_cases.values()})
    unknown = [n for n in names if n not in known]
    if unknown:
        result.errors.append(f"--cases {','.join(names)}: {', '.join(unknown)} not in the baseline: expected stress "
                             f"cases among {', '.join(known)}")
        return {}
    chosen = {k: c for k, c in base_cases.items() if c.get("stress") in names}
    left = sorted(set(base_cases) - set(chosen))
    if left:
        result.notes.append(f"judging the baseline's cases {', '.join(sorted(chosen))} only (--cases); left out on "
                            f"purpose: {', '.join(left)}")
    return chosen


def judge_cases(result: CheckResult, cases: dict, base_cases: dict, tolerances: dict,
                dof_rule: str = DOF_RULE, advisory: bool = True, held_out: int = 0,
                named: dict[str, list[str]] | None = None) -> None:
    """The outcomes and rows of every case of ``base_cases``; errors for a case the job lacks or whose runs
    cannot be compared (naming the records of ``named[case key]``), the settings of a case that differ. ``held_out``: replicates of the baseline taken out of
    ``base_cases`` to play the job (the calibration: 1), counted in the rank of an outcome (``outcome_p``)."""
    for key, case in sorted(cases.items()):
        base = base_cases.get(key)
        if base is None:
            schedules = sorted(c.get("schedule") for c in base_cases.values() if c.get("name") == case["name"])
            if schedules:
                result.errors.append(f"case {key}: schedule differs: the baseline has case {case['name']!r} with "
                                     f"schedule(s) {schedules}, the record has schedule {case['schedule']!r}")
            continue   # a new case: the baseline is stale (stability.check.coverage)
        # the stored fingerprint, or one recomputed from the stored config (fields added since count as defaults)
        if case["fingerprint"] not in (base["fingerprint"], config_fingerprint(base.get("config") or {})):
            runs, settings = setting_changes(base.get("config") or {}, case["config"])
            if runs or not settings:
                files = (named or {}).get(key)
                result.errors.append((f"{', '.join(files)}: " if files else "") + f"case {key}: its runs cannot be "
                                     f"compared with the baseline's (another model shape, data, run length or set "
                                     f"of runs): {'; '.join(runs) or config_diff(base.get('config', {}), case['config'])}")
                continue
            result.settings.append(f"case {key}: {len(settings)} setting(s) differ from the baseline's "
                                   f"({'; '.join(settings)}); its rows and outcomes are judged: a change of "
                                   f"settings is accepted deliberately, with its baseline in the same commit")
        rows_of_case(result, key, base, case, tolerances, dof_rule, advisory, held_out)
    missing = sorted(set(base_cases) - set(cases))
    if missing:
        result.errors.append(f"the job has no record of the baseline's case(s) {', '.join(missing)}: a job must "
                             f"train every case the baseline judged (stability check --cases NAMES judges fewer on "
                             f"purpose)")
    mark_duplicates(result.rows, result.signatures)


def decide(result: CheckResult) -> None:
    """Holm over the hypotheses of the primary rows (each row: worse by more than its floor; moved beyond its
    noise either way, unless judged by its floor only): a row whose first is rejected regressed, one whose
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


def suite_failures(paths) -> list[str]:
    """The failed and erroring tests of the job's JUnit XML files ("<class>::<test>: <first line of the
    message>"), so that one verdict holds every step of the job; RecordError (exit 2) for a file that is
    missing, too large (``MAX_BYTES``), cannot be read or is not JUnit XML (the suites' outcome is then unknown)."""
    from xml.etree import ElementTree

    failed = []
    for path in paths:
        try:
            check_size(Path(path), "the suites' outcome")
            root = ElementTree.parse(path).getroot()
            cases = list(root.iter("testcase"))
        except RecordError:
            raise
        except (OSError, ElementTree.ParseError, LookupError, ValueError, RecursionError) as error:
            raise RecordError(f"the suites' outcome {str(path)!r} cannot be read ({type(error).__name__}: "
                              f"{error}): a job whose tests did not report cannot be judged") from None
        if root.tag not in ("testsuites", "testsuite"):
            raise RecordError(f"the suites' outcome {str(path)!r} is not JUnit XML (its root is <{root.tag}>): "
                              f"expected <testsuites> or <testsuite>, as pytest --junitxml writes")
        for case in cases:
            problem = case.find("failure") if case.find("failure") is not None else case.find("error")
            if problem is not None:
                message = (problem.get("message") or problem.text or "").strip().splitlines()
                failed.append(f"test {case.get('classname')}::{case.get('name')} "
                              f"{'failed' if problem.tag == 'failure' else 'errored'}"
                              + (f": {message[0][:200]}" if message else ""))
    return failed


def calibration_warnings(baseline: dict) -> list[str]:
    """The warning every check with a baseline accepted over its calibration prints."""
    calibration = baseline.get("calibration") or {}
    if calibration.get("accepted_anyway"):
        return [(f"the baseline was written although its calibration failed ({calibration.get('reason')}): the "
                 f"stated false-alarm rate is not what it measured")]
    if not calibration:
        return [("the baseline holds no calibration: its false-alarm rate was not measured (stability baseline "
                 "calibrate --write)")]
    if not fig.same_family(calibration.get("primary_family"), fig.primary_family()) \
            or calibration.get("dof_rule") != DOF_RULE:
        return [("the baseline's calibration measured another rule than this check's (its primary family or "
                 "degrees-of-freedom rule differs): its false-alarm curve is stale (stability baseline calibrate "
                 "--write measures it again, without training)")]
    return []
