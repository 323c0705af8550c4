"""What the documentation shows, runs: every command block of README.md and docs/*.md is executed.

Each ```bash block is preceded by a marker line saying how it is tested:

* ``<!-- test: default -->``: run here, in a fresh copy of the repository, in the order written,
  each block with ``bash -eo pipefail`` (it must exit 0);
* ``<!-- test: slow -->``: the same, with every block of the file, under ``--run-slow`` only;
* ``<!-- test: ci -->``: the test command itself (running it here would run this test again): it
  must be the very command ``.ci/run`` runs;
* ``<!-- test: downstream -->``: commands for another repository: ``tests/test_downstream.py`` runs them,
  line by line, in a copy of examples/downstream (the ``pip install`` line installs this repository's
  wheel there, offline).

The copy gets a virtual environment that sees this environment's packages and has the copy
installed in editable mode; so ``python3 -m venv .venv`` and ``pip install ...`` (which would
download) are the only parts of a block replaced, by ``true``; a ``pip install --no-index`` (offline: a
local package) runs as written.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from validation.workflow import ROOT, fresh_copy, prepare_venv

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- test: (default|slow|ci|downstream) -->$")
DOWNLOADS = re.compile(r"python3 -m venv \.venv|pip install (?![^&;|\n]*--no-index)[^&;|\n]+")


def blocks(path: Path) -> list[tuple[str, str]]:
    """(kind, script) of every ```bash block, in order; a block without a marker has kind None."""
    lines = path.read_text().splitlines()
    out, kind, index = [], None, 0
    while index < len(lines):
        line = lines[index].strip()
        marker = MARKER.match(line)
        if marker:
            kind = marker.group(1)
        elif line.startswith("```bash"):
            end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
            out.append((kind, "\n".join(lines[index + 1:end])))
            kind, index = None, end
        elif line:
            kind = None
        index += 1
    return out


def run_blocks(path: Path, kinds: tuple[str, ...], tmp_path: Path) -> None:
    copy = fresh_copy(tmp_path / "copy")
    prepare_venv(copy)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STABILITY_", "PYTEST_", "MLFLOW_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{copy / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
    for number, (kind, script) in enumerate(blocks(path), 1):
        if kind not in kinds:
            continue
        script = DOWNLOADS.sub("true", script)
        result = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=copy,
                                env=env, capture_output=True, text=True, timeout=1800, check=False)
        assert result.returncode == 0, (f"{path.name} block {number} exited {result.returncode}:\n{script}\n"
                                        f"{(result.stdout + result.stderr)[-4000:]}")


def test_the_block_parser_reads_markers_and_refuses_none(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- test: default -->\n```bash\necho a\n```\ntext\n```bash\necho b\n```\n"
                    "<!-- test: slow -->\n\n```bash\necho c\n```\n")
    assert blocks(page) == [("default", "echo a"), (None, "echo b"), ("slow", "echo c")]
    assert DOWNLOADS.sub("true", "pip install -e .; pip install --no-index ./pkg") == "true; pip install --no-index ./pkg"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_command_block_says_how_it_is_tested(path):
    unmarked = [script for kind, script in blocks(path) if kind is None]
    assert not unmarked, f"{path.name}: command blocks without a test marker: {unmarked}"


def test_the_readme_test_command_is_the_one_ci_runs():
    ci = [script for kind, script in blocks(ROOT / "README.md") if kind == "ci"]
    assert len(ci) == 1 and ci[0].strip() in (ROOT / ".ci" / "run").read_text()


def test_the_downstream_block_is_the_readme_s_one_and_the_downstream_test_runs_it():
    from test_downstream import readme_commands

    found = {path.name: script for path in DOCS for kind, script in blocks(path) if kind == "downstream"}
    assert list(found) == ["README.md"]
    assert readme_commands() == found["README.md"].splitlines()


# the pages whose blocks take minutes on 2 cores (each extension kind run under torchrun and Ray; a baseline
# made, calibrated and judged) or half a minute and more (a Ray cluster and torchrun, the paper's controls, a
# killed and resumed run): long tests, which CI runs in a step of its own after the test command
LONG_PAGES = ("extending.md", "merge-gate.md", "scale-out.md", "arms-and-controls.md", "long-runs.md")


def _default_pages() -> list:
    long = (pytest.mark.slow, pytest.mark.long)
    return [pytest.param(p, id=p.name, marks=long if p.name in LONG_PAGES else ())
            for p in DOCS if any(k == "default" for k, _ in blocks(p))]


@pytest.mark.parametrize("path", _default_pages())
def test_the_default_blocks_run_in_order(path, tmp_path):
    run_blocks(path, ("default",), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in DOCS if any(k == "slow" for k, _ in blocks(p))], ids=lambda p: p.name)
def test_every_block_runs_in_order(path, tmp_path):
    run_blocks(path, ("default", "slow"), tmp_path)


REPORTS = ROOT / "reports"
INDEXED = re.compile(r"^\| `([^`]+)` \|", re.MULTILINE)   # a table row whose first cell is a file


def indexed(text: str) -> list[str]:
    """The files reports/README.md lists: the first cell of each table row, relative to reports/."""
    return INDEXED.findall(text)


def committed_reports() -> set[str]:
    """The files git tracks under reports/, relative to it, without reports/runs/ and the index itself."""
    listed = subprocess.run(["git", "ls-files", "-z", "reports"], cwd=ROOT, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: which files are committed is unknown")
    names = {name.removeprefix("reports/") for name in listed.stdout.decode().split("\0") if name}
    return {name for name in names if not name.startswith("runs/") and name != "README.md"}


def test_the_reports_index_lists_every_committed_file_and_only_files_that_exist():
    listed = indexed((REPORTS / "README.md").read_text())
    assert len(listed) == len(set(listed)), "files listed twice in reports/README.md"
    missing = sorted(committed_reports() - set(listed))
    assert not missing, f"committed under reports/ but not in reports/README.md: {missing}"
    absent = sorted(name for name in listed if not (REPORTS / name).is_file())
    assert not absent, f"reports/README.md lists files that do not exist: {absent}"


def test_the_index_reader_takes_first_cells_only():
    table = "| file | command |\n|---|---|\n| `zoo-ci.md` | `python -m validation.regression_zoo` |\ntext `x.md`\n"
    assert indexed(table) == ["zoo-ci.md"]
