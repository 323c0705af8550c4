"""``stability plan``: the counted FLOPs agree with 6 N tokens plus the attention term on ``smoke``; the CPU plan
of a ``smoke`` case counts the runs and steps the case trains (its time printed beside the plan's); the GPU presets fit the workflow jobs that run them; the
docs quote the plan's numbers; bad input is one error line. (What each case trains is what it declares, what the
plan counts: tests/test_stress.py.)"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from stability.cases.stress import CASES, run_case
from stability.config import resolve
from stability.model.build import build_model
from stability.plan import GPUS, describe, formula_flops_per_token, make_plan
from stability.plan.plan import probe_count, run_tokens

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "stability.yml"
FORMULA_MARGIN = 0.02   # the counted FLOPs against 6 N tokens + the attention term, relative


def matmul_parameters(model) -> int:
    """Parameters of the matrix products: every Linear weight, and the embedding table where the head shares it."""
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    tied = getattr(model, "lm_head", None) is None
    return linears + (model.embed.weight.numel() if tied else 0)


def test_the_counted_flops_agree_with_the_formula_on_smoke():
    """Per case, the plan's FLOPs are within FORMULA_MARGIN of (6 N + 12 L S d) per trained token plus a third of it
    per token of the probes and the held-out evaluation (a forward), N counted from the model, not the counter."""
    config = resolve("smoke")
    plan = make_plan(config, tuple(CASES), gpu=None, mfu=0.35, rates={p: 1e9 for p in ("fp32", "bf16", "fp16", "fp8",
                                                                                     "mxfp8", "mxfp4")})
    totals = plan.to_json()["cases"]
    for name, case in CASES.items():
        expected = 0.0
        for unit in case.units(config):
            run = unit.run
            with torch.device("meta"):
                model = build_model(dataclasses.replace(run.model, backend="torch"), 0)
            per_token = formula_flops_per_token(run.model, matmul_parameters(model))
            forward_tokens = (probe_count(run) * run.probes.probe_batch_size
                              + run.probes.eval_batches * run.data.batch_size) * run.model.context
            expected += per_token * run_tokens(unit) + per_token / 3 * forward_tokens
        assert totals[name]["flops"] == pytest.approx(expected, rel=FORMULA_MARGIN), name
    assert totals["batch_ramp"]["tokens"] > totals["standard"]["tokens"]       # the batch grows
    assert totals["lr_sweep"]["runs"] == len(config.stress.sweep_lrs) * len(config.seeds) * len(config.arm_names)


def test_the_cpu_plan_of_a_smoke_case_counts_the_runs_and_steps_the_case_trains(tmp_path):
    """``stability plan --preset smoke --cases shock --json``, then the shock case trained here: the plan names
    the runs the case trains and the steps they complete, and the JSON keys the issue names. Its seconds
    against the case's wall time are printed, not asserted (the machine may be loaded)."""
    plan_file = tmp_path / "plan.json"
    planned = subprocess.run([sys.executable, "-m", "stability.cli", "plan", "--preset", "smoke", "--cases", "shock",
                              "--json", str(plan_file)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                             check=False)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(plan_file.read_text())
    assert set(plan["cases"]["shock"]) >= {"runs", "steps", "tokens", "flops", "seconds"}
    assert set(plan["job"]) >= {"flops", "seconds", "gpus"} and set(plan["baseline"]) >= {"flops", "seconds"}
    assert plan["cases"]["shock"]["runs"] == 6 and plan["job"]["seconds"] == 2 * plan["cases"]["shock"]["seconds"]
    record = run_case("shock", resolve("smoke"))
    measured, expected = record["timing"]["wall_seconds"], plan["cases"]["shock"]["seconds"]
    print(f"\nsmoke shock: planned {expected:.1f} s, measured {measured:.1f} s ({measured / expected:.2f}x)")
    assert len(record["arms"]) == plan["cases"]["shock"]["runs"]
    assert sum(arm["final"]["steps_completed"] for arm in record["arms"]) == plan["cases"]["shock"]["steps"]


def gpu_jobs() -> dict[str, tuple[str, int, int]]:
    """{job: (preset, timeout minutes, GPUs)} of the workflow's GPU stress jobs, read from their commands."""
    jobs = {}
    for name, job in yaml.safe_load(WORKFLOW.read_text())["jobs"].items():
        script = " ".join(step.get("run", "") for step in job["steps"])
        found = re.search(r"pytest suites/ -m stress --preset (\S+) --device cuda(?: -n (\d+))?", script)
        if found:
            jobs[name] = (found.group(1), job["timeout-minutes"], int(found.group(2) or 1))
    return jobs


def test_each_gpu_job_fits_its_time_limit_by_the_plan_on_an_h200():
    """The per-pull-request GPU job and the nightly one: by the plan on H200s at the stated utilisation, the job's
    GPU-seconds fit its timeout times its GPUs, its wall time its timeout, and one run fits a GPU's memory."""
    jobs = gpu_jobs()
    assert {preset for preset, _, _ in jobs.values()} == {"gpu-pr", "full"}, jobs
    for name, (preset, minutes, gpus) in jobs.items():
        plan = make_plan(resolve(preset), tuple(CASES), GPUS["h200"], 0.35, gpus, 60 * minutes)
        job = plan.job()
        print(f"\n{name}: {preset} on {gpus} H200: {job['seconds'] / 3600:.2f} GPU-hours, "
              f"{job['wall_seconds'] / 60:.0f} min wall of {minutes}")
        assert job["seconds"] <= 60 * minutes * gpus and job["wall_seconds"] <= 60 * minutes, (name, job)
        assert max(c["memory_bytes"] for c in plan.to_json()["cases"].values()) < GPUS["h200"].memory


def test_each_gpu_baseline_job_fits_its_time_limit_by_the_plan_on_an_h200():
    """The dispatched baseline jobs (`baseline-gpu`, `baseline-nightly`): the baseline of the preset's replicates,
    by the plan on its runner's H200s at the stated utilisation, fits the job's timeout in wall time."""
    workflow = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    for name, (preset, gpus) in {"baseline-gpu": ("gpu-pr", 1), "baseline-nightly": ("full", 4)}.items():
        minutes = workflow[name]["timeout-minutes"]
        baseline = make_plan(resolve(preset), tuple(CASES), GPUS["h200"], 0.35, gpus).baseline()
        print(f"\n{name}: {preset}, {resolve(preset).replicates} replicates, {baseline['seconds'] / 3600:.1f} "
              f"GPU-hours, {baseline['wall_seconds'] / 3600:.1f} h wall of {minutes / 60:.0f} h")
        assert baseline["wall_seconds"] <= 60 * minutes, (name, baseline, minutes)


def test_the_docs_quote_the_plan():
    """docs/scale-out.md and docs/merge-gate.md quote the job's and the baseline's GPU-hours of both GPU presets as the
    plan gives them (an H200 at the stated utilisation; the nightly job on its four GPUs)."""
    pages = [(ROOT / "docs" / name).read_text() for name in ("scale-out.md", "merge-gate.md")]
    for preset, gpus in (("gpu-pr", 1), ("full", 4)):
        plan = make_plan(resolve(preset), tuple(CASES), GPUS["h200"], 0.35, gpus)
        job, baseline = plan.job(), plan.baseline()
        for hours in (job["seconds"] / 3600, baseline["seconds"] / 3600):
            for page in pages:
                assert f"{hours:.1f} GPU-hours" in page, (preset, f"{hours:.1f} GPU-hours")
        wall = f"{job['wall_seconds'] / 60:.0f} min" if gpus == 1 else f"at most {job['wall_seconds'] / 3600:.1f} h"
        assert wall in pages[0], (preset, wall)
        assert describe(plan).splitlines()[0].startswith(f"plan: preset {preset}")


@pytest.mark.parametrize(("argv", "named"), [(["--gpu", "v100"], "'v100'"), (["--mfu", "1.5"], "1.5"),
                                             (["--cases", "standard,nope"], "'nope'"), (["--gpus", "0"], "0"),
                                             (["--preset", "huge"], "'huge'")])
def test_bad_input_is_one_error_line_and_exit_2(argv, named, tmp_path, capsys):
    from stability.cli import main

    assert main(["plan", *argv, "--json", str(tmp_path / "p.json")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], errors
    assert not (tmp_path / "p.json").exists()
