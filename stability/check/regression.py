"""The merge check: records of this change against a recorded baseline -> one verdict with a stated
false-alarm rate, and an exit code.

A *baseline* (``reports/baselines/<preset>-<device>.json``, made by ``make_baseline``) holds, per stress
case (``name/schedule``), arm, seed and judged figure (``stability.record.figures``), the value of the
seed's reference run and of its *replicates*: runs of the same code, config and seed whose initial
parameters differ by one rounding step (``run.replicate``; ``stability.model.build.perturb_rounding``).
Training is chaotic, so a harmless change of rounding moves a figure by about as much as the
replicates differ: that spread is the noise of the check, measured at this preset, seed and length
(tight in a short clipped run, as wide as the seed-to-seed spread in a long unclipped one).

``check(records, baseline)`` judges every row (case x arm x figure, and the paired difference
``<arm> - baseline`` of each treatment arm, the regression this project exists to catch being "the gate
stops helping"):

1. **Status first.** Evaluation and peak figures (``kind`` "eval", "peak") of a run that did not
   complete are left out, on both sides, run by run; a run that diverged is judged by its
   ``divergence_step`` and ``diverged`` figures.
2. **Noise per seed.** The baseline runs of seed s (reference and replicates) give a mean ``m_s`` and a
   sample variance ``v_s`` (``seed_noise``), never below the square of the figure's resolution
   (``figures.quantum``: accuracy on N tokens moves by 1/N at least), so a figure identical in every
   baseline run is not judged at zero width.
3. **Row statistic.** Paired (the records hold baseline seeds): ``delta = mean_s(current_s - m_s)``,
   standard error ``sqrt(sum_s v_s (1 + 1/n_s)) / n`` with Welch-Satterthwaite degrees of freedom (a
   chaotic seed among quiet ones lends the row its own few degrees of freedom). Unpaired (other seeds):
   ``delta = mean(current) - mean_s(m_s)`` with the seed-to-seed spread of the ``m_s`` (n_baseline - 1
   degrees of freedom). ``floor = max(floor, rel_floor * |baseline|)`` (the figure table: the smallest
   change worth acting on). The row's p-value tests "worse by more than the floor":
   ``p = P(T > (worse - floor) / se)``, Student's t.
4. **One verdict per job.** Holm's step-down procedure over the p-values of every row of the job
   (Holm 1979) keeps the probability that a harmless change fails the job at or below ``alpha``
   (default 1%) whatever the dependence between the rows. A row regressed when Holm rejects it. A figure
   the baseline had and a completed run now lacks (non-finite) regressed outright (p = 0).

Exit codes: 0 nothing regressed, 1 something regressed, 2 the inputs are unusable (missing or corrupt
baseline or records, an unknown schema version, another preset or device, a case whose config differs:
the message names the field; a figure value that is not a number; a figure the table does not know).
Records whose purpose is not "regression" (fault injection, self-checks, claims) are never compared.

``null_jobs(baseline)`` judges each draw of the baseline as if it were a change against the others: the
false alarms of harmless rounding changes, measured. This module reads JSON only: no torch, no MLflow.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from stability.record import (
    REFERENCE_ARM,
    USABLE,
    RecordError,
    Status,
    arm_names,
    case_key,
    case_name,
    comparable_config,
    config_diff,
    config_fingerprint,
    device_kind,
    record_device,
    record_draw,
    validate_record,
    where,
    write_json,
)
from stability.record import figures as fig
from stability.record.stats import holm, sample_std, t_upper_tail
from stability.report.tables import fmt, text_table

BASELINE_SCHEMA_VERSION = 3
MIN_SEEDS = 3
MIN_DRAWS = 3          # per arm and seed: the reference and at least two replicates
DEFAULT_ALPHA = 0.01
TOLERANCE_KEYS = ("floor", "rel_floor")
METHOD = "Holm over every row; noise from rounding replicates"


def default_baseline_path(preset: str, device: str, directory: str | Path = "reports/baselines") -> Path:
    return Path(directory) / f"{preset}-{device_kind(device)}.json"


def paired_arm(arm: str) -> str:
    """The name of the paired-difference rows of a treatment arm."""
    return f"{arm}-{REFERENCE_ARM}"


# ----------------------------------------------------------------------------- records -> cases

def regression_records(records: list[dict]) -> tuple[list[dict], list[str]]:
    """The records a check or a baseline may use (purpose "regression"), and a note on the others."""
    used = [r for r in records if r.get("purpose", "regression") == "regression" and r.get("status") != Status.RUNNING]
    left = {}
    for r in records:
        if r.get("purpose", "regression") != "regression":
            left[r["purpose"]] = left.get(r["purpose"], 0) + 1
    notes = [f"left out {n} {purpose} record(s): only purpose 'regression' is compared"
             for purpose, n in sorted(left.items())]
    notes += [f"left out {where(r, i)}: still running or interrupted by a crash (status 'running'); finish it "
              f"with `stability run --resume` / `stability stress --resume`" for i, r in enumerate(records)
              if r.get("status") == Status.RUNNING]
    return used, notes


def _check_usable(record: dict, index: int) -> None:
    validate_record(record, where(record, index))
    for arm in record["arms"]:
        if arm["status"] not in USABLE:
            reason = f" ({arm.get('stop_reason')})" if arm.get("stop_reason") else ""
            raise RecordError(f"{where(record, index)}: arm {arm['arm']}/seed {arm['seed']} has status "
                              f"{arm['status']!r}{reason}: only completed or diverged arms can be compared; "
                              f"rerun the case")


def figure_value(record: dict, index: int, arm: dict, name: str) -> float | None:
    """A final figure as a float (None: missing or non-finite); RecordError for a value that is not a
    number or a figure the table does not know (unusable input, never a regression)."""
    value = arm["final"][name]
    if fig.figure(name) is None:
        raise RecordError(f"{where(record, index)}: arm {arm['arm']}/seed {arm['seed']} holds figure {name!r}, "
                          f"which the figure table (stability.record.figures) does not know: expected a figure "
                          f"of the table, or an entry for it there")
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)):
        raise RecordError(f"{where(record, index)}: arm {arm['arm']}/seed {arm['seed']} figure {name}={value!r} "
                          f"is not a number ({type(value).__name__}): expected a number, true/false or null")
    return float(value) if math.isfinite(value) else None


def case_values(records: list[dict]) -> dict[str, dict]:
    """{case: {"name", "schedule", "stress", "steps", "fingerprint", "config", "records",
               "arms": {arm: {"status": {seed: {draw: status}}, "diverged_at_step": {seed: {draw: step}},
                              "figures": {figure: {seed: {draw: value or None}}}}}}}.

    Seeds and draws are strings (JSON keys). An evaluation or peak figure of a run that did not complete
    is absent; None is a figure that is missing or non-finite."""
    cases: dict[str, dict] = {}
    for index, record in enumerate(records):
        _check_usable(record, index)
        key = case_key(record)
        fingerprint = config_fingerprint(record["config"])
        run = record["config"].get("run") or {}
        steps = run.get("steps", 1)
        if record.get("stress") == "precision_ladder":
            steps = (record["config"].get("stress") or {}).get("ladder_steps") or steps
        case = cases.setdefault(key, {"name": record["name"], "schedule": record["schedule"],
                                      "stress": case_name(record), "steps": steps, "fingerprint": fingerprint,
                                      "config": comparable_config(record["config"]), "records": [], "arms": {}})
        if case["fingerprint"] != fingerprint:
            raise RecordError(f"{where(record, index)}: case {key} appears with two different configs among the "
                              f"records ({config_diff(case['config'], comparable_config(record['config']))})")
        case["records"].append(record.get("id"))
        draw = str(record_draw(record))
        for arm in record["arms"]:
            entry = case["arms"].setdefault(arm["arm"], {"status": {}, "diverged_at_step": {}, "figures": {}})
            seed = str(arm["seed"])
            if draw in entry["status"].setdefault(seed, {}):
                raise RecordError(f"{where(record, index)}: case {key} arm {arm['arm']} seed {seed} draw {draw} "
                                  f"appears twice among the records (pass one run directory, or records of "
                                  f"distinct seeds)")
            entry["status"][seed][draw] = arm["status"]
            entry["diverged_at_step"].setdefault(seed, {})[draw] = arm.get("diverged_at_step")
            for name in arm.get("final") or {}:
                value = figure_value(record, index, arm, name)
                entry_ = fig.figure(name)
                if entry_.better is None:
                    continue
                if entry_.needs_completed_arm and arm["status"] != Status.COMPLETED:
                    continue  # a broken model or the explosion's size: left out (divergence figures judge it)
                entry["figures"].setdefault(name, {}).setdefault(seed, {})[draw] = value
    return cases


# ----------------------------------------------------------------------------- baseline

def make_baseline(records: list[dict], commit: str | None = None, min_seeds: int = MIN_SEEDS,
                  min_draws: int = MIN_DRAWS) -> dict:
    """A baseline document from the regression records of one preset and device, holding every seed's
    reference run and replicates; RecordError otherwise (too few seeds or replicates included)."""
    records, _ = regression_records(records)
    if not records:
        raise RecordError("no regression records to make a baseline from (fault, self-check and claim records "
                          "are never used)")
    presets = {r.get("preset") for r in records}
    if len(presets) > 1:
        raise RecordError(f"the records come from several presets {sorted(map(str, presets))}: a baseline holds "
                          f"one preset; pass the records of one preset")
    devices = {record_device(r) for r in records}
    if len(devices) > 1:
        raise RecordError(f"the records come from several devices {sorted(devices)}: a baseline holds one")
    cases = case_values(records)
    for key, case in cases.items():
        for arm, entry in case["arms"].items():
            if len(entry["status"]) < min_seeds:
                raise RecordError(f"case {key} arm {arm} has {len(entry['status'])} seed(s) "
                                  f"({sorted(entry['status'])}): a baseline needs at least {min_seeds} seeds per "
                                  f"case; run with --set seeds=0,1,2")
            for seed, draws in entry["status"].items():
                if len(draws) < min_draws:
                    raise RecordError(f"case {key} arm {arm} seed {seed} has {len(draws)} run(s) (draws "
                                      f"{sorted(draws, key=int)}): a baseline needs the reference and at least "
                                      f"{min_draws - 1} replicates to know its noise; make it with `stability "
                                      f"baseline make` or run the suites with --replicates N")
    draws = sorted({int(d) for case in cases.values() for arm in case["arms"].values()
                    for per_seed in arm["status"].values() for d in per_seed})
    git = records[-1].get("git") or {}
    return {
        "schema_version": BASELINE_SCHEMA_VERSION, "kind": "stability-baseline",
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "preset": presets.pop(), "device": devices.pop(), "min_seeds": min_seeds, "draws": draws,
        "commit": commit if commit is not None else git.get("commit"), "branch": git.get("branch"),
        "dirty": git.get("dirty"), "cases": dict(sorted(cases.items())),
    }


def validate_baseline(baseline, where_: str) -> dict:
    if not isinstance(baseline, dict) or baseline.get("kind") != "stability-baseline":
        raise RecordError(f"{where_} is not a stability baseline (no kind='stability-baseline'); make one "
                          f"with `stability baseline make`")
    version = baseline.get("schema_version")
    if version != BASELINE_SCHEMA_VERSION:
        raise RecordError(f"{where_} has schema_version={version!r}: this version of stability reads baseline "
                          f"schema_version={BASELINE_SCHEMA_VERSION} (the reference runs and their rounding "
                          f"replicates); make it again with `stability baseline make`")
    for key in ("preset", "device", "cases"):
        if key not in baseline:
            raise RecordError(f"{where_} has no {key!r} field (truncated?)")
    for name, case in baseline["cases"].items():
        if not isinstance(case, dict) or not isinstance(case.get("arms"), dict) or "fingerprint" not in case:
            raise RecordError(f"{where_}: case {name!r} lacks 'arms' or 'fingerprint'")
    return baseline


def load_baseline(path) -> dict:
    """Read and validate a baseline file; RecordError (exit 2) with a clear message otherwise."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"baseline {str(path)!r} does not exist; create it with `stability baseline make "
                          f"--out {path}`")
    try:
        baseline = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RecordError(f"baseline {str(path)!r} is not valid JSON (corrupt or truncated?): {error}") from None
    return validate_baseline(baseline, f"baseline {str(path)!r}")


