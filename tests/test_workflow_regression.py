"""The CPU workflow job on a harmful change: it fails with exit 1 from `stability check`, naming the figure;
a baseline made on the changed code (accepting the change) is one the next run of the job passes."""

from __future__ import annotations

import json
import re
import subprocess

from _workflow import WORKFLOW, prepare_venv, run_job
from _zoo import patched_copy


def test_a_harmful_change_fails_the_job_with_exit_1_from_check_naming_the_figure(tmp_path):
    copy = patched_copy(tmp_path / "copy", "attention_scale_lost")
    job = run_job(WORKFLOW, "stress-cpu", copy, install=prepare_venv)
    assert job.failed and job.steps["check"].outputs == {"code": "1"}, job.log()
    assert job.steps["fail on a regression"].ran and job.steps["fail on a regression"].code == 1
    assert ":x: REGRESSED" in job.summary and "max_attn_logit" in job.summary
    rows = json.loads((copy / "reports" / "check.json").read_text())["rows"]
    named = {row["figure"] for row in rows if row["verdict"] == "regressed"}
    assert "max_attn_logit" in named, named
    # accepting the change: a baseline made on the changed code (reference and replicates) is one the next
    # run of the job passes
    make = subprocess.run([".venv/bin/stability", "baseline", "make", "--preset", "smoke", "--replicates", "2",
                           "--out", "reports/baselines/smoke-cpu.json"], cwd=copy, capture_output=True, text=True,
                          check=False)
    assert make.returncode == 0, make.stdout[-3000:] + make.stderr[-2000:]
    assert "calibration: 27 arrangements (3 draws ^ 3 seeds)" in make.stdout, make.stdout[-3000:]
    assert re.search(r"alpha 0\.01\s+0 fail", make.stdout), make.stdout[-3000:]
    again = run_job(WORKFLOW, "stress-cpu", copy, install=lambda _copy: None)
    assert again.passed and again.steps["check"].outputs == {"code": "0"}, again.log()
    sessions = [p for p in (copy / "reports" / "runs").iterdir() if (p / "manifest.json").is_file()]
    assert len(sessions) == 3   # the job's, the baseline's, the job's again: each read only its own
