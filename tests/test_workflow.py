"""The CI workflow (.github/workflows/stability.yml): its commands, options and markers exist; the CPU job's
steps, run end to end in a fresh copy of the repository, pass on unchanged code with nothing the baseline
lacks; fail without the baseline, and against one whose invariants were removed, each naming the command
that makes it; fail a late divergence of one seed's gated arm (REGRESSED, exit 1) although a run directory
of unchanged records lies beside the job's under a later name; and nothing the job wrote, tampered with one
way at a time, steers the check (a record naming code, a baseline that is not whole, two records of one
run). Accepting a change end to end: test_accepting_a_change.py; zoo entries of each kind: test_zoo.py."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from stability.cli import build_parser
from stability.cli.init import render, workflow_template
from stability.record.rundir import newest_session
from validation.workflow import apply_patch, fresh_copy, prepare_venv, run_job
from validation.zoo import BY_NAME

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
    jobs = {name: job for name, job in workflow["jobs"].items() if name.startswith("stress-")}
    runners = {name: job["runs-on"] for name, job in jobs.items()}
    assert ["self-hosted", "gpu"] in runners.values() and "ubuntu-latest" in runners.values()
    expected = {"self-hosted,gpu": ("gpu-pr", "cuda"), "self-hosted,gpu,gpu-4": ("full", "cuda"),
                "ubuntu-latest": ("smoke", "cpu")}
    for job_name, job in jobs.items():
        key = ",".join(job["runs-on"]) if isinstance(job["runs-on"], list) else job["runs-on"]
        scale, device = expected[key]
        runs = [argv for name, argv in _commands(workflow, "pytest") if name == job_name]
        assert any(argv[:3] == ["suites/", "-m", "stress"] and f"--preset={scale}" in _normal(argv)
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


PULL_REQUEST = "github.event_name != 'schedule' && (github.event_name != 'workflow_dispatch' || inputs.baseline == '')"


def test_a_baseline_is_made_on_the_runner_of_each_job_by_hand_never_on_a_pull_request(workflow):
    """Each stress job has a baseline job on its runner, run only when dispatched by hand with the input
    `baseline` (when the stress jobs are not; the nightly job's with `nightly` too): it makes the baseline of its
    preset and device (all, or the cases named merged into the committed one), compares it with the committed one
    and uploads it. The pull-request jobs never run on the nightly schedule, the nightly one only then."""
    inputs = (workflow.get("on") or workflow[True])["workflow_dispatch"]["inputs"]
    assert inputs["baseline"]["default"] == "" and inputs["baseline"]["required"] is False
    assert inputs["nightly"]["default"] is False and inputs["nightly"]["type"] == "boolean"
    made = "github.event_name == 'workflow_dispatch' && inputs.baseline != '' && "
    for job, preset, stress_if, baseline_if in (("gpu", "gpu-pr", PULL_REQUEST, made + "!inputs.nightly"),
                                                ("cpu", "smoke", PULL_REQUEST, made + "!inputs.nightly"),
                                                ("nightly", "full", "github.event_name == 'schedule'",
                                                 made + "inputs.nightly")):
        stress, baseline = workflow["jobs"][f"stress-{job}"], workflow["jobs"][f"baseline-{job}"]
        assert stress["runs-on"] == baseline["runs-on"]
        assert stress["if"] == stress_if and baseline["if"] == baseline_if, job
        makes = [argv for name, argv in _commands(workflow, "stability") if name == f"baseline-{job}"]
        assert ["baseline", "make", "--preset", preset] == makes[0][:4] and "--cases" in makes[1], makes
        assert ["baseline", "compare", "$BASELINE", "$NEW_BASELINE"] in makes, makes
        assert any(s.get("uses", "").startswith("actions/upload-artifact") for s in baseline["steps"])


def _normal(argv: list[str]) -> list[str]:
    """["--preset", "full"] -> ["--preset=full"] for the options that take a value."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("--preset", "--device") and i + 1 < len(argv):
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
        for word in rest[:rest.index("--")] if "--" in rest else rest:      # after "--": pytest's arguments
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
        for value, option in (("full", "--preset"), ("smoke", "--preset"), ("cuda", "--device"), ("cpu", "--device")):
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


# ----------------------------------------------------------------------------- one template

def _tool():
    """tools/workflow.py: this repository's values of the workflow template, and the comparison."""
    spec = importlib.util.spec_from_file_location("workflow_tool", WORKFLOW.parents[2] / "tools" / "workflow.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_workflow_is_the_template_rendered_with_this_repositorys_values():
    """The file is what `stability init` writes (stability/cli/workflow.yml.in) with this repository's values:
    edit the template or tools/workflow.py, then regenerate the file, never the file alone."""
    tool = _tool()
    found = tool.differences(WORKFLOW.read_text(), tool.rendered())
    assert not found, (f"{WORKFLOW.name} is not the template rendered with this repository's values; regenerate "
                       f"it with `{tool.REGENERATE}`:\n" + "".join(found))


def _changed(lines: list[str]) -> list[str]:
    return [line for line in lines if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_an_edit_of_the_file_or_of_a_value_is_named_with_the_command_that_regenerates_it(tmp_path, monkeypatch,
                                                                                         capsys):
    """A hand edit of the workflow, and a value rendered differently, come out as exactly the lines that differ;
    `python tools/workflow.py --check` exits 1 naming the file and the command, 0 on the rendering."""
    tool = _tool()
    rendered = tool.rendered()
    edited = rendered.replace("timeout-minutes: 240", "timeout-minutes: 300", 1)
    assert _changed(tool.differences(edited, rendered)) == ["-    timeout-minutes: 240\n",
                                                            "+    timeout-minutes: 300\n"]
    trunk = render(workflow_template(), {**tool.values(), "BRANCH": "trunk"})
    assert _changed(tool.differences(trunk, rendered)) == ["-    branches: [main]\n", "+    branches: [trunk]\n"]
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(WORKFLOW.parents[2] / "pyproject.toml", tmp_path / "pyproject.toml")
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    monkeypatch.setattr(tool, "WORKFLOW", tmp_path / ".github" / "workflows" / "stability.yml")
    tool.WORKFLOW.write_text(edited)
    assert tool.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "+    timeout-minutes: 300" in out and ".github/workflows/stability.yml is not the template" in out
    assert "then run python tools/workflow.py" in out
    assert tool.main([]) == 0 and tool.WORKFLOW.read_text() == rendered and tool.main(["--check"]) == 0


# ----------------------------------------------------------------------------- the CPU job, end to end

PLANTED = "job-99999999999-9-cpu"   # a run directory left under reports/runs that sorts after the job's own


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """One fresh copy of the repository and the CPU job's steps as written (the install step replaced by
    prepare_venv): on unchanged code; its check and report steps again without the committed baseline, and
    against it with its invariants removed."""
    copy = fresh_copy(tmp_path_factory.mktemp("workflow") / "copy")
    runs = copy / "reports" / "runs"
    unchanged = run_job(WORKFLOW, "stress-cpu", copy, install=prepare_venv, run_id=101)
    first = {"result": json.loads((copy / "reports" / "check.json").read_text()),
             "report": (copy / "reports" / "report.html").is_file(), "session": runs / "job-101-1-cpu"}
    path = copy / "reports" / "baselines" / "smoke-cpu.json"
    committed = shutil.copy(path, copy.parent / "committed-smoke-cpu.json")
    path.unlink()
    again = {"stress", "kernel"}   # the job's later steps, on the records the unchanged job left
    no_baseline = run_job(WORKFLOW, "stress-cpu", copy, install=lambda _copy: None, run_id=101, skip=again)
    baseline = json.loads(Path(committed).read_text())
    baseline["invariants"] = baseline["covers"]["invariants"] = None
    path.write_text(json.dumps(baseline))
    no_invariants = run_job(WORKFLOW, "stress-cpu", copy, install=lambda _copy: None, run_id=101, skip=again)
    shutil.copy(committed, path)
    return SimpleNamespace(copy=copy, unchanged=unchanged, first=first, no_baseline=no_baseline,
                           no_invariants=no_invariants, baseline=Path(committed))


@pytest.fixture(scope="module")
def harmful(jobs):
    """The CPU job again in the same copy, on a harmful change (the gated arm of seed 1 trains its last 15% at
    100x the learning rate it logs), with the first job's run directory planted under a later name (as a
    session committed by mistake or restored from a cache would lie). It trains every stress suite a second
    time: the tests that read it are long (CI runs them in a step of their own)."""
    runs = jobs.copy / "reports" / "runs"
    shutil.copytree(jobs.first["session"], runs / PLANTED)
    apply_patch(jobs.copy, BY_NAME["gated_lr_x100_late_seed1"].edits)
    job = run_job(WORKFLOW, "stress-cpu", jobs.copy, install=lambda _copy: None, run_id=102)
    return SimpleNamespace(job=job, session=runs / "job-102-1-cpu",
                           result=json.loads((jobs.copy / "reports" / "check.json").read_text()))


def test_the_cpu_job_passes_on_unchanged_code_and_its_summary_holds_the_table(jobs):
    """Unchanged code passes, with the stated false-alarm rate, judging its own run directory, and nothing
    the baseline lacks (it covers what the code judges: no note of figures or invariants left unjudged)."""
    job, result = jobs.unchanged, jobs.first["result"]
    assert job.passed, job.log()
    ran = {name for name, step in job.steps.items() if step.ran}
    assert {"stress", "check", "report"} <= ran and "fail on a regression" not in ran
    assert job.steps["check"].outputs == {"code": "0"}
    assert "### Stability check: :white_check_mark: PASSED" in job.summary
    assert "| smoke/standard | gated | heldout_loss |" in job.summary       # the regression table
    assert {row["arm"] for row in result["rows"] if row["figure"] == "quant_w8a8-tensor_kl"
            and row["tier"] == "primary"} == {"reference", "gated"}        # quantization damage is in the gate
    assert "alpha = 0.01" in job.summary
    assert result["exit_code"] == 0 and result["alpha"] == 0.01 and not result["errors"]
    assert not [note for note in result["notes"] if "not judged" in note or "not in the baseline" in note]
    primary = [row for row in result["rows"] if row["tier"] == "primary" and row["p"] is not None]
    assert result["rows_judged"] == len(primary) > 20 and len(result["rows"]) > 100   # the family, the advisory rest
    assert jobs.first["report"]


def test_no_job_passes_without_its_baseline_and_the_failure_names_the_command(jobs):
    job = jobs.no_baseline
    assert job.failed and job.steps["check"].outputs == {"code": "2"} and not job.steps["stress"].ran, job.log()
    assert "stability baseline make --preset smoke --device cpu --out reports/baselines/smoke-cpu.json" in job.summary
    assert job.steps["fail on a regression"].ran


def test_a_baseline_without_the_invariants_the_job_evaluates_fails_unchanged_code_naming_the_command(jobs):
    job = jobs.no_invariants
    assert job.failed and job.steps["check"].outputs == {"code": "2"}, job.log()
    output = job.steps["check"].output
    assert "the baseline is stale" in output and "the baseline was made without the suites" in output
    assert "stability baseline make --preset smoke --device cpu --cases " in output


@pytest.mark.slow
@pytest.mark.long
def test_a_late_divergence_of_one_seed_fails_although_a_later_named_run_directory_lies_beside_it(jobs, harmful):
    """The gated arm of seed 1 at 100x its learning rate over the last 15%: the job is REGRESSED (exit 1),
    naming the seed, never "unusable input" and never advice to make the baseline again; a run directory of
    unchanged records under a later name beside the job's is not judged in its place (judged the old way,
    the newest under reports/runs, the same files would pass)."""
    job = harmful.job
    assert job.failed and job.steps["check"].outputs == {"code": "1"}, job.log()
    assert ":x: REGRESSED" in job.summary and "make the baseline again" not in job.summary
    failed = [o["reason"] for o in harmful.result["outcomes"]] + [
        f"{row['case_key']} {row['arm']} {row['figure']}" for row in harmful.result["rows"] if row["verdict"] == "regressed"]
    assert any("seed 1" in reason for reason in failed) or any("gated" in reason for reason in failed), failed
    runs = jobs.copy / "reports" / "runs"
    assert newest_session(runs).name == PLANTED != harmful.session.name
    assert _check(jobs, str(runs)).returncode == 0        # the planted records, judged in place of the job's


# ----------------------------------------------------------------------------- what a job reads is data

def _check(jobs, *records: str, baseline: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`stability check` in the copy, as the workflow's check step runs it."""
    baseline = baseline or jobs.baseline
    return subprocess.run([str(jobs.copy / ".venv" / "bin" / "stability"), "check", "--baseline", str(baseline),
                           *records], cwd=jobs.copy, capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})


def _tampered(jobs, tmp_path: Path, session: Path, change) -> Path:
    """A copy of ``session`` with ``change(record)`` applied to its plain pair's record."""
    target = shutil.copytree(session, tmp_path / session.name)
    path = next(target.glob("smoke-standard-regression-*.json"))
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))
    return target


@pytest.mark.slow
@pytest.mark.long
def test_a_record_naming_code_is_read_never_run(jobs, harmful, tmp_path):
    """A record of the harmful job naming a module that writes a marker when imported, or ``sys:exit`` (which
    made the check exit 0), as its config's plugins or its environment's extensions: the check still fails the
    job, exit 1, and nothing named was imported."""
    modules = tmp_path / "modules"
    modules.mkdir()
    marker = tmp_path / "imported"
    (modules / "planted_marker.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    env = {"PYTHONPATH": str(modules)}
    for name in ("planted_marker", "sys:exit"):
        in_config = _tampered(jobs, tmp_path / f"config-{name[:3]}", harmful.session,
                              lambda r, name=name: r["config"].__setitem__("plugins", [name]))
        beside = _tampered(jobs, tmp_path / f"env-{name[:3]}", harmful.session,
                           lambda r, name=name: r["env"]["extensions"].append(
                               {"name": "planted", "spec": name, "source": "entry point", "version": None}))
        for session in (in_config, beside):
            done = _check(jobs, str(session), env=env)
            assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
            assert "REGRESSED" in done.stdout and "max_attn_logit" in done.stdout
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["nan_figure", "no_cases", "no_gated_arm"])
def test_a_baseline_that_is_not_whole_never_passes(jobs, tmp_path, damage):
    """The committed baseline with a NaN in a completed run's figure, with no case, or without the gated arm,
    judged against the unchanged job's records (which pass the whole one): never exit 0."""
    baseline = json.loads(jobs.baseline.read_text())
    if damage == "nan_figure":
        runs = baseline["cases"]["smoke/standard"]["arms"]["gated"]["figures"]["heldout_loss"]["0"]
        runs["0"] = float("nan")
    elif damage == "no_cases":
        baseline["cases"] = {}
    else:
        for case in baseline["cases"].values():
            case["arms"].pop("gated", None)
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(baseline))           # a NaN is written as the literal NaN, as Python writes it
    done = _check(jobs, str(jobs.first["session"]), baseline=path)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert str(path) in line


@pytest.mark.parametrize("created_at", ["2099-01-01T00:00:00+00:00", "1999-01-01T00:00:00+00:00"])
@pytest.mark.slow
@pytest.mark.long
def test_a_regressed_record_beside_a_copy_of_an_unchanged_one_never_passes(jobs, harmful, tmp_path, created_at):
    """The harmful job's run directory with the unchanged job's plain-pair record copied in, dated 2099 or
    1999: two records of one run are refused (exit 2, both named), whatever their dates."""
    session = shutil.copytree(harmful.session, tmp_path / "job")
    unchanged = json.loads(next(jobs.first["session"].glob("smoke-standard-regression-*.json")).read_text())
    unchanged["created_at"] = created_at
    (session / "standard-copy.json").write_text(json.dumps(unchanged))
    done = _check(jobs, str(session))
    assert done.returncode == 2 and "is in two records" in done.stderr, done.stdout[-2000:] + done.stderr[-2000:]
    assert "standard-copy.json" in done.stderr
