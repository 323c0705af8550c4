"""`stability init` (stability.cli.init): the factory it checks, the settings table, the workflow and the
.gitignore it writes, what it prints and what it refuses; `stability baseline make`'s defaults from the settings,
what it says when the suites fail, and the model invariants it lists."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from _stability_records import pair_record, with_replicates
from test_workflow import WORKFLOW, _commands, _normal, _options, _subparsers

from stability.cases.stress import CASES
from stability.cli import build_parser, main
from stability.cli.init import TemplateError, job_commands, render, workflow_template, workflow_values
from stability.plugin.settings import KEYS, check, read_settings

PYPROJECT = b'[project]\nname = "mypackage"\nversion = "0.1.0"\n\n[tool.ruff]\nline-length = 100'   # no final newline


def init(tmp_path: Path, monkeypatch, *args: str) -> int:
    monkeypatch.chdir(tmp_path)
    return main(["init", *args])


@pytest.fixture(autouse=True)
def mypackage(tmp_path_factory, monkeypatch):
    """An importable ``mypackage.model:build`` (the harness's own model behind it: a factory that keeps the
    whole contract), outside the repository stability init writes into."""
    site = tmp_path_factory.mktemp("site")
    (site / "mypackage").mkdir()
    (site / "mypackage" / "__init__.py").write_text("")
    (site / "mypackage" / "model.py").write_text("from _factories import harness_lm as build\n")
    (site / "brokenpackage.py").write_text("def returns_a_tuple(config):\n    from _factories import harness_lm\n"
                                           "    return harness_lm(config), config\n")
    monkeypatch.syspath_prepend(str(site))
    yield
    for name in ("mypackage", "mypackage.model", "brokenpackage"):
        sys.modules.pop(name, None)


def test_the_table_is_appended_and_the_rest_of_pyproject_kept_byte_for_byte(tmp_path, monkeypatch, capsys):
    (tmp_path / "pyproject.toml").write_bytes(PYPROJECT)
    assert init(tmp_path, monkeypatch, "--factory", "mypackage.model:build") == 0
    written = (tmp_path / "pyproject.toml").read_bytes()
    assert written.startswith(PYPROJECT) and written.count(b"[tool.stability]") == 1
    data = tomllib.loads(written.decode())
    assert data["project"] == {"name": "mypackage", "version": "0.1.0"} and data["tool"]["ruff"] == {"line-length": 100}
    initial = {key.name: key.initial for key in KEYS}
    assert data["tool"]["stability"] == {**initial, "cases": list(CASES), "model": {"factory": "mypackage.model:build"}}
    settings = read_settings(tmp_path / "pyproject.toml")
    assert settings.cases == tuple(CASES) and settings.factory == "mypackage.model:build"
    config = check(settings)   # the table builds a valid config
    assert config.run.model.factory == "mypackage.model:build" and config.seeds == (0, 1, 2)
    lines = written.decode().splitlines()
    for key in KEYS:   # every key after its comment
        start = {"model": "model.factory =", "set": "[tool.stability.set]"}.get(key.name, f"{key.name} =")
        (index,) = [i for i, line in enumerate(lines) if line.startswith(start)]
        assert lines[index - 1].startswith("# ") and key.comment.split()[-1] in " ".join(lines[index - 3:index])
    out = capsys.readouterr().out
    assert "    stability baseline make\n" in out
    assert "ungated arm: " in out and "observer calls attn_logits, attn_probs, gate_score" in out   # what it found
    workflow = (tmp_path / ".github" / "workflows" / "stability.yml").read_text()
    commands = job_commands(workflow, "stress-cpu", "reports/baselines/smoke-cpu.json")
    assert [c.split()[:2] for c in commands] == [["pytest", "--pyargs"], ["stability", "check"]]
    assert "".join(f"    {c}\n" for c in commands) in out and "&&" not in out   # the job's own, one per line
    assert "-n 2" in commands[0] and '"$BASELINE"' in workflow


def test_without_a_pyproject_the_settings_go_into_stability_toml(tmp_path, monkeypatch):
    assert init(tmp_path, monkeypatch) == 0
    settings = read_settings(tmp_path / "stability.toml")
    assert settings.preset == "smoke" and settings.own_model and settings.replicates == 19
    assert not (tmp_path / "pyproject.toml").exists()


def test_nothing_is_overwritten_without_force(tmp_path, monkeypatch, capsys):
    (tmp_path / "pyproject.toml").write_bytes(PYPROJECT)
    assert init(tmp_path, monkeypatch) == 0
    first = {p: p.read_bytes() for p in (tmp_path / "pyproject.toml", tmp_path / WORKFLOW.relative_to(WORKFLOW.parents[2]))}
    capsys.readouterr()
    assert init(tmp_path, monkeypatch, "--factory", "mypackage.model:build") == 2
    err = capsys.readouterr().err
    assert "already has a [tool.stability] table" in err and "--force" in err and "nothing written" in err
    assert {p: p.read_bytes() for p in first} == first
    # only the workflow there: still refused, and the table is not written either
    (tmp_path / "pyproject.toml").write_bytes(PYPROJECT)
    assert init(tmp_path, monkeypatch) == 2
    assert "stability.yml already exists" in capsys.readouterr().err
    assert (tmp_path / "pyproject.toml").read_bytes() == PYPROJECT
    # --force replaces the table (once) and the workflow, and keeps the rest
    assert init(tmp_path, monkeypatch, "--force", "--factory", "mypackage.model:build") == 0
    text = (tmp_path / "pyproject.toml").read_text()
    assert text.startswith(PYPROJECT.decode()) and text.count("[tool.stability]") == 1
    assert read_settings(tmp_path / "pyproject.toml").factory == "mypackage.model:build"
    assert init(tmp_path, monkeypatch, "--force") == 0
    assert read_settings(tmp_path / "pyproject.toml").own_model


@pytest.mark.parametrize(("factory", "said"), [
    ("mypackage/model.py", "model.factory='mypackage/model.py' is invalid"),
    ("nosuchmodule:fn", "model.factory='nosuchmodule:fn' does not import: ModuleNotFoundError"),
    ("mypackage.model:nothing", "module 'mypackage.model' has no function 'nothing'"),
    ("brokenpackage:returns_a_tuple", "returned tuple: expected a torch.nn.Module"),
])
def test_a_factory_the_suites_cannot_use_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys, factory,
                                                                                said):
    assert init(tmp_path, monkeypatch, "--factory", factory) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and "nothing written" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_workflow_runs_on_the_default_branch_and_the_run_output_is_ignored(tmp_path, monkeypatch, capsys):
    """The push trigger names the repository's branch (git; main outside a repository); .gitignore gets the run
    output, appended to the repository's own lines, never twice."""
    assert init(tmp_path, monkeypatch) == 0
    assert "branches: [main]" in (tmp_path / ".github" / "workflows" / "stability.yml").read_text()
    assert (tmp_path / ".gitignore").read_text().splitlines()[1:] == ["reports/*", "!reports/baselines/"]
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "trunk", str(repo)], check=True)
    (repo / ".gitignore").write_text("__pycache__/\nreports/*")      # no final newline, one of the two lines
    assert init(repo, monkeypatch) == 0
    assert "branches: [trunk]" in (repo / ".github" / "workflows" / "stability.yml").read_text()
    assert "on pushes to trunk" in capsys.readouterr().out
    lines = (repo / ".gitignore").read_text().splitlines()
    assert lines[:2] == ["__pycache__/", "reports/*"] and lines[-1] == "!reports/baselines/" and lines.count("reports/*") == 1
    before = (repo / ".gitignore").read_bytes()
    assert init(repo, monkeypatch, "--force") == 0 and (repo / ".gitignore").read_bytes() == before