def write_baseline(baseline: dict, path: str | Path) -> Path:
    return write_json(Path(path), baseline)


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
    delta: float | None         # current - baseline (paired: the mean of the per-seed differences)
    floor: float | None         # the smallest change worth acting on
    noise: float | None         # max(pooled replicate sd, quantum)
    se: float | None            # standard error of delta under the noise
    z: float | None             # (worse - floor) / se: the evidence, in standard errors beyond the floor
    p: float | None             # P(T > z) under the noise's degrees of freedom; None: not judged
    verdict: str                # ok | regressed | improved | new | missing
    mode: str = ""              # "paired n=3 df=12" or "unpaired 3/2 df=2"
    note: str = ""
    p_improved: float | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


VERDICT_MARK = {"ok": "ok", "regressed": "REGRESSED", "improved": "improved", "new": "new", "missing": "missing"}


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


def seed_noise(groups: dict[str, list[float]], quantum: float) -> dict[str, tuple[float, float]]:
    """Per seed: (variance of one run, its degrees of freedom) from the seed's baseline runs, never below
    ``quantum``^2 (a variance at the quantum is a fixed resolution: infinite degrees of freedom). A seed
    with one run takes the mean variance of the others."""
    noise = {}
    for seed, values in groups.items():
        if len(values) >= 2:
            mean = sum(values) / len(values)
            noise[seed] = (sum((v - mean) ** 2 for v in values) / (len(values) - 1), len(values) - 1)
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


