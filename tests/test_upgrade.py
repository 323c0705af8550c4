"""Records, overrides and invariants of the time the reference arm was named "baseline" (record schema 2)
still read: as the reference arm named "reference", never as a run of another arm. Records of schema 3 and
baselines of schema 6, which named a case's name "stress" and its label "schedule", read with the case's
words ("case", "case_label")."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest
from _stability_records import as_schema_3, pair_record, with_replicates

from stability.check import baseline as baselines
from stability.check.baseline_schema import BASELINE_SCHEMA_VERSION, load_baseline
from stability.check.regression import check
from stability.config import ConfigError, resolve
from stability.record import RecordError, read_record, upgraded, validate_record
from stability.record.invariants import read_invariants
from stability.record.upgrade import upgraded_run, upgraded_run_name

# a null job kept before the rename (once reports/null/smoke/draw10.json.xz), kept here as this test's data
KEPT = Path(__file__).resolve().parent / "data" / "schema-2-null-job.json.xz"


@pytest.fixture(scope="module")
def schema_2_records() -> list[dict]:
    """The records of a null job kept before the rename (schema 2, the reference arm named "baseline")."""
    records = json.loads(lzma.decompress(KEPT.read_bytes()))["records"]
    assert {r["schema_version"] for r in records} == {2} and any(a["arm"] == "baseline" for a in records[0]["arms"])
    return records


def test_a_schema_2_record_reads_with_the_reference_arm_renamed(schema_2_records, tmp_path):
    for old in schema_2_records:
        path = tmp_path / f"{old['stress']}.json"
        path.write_text(json.dumps(old))
        new = read_record(path)
        assert new["schema_version"] == 4 and "baseline" not in {a["arm"] for a in new["arms"]}
        assert (new["case"], new["case_label"]) == (old["stress"], old["schedule"]) and "stress" not in new
        assert [a["arm"] for a in new["arms"]] == [
            "reference" if a["arm"] == "baseline" else a["arm"] for a in old["arms"]]
        assert new["config"]["arms"][0]["name"] == "reference"
        for before, after in zip(old["arms"], new["arms"]):
            assert after["final"] == before["final"] and after["seed"] == before["seed"]   # figures as they were
            assert after["run_key"] == before["run_key"].replace("baseline-", "reference-", 1)
            assert after["variant"] == ("ungated" if before["variant"] == "baseline" else before["variant"])
        for arm, table in new["paired"].items():
            for figure, summary in table.items():
                was = old["paired"][arm][figure]
                assert "baseline" not in summary and summary["reference"] == was["baseline"], figure
        for before, after in zip(old.get("runs") or [], new.get("runs") or []):
            assert after["steps_file"] == before["steps_file"]        # the file on disk keeps its name
    assert json.loads(path.read_text())["schema_version"] == 2           # the file itself is never rewritten


def test_a_current_record_and_other_values_pass_through_unchanged():
    record = pair_record()
    assert upgraded(record) is record and upgraded([1]) == [1] and upgraded(None) is None
    assert upgraded_run_name("baseline-seed0-lr0.01-1a2b3c4d") == "reference-seed0-lr0.01-1a2b3c4d"
    assert upgraded_run_name("gated_baseline-seed0") == "gated_baseline-seed0"
    line = {"run_key": "baseline-seed1-00ff00ff", "arm": "baseline", "record": {"arm": "baseline", "variant": "baseline"}}
    assert upgraded_run(line) == {"run_key": "reference-seed1-00ff00ff", "arm": "reference",
                                  "record": {"arm": "reference", "variant": "ungated"}}
    assert line["arm"] == "baseline"                                     # a copy: the line read is left alone


def test_a_job_of_schema_2_records_is_judged_against_a_baseline_of_today(schema_2_records):
    """A kept job's records, read as today's, are judged like today's: against a baseline made from them they
    pass, and with the reference arm's held-out loss raised 20% they fail on that row."""
    records = [upgraded(r) for r in schema_2_records if r["stress"] == "standard"]
    for record in records:
        validate_record(record, "the kept record")
    current = pair_record()
    baseline = baselines.make_baseline(with_replicates(current))
    assert check([current], baseline).exit_code == 0
    old = json.loads(json.dumps(as_schema_3(current)).replace('"reference"', '"baseline"'))   # the same job, before
    old["schema_version"] = 2
    for arm in old["arms"]:
        arm["variant"] = "baseline" if arm["arm"] == "baseline" else arm["variant"]
    assert check([upgraded(old)], baseline).exit_code == 0
    for arm in old["arms"]:
        if arm["arm"] == "baseline":
            arm["final"]["heldout_loss"] *= 1.2
    result = check([upgraded(old)], baseline)
    assert result.exit_code == 1 and [(r.arm, r.figure) for r in result.regressed][:1] == [("reference", "heldout_loss")]
    with pytest.raises(RecordError, match="schema_version=2 is unknown"):
        validate_record(old, "a schema 2 record not read through stability.record.upgraded")