def test_the_template_is_filled_marker_by_marker_and_a_mismatch_is_named():
    """A marker within a line takes a one-line value; a marker alone on its line takes whole lines, indented as
    it is, or leaves the line out; a marker without a value, a value for no marker and a value that does not
    fit its place are errors naming it."""
    template = "on: [@BRANCH@]\nenv:\n  @ENV@\nsteps:\n"
    assert render(template, {"BRANCH": "main", "ENV": "A: 1\n\nB: 2\n"}) == "on: [main]\nenv:\n  A: 1\n\n  B: 2\nsteps:\n"
    assert render(template, {"BRANCH": "main", "ENV": ""}) == "on: [main]\nenv:\nsteps:\n"
    with pytest.raises(TemplateError, match=r"no value for @ENV@; no marker for PACKAGE"):
        render(template, {"BRANCH": "main", "PACKAGE": "x"})
    with pytest.raises(TemplateError, match=r"@BRANCH@ \(within a line\) has a newline"):
        render(template, {"BRANCH": "main\n", "ENV": ""})
    with pytest.raises(TemplateError, match=r"@ENV@ \(whole lines\) does not end with a newline"):
        render(template, {"BRANCH": "main", "ENV": "A: 1"})
    values = workflow_values("pyproject.toml", "smoke", "reports/baselines", "stability[suites]", "main")
    with pytest.raises(TemplateError, match="no value for @BRANCH@; no marker for none"):
        render(workflow_template(), {name: value for name, value in values.items() if name != "BRANCH"})
    text = render(workflow_template(), values)
    assert "@" not in text.replace("actions/", "").replace("@v4", "").replace("@v5", "")   # every marker filled
    assert yaml.safe_load(text)["jobs"]["stress-nightly"]["env"]["STABILITY_PACKAGE"] == "stability[suites]"


