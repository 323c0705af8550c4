"""The CPU workflow job on a harmful change: it fails with exit 1 from `stability check`, naming the figure;
the baseline made right after the suite (accepting the change) is one the next run of the job passes."""

from __future__ import annotations

import json
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
    # accepting the change: a baseline made right after the suite is one the next suite run passes
    update = subprocess.run([".venv/bin/stability", "baseline", "update", "reports/runs", "--out",
                             "reports/baselines/smoke-cpu.json"], cwd=copy, capture_output=True, text=True,
                            check=False)
    assert update.returncode == 0, update.stderr
    again = run_job(WORKFLOW, "stress-cpu", copy, install=lambda _copy: None)
    assert again.passed and again.steps["check"].outputs == {"code": "0"}, again.log()
    sessions = [p for p in (copy / "reports" / "runs").iterdir() if (p / "manifest.json").is_file()]
    assert len(sessions) == 2   # the second run read only its own session: no pooling with the first