def test_a_schema_3_record_reads_with_its_case_named_by_case_and_case_label(tmp_path):
    """A kept null job's record (schema 3: "stress", "schedule"), read: the case's name under "case", its label
    under "case_label", every other key as it was, in its place; the file is left as it was."""
    kept = Path(__file__).resolve().parents[1] / "reports" / "null" / "smoke" / "draw100.json.xz"
    old = next(r for r in json.loads(lzma.decompress(kept.read_bytes()))["records"] if r["stress"] == "batch_ramp")
    assert old["schema_version"] == 3
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    new = read_record(path)
    assert (new["schema_version"], new["case"], new["case_label"]) == (4, "batch_ramp", old["schedule"])
    assert [k for k in new if not k.startswith("_")] == [
        {"stress": "case", "schedule": "case_label"}.get(k, k) for k in old]
    assert all(new[k] == old[k] for k in old if k not in ("stress", "schedule", "schema_version"))
    assert json.loads(path.read_text()) == old
    assert upgraded(as_schema_3(pair_record(), stress="pair"))["case"] == "standard"   # the plain pair's old name


def test_a_schema_6_baseline_reads_with_its_cases_named_by_case_and_case_label():
    """The committed smoke baseline (schema 6) loads as schema 7: each case entry's "stress" is its "case",
    its "schedule" its "case_label", and a job of today is judged against it."""
    path = Path(__file__).resolve().parents[1] / "reports" / "baselines" / "smoke-cpu.json"
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 6
    loaded = load_baseline(path)
    assert loaded["schema_version"] == BASELINE_SCHEMA_VERSION == 7
    for key, case in raw["cases"].items():
        new = loaded["cases"][key]
        assert (new["case"], new["case_label"]) == (case["stress"], case["schedule"]) and "stress" not in new
        assert key == f"{new['name']}/{new['case_label']}"


def test_the_old_name_still_selects_the_reference_arm_in_overrides_and_no_arm_may_take_it():
    assert resolve("smoke", {"arms": "baseline,gated"}).arm_names == ("reference", "gated")
    assert resolve("smoke", {"arms.baseline.qk_norm": True}).arm("reference").qk_norm is True
    assert resolve("smoke", {"baseline_gate.position": "G2", "gated_gate.position": "G1"}).arm(
        "reference").gate.position == "G2"
    from stability.config import ArmConfig

    with pytest.raises(ConfigError, match="'baseline' names the document a job is judged against"):
        ArmConfig("baseline")


def test_an_invariant_recorded_for_the_old_name_reads_as_the_reference_arm(tmp_path):
    line = {"case": "smoke/standard", "name": "loss_falls", "arm": "baseline", "seed": 0, "held": True,
            "value": 0.5, "bound": 1.0, "message": "", "test": "suites/x.py::t"}
    (tmp_path / "invariants-main.jsonl").write_text(json.dumps(line) + "\n")
    assert [(i["arm"], i["case_key"]) for i in read_invariants(tmp_path)] == [("reference", "smoke/standard")]
    assert all("case" not in i for i in read_invariants(tmp_path))     # the key under its own word, once
