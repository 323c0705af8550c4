"""Repositories of their own gate their merges with stability, end to end: examples/downstream (``mypackage``:
its own attention and gate) and examples/downstream-gqa (``gqalm``: grouped-query attention, learned positions,
a per-head gate that honours its settings, and a reference arm that fails in fp16).

One fresh virtual environment outside this repository (it sees this environment's packages through a .pth
file, as validation/workflow.py's do) gets this repository from its wheel, not editable, as a user installs it:
the README's commands ("Use it in your repository"), line by line (the CPU torch line stands: this environment
has torch). Each example is copied, installed there too, and run through ``stability init --factory ...``, its
team's settings and ``stability baseline make``:

* mypackage: the README's commands as written, the baseline with every model invariant held;
* gqalm: the baseline is written although a model invariant fails on it (the reference arm's fp16 loss gap),
  and lists it. Then the generated workflow's CPU job, as written (the install step replaced: the environment
  is ready): it passes on the unchanged code and after a harmless rewrite, fails with exit 1 from ``stability
  check`` naming ``max_attn_logit`` once the attention loses its 1/sqrt(d) scale, and stops at the stress step
  with one line (the check: exit 2) when the factory returns a tuple.

Each test prints its times and the sizes of the baseline's run directory and of a job's upload.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from test_docs import blocks

from validation.workflow import ROOT, apply_patch, fresh_copy, install, make_venv, run_job

EXAMPLE = ROOT / "examples" / "downstream"
GQA = ROOT / "examples" / "downstream-gqa"
CPU_TORCH = 'pip install "torch>=2.11" --index-url https://download.pytorch.org/whl/cpu'
# each example's settings, set in the table stability init wrote (what its team chooses for a quick CPU job)
SMALL = (("cases = [", 'cases = ["standard", "batch_ramp"]'), ("replicates = ", "replicates = 2"),
         ("[tool.stability.set]", "[tool.stability.set]\nsteps = 40"))
GQA_SETTINGS = (("cases = [", 'cases = ["precision_ladder"]'), ("replicates = ", "replicates = 2"),
                ("[tool.stability.set]", '[tool.stability.set]\n"optim.lr" = 0.1\n"stress.precisions" = ["fp32", "fp16"]'))
GQA_MODEL = "gqalm/model.py"
SCALE_LOST = (GQA_MODEL, "self.scale = 1.0 / math.sqrt(self.head_dim)", "self.scale = 1.0")
HARMLESS = (GQA_MODEL, "return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight",
            "return x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight")
TUPLE = (GQA_MODEL, "    return model\n", "    return model, config\n")
CAP_TIGHTER = (GQA_MODEL, "OUTPUT_CAP = 10.0", "OUTPUT_CAP = 4.0")   # the gated arm's fp16 rung now overflows too
VERDICTS = {"0": "PASSED", "1": "REGRESSED", "2": "UNUSABLE INPUT", "3": "CHANGED"}   # stability check's exit code -> its summary


def undo(edit: tuple[str, str, str]) -> tuple[str, str, str]:
    """The edit that takes ``edit`` back."""
    name, old, new = edit
    return name, new, old


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


@pytest.fixture(scope="module")
def environment(tmp_path_factory):
    """The fresh virtual environment both examples use, with this repository's wheel installed as the README
    says; returns (venv, the README's init and make commands, seconds it took)."""
    started = time.perf_counter()
    torch_line, pip, init, make = readme_commands()
    assert torch_line == CPU_TORCH                          # this environment has torch: the line stands
    assert pip.startswith("pip install ") and "stability-0.1.0-py3-none-any.whl" in pip
    assert init == "stability init --factory mypackage.model:build" and make == "stability baseline make"
    root = tmp_path_factory.mktemp("downstream")
    built = wheel(root / "dist")
    venv = make_venv(root / "venv")
    install(venv, str(built.parent / pip.split()[-1].strip('"')))   # the README's pip line, offline
    return venv, init, make, time.perf_counter() - started


class Repository:
    """A copy of an example with its own package installed in the shared environment (its ``.venv``, as its
    workflow expects); ``shell`` runs a command there the way a user's terminal would."""

    def __init__(self, example: Path, where: Path, venv: Path):
        self.root = shutil.copytree(example, where)
        (self.root / ".venv").symlink_to(venv)
        install(venv, "-e", str(self.root))                  # the repository's own package, as its CI does
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("STABILITY_", "PYTEST_", "MLFLOW_", "VIRTUAL_ENV"))}
        self.env["PATH"] = f"{venv / 'bin'}{os.pathsep}{self.env['PATH']}"
        self.workflow = self.root / ".github" / "workflows" / "stability.yml"

    def shell(self, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", command], cwd=self.root,
                              env=self.env, capture_output=True, text=True, timeout=1800, check=False)

    def job(self):
        """The workflow's CPU job, run here; its summary's verdict is the job's own (checked)."""
        job = run_job(self.workflow, "stress-cpu", self.root, install=lambda _repo: None)
        verdicts = re.findall(r"^### Stability check: \S+ (PASSED|REGRESSED|UNUSABLE INPUT|CHANGED)$", job.summary, re.MULTILINE)
        code = job.steps["check"].outputs.get("code")
        assert verdicts == [VERDICTS[code]] and job.failed == (code != "0"), (verdicts, code, job.log())
        return job


