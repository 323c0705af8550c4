"""Run a GitHub Actions job's ``run:`` steps here, in order, the way the runner would.

    copy = fresh_copy(destination)                       # the repository's files, as a checkout has them
    prepare_venv(copy)                                   # stands in for the job's install step (no network)
    job = run_job(WORKFLOW, "stress-cpu", copy)          # every step, with GITHUB_OUTPUT / _STEP_SUMMARY
    job.passed, job.steps["check"].outputs, job.summary

What is executed is the workflow file's own text: each ``run:`` script goes to ``bash --noprofile
--norc -eo pipefail`` (the runner's default shell) with the job's ``env``, a ``GITHUB_OUTPUT`` and a
``GITHUB_STEP_SUMMARY`` file, ``${{ steps.<id>.outputs.<name> }}`` substituted, and each step's
``if:`` evaluated (``always()``, ``success()``, ``failure()``, ``==``, ``!=``, ``&&``, ``||``, ``!``).
``uses:`` steps (checkout, setup-python, upload-artifact) are the runner's own actions: they are
recorded as skipped. The one substitution: a step named ``install ...`` downloads packages, which a
test machine cannot, so ``install`` (a callable; by default ``prepare_venv``) runs in place of its lines that
make the venv and install packages, and its other lines (the activation, the runner's checks) run as written.
A GPU job runs here on a simulated GPU (``validation.gpu_jobs``): each step up to its first CUDA computation.

Used by the tests and by ``validation/regression_zoo.py`` (the zoo runs the job on every entry).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "stability.yml"


# ----------------------------------------------------------------------------- the copy and its venv

def fresh_copy(destination: Path, source: Path = ROOT) -> Path:
    """The files a checkout of ``source`` holds (tracked, and untracked but not ignored), in ``destination``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=source,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = source / name
        if src.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return destination


def prepare_venv(copy: Path) -> None:
    """``copy/.venv``: a virtual environment that sees this environment's installed packages and has the
    copy itself installed in editable mode (so ``stability`` and ``pytest`` run the copy's code)."""
    venv = make_venv(copy / ".venv")
    install(venv, "-e", str(copy))


def make_venv(venv: Path) -> Path:
    """A virtual environment that sees this environment's installed packages (a .pth file naming every
    site-packages folder of the running interpreter), with ``pytest``, ``mlflow`` and ``stability`` scripts of
    its own (an install into it replaces them)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", code], check=True, capture_output=True,
                               text=True).stdout.strip())
    outer = [p for p in sys.path if p.endswith("site-packages")] or [sysconfig.get_paths()["purelib"]]
    (site / "_outer_environment.pth").write_text("\n".join(dict.fromkeys(outer)) + "\n")
    for tool, module, entry in (("pytest", "pytest", "console_main"), ("mlflow", "mlflow.cli", "cli"),
                                ("stability", "stability.cli", "main")):
        script = venv / "bin" / tool
        script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom {module} import {entry}\n"
                          f"sys.exit({entry}())\n")
        script.chmod(0o755)
    return venv


def install(venv: Path, *arguments: str) -> None:
    """``pip install ARGUMENTS`` into ``venv``, offline: no dependencies, no build isolation, no index."""
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-build-isolation", "--no-index", *arguments], check=True, capture_output=True)


def apply_patch(copy: Path, edits) -> None:
    """Apply (path, old text, new text) edits to the copy; each old text must occur exactly once."""
    for name, old, new in edits:
        path = copy / name
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            raise ValueError(f"{name}: the text to replace occurs {count} times (expected once): {old[:80]!r}")
        path.write_text(text.replace(old, new))


# ----------------------------------------------------------------------------- expressions

EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def _value(reference: str, outputs: dict, contexts: dict | None = None) -> str:
    context = re.fullmatch(r"(github|inputs)\.(\w+)", reference)
    if context:
        return str((contexts or {}).get(context.group(1), {}).get(context.group(2), ""))
    match = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", reference)
    if not match:
        raise ValueError(f"unsupported expression {reference!r}")
    return outputs.get(match.group(1), {}).get(match.group(2), "")


def substitute(text: str, outputs: dict, contexts: dict | None = None) -> str:
    """``${{ steps.<id>.outputs.<name> }}`` -> the value (empty when unset, as on the runner); ``${{
    github.<name> }}`` and ``${{ inputs.<name> }}`` -> the run's (``contexts["github"]``, ``contexts["inputs"]``)."""
    return EXPRESSION.sub(lambda m: _value(m.group(1), outputs, contexts), text)


def condition(text: str | None, outputs: dict, failed: bool) -> bool:
    """Evaluate a step's ``if:`` (absent: ``success()``)."""
    if text is None:
        return not failed
    text = EXPRESSION.sub(lambda m: m.group(1), str(text)).strip()
    tokens = re.findall(r"always\(\)|success\(\)|failure\(\)|steps\.[\w.-]+|'[^']*'|==|!=|&&|\|\||!|\(|\)", text)
    if "".join(tokens) != re.sub(r"\s+", "", text):
        raise ValueError(f"unsupported if: {text!r}")
    python = []
    for token in tokens:
        if token == "always()":
            python.append("True")
        elif token == "success()":
            python.append(repr(not failed))
        elif token == "failure()":
            python.append(repr(failed))
        elif token.startswith("steps."):
            python.append(repr(_value(token, outputs)))
        elif token.startswith("'"):
            python.append(repr(token[1:-1]))
        else:
            python.append({"&&": " and ", "||": " or ", "!": " not "}.get(token, f" {token} "))
    return bool(eval("".join(python), {"__builtins__": {}}))


