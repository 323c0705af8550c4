"""The merge check: compare run records with a recorded baseline -> verdict and exit code.

A *baseline* is a JSON file (``reports/baselines/<preset>-<device>.json``) made from
records by ``make_baseline``. It holds, per stress case (record name + schedule), the
config fingerprint and, per arm (baseline / gated) and figure (the arm's ``final``
figures), the mean, std, n and values over seeds.

``check(records, baseline, tolerances)`` pools the current records the same way and
compares each figure with a band::

    band = max(abs_tol, rel_tol * |baseline mean|, k * seed std)

where ``seed std`` is the larger of the baseline's and the current spread over seeds
(the seeds give the noise; with one seed only the absolute and relative parts apply).
Direction-aware: for a "lower is better" figure (loss, spike score, M-Act) the figure
regressed when ``current - baseline > band``; for "higher is better" (accuracy,
critical LR) when ``baseline - current > band``. A figure that was finite in the
baseline and is non-finite (null) now regressed too (the arm diverged).

Exit codes: 0 nothing regressed, 1 something regressed, 2 the inputs are unusable
(missing/corrupt baseline or record, unknown schema_version, another preset, device,
schedule or model config: the message says which field differs).
"""

from __future__ import annotations

import copy
import datetime as _dt
import fnmatch
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from stability.stats import sample_std
from stability.table import fmt, text_table

BASELINE_SCHEMA_VERSION = 1
USABLE_ARM_STATUS = ("completed", "diverged")

# Default tolerance table: direction and band parts per figure (the arm "final" figures).
# abs: absolute band; rel: fraction of |baseline|; k: multiples of the seed std.
DEFAULT_TOLERANCES: dict[str, dict] = {
    "heldout_loss":       {"better": "lower",  "abs": 0.05, "rel": 0.02, "k": 3.0},
    "perplexity":         {"better": "lower",  "abs": 0.5,  "rel": 0.05, "k": 3.0},
    "accuracy":           {"better": "higher", "abs": 0.01, "rel": 0.03, "k": 3.0},
    "final_train_loss":   {"better": "lower",  "abs": 0.05, "rel": 0.02, "k": 3.0},
    "min_train_loss":     {"better": "lower",  "abs": 0.05, "rel": 0.02, "k": 3.0},
    "loss_spike_score":   {"better": "lower",  "abs": 1.0,  "rel": 0.0,  "k": 3.0},   # percent of steps
    "grad_spike_score":   {"better": "lower",  "abs": 2.0,  "rel": 0.0,  "k": 3.0},   # percent of steps
    "nonfinite_events":   {"better": "lower",  "abs": 0.5,  "rel": 0.0,  "k": 3.0},   # any new event
    "skipped_steps":      {"better": "lower",  "abs": 0.5,  "rel": 0.1,  "k": 3.0},
    "diverged":           {"better": "lower",  "abs": 0.25, "rel": 0.0,  "k": 0.0},   # fraction of seeds
    "max_grad_norm":      {"better": "lower",  "abs": 0.5,  "rel": 0.5,  "k": 3.0},
    "m_act_mean":         {"better": "lower",  "abs": 1.0,  "rel": 0.25, "k": 3.0},
    "m_act_max":          {"better": "lower",  "abs": 1.0,  "rel": 0.25, "k": 3.0},
    "f_attn_mean":        {"better": "lower",  "abs": 0.05, "rel": 0.15, "k": 3.0},
    "sink_rate_mean":     {"better": "lower",  "abs": 0.1,  "rel": 0.0,  "k": 3.0},
    "max_attn_logit":     {"better": "lower",  "abs": 1.0,  "rel": 0.25, "k": 3.0},
    "logit_max":          {"better": "lower",  "abs": 1.0,  "rel": 0.25, "k": 3.0},
    "overflow_fraction":  {"better": "lower",  "abs": 0.01, "rel": 0.0,  "k": 3.0},
    "underflow_fraction": {"better": "lower",  "abs": 0.01, "rel": 0.0,  "k": 3.0},
    "loss_scale_drops":   {"better": "lower",  "abs": 2.0,  "rel": 0.5,  "k": 3.0},
    # stress cases (stability.stress): LR sweep, LR range test, batch ramp, LR shock
    "critical_lr":          {"better": "higher", "abs": 0.0,  "rel": 0.5,  "k": 2.0},   # ~one grid step
    "lr_sensitivity":       {"better": "lower",  "abs": 0.05, "rel": 0.2,  "k": 3.0},
    "ramp_divergence_lr":   {"better": "higher", "abs": 0.0,  "rel": 0.5,  "k": 2.0},
    "ramp_divergence_step": {"better": "higher", "abs": 5.0,  "rel": 0.2,  "k": 2.0},
    "ramp_best_lr":         {"better": "higher", "abs": 0.0,  "rel": 0.5,  "k": 2.0},
    "ramp_spikes":          {"better": "lower",  "abs": 2.0,  "rel": 0.5,  "k": 3.0},
    "ramp_grad_spikes":     {"better": "lower",  "abs": 2.0,  "rel": 0.5,  "k": 3.0},
    "tokens_seen":          {"better": "higher", "abs": 0.0,  "rel": 0.05, "k": 2.0},
    "shock_peak_excess":    {"better": "lower",  "abs": 0.1,  "rel": 0.25, "k": 3.0},
    "shock_recovery_steps": {"better": "lower",  "abs": 5.0,  "rel": 0.5,  "k": 3.0},
    "shock_spikes":         {"better": "lower",  "abs": 2.0,  "rel": 0.5,  "k": 3.0},
    "shock_recovered":      {"better": "higher", "abs": 0.25, "rel": 0.0,  "k": 0.0},   # fraction of seeds
    # families (fnmatch patterns): precision ladder per precision, quantization damage per scheme
    "loss_gap_*":           {"better": "lower",  "abs": 0.05, "rel": 0.25, "k": 3.0},
    "nonfinite_events_*":   {"better": "lower",  "abs": 0.5,  "rel": 0.0,  "k": 3.0},
    "diverged_*":           {"better": "lower",  "abs": 0.25, "rel": 0.0,  "k": 0.0},
    "overflow_fraction_*":  {"better": "lower",  "abs": 0.01, "rel": 0.0,  "k": 3.0},
    "underflow_fraction_*": {"better": "lower",  "abs": 0.01, "rel": 0.0,  "k": 3.0},
    "loss_scale_drops_*":   {"better": "lower",  "abs": 2.0,  "rel": 0.5,  "k": 3.0},
    "loss_spike_score_*":   {"better": "lower",  "abs": 1.0,  "rel": 0.0,  "k": 3.0},
    "quant_*_damage_loss":  {"better": "lower",  "abs": 0.02, "rel": 0.25, "k": 3.0},
    "quant_*_damage_accuracy": {"better": "higher", "abs": 0.01, "rel": 0.25, "k": 3.0},
}
TOLERANCE_KEYS = ("better", "abs", "rel", "k")