def judge(baseline: dict, current: dict, name: str, quantum: float = 0.0, tolerance: dict | None = None) -> dict:
    """The statistics of one row: ``baseline`` maps seed -> {draw: value or None}, ``current`` maps
    seed -> value or None (absent: left out). Returns the fields of ``Row`` from ``baseline`` to
    ``p_improved``, and ``lost``: seeds whose value is gone (see the module docstring for the rule)."""
    entry = fig.figure(name)
    tolerance = tolerance or {}
    groups = {s: [v for v in draws.values() if v is not None] for s, draws in baseline.items()}
    groups = {s: g for s, g in groups.items() if g}
    cur = {s: v for s, v in current.items() if v is not None}
    out = {"baseline": None, "current": _mean(cur.values()), "delta": None, "floor": None, "noise": None,
           "se": None, "z": None, "p": None, "mode": "", "note": "", "p_improved": None, "lost": []}
    if not groups:
        out["note"] = "no finite baseline value" if cur else ""
        return out
    centers = {s: sum(g) / len(g) for s, g in groups.items()}
    out["baseline"] = base_mean = sum(centers.values()) / len(centers)
    out["lost"] = sorted(s for s, v in current.items() if v is None and s in groups)
    if not cur:
        return out
    common = sorted(set(cur) & set(groups))
    if common:   # paired: the change's delta at each seed against that seed's own runs
        noise = seed_noise({s: groups[s] for s in common}, quantum)
        terms = [(noise[s][0] * (1 + 1 / len(groups[s])), noise[s][1]) for s in common]
        delta = sum(cur[s] - centers[s] for s in common) / len(common)
        se = math.sqrt(sum(v for v, _ in terms)) / len(common)
        dof = welch_dof(terms)
        sd = math.sqrt(sum(noise[s][0] for s in common) / len(common))
        mode = f"paired n={len(common)} df={dof:.3g}"
        if len(common) < len(cur):
            out["note"] = f"seed(s) {', '.join(sorted(set(cur) - set(common)))} not in the baseline: left out"
    else:        # other seeds: the seed-to-seed spread of the baseline's seed means
        between = sample_std(list(centers.values()))
        sd = max(between, quantum)
        delta = out["current"] - base_mean
        se = sd * math.sqrt(1 / len(centers) + 1 / len(cur))
        dof = len(centers) - 1
        mode = f"unpaired {len(centers)}/{len(cur)} df={dof}"
    floor = max(tolerance.get("floor", entry.floor), tolerance.get("rel_floor", entry.rel_floor) * abs(base_mean))
    worse = delta if entry.better == "lower" else -delta
    z = (worse - floor) / se if se > 0 else (math.inf if worse > floor else -math.inf)
    out.update(delta=delta, floor=floor, noise=sd, se=se, z=z, mode=mode,
               p=_tail(worse - floor, se, dof), p_improved=_tail(-worse - floor, se, dof))
    return out


