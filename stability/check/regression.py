"""The merge check: records of this change against a recorded baseline -> verdict and exit code.

A *baseline* (``reports/baselines/<preset>-<device>.json``, made by ``make_baseline``) holds, per
stress case (``name/schedule``): the config fingerprint, and per arm and seed the arm's status,
divergence step and every judged figure (``stability.record.figures``), at least ``MIN_SEEDS`` seeds.

``check(records, baseline)`` compares, per case, arm and figure, the figures of the records with
the baseline's, and also the paired difference ``<arm> - baseline`` of every treatment arm (the
regression this project exists to catch is "the gate stops helping", which can hide inside two
arms that each look fine). The rule:

1. **Status first.** An evaluation figure (``kind="eval"``: held-out loss, M-Act ...) of an arm that
   did not complete describes a broken model, and a peak figure (``kind="peak"``: largest gradient or
   update norm, spike scores) of such an arm measures the explosion: both are left out, on the
   baseline's side too (seed by seed, by the baseline's status). A seed whose baseline arm completed
   and whose arm now diverged regressed. Divergence that comes earlier is judged through the
   ``divergence_step`` figure like any other.
2. **Noise comes from the baseline alone.** ``s`` is the sample standard deviation of the
   baseline's per-seed values. When the records hold the baseline's seeds, the comparison is paired:
   ``delta = mean over seeds of (current - baseline)``, with standard error ``s * sqrt(2 / n)`` (as if
   the two runs of a seed were independent: the most two runs of one seed can differ by noise) and
   multiplier ``k``. Else it is unpaired: ``delta = mean(current) - mean(baseline)`` with standard
   error ``s * sqrt(1/n_baseline + 1/n_current)``; every seed-to-seed difference then enters delta,
   and ``s`` is itself estimated from n_baseline seeds, so the multiplier is the Student-t value with
   n_baseline - 1 degrees of freedom whose one-sided tail equals the normal tail beyond ``k``
   (``stability.record.stats.t_quantile_for_z``: 19.2 for 3 baseline seeds, 5.5 for 6, at k = 3). The
   current run's own spread never widens the band, so a regression cannot hide in the noise it
   makes.
3. **Band** ``= max(floor, rel_floor * |baseline mean|, multiplier * standard error)``, ``k = 3`` by
   default; ``floor`` and ``rel_floor`` come from the figure table (the smallest change worth acting on).
   A figure regressed when it moved in its worse direction by more than the band, improved when it
   moved the other way by more than the band. A figure the baseline had finite that is now missing
   or non-finite (in an arm that completed) regressed.

Exit codes: 0 nothing regressed, 1 something regressed, 2 the inputs are unusable (missing or
corrupt baseline or records, an unknown schema version, another preset or device, a case whose
config differs: the message names the field). Records whose purpose is not "regression" (fault
injection, self-checks, claims) are never compared; the check says how many it left out.

This module reads JSON only: no torch, no MLflow.
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
    RecordError,
    arm_names,
    case_key,
    comparable_config,
    config_diff,
    config_fingerprint,
    device_kind,
    record_device,
    usable_value,
    validate_record,
    where,
    write_json,
)
from stability.record import figures as fig
from stability.record.stats import sample_std, t_quantile_for_z
from stability.report.tables import fmt, text_table

BASELINE_SCHEMA_VERSION = 2
MIN_SEEDS = 3
DEFAULT_K = 3.0
USABLE_ARM_STATUS = ("completed", "diverged")
TOLERANCE_KEYS = ("floor", "rel_floor", "k")


def default_baseline_path(preset: str, device: str, directory: str | Path = "reports/baselines") -> Path:
    return Path(directory) / f"{preset}-{device_kind(device)}.json"


def paired_arm(arm: str) -> str:
    """The name of the paired-difference rows of a treatment arm."""
    return f"{arm}-{REFERENCE_ARM}"


# ----------------------------------------------------------------------------- records -> cases

def regression_records(records: list[dict]) -> tuple[list[dict], list[str]]:
    """The records a check or a baseline may use (purpose "regression"), and a note on the others."""
    used = [r for r in records if r.get("purpose", "regression") == "regression" and r.get("status") != "running"]
    left = {}
    for r in records:
        if r.get("purpose", "regression") != "regression":
            left[r["purpose"]] = left.get(r["purpose"], 0) + 1
    notes = [f"left out {n} {purpose} record(s): only purpose 'regression' is compared"
             for purpose, n in sorted(left.items())]
    notes += [f"left out {where(r, i)}: still running or interrupted by a crash (status 'running'); finish it "
              f"with `stability run --resume` / `stability stress --resume`" for i, r in enumerate(records)
              if r.get("status") == "running"]
    return used, notes


def _check_usable(record: dict, index: int) -> None:
    validate_record(record, where(record, index))
    for arm in record["arms"]:
        if arm["status"] not in USABLE_ARM_STATUS:
            reason = f" ({arm.get('stop_reason')})" if arm.get("stop_reason") else ""
            raise RecordError(f"{where(record, index)}: arm {arm['arm']}/seed {arm['seed']} has status "
                              f"{arm['status']!r}{reason}: only completed or diverged arms can be compared; "
                              f"rerun the case")


def case_values(records: list[dict]) -> dict[str, dict]:
    """{case: {"name", "schedule", "fingerprint", "config", "records",
               "arms": {arm: {"status": {seed: status}, "diverged_at_step": {seed: step},
                              "figures": {figure: {seed: value or None}}}}}}.

    Seeds are strings (JSON keys). An evaluation figure of an arm that did not complete is absent;
    None is a figure that is missing or non-finite."""
    cases: dict[str, dict] = {}
    for index, record in enumerate(records):
        _check_usable(record, index)
        key = case_key(record)
        fingerprint = config_fingerprint(record["config"])
        case = cases.setdefault(key, {"name": record["name"], "schedule": record["schedule"],
                                      "fingerprint": fingerprint, "config": comparable_config(record["config"]),
                                      "records": [], "arms": {}})
        if case["fingerprint"] != fingerprint:
            raise RecordError(f"{where(record, index)}: case {key} appears with two different configs among the "
                              f"records ({config_diff(case['config'], comparable_config(record['config']))})")
        case["records"].append(record.get("id"))
        for arm in record["arms"]:
            entry = case["arms"].setdefault(arm["arm"], {"status": {}, "diverged_at_step": {}, "figures": {}})
            seed = str(arm["seed"])
            if seed in entry["status"]:
                raise RecordError(f"{where(record, index)}: case {key} arm {arm['arm']} seed {seed} appears twice "
                                  f"among the records (pass one run directory, or records of distinct seeds)")
            entry["status"][seed] = arm["status"]
            entry["diverged_at_step"][seed] = arm.get("diverged_at_step")
            for name in arm.get("final") or {}:
                entry_ = fig.figure(name)
                if entry_ is None or entry_.better is None:
                    continue
                if entry_.needs_completed_arm and arm["status"] != "completed":
                    continue  # a broken model or the explosion's size: left out (the status rows judge the arm)
                entry["figures"].setdefault(name, {})[seed] = usable_value(arm, name)
    return cases


# ----------------------------------------------------------------------------- baseline

def make_baseline(records: list[dict], commit: str | None = None, min_seeds: int = MIN_SEEDS) -> dict:
    """A baseline document from regression records of one preset and device; RecordError otherwise."""
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
                                  f"case to know its noise; run with --set seeds=0,1,2")
    git = records[-1].get("git") or {}
    return {
        "schema_version": BASELINE_SCHEMA_VERSION, "kind": "stability-baseline",
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "preset": presets.pop(), "device": devices.pop(), "min_seeds": min_seeds,
        "commit": commit if commit is not None else git.get("commit"), "branch": git.get("branch"),
        "dirty": git.get("dirty"), "cases": dict(sorted(cases.items())),
    }


def validate_baseline(baseline, where_: str) -> dict:
    if not isinstance(baseline, dict) or baseline.get("kind") != "stability-baseline":
        raise RecordError(f"{where_} is not a stability baseline (no kind='stability-baseline'); make one "
                          f"with `stability baseline update RUN_DIR --out PATH`")
    version = baseline.get("schema_version")
    if version != BASELINE_SCHEMA_VERSION:
        raise RecordError(f"{where_} has schema_version={version!r}: this version of stability reads baseline "
                          f"schema_version={BASELINE_SCHEMA_VERSION}; regenerate it with `stability baseline update`")
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
        raise RecordError(f"baseline {str(path)!r} does not exist; create it with "
                          f"`stability baseline update reports/runs --out {path}`")
    try:
        baseline = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RecordError(f"baseline {str(path)!r} is not valid JSON (corrupt or truncated?): {error}") from None
    return validate_baseline(baseline, f"baseline {str(path)!r}")


def write_baseline(baseline: dict, path: str | Path) -> Path:
    return write_json(Path(path), baseline)


# ----------------------------------------------------------------------------- tolerances

def resolve_tolerances(overrides: dict | None = None) -> dict[str, dict]:
    """Per-figure overrides of ``floor``, ``rel_floor`` and ``k``; an unknown figure or key is an error."""
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
    """Read a JSON or TOML tolerance file ({figure: {floor, rel_floor, k}}) and validate it."""
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


# ----------------------------------------------------------------------------- the comparison

@dataclass
class Row:
    case: str
    arm: str
    figure: str
    better: str
    baseline: float | None
    current: float | None
    delta: float | None
    band: float | None
    verdict: str            # ok | regressed | improved | new | missing
    mode: str = ""          # "paired n=3" or "unpaired 3/2"
    note: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


VERDICT_MARK = {"ok": "ok", "regressed": "REGRESSED", "improved": "improved", "new": "new", "missing": "missing"}


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def compare_values(baseline: dict, current: dict, name: str, k: float = DEFAULT_K,
                   tolerance: dict | None = None) -> tuple:
    """(verdict, baseline mean, current mean, delta, band, mode, note) of one figure.

    ``baseline`` and ``current`` map seed -> value (None: left out). See the module docstring."""
    entry = fig.figure(name)
    tolerance = tolerance or {}
    floor = tolerance.get("floor", entry.floor)
    rel_floor = tolerance.get("rel_floor", entry.rel_floor)
    k = tolerance.get("k", k)
    base = {s: v for s, v in baseline.items() if v is not None}
    cur = {s: v for s, v in current.items() if v is not None}
    base_mean, cur_mean = _mean(base.values()), _mean(cur.values())
    if not base:
        return ("new" if cur else "ok", None, cur_mean, None, None, "", "no finite baseline value" if cur else "")
    lost = sorted(s for s in current if s in base and current[s] is None)
    if not cur:
        return ("regressed" if lost else "missing", base_mean, None, None, None, "",
                "no finite value now" if lost else "not in the records")
    spread = sample_std(list(base.values()))
    common = sorted(set(base) & set(cur))
    if common and set(cur) <= set(base):
        delta = _mean(cur[s] - base[s] for s in common)
        error = spread * math.sqrt(2.0 / len(common))
        multiplier = k
        mode = f"paired n={len(common)}"
    else:
        delta = cur_mean - base_mean
        error = spread * math.sqrt(1.0 / len(base) + 1.0 / len(cur))
        multiplier = t_quantile_for_z(k, len(base) - 1) if len(base) > 1 else k
        mode = f"unpaired {len(base)}/{len(cur)}"
    band = max(floor, rel_floor * abs(base_mean), multiplier * error)
    worse = delta if entry.better == "lower" else -delta
    if lost:
        return ("regressed", base_mean, cur_mean, delta, band, mode,
                f"no finite value now in seed(s) {', '.join(lost)}")
    verdict = "regressed" if worse > band else ("improved" if -worse > band else "ok")
    return (verdict, base_mean, cur_mean, delta, band, mode, "")


def _paired_values(case_arms: dict, arm: str, name: str) -> dict:
    """seed -> (arm - baseline) of one figure, where both arms have a usable value."""
    ref = case_arms.get(REFERENCE_ARM, {}).get("figures", {}).get(name, {})
    own = case_arms.get(arm, {}).get("figures", {}).get(name, {})
    return {s: (own[s] - ref[s] if own.get(s) is not None and ref.get(s) is not None else None)
            for s in own if s in ref}


def _completed_only(arm: dict) -> dict:
    """A baseline arm without the evaluation and peak figures of its seeds that did not complete (a
    baseline made before a figure became "peak" may still hold them)."""
    figures = {name: {s: v for s, v in values.items()
                      if not (fig.figure(name).needs_completed_arm and arm["status"].get(s) != "completed")}
               for name, values in arm["figures"].items()}
    return {**arm, "figures": {name: values for name, values in figures.items() if values}}


def _status_rows(key: str, arm: str, base: dict, cur: dict) -> list[Row]:
    rows = []
    for seed in sorted(set(base["status"]) & set(cur["status"])):
        if base["status"][seed] == "completed" and cur["status"][seed] == "diverged":
            rows.append(Row(key, arm, "status", "completed", None, None, None, None, "regressed",
                            note=f"seed {seed} diverged at step {cur['diverged_at_step'][seed]}; the baseline "
                                 f"completed"))
    return rows


@dataclass
class CheckResult:
    rows: list[Row] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    baseline_commit: str | None = None
    preset: str | None = None
    device: str | None = None
    k: float = DEFAULT_K

    HEADER: ClassVar[list[str]] = ["case", "arm", "figure", "better", "baseline", "current", "delta", "band",
                                   "compared", "verdict"]

    @property
    def regressed(self) -> list[Row]:
        return [row for row in self.rows if row.verdict == "regressed"]

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if self.regressed else 0

    @property
    def verdict(self) -> str:
        return {0: "PASS", 1: "REGRESSED", 2: "UNUSABLE INPUT"}[self.exit_code]

    def cells(self, row: Row) -> list[str]:
        band = f"±{fmt(row.band)}" if row.band is not None else "-"
        return [row.case, row.arm, row.figure, row.better, fmt(row.baseline), fmt(row.current), fmt(row.delta),
                band, row.mode or "-", VERDICT_MARK[row.verdict] + (f" ({row.note})" if row.note else "")]

    def summary_line(self) -> str:
        counts = {v: sum(r.verdict == v for r in self.rows) for v in VERDICT_MARK}
        text = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        return (f"stability check: {self.verdict} (exit {self.exit_code}); preset {self.preset}, device "
                f"{self.device}, baseline commit {str(self.baseline_commit)[:12]}; {text or 'no figures compared'}")

    def table(self, only_changed: bool = False) -> str:
        rows = [r for r in self.rows if not only_changed or r.verdict != "ok"]
        out = [self.summary_line()] + [f"error: {e}" for e in self.errors] + [f"note: {n}" for n in self.notes]
        if self.regressed:
            out += ["", "regressed: " + "; ".join(f"{r.case} {r.arm} {r.figure}" for r in self.regressed)]
        return "\n".join(out + (["", text_table([self.HEADER] + [self.cells(r) for r in rows])] if rows else []))

    def markdown(self) -> str:
        icon = {0: ":white_check_mark:", 1: ":x:", 2: ":warning:"}[self.exit_code]
        out = [f"### Stability check: {icon} {self.verdict}", "",
               (f"Preset `{self.preset}`, device `{self.device}`, baseline from commit "
                f"`{str(self.baseline_commit)[:12]}`. Band = max(floor, rel_floor × \\|baseline\\|, "
                f"{self.k:g} × baseline seed std × √(2/n)) when the seeds match; unpaired, the Student-t value of "
                f"the same tail replaces {self.k:g} and the standard error is std × √(1/n_b + 1/n_c). The noise "
                f"comes from the baseline alone."), ""]
        out += [f"- **error:** {e}" for e in self.errors]
        out += [f"- note: {n}" for n in self.notes]
        if self.regressed:
            out += ["", f"**{len(self.regressed)} figure(s) regressed:** " + ", ".join(
                f"`{r.case}` {r.arm} {r.figure}" for r in self.regressed)]
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
                "baseline_commit": self.baseline_commit, "k": self.k, "rows": [r.as_dict() for r in self.rows]}


def _compare_case(result: CheckResult, key: str, base: dict, case: dict, tolerances: dict, k: float) -> None:
    base_arms = {name: _completed_only(entry) for name, entry in base["arms"].items()}
    arms = arm_names([{"arm": a} for a in {**base_arms, **case["arms"]}])
    for arm in arms:
        base_arm, cur_arm = base_arms.get(arm), case["arms"].get(arm)
        if base_arm is None or cur_arm is None:
            result.notes.append(f"case {key}: arm {arm} is only in the {'records' if base_arm is None else 'baseline'}"
                                f": not compared")
            continue
        result.rows += _status_rows(key, arm, base_arm, cur_arm)
        names = fig.judged(set(base_arm["figures"]) | set(cur_arm["figures"]))
        for name in names:
            verdict, b, c, delta, band, mode, note = compare_values(
                base_arm["figures"].get(name, {}), cur_arm["figures"].get(name, {}), name, k,
                tolerances.get(name))
            result.rows.append(Row(key, arm, name, fig.better(name), b, c, delta, band, verdict, mode, note))
        if arm == REFERENCE_ARM:
            continue
        for name in names:
            base_d, cur_d = _paired_values(base_arms, arm, name), _paired_values(case["arms"], arm, name)
            if not any(v is not None for v in list(base_d.values()) + list(cur_d.values())):
                continue
            verdict, b, c, delta, band, mode, note = compare_values(base_d, cur_d, name, k, tolerances.get(name))
            result.rows.append(Row(key, paired_arm(arm), name, fig.better(name), b, c, delta, band, verdict, mode,
                                   note))


def check(records: list[dict], baseline: dict, tolerances: dict | None = None, k: float = DEFAULT_K) -> CheckResult:
    """Compare records with a baseline. Unusable inputs give exit_code 2 with ``errors`` (never a silent
    pass); an invalid tolerance table raises RecordError."""
    tolerances = resolve_tolerances(tolerances)
    result = CheckResult(k=k)
    try:
        validate_baseline(baseline, "baseline")
    except RecordError as error:
        result.errors.append(str(error))
        return result
    result.baseline_commit, result.preset, result.device = baseline.get("commit"), baseline["preset"], \
        baseline["device"]
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
    except RecordError as error:
        result.errors.append(str(error))
        return result
    base_cases = baseline["cases"]
    for key, case in sorted(cases.items()):
        base = base_cases.get(key)
        if base is None:
            schedules = sorted(c.get("schedule") for c in base_cases.values() if c.get("name") == case["name"])
            if schedules:
                result.errors.append(f"case {key}: schedule differs: the baseline has case {case['name']!r} with "
                                     f"schedule(s) {schedules}, the record has schedule {case['schedule']!r}")
            else:
                result.notes.append(f"case {key} is not in the baseline (new case): not compared; add it with "
                                    f"`stability baseline update`")
            continue
        # the stored fingerprint, or one recomputed from the stored config (fields added since count as defaults)
        if case["fingerprint"] not in (base["fingerprint"], config_fingerprint(base.get("config") or {})):
            result.errors.append(f"case {key}: the run config differs from the baseline's: "
                                 f"{config_diff(base.get('config', {}), case['config'])}")
            continue
        _compare_case(result, key, base, case, tolerances, k)
    missing = sorted(set(base_cases) - set(cases))
    if missing:
        result.notes.append(f"baseline case(s) without a current record (not compared): {', '.join(missing)}")
    if not result.rows and not result.errors:
        result.errors.append("no record matched a baseline case: nothing was compared (cases in the records: "
                             f"{sorted(cases)}; in the baseline: {sorted(base_cases)})")
    return result
