"""``stability plan``: the counted FLOPs agree with 6 N tokens plus the attention term on ``smoke``; the CPU plan
of a ``smoke`` case is within 2x of the case trained here; bad input is one error line. (What each case trains is
what it declares, what the plan counts: tests/test_stress.py.)"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stability.cases.stress import CASES, run_case
from stability.config import resolve
from stability.model.build import build_model
from stability.plan import formula_flops_per_token, make_plan
from stability.plan.plan import probe_count, run_tokens

ROOT = Path(__file__).resolve().parents[1]
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


def test_the_cpu_plan_of_a_smoke_case_is_within_2x_of_the_case_trained_here(tmp_path):
    """``stability plan --preset smoke --cases shock --json``, then the shock case trained here: the plan's seconds
    within a factor of 2 of the case's wall time, and the JSON keys the issue names."""
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
    assert 0.5 <= measured / expected <= 2.0, (measured, expected)


@pytest.mark.parametrize(("argv", "named"), [(["--gpu", "v100"], "'v100'"), (["--mfu", "1.5"], "1.5"),
                                             (["--cases", "standard,nope"], "'nope'"), (["--gpus", "0"], "0"),
                                             (["--preset", "huge"], "'huge'")])
def test_bad_input_is_one_error_line_and_exit_2(argv, named, tmp_path, capsys):
    from stability.cli import main

    assert main(["plan", *argv, "--json", str(tmp_path / "p.json")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], errors
    assert not (tmp_path / "p.json").exists()