# ----------------------------------------------------------------------------- the job's verdict

@dataclass
class CheckResult:
    rows: list[Row] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    baseline_commit: str | None = None
    preset: str | None = None
    device: str | None = None
    alpha: float = DEFAULT_ALPHA
    draws: list[int] = field(default_factory=list)

    HEADER: ClassVar[list[str]] = ["case", "arm", "figure", "better", "baseline", "current", "delta", "floor",
                                   "noise", "z", "p", "compared", "verdict"]

    @property
    def regressed(self) -> list[Row]:
        return [row for row in self.rows if row.verdict == "regressed"]

    @property
    def judged(self) -> int:
        return sum(row.p is not None for row in self.rows)

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if self.regressed else 0

    @property
    def verdict(self) -> str:
        return {0: "PASS", 1: "REGRESSED", 2: "UNUSABLE INPUT"}[self.exit_code]

    def method(self) -> str:
        replicates = max(0, len(self.draws) - 1)
        return (f"false-alarm rate alpha = {self.alpha:g} for the whole job ({METHOD}: {self.judged} rows, "
                f"reference + {replicates} replicates per seed)")

    def cells(self, row: Row) -> list[str]:
        return [row.case, row.arm, row.figure, row.better, fmt(row.baseline), fmt(row.current), fmt(row.delta),
                fmt(row.floor), fmt(row.noise), fmt(row.z), _fmt_p(row.p), row.mode or "-",
                VERDICT_MARK[row.verdict] + (f" ({row.note})" if row.note else "")]

    def summary_line(self) -> str:
        counts = {v: sum(r.verdict == v for r in self.rows) for v in VERDICT_MARK}
        text = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        return (f"stability check: {self.verdict} (exit {self.exit_code}); preset {self.preset}, device "
                f"{self.device}, baseline commit {str(self.baseline_commit)[:12]}; {text or 'no figures compared'}")

    def table(self, only_changed: bool = False) -> str:
        rows = [r for r in self.rows if not only_changed or r.verdict != "ok"]
        out = [self.summary_line(), self.method()] + [f"error: {e}" for e in self.errors] \
            + [f"note: {n}" for n in self.notes]
        if self.regressed:
            out += ["", "regressed: " + "; ".join(f"{r.case} {r.arm} {r.figure} (z {fmt(r.z)}, p {_fmt_p(r.p)})"
                                                  for r in self.regressed)]
        return "\n".join(out + (["", text_table([self.HEADER] + [self.cells(r) for r in rows])] if rows else []))

    def markdown(self) -> str:
        icon = {0: ":white_check_mark:", 1: ":x:", 2: ":warning:"}[self.exit_code]
        out = [f"### Stability check: {icon} {self.verdict}", "",
               (f"Preset `{self.preset}`, device `{self.device}`, baseline from commit "
                f"`{str(self.baseline_commit)[:12]}`. A row regressed when it got worse by more than its floor "
                f"with Holm-adjusted evidence at alpha = {self.alpha:g} over the job's {self.judged} rows: the "
                f"chance that a harmless change fails this job is at most {self.alpha:g}. Noise: the spread of "
                f"{max(0, len(self.draws) - 1)} rounding replicates per seed (z: standard errors beyond the "
                f"floor)."), ""]
        out += [f"- **error:** {e}" for e in self.errors]
        out += [f"- note: {n}" for n in self.notes]
        if self.regressed:
            out += ["", f"**{len(self.regressed)} figure(s) regressed:** " + ", ".join(
                f"`{r.case}` {r.arm} {r.figure} (z {fmt(r.z)}, p {_fmt_p(r.p)})" for r in self.regressed)]
        if self.rows:
            out += ["", "| " + " | ".join(self.HEADER) + " |", "|" + "---|" * len(self.HEADER)]
            for row in self.rows:
                cells = self.cells(row)
                if row.verdict == "regressed":
                    cells[-1] = f"**{cells[-1]}**"
                out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        return "\n".join(out) + "\n"

    def to_dict(self) -> dict:
        return {"exit_code": self.exit_code, "verdict": self.verdict, "errors": self.errors, "notes": self.notes,
                "baseline_commit": self.baseline_commit, "alpha": self.alpha, "method": METHOD,
                "rows_judged": self.judged, "draws": self.draws, "rows": [r.as_dict() for r in self.rows]}


