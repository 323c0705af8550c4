"""Files a command reads are data: the Markdown quotes them escaped, and a damaged session manifest, invariants
file or JUnit XML is named in one line (exit 2 where a command was given it, skipped with a warning where a scan
met it), never a traceback."""

from __future__ import annotations

import json
import re

import pytest
from _stability_records import pair_record, with_replicates

from stability.check import regression as reg
from stability.check.baseline import make_baseline, write_baseline
from stability.check.junit import suite_failures
from stability.cli import main
from stability.record import RecordError, write_record
from stability.record.invariants import append_invariant, invariant_line, invariants_file, read_invariants
from stability.record.io import MAX_BYTES
from stability.record.rundir import MANIFEST, ensure_run_dir, read_manifest, sessions

EVIL = "<script>alert(1)</script> | x | [a](javascript:x) `code` \\| *b*\n# heading\n- item"
TINY = {"seeds": "0", "steps": 4, "probes.every": 2, "probes.eval_batches": 1, "model.d_model": 32,
        "model.n_heads": 2, "model.n_kv_heads": 1, "model.context": 32, "data.batch_size": 4,
        "data.builtin_bytes": 100_000}
TINY_SETS = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]


def _write(path, document) -> str:
    path.write_text(json.dumps(document, allow_nan=False))
    return str(path)


def _oversized(path) -> None:
    """A file one byte past the cap (sparse: it takes no disk)."""
    with open(path, "wb") as handle:
        handle.truncate(MAX_BYTES + 1)


def _unescaped_pipes(line: str) -> int:
    """The cell separators of a Markdown table line: pipes not escaped by an odd run of backslashes."""
    return len(re.findall(r"(?<!\\)(?:\\\\)*\|", line))


def _tables(markdown: str) -> list[list[str]]:
    """The Markdown tables of ``markdown``: runs of lines that start with a pipe."""
    tables, current = [], []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def _one_error_line(err: str, *named: str) -> None:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(name in lines[0] for name in named), (lines[0], named)


@pytest.fixture(scope="module")
def record():
    return pair_record(seeds=(0, 1, 2))


@pytest.fixture(scope="module")
def baseline(record):
    return make_baseline(with_replicates(record), commit="abc123")


# ----------------------------------------------------------------------------- the Markdown twin


def test_the_markdown_quotes_record_text_escaped(tmp_path, record, baseline, capsys):
    """Text from a record (a description, a stop reason, env, git and tracking fields) and from the check (its
    notes, warnings and errors) reaches report.md escaped: no raw HTML, no link, every table row as many cells
    as its header."""
    evil = json.loads(json.dumps(record))
    evil["description"] = EVIL
    evil["arms"][0]["stop_reason"] = EVIL
    evil["env"]["device_name"] = EVIL
    evil["git"]["branch"] = EVIL
    evil["tracking"] = {"status": "not tracked", "uri": EVIL, "error": EVIL}
    path = _write(tmp_path / "evil.json", evil)
    write_baseline(baseline, tmp_path / "b.json")
    out = tmp_path / "out" / "report.html"
    assert main(["report", path, "--out", str(out), "--baseline", str(tmp_path / "b.json")]) == 0
    capsys.readouterr()
    result = reg.check([evil], baseline)
    result.notes.append(EVIL)
    result.warnings.append(EVIL)
    result.errors.append(EVIL)
    for markdown in (out.with_suffix(".md").read_text(), result.markdown()):
        raw = [line for line in markdown.splitlines() if "<script" in line.lower()]
        assert not raw and not re.search(r"(?<!\\)\]\(javascript", markdown), raw
        assert "\n# heading" not in markdown and "\n- item" not in markdown
        assert "&lt;script&gt;alert(1)&lt;/script&gt; \\| x \\| \\[a\\](javascript:x)" in markdown
        tables = _tables(markdown)
        assert tables
        for table in tables:
            assert {_unescaped_pipes(line) for line in table} == {_unescaped_pipes(table[0])}, table
    assert "<script>" not in out.read_text().split("</h1>")[1].split("<script>window")[0]   # the HTML escapes too


# ----------------------------------------------------------------------------- session manifests


