"""The verdict on real runs: failures injected into the training code, as a pull request would bring them,
and a job that lacks a seed, each trained for real, recorded, and judged against the committed baseline of
the preset (no doctored JSON). A NaN is a result the record keeps; a run that diverges or goes non-finite
where every baseline run of its seed completed fails the job with a line naming case, arm, seed and step;
a missing seed fails it closed. `smoke` runs in the default test command, `ci` with --run-slow
(validation/regression_zoo.py runs the same failures through the whole CPU job: reports/zoo-*.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stability.cases.pipeline import run_recorded
from stability.check.baseline_schema import load_baseline
from stability.check.regression import check
from stability.config import resolve
from stability.config.schedules import BatchRamp, Standard
from stability.record import read_record

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ["smoke", pytest.param("ci", marks=pytest.mark.slow)]


def job(run_dir: Path, preset: str, case: str, overrides: dict | None = None) -> list[dict]:
    """One case of the preset trained here, its record written (not tracked), and read back from disk."""
    record = run_recorded(case, resolve(preset, overrides or {}), run_dir, track=False, plots=False)
    return [read_record(record["record_path"])]


def baseline_of(preset: str) -> dict:
    return load_baseline(ROOT / "reports" / "baselines" / f"{preset}-cpu.json")


def gated(run) -> bool:
    return run.model.gate.enabled


@pytest.mark.parametrize("preset", PRESETS)
def test_a_nan_learning_rate_at_one_seeds_last_step_is_kept_and_fails_the_job(tmp_path, monkeypatch, preset):
    """The gated arm's LR is NaN at the last step of seed 1 only: the weights go NaN after the last update.
    The record is written with the NaN (null) in its series, nothing is refused, and the check fails the job
    naming the gated arm, seed 1 and the held-out loss that went non-finite."""
    standard_lr = Standard.lr_at

    def nan_at_the_end(self, step, run):
        last = gated(run) and run.seed == 1 and step == run.steps - 1
        return float("nan") if last else standard_lr(self, step, run)
    monkeypatch.setattr(Standard, "lr_at", nan_at_the_end)
    records = job(tmp_path, preset, "standard")
    arm = next(a for a in records[0]["arms"] if a["arm"] == "gated" and a["seed"] == 1)
    assert records[0]["status"] == "completed" and arm["series"]["lr"][-1] is None
    assert arm["final"]["heldout_loss"] is None
    result = check(records, baseline_of(preset), cases=["standard"])
    assert result.exit_code == 1, result.table()
    reasons = [o.reason for o in result.outcomes]
    assert all(o.arm == "gated" and o.seed == "1" for o in result.outcomes), reasons
    assert f"case {preset}/standard arm gated seed 1: heldout_loss is non-finite now" in " ".join(reasons)


@pytest.mark.parametrize("preset", PRESETS)
def test_one_arm_diverging_late_in_every_seed_fails_naming_each_seed_and_step(tmp_path, monkeypatch, preset):
    """The gated arm's LR is NaN from 90% of the batch-ramp run in every seed: each gated run diverges, every
    baseline run of its seed completed, so each seed fails the job with its divergence step."""
    ramp_lr = BatchRamp.lr_at

    def nan_late(self, step, run):
        return float("nan") if gated(run) and step >= 0.9 * run.steps else ramp_lr(self, step, run)
    monkeypatch.setattr(BatchRamp, "lr_at", nan_late)
    records = job(tmp_path, preset, "batch_ramp")
    result = check(records, baseline_of(preset), cases=["batch_ramp"])
    assert result.exit_code == 1, result.table()
    diverged = {o.seed: o.reason for o in result.outcomes if o.figure == "diverged"}
    assert sorted(diverged) == ["0", "1", "2"] and all(o.arm == "gated" for o in result.outcomes)
    steps = resolve(preset).run.steps
    for seed, reason in diverged.items():
        step = int(reason.split("diverged at step ")[1].split(")")[0])
        assert 0.9 * steps <= step < steps, reason
        assert reason.startswith(f"case {preset}/batch_ramp-sqrt arm gated seed {seed}: diverged = true")


@pytest.mark.parametrize("preset", PRESETS)
def test_a_job_missing_a_seed_fails_closed_naming_it(tmp_path, preset):
    """Seeds 0 and 1 only: the check cannot judge seed 2 and says so (exit 2), never passing on the rest."""
    records = job(tmp_path, preset, "standard", {"seeds": "0,1"})
    result = check(records, baseline_of(preset), cases=["standard"])
    assert result.exit_code == 2
    assert f"case {preset}/standard arm reference: seed(s) 2 of the baseline are not in the job's records" \
        in result.errors[0]


def test_the_unchanged_case_passes(tmp_path):
    """The control: the same case unchanged, judged the same way, passes."""
    result = check(job(tmp_path, "smoke", "standard"), baseline_of("smoke"), cases=["standard"])
    assert result.exit_code == 0, result.table()
