"""Accepting a wanted change, end to end, as the workflow does it, on a small configuration (the plain pair
only: `cases = ["standard"]` in the repository's settings, 4 replicates): a change that makes the model compute something
else is CHANGED (exit 3) on the CPU job; the baseline job, dispatched by hand for that case, remakes it on the
runner and shows what moved; with its baseline committed, the next CPU job passes."""

from __future__ import annotations

import json
import subprocess

import pytest

from validation.workflow import WORKFLOW, apply_patch, fresh_copy, prepare_venv, run_job

# the first three steps of warmup at a learning rate 10% higher: the early horizon's loss falls past its floor,
# nothing else moves past its own (found by trying it on the plain pair at smoke; warming up 10% sooner all the
# way raised the reference arm's largest gradient norm past its floor, a primary row at smoke)
FASTER_WARMUP = ("stability/config/schedules.py", "        return optim.lr * (step + 1) / optim.warmup_steps",
                 "        return (1.1 if step < 3 else 1.0) * optim.lr * (step + 1) / optim.warmup_steps")


@pytest.mark.slow   # a baseline made and two jobs trained: CI runs it in its step of long tests
@pytest.mark.long
def test_a_changed_model_is_accepted_by_a_baseline_remade_on_the_runner(tmp_path):
    copy = fresh_copy(tmp_path / "copy")
    settings = copy / "pyproject.toml"
    text = settings.read_text()
    settings.write_text(text.replace('[tool.stability]\n', '[tool.stability]\ncases = ["standard"]\nreplicates = 4\n', 1))
    prepare_venv(copy)
    made = subprocess.run([".venv/bin/stability", "baseline", "make", "--out", "reports/baselines/smoke-cpu.json"],
                          cwd=copy, capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-2000:]
    assert sorted(json.loads((copy / "reports/baselines/smoke-cpu.json").read_text())["cases"]) == ["smoke/standard"]

    apply_patch(copy, [FASTER_WARMUP])
    changed = run_job(WORKFLOW, "stress-cpu", copy, install=lambda _copy: None)
    assert changed.failed and changed.steps["check"].outputs == {"code": "3"}, changed.log()
    assert "### Stability check: :large_orange_diamond: CHANGED" in changed.summary
    assert "changed: smoke/standard reference early_loss moved by" in changed.steps["check"].output
    assert changed.steps["fail on a regression"].ran and changed.steps["fail on a regression"].code == 1

    remade = run_job(WORKFLOW, "baseline-cpu", copy, install=lambda _copy: None, inputs={"baseline": "standard"})
    assert remade.passed, remade.log()
    assert "(cases standard remade; the others kept)" in remade.steps["make the baseline on this runner"].output
    compared = (copy / "reports" / "baseline-compare.txt").read_text()
    moved = {tuple(line.split()[:3]) for line in compared.splitlines()[3:]}
    assert ("smoke/standard", "reference", "early_loss") in moved and ("smoke/standard", "gated", "early_loss") in moved
    assert "### New baseline `reports/baselines/new/smoke-cpu.json`" in remade.summary

    (copy / "reports/baselines/smoke-cpu.json").write_text((copy / "reports/baselines/new/smoke-cpu.json").read_text())
    accepted = run_job(WORKFLOW, "stress-cpu", copy, install=lambda _copy: None)
    assert accepted.passed and accepted.steps["check"].outputs == {"code": "0"}, accepted.log()