# ----------------------------------------------------------------------------- the job

@dataclass
class Step:
    name: str
    ran: bool
    code: int | None = None
    output: str = ""
    outputs: dict = field(default_factory=dict)
    seconds: float = 0.0
    reached: dict | None = None   # on a simulated GPU: the marker of the first CUDA computation (the step stopped)


@dataclass
class Job:
    steps: dict[str, Step] = field(default_factory=dict)
    summary: str = ""
    failed: bool = False

    @property
    def passed(self) -> bool:
        return not self.failed

    def log(self) -> str:
        return "\n".join(f"--- {name}: {'ran, exit ' + str(s.code) if s.ran else 'skipped'}\n{s.output[-3000:]}"
                         for name, s in self.steps.items())


def _outputs(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


INSTALLS = re.compile(r"^\s*(python3? -m venv|pip install)\b")


def install_checks(script: str) -> str:
    """An install step's lines other than those that make the venv and download packages (``INSTALLS``): its
    activation and the runner's own checks, which run as written after ``install``."""
    return "\n".join(line for line in script.splitlines() if not INSTALLS.match(line))


def run_script(script: str, cwd: Path, env: dict, timeout: float, reached: Path | None) -> tuple[int | None, str,
                                                                                                   dict | None]:
    """(exit code, output, marker) of ``script`` under the runner's shell. With ``reached`` (a simulated GPU's
    marker folder, ``validation/simulated_gpu``): the script's processes are stopped as soon as one of them
    reaches its first CUDA computation (a new marker there); the code is then None and the marker returned."""
    command = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script]
    if reached is None:
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                                check=False)
        return result.returncode, result.stdout + result.stderr, None
    before = set(reached.glob("*.json"))
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        deadline, marker = time.monotonic() + timeout, None
        while process.poll() is None:
            new = sorted(set(reached.glob("*.json")) - before)
            if new:
                marker = json.loads(new[0].read_text())
                break
            if time.monotonic() > deadline:
                _stop(process)
                raise subprocess.TimeoutExpired(command, timeout)
            time.sleep(0.1)
        if marker is not None:
            _stop(process)
        log.seek(0)
        return (None if marker is not None else process.returncode), log.read(), marker


def _stop(process: subprocess.Popen) -> None:
    """End ``process`` and every process it started (its session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run_job(workflow: Path, job_name: str, copy: Path, install=prepare_venv, env: dict | None = None,
            timeout: float = 3600, run_id: int | None = None, inputs: dict | None = None,
            skip: tuple[str, ...] = (), reached: Path | None = None) -> Job:
    """Run the job's steps in ``copy`` (see the module docstring); returns what each step did. ``run_id``: the
    workflow run's number (``github.run_id``; default: a new one for every call, as each run has); ``inputs``:
    a manually dispatched run's inputs (``inputs.<name>``); ``skip``: the ids of steps not to run (the later
    steps of a job run again on what an earlier run of it left, e.g. the check on its records); ``reached``: the
    marker folder of a simulated GPU (``validation.gpu_jobs``): each step stops at its first CUDA computation,
    which counts as success (``Step.reached``)."""
    spec = yaml.safe_load(workflow.read_text())["jobs"][job_name]
    contexts = {"github": {"run_id": run_id if run_id is not None else uuid.uuid4().int % 10**10, "run_attempt": 1,
                         "event_name": "workflow_dispatch" if inputs else "pull_request"},
              "inputs": dict(inputs or {})}
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("STABILITY_", "PYTEST_", "MLFLOW_", "GITHUB_", "VIRTUAL_ENV", "TRITON_INTERPRET"))}
    base_env["PATH"] = os.pathsep.join(p for p in base_env.get("PATH", "").split(os.pathsep)
                                       if not p.startswith(str(Path(sys.prefix))))
    base_env.update({k: substitute(str(v), {}, contexts) for k, v in (spec.get("env") or {}).items()})
    base_env.update(env or {})
    work = copy / ".github-runner"
    work.mkdir(exist_ok=True)
    summary = work / "step_summary.md"
    summary.write_text("")            # each job has a summary of its own (a copy may run several jobs)
    job, outputs = Job(), {}
    for index, step in enumerate(spec["steps"]):
        name = step.get("id") or step.get("name") or f"step{index}"
        if "uses" in step:
            job.steps[name] = Step(name, ran=False, output=f"uses {step['uses']}: the runner's action, not run here")
            continue
        if name in skip or not condition(step.get("if"), outputs, job.failed):
            job.steps[name] = Step(name, ran=False)
            continue
        started = time.perf_counter()
        output_file = work / f"output-{index}"
        output_file.write_text("")
        script = substitute(step["run"], outputs, contexts)
        replaced = str(step.get("name", "")).startswith("install")
        if replaced:
            install(copy)
            script = install_checks(script)
        step_env = {**base_env, **{k: str(v) for k, v in (step.get("env") or {}).items()},
                    "GITHUB_OUTPUT": str(output_file), "GITHUB_STEP_SUMMARY": str(summary)}
        code, output, marker = run_script(script, copy, step_env, timeout, reached)
        outputs[name] = _outputs(output_file)
        job.steps[name] = Step(name, ran=True, code=code, output=("(venv and packages: prepare_venv)\n" if replaced
                                                                  else "") + output,
                               outputs=outputs[name], seconds=time.perf_counter() - started, reached=marker)
        if code not in (0, None):
            job.failed = True
    job.summary = summary.read_text()
    return job