def _fmt_p(p: float | None) -> str:
    return "-" if p is None else (f"{p:.1e}" if p < 1e-3 else f"{p:.3f}")


def _single_draw(case: dict, key: str) -> dict:
    """The current records' values, seed -> value: one draw per arm and seed (a check judges one job)."""
    arms = {}
    for arm, entry in case["arms"].items():
        for seed, draws in entry["status"].items():
            if len(draws) > 1:
                raise RecordError(f"case {key} arm {arm} seed {seed}: the records hold {len(draws)} runs (draws "
                                  f"{sorted(draws, key=int)}): a check judges one job's records; pass the run "
                                  f"directory of one job")
        arms[arm] = {"status": {s: next(iter(d.values())) for s, d in entry["status"].items()},
                     "diverged_at_step": {s: next(iter(d.values())) for s, d in entry["diverged_at_step"].items()},
                     "figures": {name: {s: next(iter(d.values())) for s, d in values.items()}
                                 for name, values in entry["figures"].items()}}
    return arms


def _paired(arms: dict, arm: str, name: str, nested: bool) -> dict:
    """seed (-> draw) -> (arm - baseline) of one figure, where both arms have it (None when either is None)."""
    ref = arms.get(REFERENCE_ARM, {}).get("figures", {}).get(name, {})
    own = arms.get(arm, {}).get("figures", {}).get(name, {})

    def minus(a, b):
        return a - b if a is not None and b is not None else None
    if not nested:
        return {s: minus(own[s], ref[s]) for s in own if s in ref}
    return {s: {d: minus(own[s][d], ref[s][d]) for d in own[s] if d in ref[s]} for s in own if s in ref}