def test_a_downstream_repository_is_gated_by_the_generated_workflow(environment, tmp_path):
    venv, init, make, setup = environment
    started = time.perf_counter()
    repo = Repository(EXAMPLE, tmp_path / "repo", venv)
    where = repo.shell('python -c "import stability, mypackage; print(stability.__file__)"')
    assert str(venv) in where.stdout and str(ROOT) not in where.stdout, where.stdout + where.stderr   # the wheel
    done = repo.shell(init)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "    stability baseline make" in done.stdout and "stability check --baseline" in done.stdout
    assert "observer calls attn_logits, attn_probs, gate_score" in done.stdout   # what init found in the factory
    edit_settings(repo.root / "pyproject.toml", SMALL)
    done = repo.shell(make)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    baseline = json.loads((repo.root / "reports" / "baselines" / "smoke-cpu.json").read_text())
    assert sorted(baseline["cases"]) == ["smoke/batch_ramp-sqrt", "smoke/standard"] and len(baseline["replicates"]) == 3
    assert "model invariants: all " in done.stdout and " held" in done.stdout
    assert re.search(r"\[standard\] gated-seed2: step 40/40  loss \d+\.\d+ .* steps/s  ETA 0:00", done.stderr)
    run_dir = max((repo.root / "reports" / "runs").iterdir())
    print(f"\ndownstream: environment {setup:.0f} s, baseline {time.perf_counter() - started:.0f} s; baseline run "
          f"directory {tree_size(run_dir) / 1e6:.1f} MB")


