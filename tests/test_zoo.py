"""A couple of regression-zoo entries of each kind, through the cases they move (the zoo benchmark,
validation/regression_zoo.py, runs every entry through the whole CPU workflow job)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from validation.workflow import prepare_venv
from validation.zoo import BY_NAME, patched_copy

ZOO_CASES = ("standard", "lr_sweep")


def copy_environment() -> dict:
    """This process's environment without what would point a patched copy's commands elsewhere."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("STABILITY_", "MLFLOW_", "PYTEST_", "VIRTUAL_ENV"))}   # the cases these entries move; the zoo benchmark runs the whole job


@pytest.mark.parametrize("name, expected", [
    # a minute each on 2 cores: long tests (CI's step of long tests runs these two); the kept jobs of every
    # entry are judged again in the test command (tests/test_docs_examples.py)
    pytest.param("init_std_x3", 1, marks=(pytest.mark.slow, pytest.mark.long)),
    pytest.param("rmsnorm_divide_by_sqrt", 0, marks=(pytest.mark.slow, pytest.mark.long)),
    pytest.param("gate_sigmoid_to_identity", 1, marks=pytest.mark.slow),
    pytest.param("fused_qkv_projection", 0, marks=pytest.mark.slow)])
def test_zoo_entries_harmful_caught_harmless_passed(tmp_path, name, expected):
    """Two harmful and two harmless zoo entries through `stability stress` of the cases they move and
    `stability check` (validation/regression_zoo.py measures every entry through the whole CPU job)."""
    entry = BY_NAME[name]
    assert entry.harmful == bool(expected)
    copy = patched_copy(tmp_path / name, name)
    prepare_venv(copy)
    stability = str(copy / ".venv" / "bin" / "stability")
    env = copy_environment()
    stress = subprocess.run([stability, "stress", *ZOO_CASES, "--preset", "smoke", "--no-track"], cwd=copy,
                            env=env, capture_output=True, text=True, check=False)
    assert stress.returncode == 0, stress.stdout[-2000:] + stress.stderr[-2000:]
    check = subprocess.run([stability, "check", "--baseline", "reports/baselines/smoke-cpu.json", "--cases",
                            ",".join(ZOO_CASES), "--json", "check.json"], cwd=copy, env=env, capture_output=True, text=True, check=False)
    assert check.returncode == expected, check.stdout[-3000:]
    named = [row for row in json.loads((copy / "check.json").read_text())["rows"] if row["verdict"] == "regressed"]
    assert bool(named) == bool(expected) and (not expected or "REGRESSED" in check.stdout)


def test_the_cpu_jobs_kernel_step_catches_a_wrong_gate_gradient(tmp_path):
    """The CPU stress suites train on the torch backend, so only the job's kernel step reaches the Triton
    backward: with the zoo's ``kernel_dg_missing_factor`` applied, that step, run as the workflow
    writes it, fails and names dgate."""
    import yaml

    from validation.workflow import WORKFLOW

    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["stress-cpu"]["steps"]
    script = next(step["run"] for step in steps if step.get("id") == "kernel")
    copy = patched_copy(tmp_path / "kernel", "kernel_dg_missing_factor")
    prepare_venv(copy)
    env = copy_environment()
    result = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=copy, env=env, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    assert "dgate: kernel error" in result.stdout and "[True-elem]" in result.stdout


def test_every_zoo_patch_still_applies_to_the_code_exactly_once():
    """A zoo entry whose text moved away would measure nothing: each edit's old text occurs once, and the
    patched file still compiles."""
    from pathlib import Path

    from validation.zoo import BY_NAME

    root = Path(__file__).resolve().parents[1]
    drifted, broken = [], []
    for entry in BY_NAME.values():
        patched = {}
        for name, old, new in entry.edits:
            text = patched.get(name, (root / name).read_text())
            if text.count(old) != 1:
                drifted.append((entry.name, name))
            patched[name] = text.replace(old, new)
        for name, text in patched.items():
            try:
                compile(text, name, "exec")
            except SyntaxError as error:
                broken.append((entry.name, name, str(error)))
    assert not drifted, drifted
    assert not broken, broken


def test_every_entry_the_zoo_benchmark_runs_is_checked_above():
    """The test above walks ``BY_NAME``: every entry of every group the zoo benchmark runs is there, under a
    name no other entry has (a group left out of ``BY_NAME``, or a name taken twice, would go unchecked)."""
    from validation.regression_zoo import GROUPS, UNCHANGED

    entries = [entry for _, group in GROUPS for entry in group if entry is not UNCHANGED]
    names = [entry.name for entry in entries]
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)
    assert [entry for entry in entries if BY_NAME.get(entry.name) is not entry] == []
    assert set(BY_NAME) == set(names)


def test_a_kept_job_names_the_code_it_ran(tmp_path):
    """The zoo and the null jobs keep, with a job, the commit of the checkout its copy was made from
    (``code_of``): the commit alone when the tracked files are as committed, "+changes" when one differs,
    None for a folder that is not a git checkout."""
    from validation.regression_zoo import code_of

    def git(*arguments: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *arguments], cwd=tmp_path,
                              check=True, capture_output=True, text=True).stdout.strip()

    assert code_of(tmp_path) is None
    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    commit = git("rev-parse", "HEAD")
    assert code_of(tmp_path) == commit
    (tmp_path / "untracked.txt").write_text("not the code\n")
    assert code_of(tmp_path) == commit
    (tmp_path / "a.txt").write_text("two\n")
    assert code_of(tmp_path) == commit + "+changes"