def test_the_manifest_is_written_whole_and_the_first_writer_wins(tmp_path):
    session = ensure_run_dir(tmp_path / "s", label="first")
    ensure_run_dir(session, label="second")
    assert read_manifest(session)["label"] == "first"
    assert sorted(p.name for p in session.iterdir()) == [MANIFEST]   # no temporary file left behind
    assert read_manifest(tmp_path) is None                            # no manifest: not a session


def _leftover(root, damage: str):
    """A session under ``root`` holding a record, its manifest damaged as ``damage`` says."""
    session = ensure_run_dir(root / "20260101T000000-run-aaaaaa", label="run")
    write_record(pair_record(seeds=(0, 1, 2)), session)
    manifest = session / MANIFEST
    if damage == "truncated":
        manifest.write_text(manifest.read_text()[:25])
    elif damage == "not an object":
        manifest.write_text("[1, 2]")
    elif damage == "label not text":
        manifest.write_text(json.dumps({"kind": "stability-run-dir", "label": ["run"]}))
    else:
        _oversized(manifest)
    return session


@pytest.mark.parametrize("damage", ["truncated", "not an object", "label not text", "too large"])
def test_a_damaged_manifest_is_named_and_skipped(tmp_path, capsys, damage):
    """A leftover session whose manifest is damaged is skipped by every scan of the directory of sessions,
    with a warning naming its manifest; the sessions beside it are read as before."""
    root = tmp_path / "runs"
    leftover = _leftover(root, damage)
    assert sessions(root) == []
    err = capsys.readouterr().err
    assert str(leftover / MANIFEST) in err and "skipped" in err and err.startswith("warning:")
    good = ensure_run_dir(root / "20260102T000000-run-bbbbbb", label="run")
    write_record(pair_record(seeds=(0, 1, 2), name="other"), good)
    assert main(["report", str(root), "--out", str(tmp_path / "r.html")]) == 0   # the newest readable session
    assert "other/standard" in (tmp_path / "r.md").read_text()


def test_a_run_under_a_root_with_a_damaged_session_trains_and_names_it(tmp_path, capsys):
    """`stability run --out ROOT` looks for an interrupted run of its own under ROOT: a session there whose
    manifest was cut short is named and passed over, and the run trains into a new session."""
    root = tmp_path / "runs"
    leftover = _leftover(root, "truncated")
    assert main(["run", "--out", str(root), "--no-track", "--quiet", *TINY_SETS]) == 0
    err = capsys.readouterr().err
    assert str(leftover / MANIFEST) in err and "skipped" in err and "Traceback" not in err
    made = [s for s in root.iterdir() if s != leftover]
    assert len(made) == 1 and read_manifest(made[0])["label"] == "run"


@pytest.mark.parametrize("damage", ["truncated", "too large"])
def test_a_command_given_a_session_with_a_damaged_manifest_names_it(tmp_path, capsys, damage):
    """Given that session itself (to resume, to report on), a command exits 2 naming its manifest and leaves
    it as it was."""
    session = _leftover(tmp_path / "runs", damage)
    before = {p.name: p.stat().st_size for p in session.iterdir()}
    assert main(["run", "--resume", str(session), "--no-track"]) == 2
    _one_error_line(capsys.readouterr().err, str(session / MANIFEST))
    assert main(["report", str(session), "--out", str(tmp_path / "r.html")]) == 2
    _one_error_line(capsys.readouterr().err, str(session / MANIFEST))
    assert {p.name: p.stat().st_size for p in session.iterdir()} == before


# ----------------------------------------------------------------------------- invariants files