def _steps(job: dict) -> list[str]:
    return [step.get("id") or step.get("name") or step["uses"].split("@")[0] for step in job["steps"]]


@pytest.mark.parametrize("factory", ["", "mypackage.model:build"], ids=["own model", "factory"])
def test_the_workflow_has_this_repositorys_jobs_and_steps(tmp_path, monkeypatch, factory, pytestconfig):
    """The CPU, GPU and nightly jobs of this repository's workflow, step for step (the kernel steps only for the
    harness's own model: a factory's attention never runs the harness's kernel; the compile job of this
    repository's kernel is its own); every command and option it uses exists."""
    init(tmp_path, monkeypatch, *(["--factory", factory] if factory else []))
    text = (tmp_path / ".github" / "workflows" / "stability.yml").read_text()
    generated = yaml.safe_load(text)
    ours = yaml.safe_load(WORKFLOW.read_text())
    assert generated.keys() == ours.keys() and generated[True] == ours[True]   # YAML reads the key "on" as True
    assert generated["jobs"].keys() == ours["jobs"].keys() - {"kernel-compile"}
    said = re.search(r"^# Which job gates merges(.*?)^name:", text, re.MULTILINE | re.DOTALL).group(1)
    gating, nightly = said.split("nightly", 1)
    assert set(re.findall(r"stress-[a-z]+", said)) == {name for name in generated["jobs"] if name.startswith("stress-")}
    assert all(generated["jobs"][name]["if"] == ours["jobs"]["stress-cpu"]["if"]     # a pull request's condition
               for name in re.findall(r"stress-[a-z]+", gating))
    assert re.findall(r"stress-[a-z]+", nightly) == ["stress-nightly"] and "gates nothing" in nightly
    assert generated["jobs"]["stress-nightly"]["if"] == "github.event_name == 'schedule'"
    for name, job in generated["jobs"].items():
        expected = [s for s in _steps(ours["jobs"][name]) if factory == "" or s != "kernel"]
        assert _steps(job) == expected, name
        assert job["runs-on"] == ours["jobs"][name]["runs-on"] and job["if"] == ours["jobs"][name]["if"]
        assert job["timeout-minutes"] == ours["jobs"][name]["timeout-minutes"]
        assert job["env"]["BASELINE"] == ours["jobs"][name]["env"]["BASELINE"]
    runs = {job: argv for job, argv in _commands(generated, "pytest") if "stress" in argv}
    assert _normal(runs["stress-cpu"])[:5] == ["--pyargs", "stability.suites", "-m", "stress", "--preset=smoke"]
    assert "--device=cuda" in _normal(runs["stress-gpu"]) and "--preset=gpu-pr" in _normal(runs["stress-gpu"])
    assert "--preset=full" in _normal(runs["stress-nightly"]) and "-n" in runs["stress-nightly"]
    for _, argv in _commands(generated, "pytest"):
        for word in argv:
            if word.startswith("-") and word != "--pyargs":
                pytestconfig.getoption(word.split("=")[0])   # ValueError for an option pytest lacks
    parser = build_parser()
    for _, argv in _commands(generated, "stability"):
        sub, rest = _subparsers(parser)[argv[0]], argv[1:]
        if _subparsers(sub):                       # stability baseline make|compare ...
            sub, rest = _subparsers(sub)[rest[0]], rest[1:]
        rest = rest[:rest.index("--")] if "--" in rest else rest   # after "--": pytest's arguments
        assert all(w.split("=")[0] in _options(sub) for w in rest if w.startswith("-")), argv


