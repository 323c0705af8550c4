"""Malformed input is refused, never crashed on: records, baselines, invariants files and JUnit XML are data.

Every command that reads them (``check``, ``report``, ``baseline update``, ``baseline calibrate``, ``run
--resume``) answers a malformed file with exit 2 and one ``error:`` line on stderr naming the file, and
writes nothing (no --json verdict, no baseline, no report). Hypothesis mutates real inputs: the records of
a real (tiny) ``stability run``, the baseline ``baseline update`` makes of them, and the committed baselines.
Two kinds of mutation: those that always make the input invalid (a wrong type, a missing or extra key,
a truncation: exit 2 is required), and any mutation at all (the input may stay valid: exit 0 or 1 is fine,
a traceback never is).
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stability.check.baseline_schema import Baseline, BaselineArm, BaselineCase, load_baseline
from stability.cli import main
from stability.record import Status
from stability.record import figures as fig
from stability.record.invariants import FIELDS, invariant_line
from stability.record.schema import CaseRecord
from stability.record.validate import _fields

REPO = Path(__file__).resolve().parents[1]
COMMITTED = sorted((REPO / "reports" / "baselines").glob("*.json"))
TINY = ["--preset", "smoke", "--no-track", "--quiet", "--set", "steps=8", "--set", "probes.every=4",
        "--set", "probes.eval_batches=1", "--set", "seeds=0,1,2"]
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])

# values that are wrong wherever a number, a string, an object or a list is expected
WRONG = ["3.2", "x", [], [1, 2], {}, {"a": 1}, True, None, -1, 0, 1.5, 10 ** 30, -10 ** 20, 1e308, [[[[[]]]]]]


# ----------------------------------------------------------------------------- real inputs

@dataclass
class Real:
    root: Path
    sessions: list[Path]     # the run directories of replicates 0, 1 and 2
    baseline: Path           # the baseline `baseline update` made of them

    def record(self, replicate: int = 0) -> Path:
        return next(p for p in self.sessions[replicate].glob("*.json") if p.name != "manifest.json")


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Real:
    """Three rounding replicates of a real 8-step run of three seeds, and the baseline made of them."""
    root = tmp_path_factory.mktemp("real")
    sessions = []
    for replicate in range(3):
        out = root / f"replicate{replicate}"
        assert main(["run", *TINY, "--set", f"replicate={replicate}", "--out", str(out)]) == 0
        sessions.append(next(out.iterdir()))
    baseline = root / "baseline.json"
    assert main(["baseline", "update", *map(str, sessions), "--out", str(baseline), "--allow-dirty",
                 "--accept-calibration"]) == 0
    return Real(root, sessions, baseline)


_count = itertools.count()


def fresh(real: Real) -> Path:
    """A new empty directory for one example."""
    path = real.root / f"example{next(_count)}"
    path.mkdir()
    return path


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``stability ARGV`` in this process; a traceback fails the test."""
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def refused(code: int, err: str, named: Path, unwritten: list[Path]) -> None:
    """Exit 2, one ``error:`` line naming ``named``, and none of ``unwritten`` written."""
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert named.name in lines[0], (named.name, lines[0])
    for path in unwritten:
        assert not path.exists(), path


def refused_or_judged(code: int, err: str, named: Path, unwritten: list[Path]) -> None:
    """An input that may still be valid: judged (exit 0, 1, or 3 for a figure or setting that moved), or refused
    as ``refused`` says."""
    assert code in (0, 1, 2, 3), code
    if code == 2:
        refused(code, err, named, unwritten)


def dump(document, path: Path) -> Path:
    """``document`` as JSON text (NaN and Infinity as the literals a careless writer leaves)."""
    path.write_text(json.dumps(document, allow_nan=True))
    return path


# ----------------------------------------------------------------------------- mutations