def _divergence_notes(key: str, arm: str, base: dict, cur: dict) -> list[str]:
    notes = []
    for seed, status in sorted(cur["status"].items()):
        if status == Status.DIVERGED and all(s == Status.COMPLETED for s in base["status"].get(seed, {}).values()):
            notes.append(f"case {key} {arm} seed {seed} diverged at step {cur['diverged_at_step'][seed]}; every "
                         f"baseline run of that seed completed (judged by divergence_step)")
    return notes


def _rows_of_case(result: CheckResult, key: str, base: dict, case: dict, tolerances: dict) -> None:
    current = _single_draw(case, key)
    config, steps = base.get("config") or case["config"], base.get("steps") or case["steps"]
    for arm in arm_names([{"arm": a} for a in {**base["arms"], **current}]):
        base_arm, cur_arm = base["arms"].get(arm), current.get(arm)
        if base_arm is None or cur_arm is None:
            result.notes.append(f"case {key}: arm {arm} is only in the {'records' if base_arm is None else 'baseline'}"
                                f": not compared")
            continue
        result.notes += _divergence_notes(key, arm, base_arm, cur_arm)
        names = fig.judged(set(base_arm["figures"]) | set(cur_arm["figures"]))
        for name in names:
            values = (base_arm["figures"].get(name, {}), cur_arm["figures"].get(name, {}))
            result.rows.append(_row(key, arm, name, *values, fig.quantum(name, config, steps), tolerances))
        if arm == REFERENCE_ARM:
            continue
        for name in names:
            values = (_paired(base["arms"], arm, name, True), _paired(current, arm, name, False))
            if any(v is not None for draws in values[0].values() for v in draws.values()) \
                    or any(v is not None for v in values[1].values()):
                result.rows.append(_row(key, paired_arm(arm), name, *values, fig.quantum(name, config, steps),
                                        tolerances))