def tolerance_key(figure: str, table: dict | None = None) -> str | None:
    """The tolerance-table key of a figure: its own name, else the first matching pattern (None: not
    compared)."""
    table = DEFAULT_TOLERANCES if table is None else table
    if figure in table:
        return figure
    return next((key for key in table if "*" in key and fnmatch.fnmatchcase(figure, key)), None)


def _figure_order(figures) -> list[str]:
    keys = list(DEFAULT_TOLERANCES)
    return sorted(figures, key=lambda f: (keys.index(tolerance_key(f) or keys[-1]), f))

# Config fields that may differ between the baseline and a record without making them incomparable.
FINGERPRINT_IGNORES = ("seeds", "run.seed", "run.device", "name", "preset")


class RegressionInputError(ValueError):
    """Unusable input to the check (exit code 2): the message says what and where."""

    exit_code = 2


# ----------------------------------------------------------------------------- small helpers

def device_kind(device: str | None) -> str:
    """"cuda:1" -> "cuda", None -> "cpu"."""
    return (device or "cpu").split(":")[0]


def default_baseline_path(preset: str, device: str, directory: str | Path = "reports/baselines") -> Path:
    return Path(directory) / f"{preset}-{device_kind(device)}.json"


def _flatten(mapping: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


def comparable_config(config: dict) -> dict:
    """The flattened config without the fields allowed to differ (seeds, device, names)."""
    flat = _flatten(config or {})
    return {k: v for k, v in sorted(flat.items()) if k not in FINGERPRINT_IGNORES}


def config_fingerprint(config: dict) -> str:
    return hashlib.sha256(json.dumps(comparable_config(config), sort_keys=True).encode()).hexdigest()[:16]


def case_key(record: dict) -> str:
    return f"{record.get('name')}/{record.get('schedule')}"


def _number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _stats(values: list) -> dict:
    finite = [v for v in values if v is not None]
    n = len(finite)
    mean = sum(finite) / n if n else None
    std = sample_std(finite)
    return {"mean": mean, "std": std, "n": n, "values": list(values)}


def _validate_record(record, where: str) -> None:
    from stability.experiment import SCHEMA_VERSION

    if not isinstance(record, dict):
        raise RegressionInputError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    version = record.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RegressionInputError(f"{where}: schema_version={version!r} is unknown: this version of stability "
                                   f"reads record schema_version={SCHEMA_VERSION}")
    for key in ("name", "preset", "schedule", "config", "arms"):
        if key not in record:
            raise RegressionInputError(f"{where}: the record has no {key!r} field (truncated or not a record)")
    for arm in record["arms"]:
        status = arm.get("status")
        if status not in USABLE_ARM_STATUS:
            raise RegressionInputError(
                f"{where}: arm {arm.get('arm')}/seed{arm.get('seed')} has status {status!r}"
                f"{' (' + str(arm.get('stop_reason')) + ')' if arm.get('stop_reason') else ''}: only completed or "
                f"diverged arms can be compared; rerun the case")


def _where(record: dict, index: int) -> str:
    return str(record.get("_path") or f"record #{index + 1} ({case_key(record)}, id {record.get('id')})")


def load_record(path: str | Path) -> dict:
    """Read a record file for the check: RegressionInputError (exit 2) when missing, corrupt or unknown."""
    path = Path(path)
    if not path.is_file():
        raise RegressionInputError(f"record {str(path)!r} does not exist")
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RegressionInputError(f"record {str(path)!r} is not valid JSON (corrupt or truncated?): {error}") \
            from None
    _validate_record(record, f"record {str(path)!r}")
    record["_path"] = str(path)
    return record


def _pool(records: list[dict]) -> dict:
    """{case: {"name", "schedule", "config", "fingerprint", "arms": {arm: {figure: [values over seeds]}}}}."""
    cases: dict[str, dict] = {}
    for index, record in enumerate(records):
        _validate_record(record, _where(record, index))
        key = case_key(record)
        fingerprint = config_fingerprint(record["config"])
        case = cases.setdefault(key, {"name": record["name"], "schedule": record["schedule"],
                                      "config": comparable_config(record["config"]), "fingerprint": fingerprint,
                                      "arms": {}, "records": []})
        if case["fingerprint"] != fingerprint:
            diff = config_diff(case["config"], comparable_config(record["config"]))
            raise RegressionInputError(f"{_where(record, index)}: case {key} appears with two different configs "
                                       f"among the records ({diff})")
        case["records"].append(record.get("id"))
        for arm in record["arms"]:
            figures = case["arms"].setdefault(arm["arm"], {})
            for figure, value in (arm.get("final") or {}).items():
                if tolerance_key(figure) is not None:
                    figures.setdefault(figure, []).append(_number(value))
    return cases


def config_diff(expected: dict, actual: dict, limit: int = 4) -> str:
    """A readable list of the first fields that differ between two flattened configs."""
    keys = sorted(set(expected) | set(actual))
    diffs = [f"{k}: baseline {expected.get(k, '<absent>')!r}, record {actual.get(k, '<absent>')!r}"
             for k in keys if expected.get(k, "<absent>") != actual.get(k, "<absent>")]
    more = f" and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return "; ".join(diffs[:limit]) + more if diffs else "no field differs"


# ----------------------------------------------------------------------------- baseline

def make_baseline(records: list[dict], commit: str | None = None) -> dict:
    """A baseline document from records (one preset and device); raises RegressionInputError."""
    if not records:
        raise RegressionInputError("no records to make a baseline from")
    presets = {r.get("preset") for r in records if isinstance(r, dict)}
    if len(presets) > 1:
        raise RegressionInputError(f"the records come from several presets {sorted(map(str, presets))}: a baseline "
                                   f"holds one preset; pass the records of one preset")
    devices = {device_kind(((r.get("config") or {}).get("run") or {}).get("device")) for r in records
               if isinstance(r, dict)}
    if len(devices) > 1:
        raise RegressionInputError(f"the records come from several devices {sorted(devices)}: a baseline holds one")
    cases = _pool(records)
    git = records[-1].get("git") or {}
    out_cases = {}
    for key, case in sorted(cases.items()):
        out_cases[key] = {
            "name": case["name"], "schedule": case["schedule"], "fingerprint": case["fingerprint"],
            "config": case["config"], "records": case["records"],
            "arms": {arm: {figure: _stats(values) for figure, values in sorted(figures.items())}
                     for arm, figures in sorted(case["arms"].items())},
        }
    return {
        "schema_version": BASELINE_SCHEMA_VERSION, "kind": "stability-baseline",
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "preset": presets.pop(), "device": devices.pop(),
        "commit": commit if commit is not None else git.get("commit"), "branch": git.get("branch"),
        "dirty": git.get("dirty"), "cases": out_cases,
    }


def _validate_baseline(baseline, where: str) -> dict:
    if not isinstance(baseline, dict) or baseline.get("kind") != "stability-baseline":
        raise RegressionInputError(f"{where} is not a stability baseline (no kind='stability-baseline'); make one "
                                   f"with `stability baseline update RECORDS... --out PATH`")
    version = baseline.get("schema_version")
    if version != BASELINE_SCHEMA_VERSION:
        raise RegressionInputError(f"{where} has schema_version={version!r}: this version of stability reads "
                                   f"baseline schema_version={BASELINE_SCHEMA_VERSION}; regenerate it")
    for key in ("preset", "device", "cases"):
        if key not in baseline:
            raise RegressionInputError(f"{where} has no {key!r} field (truncated?)")
    for name, case in baseline["cases"].items():
        if not isinstance(case, dict) or "arms" not in case or "fingerprint" not in case:
            raise RegressionInputError(f"{where}: case {name!r} lacks 'arms' or 'fingerprint'")
    return baseline


def load_baseline(path) -> dict:
    """Read and validate a baseline file; RegressionInputError (exit 2) with a clear message otherwise."""
    path = Path(path)
    if not path.is_file():
        raise RegressionInputError(f"baseline {str(path)!r} does not exist; create it with "
                                   f"`stability baseline update reports/runs/*.json --out {path}`")
    try:
        baseline = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RegressionInputError(f"baseline {str(path)!r} is not valid JSON (corrupt or truncated?): {error}") \
            from None
    return _validate_baseline(baseline, f"baseline {str(path)!r}")


def write_baseline(baseline: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(baseline, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------- tolerances

def resolve_tolerances(overrides: dict | None = None) -> dict[str, dict]:
    """The default table with per-figure overrides merged in; an unknown figure or key is an error."""
    table = copy.deepcopy(DEFAULT_TOLERANCES)
    for figure, entry in (overrides or {}).items():
        key = tolerance_key(figure, table)
        if key is None:
            raise RegressionInputError(f"tolerance for unknown figure {figure!r}: known figures and patterns are "
                                       f"{', '.join(table)}")
        if key != figure:   # a member of a family: its own entry, starting from the family's
            table[figure] = dict(table[key])
        if not isinstance(entry, dict):
            raise RegressionInputError(f"tolerance for {figure!r} must be a table of {TOLERANCE_KEYS}, "
                                       f"got {entry!r}")
        for key, value in entry.items():
            if key not in TOLERANCE_KEYS:
                raise RegressionInputError(f"tolerance {figure}.{key} is unknown: expected one of {TOLERANCE_KEYS}")
            if key == "better":
                if value not in ("lower", "higher"):
                    raise RegressionInputError(f"tolerance {figure}.better={value!r}: expected 'lower' or 'higher'")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
                    or not math.isfinite(value):
                raise RegressionInputError(f"tolerance {figure}.{key}={value!r}: expected a number >= 0")
            table[figure][key] = value
    return table


def load_tolerances(path) -> dict:
    """Read a JSON or TOML tolerance file ({figure: {abs, rel, k, better}}) and validate it."""
    path = Path(path)
    if not path.is_file():
        raise RegressionInputError(f"tolerance file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as error:  # tomllib.TOMLDecodeError, json.JSONDecodeError
        raise RegressionInputError(f"tolerance file {str(path)!r} cannot be parsed: {error}") from None
    if not isinstance(data, dict):
        raise RegressionInputError(f"tolerance file {str(path)!r} must hold a table of figures")
    resolve_tolerances(data)
    return data


# ----------------------------------------------------------------------------- the check

@dataclass
class Row:
    case: str
    arm: str
    figure: str
    better: str
    baseline: float | None
    current: float | None
    band: float | None
    verdict: str            # ok | regressed | improved | new | missing
    baseline_n: int = 0
    current_n: int = 0
    baseline_std: float = 0.0
    current_std: float = 0.0
    note: str = ""

    @property
    def delta(self) -> float | None:
        if self.baseline is None or self.current is None:
            return None
        return self.current - self.baseline

    def as_dict(self) -> dict:
        return {**self.__dict__, "delta": self.delta}


VERDICT_MARK = {"ok": "ok", "regressed": "REGRESSED", "improved": "improved", "new": "new", "missing": "missing"}


@dataclass
class CheckResult:
    rows: list[Row] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    baseline_commit: str | None = None
    preset: str | None = None
    device: str | None = None

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

    def _cells(self, row: Row) -> list[str]:
        band = f"±{fmt(row.band)}" if row.band is not None else "-"
        return [row.case, row.arm, row.figure, f"{row.better} better", fmt(row.baseline), fmt(row.current),
                fmt(row.delta), band, VERDICT_MARK[row.verdict] + (f" ({row.note})" if row.note else "")]

    HEADER: ClassVar[list[str]] = ["case", "arm", "figure", "direction", "baseline", "current", "delta", "band",
                                   "verdict"]

    def summary_line(self) -> str:
        counts = {v: sum(r.verdict == v for r in self.rows) for v in VERDICT_MARK}
        text = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        return (f"stability check: {self.verdict} (exit {self.exit_code}); preset {self.preset}, device "
                f"{self.device}, baseline commit {str(self.baseline_commit)[:12]}; {text or 'no figures compared'}")

    def table(self, only_changed: bool = False) -> str:
        rows = [r for r in self.rows if not only_changed or r.verdict != "ok"]
        cells = [self.HEADER] + [self._cells(r) for r in rows]
        out = [self.summary_line()] + [f"error: {e}" for e in self.errors] + [f"note: {n}" for n in self.notes]
        return "\n".join(out + (["", text_table(cells)] if rows else []))

    def markdown(self) -> str:
        icon = {0: ":white_check_mark:", 1: ":x:", 2: ":warning:"}[self.exit_code]
        out = [f"### Stability check: {icon} {self.verdict}", "",
               (f"Preset `{self.preset}`, device `{self.device}`, baseline from commit "
                f"`{str(self.baseline_commit)[:12]}`. Band = max(abs, rel × |baseline|, k × seed std)."), ""]
        out += [f"- **error:** {e}" for e in self.errors]
        out += [f"- note: {n}" for n in self.notes]
        if self.regressed:
            out += ["", f"**{len(self.regressed)} figure(s) regressed:** " + ", ".join(
                f"`{r.case}` {r.arm} {r.figure}" for r in self.regressed)]
        if self.rows:
            out += ["", "| " + " | ".join(self.HEADER) + " |", "|" + "---|" * len(self.HEADER)]
            for row in self.rows:
                cells = self._cells(row)
                if row.verdict == "regressed":
                    cells[-1] = f"**{cells[-1]}**"
                out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        return "\n".join(out) + "\n"

    def to_dict(self) -> dict:
        return {"exit_code": self.exit_code, "verdict": self.verdict, "errors": self.errors, "notes": self.notes,
                "baseline_commit": self.baseline_commit, "rows": [r.as_dict() for r in self.rows]}


def _compare(case: str, arm: str, figure: str, tol: dict, base: dict, values: list) -> Row:
    cur = _stats(values)
    better = tol["better"]
    row = Row(case, arm, figure, better, base.get("mean"), cur["mean"], None, "ok", base.get("n", 0), cur["n"],
              base.get("std") or 0.0, cur["std"])
    if row.baseline is None:
        row.verdict, row.note = "new", "no finite baseline value"
        return row
    nonfinite = sum(v is None for v in values)
    row.band = max(tol["abs"], tol["rel"] * abs(row.baseline), tol["k"] * max(row.baseline_std, row.current_std))
    if nonfinite and base.get("n", 0) == len(base.get("values", [])):
        row.verdict, row.note = "regressed", f"non-finite in {nonfinite}/{len(values)} seeds"
        return row
    if row.current is None:
        row.verdict, row.note = "regressed", "no finite value"
        return row
    worse = row.current - row.baseline if better == "lower" else row.baseline - row.current
    if worse > row.band:
        row.verdict = "regressed"
    elif -worse > row.band:
        row.verdict = "improved"
    return row


def check(records: list[dict], baseline: dict, tolerances: dict | None = None) -> CheckResult:
    """Compare records with a baseline. Unusable inputs give exit_code 2 with ``errors`` (never a silent pass);
    an invalid tolerance table raises RegressionInputError."""
    table = resolve_tolerances(tolerances)
    result = CheckResult()
    try:
        _validate_baseline(baseline, "baseline")
    except RegressionInputError as error:
        result.errors.append(str(error))
        return result
    result.baseline_commit, result.preset, result.device = baseline.get("commit"), baseline["preset"], \
        baseline["device"]
    if not records:
        result.errors.append("no records to check")
        return result
    for index, record in enumerate(records):
        where = _where(record, index) if isinstance(record, dict) else f"record #{index + 1}"
        try:
            _validate_record(record, where)
        except RegressionInputError as error:
            result.errors.append(str(error))
            continue
        if record["preset"] != baseline["preset"]:
            result.errors.append(f"{where}: preset differs: baseline preset {baseline['preset']!r}, record preset "
                                 f"{record['preset']!r}; compare with reports/baselines/{record['preset']}-"
                                 f"{device_kind(record['config'].get('run', {}).get('device'))}.json")
        device = device_kind((record["config"].get("run") or {}).get("device"))
        if device != baseline["device"]:
            result.errors.append(f"{where}: device differs: baseline device {baseline['device']!r}, record device "
                                 f"{device!r}")
    if result.errors:
        return result
    try:
        cases = _pool(records)
    except RegressionInputError as error:
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
        if base["fingerprint"] != case["fingerprint"]:
            result.errors.append(f"case {key}: model/run config differs from the baseline's: "
                                 f"{config_diff(base.get('config', {}), case['config'])}")
            continue
        for arm in sorted(set(base["arms"]) | set(case["arms"])):
            base_figures, figures = base["arms"].get(arm, {}), case["arms"].get(arm, {})
            for figure in _figure_order(set(base_figures) | set(figures)):
                tol = table[tolerance_key(figure, table)]
                if figure in base_figures and figure in figures:
                    result.rows.append(_compare(key, arm, figure, tol, base_figures[figure], figures[figure]))
                elif figure in base_figures and base_figures[figure].get("mean") is not None:
                    result.rows.append(Row(key, arm, figure, tol["better"], base_figures[figure]["mean"],
                                           None, None, "missing", base_figures[figure]["n"], 0,
                                           note="not in the records"))
                elif figure in figures:
                    stats = _stats(figures[figure])
                    result.rows.append(Row(key, arm, figure, tol["better"], None, stats["mean"], None,
                                           "new", 0, stats["n"], note="not in the baseline"))
    missing = sorted(set(base_cases) - set(cases))
    if missing:
        result.notes.append(f"baseline case(s) without a current record (not compared): {', '.join(missing)}")
    if not result.rows and not result.errors:
        result.errors.append("no record matched a baseline case: nothing was compared (cases in the records: "
                             f"{sorted(cases)}; in the baseline: {sorted(base_cases)})")
    return result


def load_records(paths) -> list[dict]:
    """Read record files (directories are searched for *.json); RegressionInputError on the first bad one."""
    files: list[Path] = []
    for item in paths:
        p = Path(item)
        files.extend(sorted(p.glob("*.json")) if p.is_dir() else [p])
    if not files:
        raise RegressionInputError(f"no record files found in {[str(p) for p in paths]}")
    return [load_record(p) for p in files]


def write_step_summary(result: CheckResult, path: str | None = None) -> Path | None:
    """Append the Markdown verdict to $GITHUB_STEP_SUMMARY (or ``path``) when set."""
    target = path or os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    with open(target, "a") as handle:
        handle.write(result.markdown() + "\n")
    return Path(target)


def baseline_from_mlflow(branch: str, tracking_uri: str | None = None, preset: str | None = None,
                         device: str | None = None) -> dict:
    """A baseline from the JSON records of the latest parent run per case tagged git.branch=BRANCH."""
    from stability.tracking import fetch_records

    try:
        records = fetch_records(branch=branch, tracking_uri=tracking_uri, preset=preset)
    except RegressionInputError:
        raise
    except Exception as error:  # noqa: BLE001  (the store is the input here: any failure -> unusable input)
        raise RegressionInputError(f"cannot read baseline runs for branch {branch!r} from the tracking store: "
                                   f"{type(error).__name__}: {str(error).splitlines()[0][:300]}") from None
    if device is not None:
        records = [r for r in records
                   if device_kind(((r.get("config") or {}).get("run") or {}).get("device")) == device_kind(device)]
    if not records:
        raise RegressionInputError(f"no parent run tagged git.branch={branch!r}"
                                   f"{f' with preset {preset!r}' if preset else ''} holds a JSON record in the "
                                   f"tracking store")
    return make_baseline(records)


# ----------------------------------------------------------------------------- command line

DEFAULT_RECORD_GLOB = "reports/runs"


def _record_paths(items: list[str] | None) -> list[str]:
    return list(items) if items else [DEFAULT_RECORD_GLOB]


def cmd_check(args) -> int:
    """`stability check`: table on stdout, Markdown to $GITHUB_STEP_SUMMARY / --markdown; exit 0/1/2."""
    import sys

    try:
        records = load_records(_record_paths(args.records))
        tolerances = load_tolerances(args.tolerances) if args.tolerances else None
        if args.from_mlflow:
            first = records[0]
            baseline = baseline_from_mlflow(args.from_mlflow, args.tracking_uri, preset=first.get("preset"),
                                            device=(first.get("config", {}).get("run") or {}).get("device"))
        else:
            if not args.baseline:
                raise RegressionInputError("give --baseline PATH (e.g. reports/baselines/smoke-cpu.json) or "
                                           "--from-mlflow BRANCH")
            baseline = load_baseline(args.baseline)
        result = check(records, baseline, tolerances)
    except RegressionInputError as error:
        result = CheckResult(errors=[str(error)])
    print(result.table(only_changed=args.changed_only))
    summary = write_step_summary(result, args.markdown)
    if summary is not None:
        print(f"markdown summary appended to {summary}", file=sys.stderr)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=1))
    return result.exit_code


def cmd_baseline_update(args) -> int:
    import sys

    from stability.experiment import git_info

    try:
        records = load_records(_record_paths(args.records))
        baseline = make_baseline(records, commit=args.commit or git_info().get("commit"))
    except RegressionInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else default_baseline_path(baseline["preset"], baseline["device"])
    write_baseline(baseline, out)
    cases = ", ".join(f"{k} (n={max((s['n'] for f in c['arms'].values() for s in f.values()), default=0)})"
                      for k, c in baseline["cases"].items())
    print(f"baseline written: {out} (preset {baseline['preset']}, device {baseline['device']}, commit "
          f"{str(baseline['commit'])[:12]}; cases: {cases})")
    return 0


def add_check_parsers(sub) -> None:
    """Register `check` and `baseline update` on the `stability` subparsers."""
    chk = sub.add_parser("check", help="compare records with a baseline (exit 0 ok, 1 regressed, 2 unusable)")
    chk.add_argument("records", nargs="*", help=f"record files or directories (default {DEFAULT_RECORD_GLOB}/)")
    chk.add_argument("--baseline", help="baseline JSON, e.g. reports/baselines/<preset>-<device>.json")
    chk.add_argument("--from-mlflow", metavar="BRANCH",
                     help="take the baseline from the latest parent runs tagged git.branch=BRANCH")
    chk.add_argument("--tracking-uri", help="MLflow tracking URI for --from-mlflow")
    chk.add_argument("--tolerances", help="JSON or TOML tolerance overrides {figure: {abs, rel, k, better}}")
    chk.add_argument("--markdown", help="also append the Markdown summary here (default $GITHUB_STEP_SUMMARY)")
    chk.add_argument("--json", help="write the verdict rows as JSON here")
    chk.add_argument("--changed-only", action="store_true", help="table rows only for figures not 'ok'")
    chk.set_defaults(func=cmd_check)

    base = sub.add_parser("baseline", help="manage regression baselines")
    base_sub = base.add_subparsers(dest="baseline_command", required=True)
    upd = base_sub.add_parser("update", help="write a baseline from records")
    upd.add_argument("records", nargs="*", help=f"record files or directories (default {DEFAULT_RECORD_GLOB}/)")
    upd.add_argument("--out", help="baseline file (default reports/baselines/<preset>-<device>.json)")
    upd.add_argument("--commit", help="commit the baseline comes from (default: git HEAD)")
    upd.set_defaults(func=cmd_baseline_update)