def places(document, at=()) -> list[tuple]:
    """The path (keys and indexes) of every value in ``document``."""
    found = [at]
    if isinstance(document, dict):
        for key, value in document.items():
            found += places(value, (*at, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += places(value, (*at, index))
    return found


def holder(document, at: tuple):
    for key in at[:-1]:
        document = document[key]
    return document


def replace(document, at: tuple, value):
    out = copy.deepcopy(document)
    if not at:
        return value
    holder(out, at)[at[-1]] = value
    return out


def delete(document, at: tuple):
    out = copy.deepcopy(document)
    del holder(out, at)[at[-1]]
    return out


def any_mutation(document):
    """A strategy of documents: ``document`` with one value replaced, one key or item removed, or one key added,
    anywhere (the result may still be valid)."""
    paths = places(document)
    containers = [p for p in paths if isinstance(holder(document, (*p, None)) if p else document, (dict, list))]

    def removed(at):
        return delete(document, at)

    def added(at, value):
        out = copy.deepcopy(document)
        target = holder(out, (*at, None)) if at else out
        if isinstance(target, dict):
            target["surplus_key"] = value
        else:
            target.append(value)
        return out
    return st.one_of(
        st.builds(replace, st.just(document), st.sampled_from(paths), st.sampled_from(WRONG + [math.nan, math.inf])),
        st.builds(removed, st.sampled_from([p for p in paths if p])),
        st.builds(added, st.sampled_from(containers), st.sampled_from(WRONG)),
    )


def truncated(text: str):
    """``text`` cut before its last closing bracket: never JSON."""
    end = text.rstrip().rfind("}")
    return st.integers(1, end - 1).map(lambda n: text[:n])


def deeply_nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# ----------------------------------------------------------------------------- baselines

def baseline_paths(baseline: dict) -> dict[str, list[tuple]]:
    """Where a baseline can be made invalid, by what is wrong there."""
    cases = baseline["cases"]
    arms = [("cases", c, "arms", a) for c in cases for a in cases[c]["arms"]]
    values = [(("cases", c, "arms", a, "figures", f, s, d), cases[c]["arms"][a]["status"][s][d])
              for c in cases for a in cases[c]["arms"] for f, per in cases[c]["arms"][a]["figures"].items()
              for s in per for d in per[s]]
    return {
        "required": [(k,) for k in sorted(Baseline.__required_keys__)]
        + [("cases", c, k) for c in cases for k in sorted(BaselineCase.__required_keys__)]
        + [(*a, k) for a in arms for k in sorted(BaselineArm.__required_keys__)],
        "containers": [()] + [("cases", c) for c in cases] + arms,
        "figures": [at for at, _ in values],
        "completed_measures": [at for at, status in values if status == Status.COMPLETED
                               and fig.figure(at[5]).needs_completed_arm and fig.figure(at[5]).name == at[5]],
        "not_outcomes": [at for at, _ in values if fig.figure(at[5]).quantum != "seed"],
        "seeds": [(*a, "status", s) for a in arms for s in holder(baseline, (*a, "status", None))],
        "statuses": [(*a, "status", s, d) for a in arms for s, per in holder(baseline, (*a, "status", None)).items()
                     for d in per],
        "steps": [("cases", c, "steps") for c in cases],
    }


def invalid_baseline(baseline: dict):
    """A strategy of baselines (documents) that are always invalid."""
    at = baseline_paths(baseline)
    not_a_number = st.sampled_from(["3.2", "x", [], [1, 2], {}, {"a": 1}, [[[[]]]]])
    return st.one_of(
        st.builds(delete, st.just(baseline), st.sampled_from(at["required"] + at["seeds"] + at["statuses"])),
        st.builds(lambda where, value: replace(baseline, (*where, "surplus_key"), value),
                  st.sampled_from(at["containers"]), st.sampled_from(WRONG)),
        st.builds(replace, st.just(baseline), st.sampled_from(at["figures"]), not_a_number),
        st.builds(replace, st.just(baseline), st.sampled_from(at["not_outcomes"]), st.booleans()),
        st.builds(replace, st.just(baseline), st.sampled_from(at["completed_measures"]),
                  st.sampled_from([None, math.nan, math.inf, -math.inf])),
        st.builds(replace, st.just(baseline), st.sampled_from(at["statuses"]),
                  st.sampled_from(["running", "killed", "error", "x", 1, None, True])),
        st.builds(replace, st.just(baseline), st.sampled_from(at["steps"]),
                  st.sampled_from(["sixty", 0, -5, 1.5, True, None, [60]])),
        st.builds(replace, st.just(baseline), st.just(("min_seeds",)), st.sampled_from([0, -1, "3", 1.5, True, None])),
        st.builds(replace, st.just(baseline), st.just(("replicates",)),
                  st.sampled_from([[], [0, 0, 1], [-1, 0], "0,1", [0.5, 1], None, {"0": 0}])),
        st.builds(replace, st.just(baseline), st.just(("cases",)), st.sampled_from([[], {}, "x", None, 3])),
        st.builds(replace, st.just(baseline), st.sampled_from([("preset",), ("device",)]),
                  st.sampled_from([7, None, [], {}, True])),
        st.builds(replace, st.just(baseline), st.just(("calibration",)), st.sampled_from(["x", [], 3, True, {}])),
    )


@pytest.fixture(scope="module")
def real_baseline(real) -> dict:
    return json.loads(real.baseline.read_text())


@FUZZ
@given(data=st.data())
def test_an_invalid_baseline_is_refused_by_check_report_and_calibrate(real, real_baseline, data, capsys):
    here = fresh(real)
    bad = dump(data.draw(invalid_baseline(real_baseline)), here / "baseline.json")
    before = bad.read_bytes()
    command = data.draw(st.sampled_from(["check", "report", "calibrate"]))
    if command == "check":
        code, _, err = run(["check", "--baseline", str(bad), str(real.record()), "--json", str(here / "v.json")], capsys)
        refused(code, err, bad, [here / "v.json"])
    elif command == "report":
        code, _, err = run(["report", str(real.record()), "--baseline", str(bad), "--out", str(here / "r.html")],
                           capsys)
        refused(code, err, bad, [here / "r.html", here / "r.md"])
    else:
        code, _, err = run(["baseline", "calibrate", str(bad), "--write", "--accept-calibration"], capsys)
        refused(code, err, bad, [])
        assert bad.read_bytes() == before


@pytest.mark.parametrize("committed", COMMITTED, ids=lambda p: p.name)
def test_the_committed_baselines_load_whole(committed):
    assert load_baseline(committed)["kind"] == "stability-baseline"


@pytest.fixture(scope="module")
def committed_baselines() -> list[dict]:
    return [json.loads(path.read_text()) for path in COMMITTED]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_an_invalid_committed_baseline_is_refused(real, committed_baselines, data, capsys):
    document = data.draw(st.sampled_from(committed_baselines))
    here = fresh(real)
    bad = dump(data.draw(invalid_baseline(document)), here / "committed.json")
    code, _, err = run(["check", "--baseline", str(bad), str(real.record()), "--json", str(here / "v.json")], capsys)
    refused(code, err, bad, [here / "v.json"])


@FUZZ
@given(data=st.data())
def test_any_mutation_of_a_baseline_is_judged_or_refused_never_crashed_on(real, real_baseline, data, capsys):
    here = fresh(real)
    odd = dump(data.draw(any_mutation(real_baseline)), here / "baseline.json")
    code, _, err = run(["check", "--baseline", str(odd), str(real.record()), "--json", str(here / "v.json")], capsys)
    refused_or_judged(code, err, odd, [here / "v.json"])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_truncated_or_deeply_nested_baseline_is_refused(real, data, capsys):
    here = fresh(real)
    bad = here / "baseline.json"
    text = real.baseline.read_text()
    if data.draw(st.booleans()):
        bad.write_text(data.draw(truncated(text)))
    else:
        depth = data.draw(st.sampled_from([10, 2000, 100_000]))
        bad.write_text(text.replace('"min_seeds": 3', f'"min_seeds": {deeply_nested(depth)}', 1))
    code, _, err = run(["check", "--baseline", str(bad), str(real.record())], capsys)
    refused(code, err, bad, [])


# ----------------------------------------------------------------------------- records

def record_paths(record: dict) -> dict[str, list[tuple]]:
    arms = [("arms", i) for i in range(len(record["arms"]))]
    finals = [(*a, "final", name) for a in arms for name in record["arms"][a[1]]["final"]]
    series = [(*a, "series", key) for a in arms for key in record["arms"][a[1]]["series"]]
    return {
        "required": [(k,) for k in _fields(CaseRecord)[1]] + [(*a, k) for a in arms for k in ("arm", "seed", "status")],
        "containers": [()] + arms + [(*a, "final") for a in arms] + [(*a, "series") for a in arms]
        + [(*a, "timing") for a in arms] + [("git",), ("env",)],
        "finals": finals,
        "series": series,
    }


def invalid_record(record: dict):
    """A strategy of records (documents) that are always invalid."""
    at = record_paths(record)

    def shorter(where):
        out = copy.deepcopy(record)
        holder(out, (*where, None)).pop()
        return out
    config = {("config", "run", "device"): [7, [], {}, True],
              ("config", "run", "replicate"): ["x", -1, 1.5, True, [], 10 ** 30],
              ("config", "run", "steps"): [0, -8, "8", 8.5, None],
              ("config", "run", "data", "batch_size"): [0, "8", None, 2.5],
              ("config", "run", "model", "n_heads"): [0, -4, "4"],
              ("config", "run"): [7, "x", []],
              ("config",): [7, "x", [], None]}
    return st.one_of(
        st.builds(delete, st.just(record), st.sampled_from(at["required"])),
        st.builds(lambda where, value: replace(record, (*where, "surplus_key"), value),
                  st.sampled_from(at["containers"]), st.sampled_from(WRONG)),
        st.builds(replace, st.just(record), st.sampled_from(at["finals"]),
                  st.sampled_from(["3.2", "x", [], [1, 2], {}, {"a": 1}])),
        st.builds(replace, st.just(record), st.sampled_from([(*a, "seed") for a in (("arms", i) for i in
                                                                                     range(len(record["arms"])))]),
                  st.sampled_from(["0", 1.5, None, [], True])),
        st.builds(replace, st.just(record), st.sampled_from([("arms", i, "status") for i in range(len(record["arms"]))]),
                  st.sampled_from(["done", 1, None, []])),
        st.builds(replace, st.just(record), st.just(("schema_version",)), st.sampled_from([1, 4, "3", None, 2.5])),
        st.builds(shorter, st.sampled_from(at["series"])),
        st.sampled_from(list(config.items())).flatmap(
            lambda item: st.sampled_from(item[1]).map(lambda value: replace(record, item[0], value))),
    )


@pytest.fixture(scope="module")
def real_record(real) -> dict:
    return json.loads(real.record().read_text())


def _session_with(real: Real, here: Path, record_text: str, replicate: int = 0) -> tuple[Path, Path]:
    """A copy of replicate ``replicate``'s run directory whose record is ``record_text``: (the directory, the
    record)."""
    session = here / f"session{replicate}"
    shutil.copytree(real.sessions[replicate], session)
    record = next(p for p in session.glob("*.json") if p.name != "manifest.json")
    record.write_text(record_text)
    return session, record


@FUZZ
@given(data=st.data())
def test_an_invalid_record_is_refused_by_every_command_that_reads_it(real, real_record, data, capsys):
    here = fresh(real)
    document = data.draw(invalid_record(real_record))
    text = json.dumps(document, allow_nan=True) if data.draw(st.booleans()) else \
        data.draw(truncated(json.dumps(real_record)))
    session, bad = _session_with(real, here, text)
    command = data.draw(st.sampled_from(["check", "report", "update", "resume"]))
    if command == "check":
        code, _, err = run(["check", "--baseline", str(real.baseline), str(session), "--json", str(here / "v.json")],
                           capsys)
        refused(code, err, bad, [here / "v.json"])
    elif command == "report":
        code, _, err = run(["report", str(session), "--out", str(here / "r.html")], capsys)
        refused(code, err, bad, [here / "r.html", here / "r.md"])
    elif command == "update":
        code, _, err = run(["baseline", "update", str(session), *map(str, real.sessions[1:]), "--out",
                            str(here / "b.json"), "--allow-dirty", "--accept-calibration"], capsys)
        refused(code, err, bad, [here / "b.json"])
    else:
        code, _, err = run(["run", "--resume", str(session), "--no-track", "--quiet"], capsys)
        refused(code, err, bad, [])


@FUZZ
@given(data=st.data())
def test_any_mutation_of_a_record_is_judged_or_refused_never_crashed_on(real, real_record, data, capsys):
    here = fresh(real)
    session, odd = _session_with(real, here, json.dumps(data.draw(any_mutation(real_record)), allow_nan=True))
    command = data.draw(st.sampled_from(["check", "report", "update"]))
    if command == "check":
        code, _, err = run(["check", "--baseline", str(real.baseline), str(session), "--json", str(here / "v.json")],
                           capsys)
        refused_or_judged(code, err, odd, [here / "v.json"])
    elif command == "report":
        code, _, err = run(["report", str(session), "--baseline", str(real.baseline), "--out", str(here / "r.html")],
                           capsys)
        refused_or_judged(code, err, odd, [here / "r.html", here / "r.md"])
    else:
        code, _, err = run(["baseline", "update", str(session), *map(str, real.sessions[1:]), "--out",
                            str(here / "b.json"), "--allow-dirty", "--accept-calibration"], capsys)
        refused_or_judged(code, err, odd, [here / "b.json"])


# ----------------------------------------------------------------------------- invariants files

def invariant() -> dict:
    return invariant_line("smoke/standard", "completed", "gated", 0, True, 1.0, 2.0, "fine", "test_x")


def invalid_invariant():
    """A strategy of invariant lines (text) that are always invalid."""
    line = invariant()
    wrong = {"case_key": [None, 7, [], ["a"], {}], "name": [None, 7, []], "arm": [7, [], {}],
             "seed": ["0", 1.5, True, []], "held": [None, "yes", 1, []], "value": ["x", [], {}],
             "bound": ["x", []], "message": [None, 7], "test": [None, []]}
    return st.one_of(
        st.sampled_from(FIELDS).map(lambda name: json.dumps(delete(line, (name,)))),
        st.sampled_from(WRONG).map(lambda value: json.dumps({**line, "surplus_key": value})),
        st.sampled_from(sorted(wrong)).flatmap(
            lambda name: st.sampled_from(wrong[name]).map(lambda value: json.dumps({**line, name: value}))),
        st.sampled_from(["[1, 2]", "7", "null", '"text"', "{", '{"case": NaN', deeply_nested(100_000)]),
        truncated(json.dumps(line)),
    )


@FUZZ
@given(data=st.data())
def test_an_invalid_invariants_line_is_refused_naming_the_file_and_line(real, data, capsys):
    here = fresh(real)
    session, _ = _session_with(real, here, real.record().read_text())
    lines = [json.dumps(invariant())] * data.draw(st.integers(0, 2)) + [data.draw(invalid_invariant())]
    bad = session / "invariants-gw0.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    command = data.draw(st.sampled_from(["check", "report", "update"]))
    if command == "check":
        code, _, err = run(["check", "--baseline", str(real.baseline), str(session), "--json", str(here / "v.json")],
                           capsys)
        refused(code, err, bad, [here / "v.json"])
    elif command == "report":
        code, _, err = run(["report", str(session), "--baseline", str(real.baseline), "--out", str(here / "r.html")],
                           capsys)
        refused(code, err, bad, [here / "r.html", here / "r.md"])
    else:
        code, _, err = run(["baseline", "update", str(session), *map(str, real.sessions[1:]), "--out",
                            str(here / "b.json"), "--allow-dirty", "--accept-calibration"], capsys)
        refused(code, err, bad, [here / "b.json"])
    assert f"{bad.name}:{len(lines)}" in err


# ----------------------------------------------------------------------------- JUnit XML

GOOD_JUNIT = ('<testsuites><testsuite name="suites"><testcase classname="suites.test_standard" name="test_a"/>'
              '<testcase classname="suites.test_standard" name="test_b"><failure message="boom">trace</failure>'
              '</testcase></testsuite></testsuites>')


def invalid_junit():
    cut = st.integers(0, GOOD_JUNIT.rfind("</testsuites>") - 1).map(lambda n: GOOD_JUNIT[:n])
    return st.one_of(cut, st.sampled_from(["", "not xml", "{}", "<a><b></a>", "\x00\x01", "<?xml version='1.0'?>",
                                           "<a>" * 10 + "</b>", '<!DOCTYPE x [<!ENTITY e SYSTEM "file:///nope">]><x>&e;</x>']))


def odd_junit():
    """JUnit XML that is well formed but unusual: the check reads it (exit 0 or 1)."""
    texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=30)
    return st.builds(lambda classname, name, message, tag: (
        f'<testsuites><testcase classname={quoteattr(classname)} name={quoteattr(name)}>'
        f'<{tag} message={quoteattr(message)}/></testcase><testcase/><other/></testsuites>'),
        texts, texts, texts, st.sampled_from(["failure", "error", "skipped", "system-out"]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_broken_junit_file_is_refused_and_a_well_formed_one_is_read(real, data, capsys):
    here = fresh(real)
    junit = here / "suites.xml"
    valid = data.draw(st.booleans())
    junit.write_text(data.draw(odd_junit() if valid else invalid_junit()))
    code, _, err = run(["check", "--baseline", str(real.baseline), str(real.record()), "--junit", str(junit),
                        "--json", str(here / "v.json")], capsys)
    if valid:
        assert code in (0, 1) and (here / "v.json").is_file(), err
    else:
        refused(code, err, junit, [here / "v.json"])


# ----------------------------------------------------------------------------- the crashes found, one by one

def _baseline_with(real: Real, here: Path, edit) -> Path:
    document = json.loads(real.baseline.read_text())
    edit(document)
    return dump(document, here / "baseline.json")


def _figures(document: dict, arm: str = "gated") -> dict:
    return document["cases"]["smoke/standard"]["arms"][arm]["figures"]


@pytest.mark.parametrize(("edit", "said"), [
    (lambda b: _figures(b)["heldout_loss"]["0"].update({"0": "3.2"}), "heldout_loss = '3.2': expected a number"),
    (lambda b: _figures(b)["heldout_loss"]["0"].update({"0": [1, 2]}), "heldout_loss = [1, 2]: expected a number"),
    (lambda b: _figures(b)["heldout_loss"]["0"].update({"0": True}), "heldout_loss = True: expected a number"),
    (lambda b: _figures(b)["heldout_loss"]["0"].update({"0": None}), "heldout_loss = null in a completed run"),
    (lambda b: b["cases"]["smoke/standard"]["arms"]["gated"].pop("status"),
     "cases.smoke/standard.arms.gated has no 'status' field"),
    (lambda b: b["cases"]["smoke/standard"]["arms"].pop("gated"), "has no arm 'gated'"),
    (lambda b: b["cases"]["smoke/standard"]["arms"]["gated"]["status"].pop("2"), "seeds"),
    (lambda b: b["cases"]["smoke/standard"]["arms"]["gated"]["status"]["1"].pop("2"), "replicates"),
    (lambda b: b.update(cases=[]), "cases = []: expected an object"),
    (lambda b: b.update(cases={}), "cases = {}: expected a non-empty object"),
    (lambda b: b.update(calibration="x"), "calibration = 'x': expected an object"),
    (lambda b: b["cases"]["smoke/standard"].update(steps="sixty"), "steps = 'sixty': expected a whole number"),
    (lambda b: b.update(min_seeds=0), "min_seeds = 0: expected a whole number >= 1"),
    (lambda b: b.update(replicates=[0, 0, 1]), "replicates = [0, 0, 1]: expected a non-empty list of distinct"),
    (lambda b: _figures(b).update(made_up={"0": {"0": 1.0}}), "figure 'made_up' is not a figure of the table"),
])
def test_each_named_baseline_crash_is_now_exit_2_naming_file_case_arm_and_figure(real, capsys, edit, said):
    here = fresh(real)
    bad = _baseline_with(real, here, edit)
    code, _, err = run(["check", "--baseline", str(bad), str(real.record()), "--json", str(here / "v.json")], capsys)
    refused(code, err, bad, [here / "v.json"])
    assert said in err, err


def test_a_figure_of_an_extension_names_the_extensions_to_load(real, capsys):
    here = fresh(real)

    def edit(document):
        document["cases"]["smoke/standard"]["config"]["plugins"] = ["acme_figures"]
        _figures(document)["acme_score"] = {"0": {"0": 1.0}}
    bad = _baseline_with(real, here, edit)
    code, _, err = run(["baseline", "calibrate", str(bad)], capsys)
    refused(code, err, bad, [])
    assert "figure 'acme_score' is not known to this installation" in err and "['acme_figures']" in err, err


@pytest.mark.parametrize(("edit", "said"), [
    (lambda r: r["config"]["run"].update(device=7), "config.run.device = 7"),
    (lambda r: r["config"]["run"].update(replicate="x"), "config.run.replicate = 'x'"),
    (lambda r: r["config"]["run"].update(steps=0), "config.run.steps = 0"),
    (lambda r: r["config"]["run"]["data"].update(batch_size="8"), "config.run.data.batch_size = '8'"),
    (lambda r: r["arms"][0]["series"]["loss"].pop(), "series.loss has 7 entries"),
])
@pytest.mark.parametrize("command", ["check", "report"])
def test_each_named_record_crash_is_now_exit_2_naming_the_file_and_field(real, capsys, edit, said, command):
    here = fresh(real)
    document = json.loads(real.record().read_text())
    edit(document)
    session, bad = _session_with(real, here, json.dumps(document))
    if command == "check":
        code, _, err = run(["check", "--baseline", str(real.baseline), str(session), "--json", str(here / "v.json")],
                           capsys)
    else:
        code, _, err = run(["report", str(session), "--out", str(here / "r.html")], capsys)
    refused(code, err, bad, [here / "v.json", here / "r.html"])
    assert said in err, err


def test_an_invariants_line_whose_case_is_a_list_is_exit_2(real, capsys):
    here = fresh(real)
    session, _ = _session_with(real, here, real.record().read_text())
    bad = session / "invariants-main.jsonl"
    bad.write_text(json.dumps({**invariant(), "case_key": ["smoke/standard"]}) + "\n")
    code, _, err = run(["check", "--baseline", str(real.baseline), str(session)], capsys)
    refused(code, err, bad, [])
    assert 'invariants-main.jsonl:1 is not an invariant: expected case_key text (found ["smoke/standard"])' in err, err


def test_the_real_inputs_themselves_are_judged(real, capsys):
    """The unmutated inputs pass: what the refusals above refuse is the mutation."""
    here = fresh(real)
    code, _, err = run(["check", "--baseline", str(real.baseline), str(real.sessions[0]), "--json",
                        str(here / "v.json")], capsys)
    assert code == 0 and (here / "v.json").is_file(), err
    code, _, err = run(["report", str(real.sessions[0]), "--baseline", str(real.baseline), "--out",
                        str(here / "r.html")], capsys)
    assert code == 0 and (here / "r.html").is_file(), err


# ----------------------------------------------------------------------------- run --resume

def _interrupted(real: Real, here: Path, edit=None) -> tuple[Path, Path]:
    """A copy of a run directory whose record was interrupted (its last arm killed), edited by ``edit``."""
    document = json.loads(real.record().read_text())
    document["status"] = document["arms"][-1]["status"] = Status.KILLED.value
    if edit is not None:
        edit(document)
    return _session_with(real, here, json.dumps(document))


@pytest.mark.parametrize(("manifest", "said"), [
    ("{", "manifest.json' is not valid JSON"),
    ("[]", "holds a JSON list: expected an object"),
    ('{"label": 7}', "has label 7: expected the name of a command"),
    ('[[[[' * 50_000, "nests too deep"),
])
def test_a_broken_manifest_of_an_interrupted_run_is_exit_2_naming_it(real, capsys, manifest, said):
    here = fresh(real)
    session, _ = _interrupted(real, here)
    (session / "manifest.json").write_text(manifest)
    code, _, err = run(["run", "--resume", str(session), "--no-track", "--quiet"], capsys)
    refused(code, err, session / "manifest.json", [])
    assert said in err, err


@pytest.mark.parametrize(("edit", "said"), [
    (lambda r: r["config"]["run"]["probes"].update(every=1.5), "probes.every=1.5 is invalid"),
    (lambda r: r["config"]["run"]["optim"].update(betas="x"), "holds a config this code cannot read"),
    (lambda r: r["config"].update(seeds=7), "holds a config this code cannot read"),
    (lambda r: r["config"].update(arms=[{"gate": {}}]), "holds a config this code cannot read"),
    (lambda r: r.update(config=1.5), "config = 1.5: expected an object"),
])
def test_an_interrupted_record_whose_config_this_code_cannot_read_is_exit_2(real, capsys, edit, said):
    here = fresh(real)
    session, bad = _interrupted(real, here, edit)
    code, _, err = run(["run", "--resume", str(session), "--no-track", "--quiet"], capsys)
    refused(code, err, bad, [])
    assert said in err, err


# ----------------------------------------------------------------------------- replay bundles

@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> dict:
    """A real replay bundle: the step after an LR multiplied by 1000 (the config's fault injection) is flagged."""
    import torch

    root = tmp_path_factory.mktemp("spike")
    assert main(["run", "--preset", "smoke", "--no-track", "--quiet", "--set", "steps=18", "--set", "probes.every=4",
                 "--set", "probes.eval_batches=1", "--set", "seeds=0", "--set", "fault.kind=lr_spike", "--set",
                 "fault.step=14", "--set", "fault.lr_factor=1000", "--out", str(root)]) == 0
    return torch.load(next(root.glob("*/replay/*/gated-*.pt")), weights_only=True)


def invalid_bundle(bundle: dict):
    """A strategy of bundles that are always invalid."""
    import torch

    wrong_batch = [torch.zeros(3), torch.zeros(8, 64), torch.full((8, 64), 10 ** 6), -torch.ones(8, 64, dtype=torch.long),
                   torch.zeros(0, 64, dtype=torch.long), torch.zeros(2, 2, 2, dtype=torch.long), "x", None, [1, 2]]
    wrong = {"step": ["15", -1, 1.5, None, True, torch.tensor(15)], "x": wrong_batch, "y": wrong_batch,
             "measured": [None, "x", [], torch.zeros(2)], "config": [None, "x", [], 7, torch.zeros(2)],
             "model": [None, "x", [], {"embed.weight": "x"}], "kind": ["checkpoint", 7, torch.zeros(2), None],
             "format": ["1", 2, torch.tensor(1), None], "threads": [0, -1, "2", 1.5],
             "optimizer": ["x", [], 7]}

    def replaced(item):
        field, value = item
        return {**bundle, field: value}
    return st.one_of(
        st.sampled_from(sorted(wrong)).flatmap(lambda f: st.sampled_from(wrong[f]).map(lambda v: (f, v))).map(replaced),
        st.sampled_from(["step", "x", "y", "measured", "config", "model", "kind", "format"]).map(
            lambda field: {k: v for k, v in bundle.items() if k != field}),
        st.sampled_from(["loss", "grad_norm", "severity"]).flatmap(lambda key: st.sampled_from(["x", [], {}, True]).map(
            lambda value: {**bundle, "measured": {**bundle["measured"], key: value}})),
        st.sampled_from([1, None, [1], "x"]).map(lambda v: {**bundle, "measured": {**bundle["measured"], "reasons": v}}),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_an_invalid_bundle_is_refused_before_any_replay(real, bundle, data, capsys):
    import torch

    here = fresh(real)
    bad = here / "bundle.pt"
    torch.save(data.draw(invalid_bundle(bundle)), bad)
    code, _, err = run(["replay", str(bad), "--json", str(here / "r.json")], capsys)
    refused(code, err, bad, [here / "r.json"])


def test_the_real_bundle_itself_replays(real, bundle, capsys):
    import torch

    here = fresh(real)
    torch.save(bundle, here / "bundle.pt")
    code, _, err = run(["replay", str(here / "bundle.pt"), "--json", str(here / "r.json")], capsys)
    assert code == 0 and (here / "r.json").is_file(), err


# ----------------------------------------------------------------------------- duplicates

@pytest.mark.parametrize("where", ["top", "case", "figure"])
def test_a_duplicated_key_counts_as_its_last_value_and_a_bad_last_value_is_refused(real, capsys, where):
    """JSON keeps the last of two equal keys: a baseline whose repeated key ends with a bad value is refused."""
    here = fresh(real)
    document = json.loads(real.baseline.read_text())
    text = json.dumps(document)
    _figures(document)["heldout_loss"]["0"] = "RUNS"
    duplicated = {"top": text[:-1] + ', "min_seeds": 0}',
                  "case": text.replace('"steps": 8,', '"steps": 8, "steps": "eight",', 1),
                  "figure": json.dumps(document).replace('"RUNS"', '{"0": 1.0, "1": 1.0, "2": 1.0, "0": "x"}')}[where]
    bad = here / "baseline.json"
    bad.write_text(duplicated)
    assert duplicated != text
    code, _, err = run(["check", "--baseline", str(bad), str(real.record()), "--json", str(here / "v.json")], capsys)
    refused(code, err, bad, [here / "v.json"])


def test_a_record_given_twice_or_copied_is_refused_naming_both(real, capsys):
    """One run in two files (a record named twice, or a copy beside it) is never settled by a date inside them:
    exit 2 naming both files, nothing written."""
    here = fresh(real)
    session, record = _session_with(real, here, real.record().read_text())
    shutil.copy(record, session / f"copy-{record.name}")
    code, _, err = run(["check", "--baseline", str(real.baseline), str(session), "--json", str(here / "v.json")],
                       capsys)
    assert code == 2 and f"copy-{record.name}" in err and record.name in err and not (here / "v.json").exists()
    code, _, err = run(["baseline", "update", str(session), *map(str, real.sessions), "--out", str(here / "b.json"),
                        "--allow-dirty", "--accept-calibration"], capsys)
    assert code == 2 and not (here / "b.json").exists(), err