def test_baseline_make_runs_the_installed_suites_with_the_settings(tmp_path, monkeypatch, capsys):
    """From any repository: the installed suites (pytest --pyargs stability.suites), at the settings' preset
    and replicates, under the plugin's own option names; the baseline goes into the settings' directory."""
    (tmp_path / "stability.toml").write_text('preset = "ci"\nreplicates = 3\nbaselines = "gate"\n')
    seen = []

    def fake_run(command, env, check):
        seen.append((command, env))
        return subprocess.CompletedProcess(command, 1)
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.chdir(tmp_path)
    assert main(["baseline", "make"]) == 2
    (command, env), = seen
    assert command[1:] == ["-m", "pytest", "--pyargs", "stability.suites", "-m", "stress", "--stability-preset", "ci",
                           "--stability-replicates", "3", "-p", "no:cacheprovider"]
    err = capsys.readouterr().err
    assert env["STABILITY_RUN_DIR"].startswith("reports/runs/") and "pytest exit 1" in err
    assert "nothing was recorded" in err and "records so far" not in err     # no directory named that is not there
    seen.clear()
    assert main(["baseline", "make", "--preset", "smoke", "--replicates", "2", "--suites", ".", "--device", "cpu"]) == 2
    assert seen[0][0][3:] == [".", "-m", "stress", "--stability-preset", "smoke", "--stability-replicates", "2", "-p",
                              "no:cacheprovider", "--stability-device", "cpu"]


def test_baseline_make_writes_the_baseline_and_lists_the_model_invariants_that_failed(tmp_path, monkeypatch, capsys):
    """The suites pass (a model invariant that fails is recorded, not failed): the baseline is written from the
    run directory and the invariants that did not hold are listed; when the suites fail, the directory is
    named only if it holds something."""
    record = pair_record()
    invariants = [{"case_key": "smoke/standard", "name": "loss_falls", "arm": "reference", "seed": 1, "held": False,
                   "value": 0.97, "bound": 0.9, "message": "final / first", "test": "t"},
                  {"case_key": "smoke/standard", "name": "loss_falls", "arm": "gated", "seed": 1, "held": True,
                   "value": 0.6, "bound": 0.9, "message": "", "test": "t"}]
    exit_code = [0]

    def fake_run(command, env, check):
        run_dir = Path(env["STABILITY_RUN_DIR"])
        run_dir.mkdir(parents=True)
        (run_dir / "manifest.json").write_text("{}")
        for index, one in enumerate(with_replicates(record, replicates=(1, 2))):
            (run_dir / f"r{index}.json").write_text(json.dumps(one, allow_nan=False))
        (run_dir / "invariants-gw0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in invariants))
        return subprocess.CompletedProcess(command, exit_code[0])
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.chdir(tmp_path)
    assert main(["baseline", "make", "--commit", "abc"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "reports" / "baselines" / "smoke-cpu.json").is_file() and "baseline written" in out
    listed = out[out.index("model invariants that did not hold on this model: 1 of 2"):].splitlines()
    assert listed[1] == "  smoke/standard reference seed 1: loss_falls (0.97 against bound 0.9) - final / first"
    assert "gated" not in "".join(listed)
    exit_code[0] = 1
    assert main(["baseline", "make"]) == 2
    assert "pytest exit 1" in (err := capsys.readouterr().err) and "the records so far are in reports/runs/" in err


def test_every_settings_key_is_in_the_documented_table():
    text = (Path(__file__).resolve().parents[1] / "docs" / "your-repository.md").read_text()
    assert [key.name for key in KEYS if f"| `{key.name}` |" not in text] == []
