"""validation/gpu_check.py: what runs without a GPU (arguments, the table, the correctness rule, a run
that skips every GPU part cleanly). The GPU parts themselves run only on a CUDA machine."""

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
    args = gpu_check.parse_args(["--parts", "bench, pair", "--pair-seconds", "30"])
    assert args.parts == ["bench", "pair"] and args.pair_seconds == 30 and args.seqlens == [1024, 2048, 4096, 8192]
    assert gpu_check.parse_args([]).parts == list(gpu_check.PARTS)


@pytest.mark.parametrize("argv", [["--parts", "bench,warp"], ["--parts", ","], ["--pair-seconds", "0"]])
def test_bad_arguments_exit_2_naming_the_value(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        gpu_check.parse_args(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert ("warp" in err) if "warp" in argv[1] else ("invalid" in err or "positive" in err)


def test_table_lists_every_row_and_counts_the_failures():
    rows = [gpu_check.Row("bench", "S=1024 fused gated", "fwd 0.1 ms", "info"),
            gpu_check.Row("kernel-tests", "suites/test_kernel.py", "8 passed", "pass"),
            gpu_check.Row("pair", "full pair", "over 240 s", "timeout"),
            gpu_check.Row("determinism", "bit for bit", "a vs b", "fail")]
    text = gpu_check.table(rows, "### header")
    lines = text.splitlines()
    assert lines[0] == "### header" and lines[2] == "| part | check | value | verdict |"
    assert sum(line.startswith("| ") for line in lines) == 1 + len(rows)
    assert lines[-1] == "2 failed: pair full pair; determinism bit for bit"
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
def test_without_a_gpu_every_part_is_skipped_cleanly(tmp_path):
    out = subprocess.run([sys.executable, "-m", "validation.gpu_check", "--out", str(tmp_path / "t.md")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr
    assert "no CUDA GPU" in out.stdout
    table = (tmp_path / "t.md").read_text()
    assert all(f"| {part} | needs a CUDA GPU | - | skipped |" in table for part in gpu_check.PARTS)
    assert table.rstrip().endswith("0 failed")
