"""Records of an older schema, read as the current schema holds them.

    upgraded(record)     a record of schema 2 or 3 as schema 4 (a new dict); any other record as it is
    upgraded_baseline(b) a baseline of schema 6 as schema 7 (a new dict); any other document as it is
    upgraded_invariant(l) an invariant line of before "case_key" with today's names (a new dict)
    upgraded_run(entry)  one run's entry of schema 2 (a line of its per-step file, say) with the new names
    upgraded_run_name(n) "baseline-seed0-lr0.01" -> "reference-seed0-lr0.01"

Schema 2 -> 3: the reference arm, named "baseline" until then, is named "reference" ("baseline" names the
document a job is judged against, ``stability.check.baseline``). So in a schema 2 record the arm's name
(``arms[].arm``, ``runs[].arm``, ``config.arms[].name``, the ``arm`` of a case's own results), the start of
its runs' names and keys ("baseline-seed0-..."), the arm in a Ray unit's name, and a paired figure's
field holding the reference arm's mean ("baseline") are renamed; the gate variant of a run without a
gate, "baseline", is "ungated". Files on disk keep their names: a ``steps_file`` or bundle ``path`` still
points at them. A record of schema 2 has no "run_steps" either: ``stability.record.case_steps`` reads
it through the setting that held it.

Schema 3 -> 4: a case record names its case by the words for it: the case's name under "case" (was
"stress"; absent in the oldest records, "pair" before the plain pair was called "standard": both mean
"standard") and its label under "case_label" (was "schedule", the word an arm record keeps for the
schedule its run trained under). Baseline schema 6 -> 7: a baseline's case entry likewise ("stress" ->
"case", "schedule" -> "case_label"), and each of its invariant lines, as every invariant line written
before: the case key it names under "case_key" (was "case", the word that now holds a case's name).

The record or baseline on disk is never rewritten.
"""

from __future__ import annotations

import copy

from stability.config import OLD_REFERENCE_ARM, REFERENCE_ARM, current_arm_name
from stability.config.run import UNGATED
from stability.record.identity import STANDARD
from stability.record.schema import RESULTS_BEFORE_THE_SLOT

OLD_UNGATED = "baseline"      # the gate variant of a run without a gate, until schema 3
OLD_CASE_NAMES = {"pair": STANDARD}   # a case's name before the plain pair was called "standard"


def upgraded_run_name(name):
    """"baseline-seed0-lr0.01-1a2b3c4d" -> "reference-seed0-lr0.01-1a2b3c4d"; other names as they are."""
    if isinstance(name, str) and name.startswith(f"{OLD_REFERENCE_ARM}-"):
        return REFERENCE_ARM + name[len(OLD_REFERENCE_ARM):]
    return name


def _unit_name(name):
    """"lr_sweep/baseline/seed0/lr=0.01" -> "lr_sweep/reference/seed0/lr=0.01"."""
    if not isinstance(name, str):
        return name
    return "/".join(current_arm_name(part) if index == 1 else part for index, part in enumerate(name.split("/")))


def _run_entry(entry: dict) -> None:
    """An arm record, a run summary or a run of a session, in place."""
    if not isinstance(entry, dict):
        return
    if "arm" in entry:
        entry["arm"] = current_arm_name(entry["arm"])
    if entry.get("variant") == OLD_UNGATED:
        entry["variant"] = UNGATED
    for key in ("run_name", "run_key", "name"):
        if key in entry:
            entry[key] = upgraded_run_name(entry[key])
    if isinstance(entry.get("unit"), dict) and "name" in entry["unit"]:
        entry["unit"]["name"] = _unit_name(entry["unit"]["name"])


def upgraded_run(entry):
    """A copy of one run's entry of schema 2 (an arm record, a run summary, a line of its per-step file, which
    may hold its arm record under "record") with the reference arm's names of schema 3; any other value as
    it is."""
    if not isinstance(entry, dict):
        return entry
    out = copy.deepcopy(entry)
    _run_entry(out)
    if isinstance(out.get("record"), dict):
        _run_entry(out["record"])
    return out


def _results(result) -> None:
    """A case's own results, in place: the ``arm`` of its per-arm entries and runs."""
    if isinstance(result, dict):
        for value in result.values():
            if isinstance(value, list):
                for item in value:
                    _run_entry(item)