def _row(key: str, arm: str, name: str, baseline: dict, current: dict, quantum: float, tolerances: dict) -> Row:
    """One judged row (its verdict before the family-wise decision: ok, new, missing, or regressed for a
    value that is gone)."""
    stats = judge(baseline, current, name, quantum, tolerances.get(name))
    lost = stats.pop("lost")
    verdict = "ok"
    if stats["baseline"] is None:
        verdict = "new" if stats["current"] is not None else "ok"
    elif lost:
        verdict, stats["p"] = "regressed", 0.0
        stats["note"] = f"no finite value now in seed(s) {', '.join(lost)}"
    elif stats["current"] is None:
        verdict, stats["note"] = "missing", "not in the records"
    return Row(key, arm, name, fig.better(name), verdict=verdict, **stats)


def check(records: list[dict], baseline: dict, tolerances: dict | None = None,
          alpha: float = DEFAULT_ALPHA) -> CheckResult:
    """Judge records against a baseline at family-wise false-alarm rate ``alpha``. Unusable inputs give
    exit_code 2 with ``errors`` (never a silent pass); an invalid tolerance table raises RecordError."""
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
    result.draws = list(baseline.get("draws") or [])
    records, notes = regression_records(records)
    result.notes += notes
    if not records:
        result.errors.append("no regression records to check")
        return result
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
    try:
        cases = case_values(records)
        judge_cases(result, cases, baseline["cases"], tolerances)
    except RecordError as error:
        result.errors.append(str(error))
        return result
    decide(result)
    return result


def judge_cases(result: CheckResult, cases: dict, base_cases: dict, tolerances: dict) -> None:
    """The rows of every case the records and the baseline share (errors for configs that differ)."""
    for key, case in sorted(cases.items()):
        base = base_cases.get(key)
        if base is None:
            schedules = sorted(c.get("schedule") for c in base_cases.values() if c.get("name") == case["name"])
            if schedules:
                result.errors.append(f"case {key}: schedule differs: the baseline has case {case['name']!r} with "
                                     f"schedule(s) {schedules}, the record has schedule {case['schedule']!r}")
            else:
                result.notes.append(f"case {key} is not in the baseline (new case): not compared; add it with "
                                    f"`stability baseline make`")
            continue
        # the stored fingerprint, or one recomputed from the stored config (fields added since count as defaults)
        if case["fingerprint"] not in (base["fingerprint"], config_fingerprint(base.get("config") or {})):
            result.errors.append(f"case {key}: the run config differs from the baseline's: "
                                 f"{config_diff(base.get('config', {}), case['config'])}")
            continue
        _rows_of_case(result, key, base, case, tolerances)
    missing = sorted(set(base_cases) - set(cases))
    if missing:
        result.notes.append(f"baseline case(s) without a current record (not compared): {', '.join(missing)}")
    if not result.rows and not result.errors:
        result.errors.append("no record matched a baseline case: nothing was compared (cases in the records: "
                             f"{sorted(cases)}; in the baseline: {sorted(base_cases)})")