GOOD_LINE = invariant_line("smoke/standard", "completed", "gated", 2, True, 1.0, 2.0, "fine", "t.py::test")


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("case_key", ["smoke/standard"], "case_key text"),
    ("name", 3, "name text"),
    ("arm", {"a": 1}, "arm text or null"),
    ("seed", True, "seed an integer or null"),
    ("seed", 1.5, "seed an integer or null"),
    ("seed", 10**30, "seed an integer or null"),        # past 64 bits: read as a float
    ("held", "yes", "held true or false"),
    ("value", "0.8", "value a number or null"),
    ("bound", False, "bound a number or null"),
    ("message", None, "message text"),
    ("test", [], "test text"),
])
def test_an_invariants_line_of_the_wrong_type_is_named_with_its_field(tmp_path, field, value, expected):
    (tmp_path / "invariants-gw0.jsonl").write_text(json.dumps(GOOD_LINE) + "\n"
                                                   + json.dumps({**GOOD_LINE, field: value}) + "\n")
    with pytest.raises(RecordError) as error:
        read_invariants(tmp_path)
    message = str(error.value)
    assert f"invariants-gw0.jsonl:2 is not an invariant: expected {expected} (found " in message, message


def test_what_the_writer_writes_the_reader_takes(tmp_path):
    """Figures the suites pass as flags are written as numbers, so every line written reads back."""
    line = invariant_line("smoke/standard", "completed", None, None, False, True, False)
    append_invariant(invariants_file(tmp_path), line)
    assert read_invariants(tmp_path) == [line] and (line["value"], line["bound"]) == (1.0, 0.0)


def test_non_finite_and_out_of_range_invariant_figures_read_as_null(tmp_path):
    (tmp_path / "invariants-main.jsonl").write_text(
        json.dumps(GOOD_LINE).replace('"value": 1.0', '"value": NaN').replace('"bound": 2.0', '"bound": 1e999'))
    (line,) = read_invariants(tmp_path)
    assert line["value"] is None and line["bound"] is None and line["seed"] == 2


@pytest.mark.parametrize(("content", "said"), [
    (None, "MiB"),
    (b'{"case": "\xff"}\n', "cannot be read"),
    (("[" * 100_000).encode(), "nests too deep"),
])
def test_an_unreadable_invariants_file_is_named(tmp_path, content, said):
    path = tmp_path / "invariants-main.jsonl"
    if content is None:
        _oversized(path)
    else:
        path.write_bytes(content)
    with pytest.raises(RecordError, match="invariants-main.jsonl") as error:
        read_invariants(tmp_path)
    assert said in str(error.value)


def test_a_check_of_a_run_with_a_broken_invariants_file_is_bad_input(tmp_path, record, baseline, capsys):
    run_dir = ensure_run_dir(tmp_path / "run", label="pytest")
    write_record(json.loads(json.dumps(record)), run_dir)
    (run_dir / "invariants-main.jsonl").write_text(json.dumps({**GOOD_LINE, "case_key": ["x"]}) + "\n")
    write_baseline(baseline, tmp_path / "b.json")
    assert main(["check", "--baseline", str(tmp_path / "b.json"), str(run_dir)]) == 2
    _one_error_line(capsys.readouterr().err, "invariants-main.jsonl:1", "case_key text")


# ----------------------------------------------------------------------------- JUnit XML


@pytest.mark.parametrize(("content", "said"), [
    (None, "MiB"),
    (b"<testsuites><testsuite><testcase name='\xff'/></testsuite></testsuites>", "cannot be read"),
    (b"<?xml version='1.0' encoding='no-such-encoding'?><testsuites/>", "cannot be read"),
    (b"<testsuites><testsuite>", "cannot be read"),
    (b"<html><body>not a test report</body></html>", "is not JUnit XML"),
    (b"", "cannot be read"),
])
def test_a_junit_file_that_cannot_be_read_as_junit_is_bad_input_naming_it(tmp_path, record, baseline, capsys,
                                                                          content, said):
    junit = tmp_path / "junit.xml"
    if content is None:
        _oversized(junit)
    else:
        junit.write_bytes(content)
    with pytest.raises(RecordError, match="junit.xml") as error:
        suite_failures([junit])
    assert said in str(error.value)
    write_baseline(baseline, tmp_path / "b.json")
    path = _write(tmp_path / "r.json", record)
    assert main(["check", "--baseline", str(tmp_path / "b.json"), path, "--junit", str(junit)]) == 2
    _one_error_line(capsys.readouterr().err, str(junit), said)


def test_a_deeply_nested_junit_file_is_read_without_a_traceback(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text("<testsuites>" + "<a>" * 100_000 + "</a>" * 100_000 + "</testsuites>")
    assert suite_failures([junit]) == []
