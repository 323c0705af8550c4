"""The GPU jobs run the first time a GPU runner picks them up: every GPU job of this repository's workflow and of
the template ``stability init`` writes, its commands as written, on simulated GPUs (``validation.gpu_jobs``:
1 for the pull-request jobs' runner, 4 for the nightly ones'), gets past every option, worker count, GPU
pinning and settings check to its first CUDA computation, in each step that runs the suites. Before the
plugin chose one pytest-xdist worker per GPU, the pull-request job's ``-n auto`` (this repository's addopts)
stopped both of its commands with a usage error on one GPU: the first test shows that this test sees it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from validation.gpu_jobs import computing_steps, gpu_jobs, run_gpu_job, step_keys, stopped_before_cuda
from validation.workflow import WORKFLOW, fresh_copy, install, make_venv, prepare_venv

EXPECTED = {"stress-gpu": 1, "stress-nightly": 4, "baseline-gpu": 1, "baseline-nightly": 4}


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    """A checkout of this repository with its venv (the workflow's install step stands in)."""
    copy = fresh_copy(tmp_path_factory.mktemp("gpu-repository"))
    prepare_venv(copy)
    return copy


@pytest.fixture(scope="module")
def downstream(tmp_path_factory, repository) -> Path:
    """A repository that ran ``stability init`` (the harness's own model: the template's kernel steps too), with
    the harness installed in its venv (the template's install step stands in)."""
    root = tmp_path_factory.mktemp("gpu-downstream")
    (root / "pyproject.toml").write_text('[project]\nname = "team"\nversion = "0.1"\n')
    venv = make_venv(root / ".venv")
    install(venv, "-e", str(repository))
    subprocess.run([str(venv / "bin" / "stability"), "init"], cwd=root, check=True, capture_output=True, text=True)
    return root


def test_every_gpu_job_is_simulated_on_its_runners_gpus(repository, downstream):
    for root in (repository, downstream):
        text = (root / ".github" / "workflows" / "stability.yml").read_text()
        assert gpu_jobs(text) == EXPECTED, root
        for job in EXPECTED:
            assert computing_steps(text, job), f"{job}: no step runs the suites"


def test_one_worker_per_gpu_is_what_lets_the_pull_request_job_start(repository, tmp_path):
    """With pytest-xdist's own count (the CPU cores: 2 here) the stress step stops on a usage error."""
    job = run_gpu_job(WORKFLOW, "stress-gpu", repository, gpus=1, markers=tmp_path / "markers",
                      install=lambda _copy: None, skip=tuple(k for k in step_keys(WORKFLOW.read_text(), "stress-gpu")
                                                             if k != "stress"),
                      env={"PYTEST_XDIST_AUTO_NUM_WORKERS": "2", "PYTEST_ADDOPTS": "--max-worker-restart=0"})
    (problem, *_) = stopped_before_cuda(WORKFLOW.read_text(), job, "stress-gpu")
    assert "stress" in problem and "pytest-xdist workers but 1 GPU" in problem


def _jobs() -> list:
    """Every GPU job of the workflow and of the template; the pull-request jobs of this repository's workflow
    in the test command, the others (the same commands on 4 GPUs, or with the template's values) long tests,
    which CI runs in a step of its own after it."""
    long = (pytest.mark.slow, pytest.mark.long)
    return [pytest.param(name, where, id=f"{name}-{where}",
                         marks=() if where == "workflow" and EXPECTED[name] == 1 else long)
            for where in ("workflow", "template") for name in EXPECTED]


@pytest.mark.parametrize(("name", "where"), _jobs())
def test_the_gpu_job_reaches_its_first_cuda_computation(name, where, repository, downstream, tmp_path):
    root = repository if where == "workflow" else downstream
    workflow = root / ".github" / "workflows" / "stability.yml"
    gpus = EXPECTED[name]
    job = run_gpu_job(workflow, name, root, gpus=gpus, markers=tmp_path / "markers", install=lambda _copy: None)
    assert not stopped_before_cuda(workflow.read_text(), job, name), job.log()
    for step in computing_steps(workflow.read_text(), name):
        marker = job.steps[step].reached
        assert marker["what"] == "torch.cuda._lazy_init" and len(marker["visible"]) in (1, gpus), marker
    (install,) = [step for key, step in job.steps.items() if key.startswith("install")]
    assert install.code == 0, install.output   # its check that torch sees a GPU, as written