def decide(result: CheckResult) -> None:
    """Holm over the p-values of every judged row: which regressed; improvements at alpha / rows."""
    judged = [row for row in result.rows if row.p is not None]
    for row, rejected in zip(judged, holm([row.p for row in judged], result.alpha)):
        if rejected:
            row.verdict = "regressed"
        elif row.verdict == "regressed":   # a lost value: p = 0 is always rejected; kept for clarity
            pass
        elif row.p_improved is not None and row.p_improved <= result.alpha / max(1, len(judged)):
            row.verdict = "improved"


# ----------------------------------------------------------------------------- calibration

def split_runs(cases: dict, chosen) -> tuple[dict, dict]:
    """(the cases without the chosen runs, the chosen runs as a one-draw case set): ``chosen(seed)`` is the
    draw (a string key) that plays the change at that seed."""
    kept_cases, drawn_cases = {}, {}
    for key, case in cases.items():
        kept_arms, drawn_arms = {}, {}
        for arm, entry in case["arms"].items():
            def split(per_seed):
                kept = {s: {d: v for d, v in draws.items() if d != chosen(s)} for s, draws in per_seed.items()}
                drawn = {s: {chosen(s): draws[chosen(s)]} for s, draws in per_seed.items() if chosen(s) in draws}
                return kept, drawn
            status_kept, status_drawn = split(entry["status"])
            step_kept, step_drawn = split(entry["diverged_at_step"])
            figures = {name: split(values) for name, values in entry["figures"].items()}
            kept_arms[arm] = {"status": status_kept, "diverged_at_step": step_kept,
                              "figures": {n: k for n, (k, _) in figures.items()}}
            drawn_arms[arm] = {"status": status_drawn, "diverged_at_step": step_drawn,
                               "figures": {n: d for n, (_, d) in figures.items() if d}}
        kept_cases[key] = {**case, "arms": kept_arms}
        drawn_cases[key] = {**case, "arms": drawn_arms}
    return kept_cases, drawn_cases


def leave_out(baseline: dict, draw: int) -> tuple[dict, dict]:
    """(the baseline without ``draw``, the values of ``draw`` as a one-draw case set): a draw judged as if
    it were a change, against the others."""
    kept_cases, drawn_cases = split_runs(baseline["cases"], lambda _seed: str(draw))
    return {**baseline, "cases": kept_cases, "draws": [d for d in baseline.get("draws", []) if d != draw]}, \
        drawn_cases


def null_jobs(baseline: dict, alpha: float = DEFAULT_ALPHA, tolerances: dict | None = None) -> list[CheckResult]:
    """Each draw of ``baseline`` judged as a change against the others: harmless rounding changes, so any
    row that regresses here is a false alarm of the rule at this preset (expected in at most a fraction
    ``alpha`` of such jobs)."""
    validate_baseline(baseline, "baseline")
    tolerances = resolve_tolerances(tolerances)
    results = []
    for draw in baseline.get("draws") or []:
        kept, drawn = leave_out(baseline, draw)
        result = CheckResult(alpha=alpha, baseline_commit=baseline.get("commit"), preset=baseline["preset"],
                             device=baseline["device"], draws=kept["draws"])
        judge_cases(result, drawn, kept["cases"], tolerances)
        decide(result)
        result.notes.insert(0, f"draw {draw} judged against the other draws")
        results.append(result)
    return results
