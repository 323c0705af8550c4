"""The CI workflow (.github/workflows/stability.yml): its commands, options and markers exist, and the CPU
job's steps, run end to end in a fresh copy of the repository, pass on unchanged code
(test_workflow_regression.py: a harmful change fails it; test_zoo.py: zoo entries of each kind)."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from _workflow import fresh_copy, prepare_venv, run_job

from stability.cli import build_parser

SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "then", "else", "do", "if", "!", ">>", ">"}
WORKFLOW = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "stability.yml"


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _commands(workflow: dict, program: str) -> list[tuple[str, list[str]]]:
    """(job, argv) of every ``program ...`` command line in the run scripts (continuations joined)."""
    out = []
    for job_name, job in workflow["jobs"].items():
        for step in job["steps"]:
            script = step.get("run", "").replace("\\\n", " ")
            for line in script.splitlines():
                lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
                lexer.whitespace_split, lexer.commenters = True, "#"
                words: list[str] = []
                for token in [*lexer, ";"]:
                    if token in SEPARATORS:
                        if words and words[0] == program:
                            out.append((job_name, words[1:]))
                        words = []
                    else:
                        words.append(token)
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def test_gpu_and_cpu_jobs_run_the_stress_suites_at_their_scale(workflow):
    jobs = workflow["jobs"]
    runners = {name: job["runs-on"] for name, job in jobs.items()}
    assert ["self-hosted", "gpu"] in runners.values() and "ubuntu-latest" in runners.values()
    expected = {"self-hosted,gpu": ("full", "cuda"), "ubuntu-latest": ("smoke", "cpu")}
    for job_name, job in jobs.items():
        key = ",".join(job["runs-on"]) if isinstance(job["runs-on"], list) else job["runs-on"]
        scale, device = expected[key]
        runs = [argv for name, argv in _commands(workflow, "pytest") if name == job_name]
        assert any(argv[:3] == ["suites/", "-m", "stress"] and f"--scale={scale}" in _normal(argv)
                   and f"--device={device}" in _normal(argv) and any(a.startswith("--junitxml") for a in argv)
                   for argv in runs), (job_name, runs)
        steps = job["steps"]
        assert any(s.get("uses", "").startswith("actions/upload-artifact") and s["with"]["path"].rstrip("/") ==
                   "reports" and s.get("if") == "always()" for s in steps), job_name
        checks = [argv for name, argv in _commands(workflow, "stability") if name == job_name and argv[0] == "check"]
        assert checks, f"{job_name}: no `stability check` step"
        failing = [s for s in steps if "steps.check.outputs.code" in str(s.get("if", ""))]
        assert failing and "exit 1" in failing[-1]["run"], f"{job_name}: a regression does not fail the job"
        assert steps[-1] is failing[-1], f"{job_name}: the failing step must come after the report and upload"


def _normal(argv: list[str]) -> list[str]:
    """["--scale", "full"] -> ["--scale=full"] for the options that take a value."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("--scale", "--device") and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def test_every_stability_subcommand_and_flag_in_the_workflow_exists(workflow):
    parser = build_parser()
    commands = _commands(workflow, "stability")
    assert {argv[0] for _, argv in commands} >= {"check", "report"}
    for _, argv in commands:
        subs = _subparsers(parser)
        assert argv[0] in subs, f"`stability {argv[0]}` is not a subcommand (have {sorted(subs)})"
        sub, rest = subs[argv[0]], argv[1:]
        nested = _subparsers(sub)
        if nested:
            assert rest and rest[0] in nested, f"`stability {argv[0]} {rest[:1]}` is not a subcommand"
            sub, rest = nested[rest[0]], rest[1:]
        for word in rest:
            if word.startswith("-"):
                assert word.split("=")[0] in _options(sub), f"`stability {argv[0]}` has no option {word}"


def test_every_pytest_option_and_marker_in_the_workflow_exists(workflow, pytestconfig):
    runs = _commands(workflow, "pytest")
    assert runs
    markers = {line.split(":")[0].split("(")[0].strip() for line in pytestconfig.getini("markers")}
    for _, argv in runs:
        for index, word in enumerate(argv):
            if not word.startswith("-"):
                continue
            option = word.split("=")[0]
            try:
                pytestconfig.getoption(option)
            except ValueError:
                pytest.fail(f"pytest has no option {option} (used in the workflow: {' '.join(argv)})")
            if option == "-m":
                names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", argv[index + 1])) - {"and", "or", "not"}
                assert names <= markers, f"unknown marker(s) {names - markers} in -m {argv[index + 1]!r}"
        for value, option in (("full", "--scale"), ("smoke", "--scale"), ("cuda", "--device"), ("cpu", "--device")):
            if f"{option}={value}" in _normal(argv):
                choices = [a for a in pytestconfig._parser._anonymous.options + [o for g in pytestconfig._parser
                           ._groups for o in g.options] if option in a.names()]
                allowed = choices[0].attrs().get("choices") if choices else None
                assert allowed is None or value in allowed, f"{option} {value} not in {allowed}"


def test_the_install_step_brings_the_test_extra_with_pyyaml(workflow):
    pyproject = (WORKFLOW.parents[2] / "pyproject.toml").read_text()
    assert re.search(r'test = \[[^\]]*"pyyaml', pyproject), "pyyaml missing from the test extra"
    installs = [argv for _, argv in _commands(workflow, "pip") if argv[:2] == ["install", "-e"]]
    assert len(installs) == len(workflow["jobs"]) and all(argv[2] == ".[test]" for argv in installs)


# ----------------------------------------------------------------------------- the CPU job, end to end

def test_the_cpu_job_passes_on_unchanged_code_and_its_summary_holds_the_table(tmp_path):
    """A fresh copy, the job's run: steps as written (the install step replaced by prepare_venv): unchanged
    code passes, with the stated false-alarm rate (a second job on the same copy, reading only its own run
    directory, is run by tests/test_workflow_regression.py)."""
    copy = fresh_copy(tmp_path / "copy")
    job = run_job(WORKFLOW, "stress-cpu", copy, install=prepare_venv)
    assert job.passed, job.log()
    ran = {name for name, step in job.steps.items() if step.ran}
    assert {"stress", "check", "report"} <= ran and "fail on a regression" not in ran
    assert job.steps["check"].outputs == {"code": "0"}
    assert "### Stability check: :white_check_mark: PASS" in job.summary
    assert "| smoke/standard | gated | heldout_loss |" in job.summary       # the regression table
    assert "alpha = 0.01" in job.summary
    result = json.loads((copy / "reports" / "check.json").read_text())
    assert result["exit_code"] == 0 and result["alpha"] == 0.01
    primary = [row for row in result["rows"] if row["tier"] == "primary" and row["p"] is not None]
    assert result["rows_judged"] == len(primary) > 20 and len(result["rows"]) > 100   # the family, the advisory rest
    assert (copy / "reports" / "report.html").is_file()