def _reference_named(out: dict) -> None:
    """Schema 2 -> 3, in place: the reference arm named "reference"."""
    out["schema_version"] = 3
    config = out.get("config")
    if isinstance(config, dict) and isinstance(config.get("arms"), list):
        for arm in config["arms"]:
            if isinstance(arm, dict) and "name" in arm:
                arm["name"] = current_arm_name(arm["name"])
    for key in ("arms", "runs", "replay_bundles"):
        for entry in out.get(key) or []:
            _run_entry(entry)
    if isinstance(out.get("replay_bundles"), list) and all(isinstance(b, dict) for b in out["replay_bundles"]):
        # listed as this schema's writer lists them: by run key, then step (the renamed keys sort elsewhere)
        out["replay_bundles"].sort(key=lambda b: (str(b.get("run_key")), b.get("step") or 0))
    for table in (out["paired"].values() if isinstance(out.get("paired"), dict) else ()):
        for figure, summary in (table.items() if isinstance(table, dict) else ()):
            if isinstance(summary, dict):     # the reference arm's mean: "baseline" -> "reference", in place
                table[figure] = {("reference" if k == "baseline" else k): v for k, v in summary.items()}
    results = out.get("results")
    for result in (results.values() if isinstance(results, dict) else ()):
        _results(result)
    for case in RESULTS_BEFORE_THE_SLOT:
        _results(out.get(case))
    tracking = out.get("tracking")
    if isinstance(tracking, dict):
        if isinstance(tracking.get("child_run_ids"), dict):
            tracking["child_run_ids"] = {upgraded_run_name(k): v for k, v in tracking["child_run_ids"].items()}
        if isinstance(tracking.get("complete_children"), list):
            tracking["complete_children"] = [upgraded_run_name(k) for k in tracking["complete_children"]]
    ray = out.get("ray")
    if isinstance(ray, dict):
        for unit in ray.get("units") or []:
            if isinstance(unit, dict) and "name" in unit:
                unit["name"] = _unit_name(unit["name"])


def _case_words(entry: dict) -> dict:
    """A case record of schema 3, or a baseline's case entry of schema 6, with its case's name under "case"
    and its label under "case_label" (the other keys in their order)."""
    out = {}
    for key, value in entry.items():
        if key == "schedule":
            out["case_label"] = value
        elif key == "stress":
            out["case"] = OLD_CASE_NAMES.get(value, value or STANDARD)
        else:
            out[key] = value
    out.setdefault("case", STANDARD)
    return out


def upgraded(record):
    """``record`` as the current schema holds it (see the module docstring); a record of another schema
    (this schema's, or one this version cannot read: validation names it) is returned as it is."""
    if not isinstance(record, dict) or record.get("schema_version") not in (2, 3):
        return record
    out = copy.deepcopy(record)
    if out["schema_version"] == 2:
        _reference_named(out)
    out = _case_words(out)
    out["schema_version"] = 4
    return out


OLD_BASELINE_KEYS = {"draws": "replicates"}   # a baseline's keys before their rename (any schema)


def _renamed(value, names: dict[str, str] = OLD_BASELINE_KEYS):
    """``value`` with every key of ``names`` (old -> new) under its new name, in the same place; a dict holding
    both names of one key keeps the old one, which validation then refuses."""
    if not isinstance(value, dict):
        return value
    return {names[k] if k in names and names[k] not in value else k: v for k, v in value.items()}


def upgraded_invariant(line):
    """An invariant line (``stability.record.invariants``) with today's names: the case key under "case_key"
    (was "case"), the reference arm "reference" (was "baseline"), in a copy; anything else as it is."""
    if not isinstance(line, dict):
        return line
    out = _renamed(line, {"case": "case_key"})
    if isinstance(out.get("arm"), str):
        out["arm"] = current_arm_name(out["arm"])
    return out


def upgraded_baseline(baseline):
    """``baseline`` (an object read from a baseline file) as the current baseline schema holds it: renamed
    keys (``OLD_BASELINE_KEYS``, at the top level and in the calibration) under their names of today; of
    schema 6, schema 7, whose case entries name their case by "case" and "case_label". Any other document as
    it is (validation names what is wrong with it)."""
    if not isinstance(baseline, dict):
        return baseline
    out = _renamed(baseline)
    if "calibration" in out:
        out["calibration"] = _renamed(out["calibration"])
    if out.get("schema_version") != 6:
        return out
    out["schema_version"] = 7
    if isinstance(out.get("cases"), dict):
        out["cases"] = {key: _case_words(case) if isinstance(case, dict) else case
                        for key, case in out["cases"].items()}
    if isinstance(out.get("invariants"), list):
        out["invariants"] = [upgraded_invariant(line) for line in out["invariants"]]
    return out
