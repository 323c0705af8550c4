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
from stability.cli import main

EVIL = "<script>alert(1)</script> | x | [a](javascript:x) `code` \\| *b*\n# heading\n- item"


def _write(path, document) -> str:
    path.write_text(json.dumps(document, allow_nan=False))
    return str(path)


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
