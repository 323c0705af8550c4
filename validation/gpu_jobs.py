"""A workflow's GPU jobs run here as written, on simulated GPUs, up to their first CUDA computation.

    jobs = gpu_jobs(workflow_text)                       # {"stress-gpu": 1, "stress-nightly": 4, ...}
    job = run_gpu_job(WORKFLOW, "stress-gpu", copy, gpus=1, markers=tmp / "markers")
    stopped_before_cuda(job)                             # [] when every computing step reached its GPU

Each step's processes see ``gpus`` simulated GPUs (``validation/simulated_gpu``: ``CUDA_VISIBLE_DEVICES``
lists them, torch says it has that many, device queries describe an H100) and stop at their first CUDA
computation. So what a GPU runner would do before its first kernel runs here: the job's options,
pytest-xdist's worker count and one GPU per worker, the plugin's settings and every check made before
training. A computing step (one that runs ``pytest`` or ``stability baseline make``) that ends before it
reached a GPU, a usage error above all, is the failure this finds.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from validation.workflow import Job, prepare_venv, run_job

SIMULATOR = Path(__file__).resolve().parent / "simulated_gpu"
COMPUTES = re.compile(r"^\s*(pytest|stability baseline make)\b", re.MULTILINE)
RUNNER_GPUS = re.compile(r"^gpu-(\d+)$")
# the inputs of a dispatched run that make a baseline job run (the whole baseline), per job
BASELINE_INPUTS = {"baseline-gpu": {"baseline": "all", "nightly": False},
                   "baseline-nightly": {"baseline": "all", "nightly": True}}


def runner_gpus(runs_on) -> int:
    """The GPUs of a runner with these labels: N for a label ``gpu-N``, 1 for ``gpu``, 0 otherwise."""
    labels = [runs_on] if isinstance(runs_on, str) else list(runs_on)
    counts = [int(m.group(1)) for m in map(RUNNER_GPUS.match, labels) if m]
    return max(counts) if counts else (1 if "gpu" in labels else 0)


def gpu_jobs(workflow: str) -> dict[str, int]:
    """{job: GPUs of its runner} for every job of the workflow text that runs on GPUs."""
    jobs = yaml.safe_load(workflow)["jobs"]
    return {name: runner_gpus(job["runs-on"]) for name, job in jobs.items() if runner_gpus(job["runs-on"])}


def computing_steps(workflow: str, job: str) -> list[str]:
    """The keys (``step_keys``) of the job's steps that run the suites (``COMPUTES``)."""
    steps = yaml.safe_load(workflow)["jobs"][job]["steps"]
    return [key for key, step in zip(step_keys(workflow, job), steps) if COMPUTES.search(step.get("run", ""))]


def simulated_environment(gpus: int, markers: Path) -> dict[str, str]:
    """The environment of a runner with ``gpus`` simulated GPUs whose processes leave markers in ``markers``."""
    markers.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(p for p in (str(SIMULATOR), os.environ.get("PYTHONPATH", "")) if p)
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus)), "STABILITY_SIMULATED_GPUS": str(markers),
            "PYTHONPATH": path}


def run_gpu_job(workflow: Path, job: str, copy: Path, gpus: int, markers: Path, install=prepare_venv,
                env: dict | None = None, timeout: float = 600, skip: tuple[str, ...] | None = None) -> Job:
    """Run ``job`` of ``workflow`` in ``copy`` on ``gpus`` simulated GPUs (a baseline job as dispatched to make
    the whole baseline), each step up to its first CUDA computation; ``env``: more of the runner's variables.
    ``skip``: the steps not to run; by default those after the computation (check, report, compare, the failing
    step), which have nothing to read on a simulated GPU (the CPU job runs them end to end)."""
    text = workflow.read_text()
    if skip is None:
        kept = set(computing_steps(text, job))
        skip = tuple(key for key in step_keys(text, job) if key not in kept and not key.startswith("install"))
    return run_job(workflow, job, copy, install=install, env={**simulated_environment(gpus, markers), **(env or {})},
                   timeout=timeout, inputs=BASELINE_INPUTS.get(job), reached=markers, skip=skip)


def step_keys(workflow: str, job: str) -> list[str]:
    """The keys ``run_job`` gives the job's steps: the id, else the name (``stepN`` for neither)."""
    steps = yaml.safe_load(workflow)["jobs"][job]["steps"]
    return [step.get("id") or step.get("name") or f"step{index}" for index, step in enumerate(steps)]


def stopped_before_cuda(workflow: str, job: Job, name: str) -> list[str]:
    """The computing steps of ``job`` (job ``name`` of the workflow text) that did not reach a GPU, each with
    its exit code and the end of its output; empty when every one did."""
    out = []
    for step in computing_steps(workflow, name):
        ran = job.steps.get(step)
        if ran is None or not ran.ran:
            out.append(f"{name}/{step}: did not run")
        elif ran.reached is None:
            out.append(f"{name}/{step}: exit {ran.code} before any CUDA computation:\n{ran.output[-2500:]}")
    return out