@pytest.mark.slow   # a downstream repository's baseline made and its fp16 job trained: a long test
@pytest.mark.long
def test_a_grouped_query_repository_whose_reference_arm_fails_in_fp16(environment, tmp_path):
    venv, init, make, _ = environment
    started = time.perf_counter()
    repo = Repository(GQA, tmp_path / "repo", venv)
    subprocess.run(["git", "init", "-q", "-b", "master", str(repo.root)], check=True)
    done = repo.shell(init.replace("mypackage.model:build", "gqalm.model:build"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "branches: [master]" in repo.workflow.read_text()   # the repository's own default branch
    assert (repo.root / ".gitignore").read_text().splitlines()[-2:] == ["reports/*", "!reports/baselines/"]
    edit_settings(repo.root / "pyproject.toml", GQA_SETTINGS)
    done = repo.shell(make)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    listed = done.stdout[done.stdout.index("model invariants that did not hold on this model"):].split("to hold")[0]
    assert re.search(r"smoke/precision_ladder reference: mean_loss_gap_fp16 \(0\.\d+ against bound 0\.25\)", listed), listed
    assert "gated" not in listed                                   # the gated arm's fp16 rung holds
    baseline_file = repo.root / "reports" / "baselines" / "smoke-cpu.json"
    baseline = json.loads(baseline_file.read_text())
    assert sorted(baseline["cases"]) == ["smoke/precision_ladder"]
    held = {(i["arm"], i["seed"]): i["held"] for i in baseline["invariants"] if i["name"] == "mean_loss_gap_fp16"}
    assert held == {("reference", None): False, ("gated", None): True}, held   # the baseline records which held
    made = time.perf_counter()
    sizes = {"baseline run directory": tree_size(max((repo.root / "reports" / "runs").iterdir()))}

    job = repo.job()
    assert job.passed and job.steps["check"].outputs == {"code": "0"}, job.log()
    assert "kernel" not in job.steps and "### Stability check: :white_check_mark: PASSED" in job.summary
    assert "mean_loss_gap_fp16" in job.steps["stress"].output            # listed in the suites' summary, not failed
    assert re.search(r"\[precision_ladder\] reference-seed0-fp16: step 20/20 .* steps/s  ETA", job.steps["stress"].output)
    sizes["job upload (zipped)"] = upload_size(repo.root / "reports")
    unchanged = time.perf_counter()

    apply_patch(repo.root, [SCALE_LOST])
    job = repo.job()
    assert job.failed and job.steps["check"].outputs == {"code": "1"}, job.log()
    assert job.steps["stress"].code == 0 and job.steps["fail on a regression"].code == 1
    rows = json.loads((repo.root / "reports" / "check.json").read_text())["rows"]
    named = {row["figure"] for row in rows if row["verdict"] == "regressed"}
    assert "max_attn_logit" in named and "max_attn_logit" in job.summary, named
    apply_patch(repo.root, [undo(SCALE_LOST)])
    harmful = time.perf_counter()

    apply_patch(repo.root, [HARMLESS])
    job = repo.job()
    assert job.passed and job.steps["check"].outputs == {"code": "0"}, job.log()
    apply_patch(repo.root, [undo(HARMLESS)])
    harmless = time.perf_counter()

    apply_patch(repo.root, [CAP_TIGHTER])                              # an invariant that held stops holding
    job = repo.job()
    assert job.failed and job.steps["check"].outputs == {"code": "1"}, job.log()
    failed = json.loads((repo.root / "reports" / "check.json").read_text())["outcomes"]
    assert any(o["arm"] == "gated" and o["figure"] == "mean_loss_gap_fp16" for o in failed), failed
    assert "model invariant mean_loss_gap_fp16 no longer holds" in job.summary
    apply_patch(repo.root, [undo(CAP_TIGHTER)])
    invariant = time.perf_counter()

    apply_patch(repo.root, [TUPLE])
    shutil.rmtree(repo.root / "reports" / "runs")                  # a fresh checkout of the change has no runs
    job = repo.job()
    stress = job.steps["stress"]
    shown = stress.output.split("sys.exit(console_main())")[-1]    # after the deprecation warning of the venv's script
    assert stress.code == 4 and "Traceback" not in stress.output, stress.output
    (line,) = [line for line in shown.splitlines() if line.strip()]
    assert line.startswith("ERROR: [tool.stability] in ") and "model.factory='gqalm.model:build' returned tuple" in line
    assert job.failed and job.steps["check"].outputs == {"code": "2"}, job.log()
    print(f"\ndownstream-gqa: baseline {made - started:.0f} s, unchanged job {unchanged - made:.0f} s, harmful "
          f"{harmful - unchanged:.0f} s, harmless {harmless - harmful:.0f} s, invariant {invariant - harmless:.0f} s, "
          f"tuple {time.perf_counter() - invariant:.0f} s; "
          + ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in sizes.items()))


def tree_size(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def upload_size(path: Path) -> int:
    """Bytes of ``path`` zipped as actions/upload-artifact uploads it (deflate, level 6)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
        for item in sorted(path.rglob("*")):
            if item.is_file():
                archive.write(item, item.relative_to(path))
    return len(buffer.getvalue())
