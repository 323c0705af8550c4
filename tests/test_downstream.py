"""A repository of its own gates its merges with stability, end to end (examples/downstream, the package
``mypackage`` with its own attention model and gate).

A fresh virtual environment outside this repository (it sees this environment's packages through a .pth
file, as tests/_workflow.py's do) gets this repository from a wheel, not editable, as a user installs it;
a copy of the example is installed there too. Then the README's commands ("Use it in your repository"),
line by line: the wheel, ``stability init --factory mypackage.model:build``, and, after the example's
settings (``SMALL``: two cases, 40 steps, 2 replicates: minutes on 2 cores), ``stability baseline make``.
Then the generated workflow's CPU job, as written (the install step replaced: the environment is ready):
it passes on the unchanged example, and fails with exit 1 from ``stability check``, naming the figure,
once the example's attention loses its softmax scale.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _workflow import ROOT, apply_patch, fresh_copy, install, make_venv, run_job
from test_docs import blocks

EXAMPLE = ROOT / "examples" / "downstream"
# the example's settings, set in the table stability init wrote (what a team chooses for a quick CPU job)
SMALL = (("cases = [", 'cases = ["standard", "batch_ramp"]'), ("replicates = ", "replicates = 2"),
         ("[tool.stability.set]", "[tool.stability.set]\nsteps = 40"))
SCALE_LOST = ("mypackage/model.py", "self.scale = 1.0 / math.sqrt(self.head_dim)", "self.scale = 1.0")


def readme_commands() -> list[str]:
    """The commands of the README's block marked ``downstream``."""
    (script,) = [script for kind, script in blocks(ROOT / "README.md") if kind == "downstream"]
    return [line for line in script.splitlines() if line.strip()]


def wheel(destination: Path) -> Path:
    """This repository's wheel, built from a checkout of it (a copy: no build files left here)."""
    checkout = fresh_copy(destination / "checkout")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(destination), str(checkout)], check=True, capture_output=True, timeout=600)
    return next(destination.glob("stability-*.whl"))


def edit_settings(path: Path, edits) -> None:
    lines = path.read_text().splitlines()
    for start, replacement in edits:
        (index,) = [i for i, line in enumerate(lines) if line.startswith(start)]
        lines[index] = replacement
    path.write_text("\n".join(lines) + "\n")


def test_a_downstream_repository_is_gated_by_the_generated_workflow(tmp_path):
    started = time.perf_counter()
    pip, init, make = readme_commands()
    assert pip.startswith("pip install ") and "stability-0.1.0-py3-none-any.whl" in pip
    assert init == "stability init --factory mypackage.model:build" and make == "stability baseline make"
    repo = shutil.copytree(EXAMPLE, tmp_path / "repo")
    shutil.copy(wheel(tmp_path / "dist"), repo)
    venv = make_venv(repo / ".venv")
    install(venv, str(repo / pip.split()[-1].strip('"')))   # the README's pip line, offline
    install(venv, "-e", str(repo))                           # the repository's own package, as its CI does
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STABILITY_", "PYTEST_", "MLFLOW_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"

    def shell(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", command], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=1800, check=False)

    where = shell('python -c "import stability, mypackage; print(stability.__file__)"')
    assert str(venv) in where.stdout and str(ROOT) not in where.stdout, where.stdout + where.stderr   # the wheel
    done = shell(init)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "    stability baseline make" in done.stdout and "stability check --baseline" in done.stdout
    edit_settings(repo / "pyproject.toml", SMALL)
    done = shell(make)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    baseline = json.loads((repo / "reports" / "baselines" / "smoke-cpu.json").read_text())
    assert sorted(baseline["cases"]) == ["smoke/batch_ramp-sqrt", "smoke/standard"] and len(baseline["draws"]) == 3
    made = time.perf_counter()

    workflow = repo / ".github" / "workflows" / "stability.yml"
    job = run_job(workflow, "stress-cpu", repo, install=lambda _repo: None)
    assert job.passed and job.steps["check"].outputs == {"code": "0"}, job.log()
    assert "kernel" not in job.steps and "### Stability check: :white_check_mark: PASS" in job.summary
    passed = time.perf_counter()

    apply_patch(repo, [SCALE_LOST])
    job = run_job(workflow, "stress-cpu", repo, install=lambda _repo: None)
    assert job.failed and job.steps["check"].outputs == {"code": "1"}, job.log()
    assert job.steps["fail on a regression"].ran and job.steps["fail on a regression"].code == 1
    rows = json.loads((repo / "reports" / "check.json").read_text())["rows"]
    named = {row["figure"] for row in rows if row["verdict"] == "regressed"}
    assert "max_attn_logit" in named and "max_attn_logit" in job.summary, named
    print(f"\ndownstream: set up and baseline {made - started:.0f} s, unchanged job {passed - made:.0f} s, "
          f"harmful change {time.perf_counter() - passed:.0f} s; regressed: {sorted(named)}")
