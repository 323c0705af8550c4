"""validation/gpu_check.py: what runs without a GPU (arguments, the table, the correctness rule, the dry run and its
plan of a full step, a refusal that names what it needs). The GPU parts themselves run only on a CUDA machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import bench_kernel
from validation import gpu_check

ROOT = Path(__file__).resolve().parent.parent


def test_arguments():
    args = gpu_check.parse_args(["--parts", "bench, step", "--steps", "20"])
    assert args.parts == ["bench", "step"] and args.steps == 20 and args.seqlens == [1024, 2048, 4096, 8192]
    assert gpu_check.parse_args([]).parts == list(gpu_check.PARTS)


@pytest.mark.parametrize("argv", [["--parts", "bench,warp"], ["--parts", ","], ["--steps", "0"]])
def test_bad_arguments_exit_2_naming_the_value(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        gpu_check.parse_args(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert ("warp" in err) if "warp" in argv[1] else ("invalid" in err or "positive" in err)


def test_table_lists_every_row_and_counts_the_failures():
    rows = [gpu_check.Row("bench", "S=1024 fused gated", "fwd 0.1 ms", "info"),
            gpu_check.Row("kernel-tests", "suites/test_kernel.py", "8 passed", "pass"),
            gpu_check.Row("step", "full step", "over 240 s", "timeout"),
            gpu_check.Row("determinism", "bit for bit", "a vs b", "fail")]
    text = gpu_check.table(rows, "### header")
    lines = text.splitlines()
    assert lines[0] == "### header" and lines[2] == "| part | check | value | verdict |"
    assert sum(line.startswith("| ") for line in lines) == 1 + len(rows)
    assert lines[-1] == "2 failed: step full step; determinism bit for bit"
    assert gpu_check.table(rows[:2], "h").splitlines()[-1] == "0 failed"
    with pytest.raises(ValueError, match="'maybe'"):
        gpu_check.Row("bench", "x", "y", "maybe")


@pytest.mark.parametrize(("code", "summary", "verdict"), [(0, "8 passed in 3s", "pass"),
                                                           (0, "8 skipped in 1s", "skipped"),
                                                           (5, "8 deselected in 1s", "skipped"),
                                                           (1, "1 failed, 7 passed", "fail")])
def test_pytest_verdicts(code, summary, verdict):
    assert gpu_check.pytest_verdict(code, summary) == verdict


def test_the_flash_rule_passes_the_torch_path_and_catches_an_injected_error():
    """The correctness rule of the kernel checks, on the CPU: bf16 SDPA + gate against float64."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(1, 2, 64, 32, generator=gen) for _ in range(4))
    ref = bench_kernel.sdpa_gate(q.double(), k.double(), v.double(), g.double())
    torch_out = bench_kernel.sdpa_gate(*(t.bfloat16() for t in (q, k, v, g)))
    ok, err, bound = bench_kernel.flash_rule(torch_out, torch_out, ref, 2, torch.bfloat16)
    assert ok and 0 < err <= bound
    broken = torch_out.clone()
    broken[0, 1, 7, 3] += 4 * bound        # one wrong element, as a kernel bug would leave
    assert not bench_kernel.flash_rule(broken, torch_out, ref, 2, torch.bfloat16)[0]
    poisoned = torch_out.clone()
    poisoned[0, 0, 0, 0] = float("nan")     # an element the kernel never wrote
    assert not bench_kernel.flash_rule(poisoned, torch_out, ref, 2, torch.bfloat16)[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the full check is a benchmark")
def test_without_a_gpu_it_runs_nothing_and_names_what_it_needs(tmp_path):
    out = subprocess.run([sys.executable, "-m", "validation.gpu_check", "--out", str(tmp_path / "t.md")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    (error,) = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert "a CUDA GPU" in error and "torch >= 2.11" in error and "triton >= 3.6" in error and torch.__version__ in error
    assert not (tmp_path / "t.md").exists()


def test_the_dry_run_lists_the_parts_and_plans_a_full_step():
    """The dry run needs no GPU: every part with its limit, and the plan's full step (the FLOPs agree with the count
    of stability.plan; the time is the FLOPs at the plan's utilisation of an H200's BF16 peak)."""
    from stability.plan import DEFAULT_MFU, GPUS

    args = gpu_check.parse_args(["--dry-run"])
    text = gpu_check.dry_run(args)
    assert all(f"  {part}" in text for part in gpu_check.PARTS) and "needs a CUDA GPU" in text
    plan = gpu_check.planned_step()
    assert plan["seconds"] == pytest.approx(plan["flops"] / (GPUS["h200"].bf16 * DEFAULT_MFU))
    assert 1e13 < plan["flops"] < 3e13 and 5e9 < plan["memory_bytes"] < GPUS["h200"].memory
    assert gpu_check.gpu_name_of("NVIDIA H200") == "h200" and gpu_check.gpu_name_of("Tesla T4") is None
