"""validation/gpu_check.py: what runs without a GPU (arguments and budgets, the table and its files after each part,
a part killed at its budget, the kernel subset's rule, pinning the autotuner, the step's status and stop reason,
the correctness rule, a refusal that names what it needs) and the dry run, in a subprocess that cannot import
mlflow, bitsandbytes, torchao or pytest-benchmark (the lent GPU's image has none of them). The GPU parts themselves
run only on a CUDA machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from benchmarks import bench_kernel
from validation import gpu_check, gpu_check_subset, gpu_check_workers

ROOT = Path(__file__).resolve().parent.parent
NOT_ON_THE_IMAGE = ("mlflow", "bitsandbytes", "torchao", "pytest_benchmark")
# imported first by every Python process started with this folder on PYTHONPATH: the finder of sys.path hides the
# packages above, so `import mlflow` fails and importlib.util.find_spec("mlflow") is None, as where it is not installed
HIDE = f"""
import sys
from importlib.machinery import PathFinder

HIDDEN = {set(NOT_ON_THE_IMAGE)!r}


class _Hidden(PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] in HIDDEN:
            return None
        return PathFinder.find_spec(fullname, path, target)


sys.meta_path[:] = [_Hidden if finder is PathFinder else finder for finder in sys.meta_path]
"""


def test_arguments_and_budgets():
    args = gpu_check.parse_args(["--parts", "bench, step", "--steps", "20"])
    assert args.parts == ["bench", "step"] and args.steps == 20 and args.seqlens == [1024, 2048, 4096, 8192]
    assert args.budgets == {"bench": gpu_check.BUDGETS["bench"], "step": gpu_check.BUDGETS["step"]}
    default = gpu_check.parse_args([])
    assert default.parts == list(gpu_check.PARTS) and list(default.budgets) == list(gpu_check.PARTS)
    assert set(gpu_check.BUDGETS) == set(gpu_check.PARTS)
    assert gpu_check.budget_sum(default.budgets) == sum(gpu_check.BUDGETS.values()) < gpu_check.TOTAL_BUDGET == 540
    assert gpu_check.parse_args(["--budget", "bench=200", "--budget", "step=60"]).budgets["bench"] == 200
    line = gpu_check.budget_lines(default.budgets)
    assert line.endswith(f"sum {sum(gpu_check.BUDGETS.values())} of 540") and "kernel-tests 160" in line


@pytest.mark.parametrize("argv", [["--parts", "bench,warp"], ["--parts", ","], ["--steps", "0"],
                                  ["--budget", "warp=10"], ["--budget", "bench=-1"], ["--budget", "bench=400"]])
def test_bad_arguments_exit_2_naming_the_value(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        gpu_check.parse_args(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    if "warp" in argv[1]:
        assert "warp" in err
    elif argv[1] == "bench=400":
        assert "540 s" in err and "sum to" in err
    else:
        assert "invalid" in err


def test_table_lists_every_row_and_counts_the_failures():
    rows = [gpu_check.Row("bench", "S=1024 fused gated", "fwd 0.1 ms", "info"),
            gpu_check.Row("kernel-tests", "suites/test_kernel.py", "8 passed", "pass"),
            gpu_check.Row("step", "full step", "over 240 s", "timeout"),
            gpu_check.Row("determinism", "bit for bit", "a | b", "fail")]
    text = gpu_check.table(rows, "### header")
    lines = text.splitlines()
    assert lines[0] == "### header" and lines[2] == "| part | check | value | verdict |"
    assert sum(line.startswith("| ") for line in lines) == 1 + len(rows)
    assert "| a / b |" in text     # a | in a value would split its cell
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


def test_a_part_past_its_budget_is_killed_and_keeps_what_it_printed(tmp_path):
    code = "import time; print('PASSED one', flush=True); time.sleep(60)"
    log = tmp_path / "part.log"
    started = time.perf_counter()
    outcome = gpu_check.run_budgeted([sys.executable, "-c", code], 2, log, echo=None)
    assert outcome.timed_out and time.perf_counter() - started < 30
    assert "PASSED one" in outcome.output and "PASSED one" in log.read_text() and "killed at the budget" in log.read_text()
    row = gpu_check.pytest_row("kernel-tests", "subset", outcome, 2)
    assert row.verdict == "timeout" and "1 passed by then" in row.value
    code = "print('==== 3 passed, 1 skipped in 1.02s (0:00:01) ====', flush=True); print('a warning at exit')"
    done = gpu_check.run_budgeted([sys.executable, "-c", code], 30, echo=None)
    row = gpu_check.pytest_row("fp8-tests", "x", done, 30)
    assert done.code == 0 and row.verdict == "pass" and row.value.startswith("3 passed, 1 skipped in 1.02s (0:00:01) (")
    assert gpu_check.summary_of("x\n1 failed, 2 passed, 3 warnings in 4.5s\n") == "1 failed, 2 passed, 3 warnings in 4.5s"
    assert gpu_check.summary_of("no tests ran in 0.1s") == "no tests ran in 0.1s" and gpu_check.summary_of("x") is None


def test_the_table_is_on_disk_after_each_part_so_a_killed_run_keeps_the_finished_ones(tmp_path, monkeypatch):
    """Part two sees part one's row in the files already; a part that raises is a failed row, not a stop."""
    seen = {}

    def first(ctx, budget):
        return [gpu_check.Row("bench", "first", "done", "pass")]

    def second(ctx, budget):
        seen["md"] = (tmp_path / gpu_check.TABLE).read_text()
        seen["json"] = json.loads((tmp_path / gpu_check.TABLE_JSON).read_text())
        raise RuntimeError("broken part")

    monkeypatch.setattr(gpu_check, "RUNNERS", {"bench": first, "step": second})
    monkeypatch.setattr(gpu_check, "header_of", lambda dry: "### header")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("STABILITY_DEVICE", "cpu")     # main sets a default for its subprocesses: not in this one
    code = gpu_check.main(["--parts", "bench,step", "--out-dir", str(tmp_path)])
    assert "| bench | first | done | pass |" in seen["md"]
    assert seen["json"]["parts"] == {"bench": {"state": "done", "budget": gpu_check.BUDGETS["bench"],
                                               "seconds": seen["json"]["parts"]["bench"]["seconds"]},
                                     "step": {"state": "running", "budget": gpu_check.BUDGETS["step"], "seconds": None}}
    final = json.loads((tmp_path / gpu_check.TABLE_JSON).read_text())
    assert code == 1 and final["exit"] == 1 and final["failed"] == 1
    assert final["rows"][-1] == {"part": "step", "item": "raised", "value": "RuntimeError: broken part",
                                 "verdict": "fail"}


def _item(nodeid, function, params=None, marks=(), hypothesis=False):
    return {"nodeid": nodeid, "function": function, "params": params or {}, "marks": ["kernel", *marks],
            "hypothesis": hypothesis}


def test_the_subset_takes_the_bf16_gpu_tests_then_covers_every_value_and_function_cheaply():
    items = [_item("a[fp32-32]", "test_a", {"dtype": "fp32", "head_dim": 32}),
             _item("a[fp16-32]", "test_a", {"dtype": "fp16", "head_dim": 32}),
             _item("a[fp32-16]", "test_a", {"dtype": "fp32", "head_dim": 16}),
             _item("a[fp16-16]", "test_a", {"dtype": "fp16", "head_dim": 16}),
             _item("b", "test_b"),
             _item("prop", "test_property", hypothesis=True),
             _item("gpu[bf16-128]", "test_gpu", {"dtype": "bf16", "head_dim": 128}, marks=("gpu",)),
             _item("gpu[fp32-128]", "test_gpu", {"dtype": "fp32", "head_dim": 128}, marks=("gpu",)),
             _item("extremes", "test_gpu_extremes", marks=("gpu",))]
    chosen = gpu_check_subset.select(items)
    assert {"gpu[bf16-128]", "extremes", "b"} <= set(chosen) and "prop" not in chosen
    assert not gpu_check_subset.missing(items, chosen)
    assert len(chosen) == 6 and "gpu[fp32-128]" not in chosen     # each missing value at the fewest compiles
    assert chosen == [n for n in (item["nodeid"] for item in items) if n in chosen]     # collection order
    assert gpu_check_subset.missing(items, ["b"])["dtype"] == ["'bf16'", "'fp16'", "'fp32'"]


def test_a_pin_is_read_from_tuned_configs_and_cuts_each_list_to_one_config():
    config = "BLOCK_M: 128, BLOCK_N: 64, num_warps: 8, num_ctas: 1, num_stages: 3, maxnreg: None"
    assert gpu_check_workers.blocks_of(config) == [128, 64, 8, 3]
    try:
        import triton
    except ImportError:
        triton = None
    if triton is not None:    # triton's own str() of a Config, as tuned_configs() writes it
        real = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2)
        assert gpu_check_workers.blocks_of(str(real)) == [64, 32, 4, 2]
    tuned = {"fwd/fast/sm_90": {"(256, 128)": config}, "dq/fast/sm_90": {"(256, 128)": config.replace("128", "64")}}
    pin = gpu_check_workers.pin_from(tuned)
    assert pin == {"fwd/fast/sm_90": [128, 64, 8, 3], "dq/fast/sm_90": [64, 64, 8, 3]}
    with pytest.raises(ValueError, match="2 different configs"):
        gpu_check_workers.pin_from({"fwd/fast/sm_90": {"k1": config, "k2": config.replace("128", "32")}})
    module = types.SimpleNamespace(GPU_CONFIGS={90: {("fwd", "fast"): [(64, 64, 4, 3), (128, 64, 8, 3)],
                                                     ("dq", "fast"): [(64, 64, 8, 3)]}}, _TUNED={})
    gpu_check_workers.apply_pin(module, pin)
    assert module.GPU_CONFIGS[90] == {("fwd", "fast"): [(128, 64, 8, 3)], ("dq", "fast"): [(64, 64, 8, 3)]}
    module._TUNED[("fwd", "fast", 90)] = object()
    with pytest.raises(ValueError, match="too late"):
        gpu_check_workers.apply_pin(module, pin)
    with pytest.raises(ValueError, match="names no list"):
        gpu_check_workers.apply_pin(module, {"fwd/fast/sm_75": [1, 2, 3, 4]})


def test_the_step_part_shows_each_step_status_and_the_stop_reason():
    assert gpu_check_workers.step_status({"loss_spike": False, "nonfinite": "", "skipped": False}) == "ok"
    assert gpu_check_workers.step_status({"grad_spike": True, "nonfinite": "grad", "skipped": True}) == \
        "grad spike, non-finite grad, optimiser step skipped"
    record = {"status": "diverged", "stop_reason": "non-finite loss at step 7", "diverged_at_step": 7,
              "series": {"step": list(range(8))}}
    assert gpu_check_workers.stop_line(record, 35) == ("stop: status diverged, stop reason: non-finite loss at step 7; "
                                                      "8 of 35 steps trained, diverged at step 7")
    result = {"status": "diverged", "stop_reason": "non-finite loss at step 7", "diverged_at_step": 7, "steps": 35,
              "warmup": 5, "trained": 8, "timed": 3, "seconds": 0.1, "seconds_median": 0.1, "memory": 2e10,
              "device": "NVIDIA H100 80GB HBM3"}
    plan = gpu_check.planned_step("h100")
    rows, measured = gpu_check.step_rows(result, plan, "h100")
    assert rows[0].verdict == "fail" and "stop reason: non-finite loss at step 7, at step 7" in rows[0].value
    assert rows[1].verdict == "fail" and measured["mfu"] == pytest.approx(plan["flops"] / 0.1 / plan["gpu"].bf16)
    rows, measured = gpu_check.step_rows({**result, "timed": 0, "seconds": None}, plan, "h100")
    assert measured is None and rows[-1].value == "none trained"
    assert gpu_check_workers.read_result("x\nRESULT {\"a\": 1}\nRESULT {\"a\": 2}\n") == {"a": 2}


def test_bench_rows_read_the_benchmark_report():
    report = ("### Gated attention\n\n| S | implementation | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |\n"
              "|---:|---|---:|---:|---:|---:|\n| 4096 | fused gated | 1.000 | 300.0 | 3.000 | 350.0 |\n\n"
              "| S | a | b | c | d |\n|---:|---:|---:|---:|---:|\n| 4096 | 1.200x | 1.100x | +3.0% | +2.0% |\n\n"
              "Goals (S=4096, fwd+bwd): met\n")
    rows = gpu_check.bench_rows(report, checked=False)
    assert [r.item for r in rows] == ["bf16 correctness", "S=4096 fused gated", "S=4096 fused gated vs SDPA + gate",
                                      "Goals (S=4096, fwd+bwd)"]
    assert rows[-1].value == "met" and "fwd+bwd 3.000 ms" in rows[1].value


def test_validation_does_not_import_benchmarks():
    import ast

    for path in (ROOT / "validation").glob("gpu_check*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] == "benchmarks" for n in names), f"{path.name} imports {names}"


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
    out = subprocess.run([sys.executable, "-m", "validation.gpu_check", "--out-dir", str(tmp_path / "out")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    (error,) = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert "a CUDA GPU" in error and "torch >= 2.11" in error and "triton >= 3.6" in error and torch.__version__ in error
    assert not (tmp_path / "out").exists()


def test_the_dry_run_text_lists_the_parts_budgets_and_plans_a_full_step():
    """Every part with its budget, their sum, and the plan's full step (the FLOPs agree with the count of
    stability.plan; the time is the FLOPs at the plan's utilisation of an H200's BF16 peak)."""
    from stability.plan import DEFAULT_MFU, GPUS

    args = gpu_check.parse_args(["--dry-run"])
    text = gpu_check.dry_run(args)
    assert all(f"  {part}" in text for part in gpu_check.PARTS) and "needs a CUDA GPU" in text
    assert gpu_check.budget_lines(args.budgets) in text
    plan = gpu_check.planned_step()
    assert plan["seconds"] == pytest.approx(plan["flops"] / (GPUS["h200"].bf16 * DEFAULT_MFU))
    assert 1e13 < plan["flops"] < 3e13 and 5e9 < plan["memory_bytes"] < GPUS["h200"].memory
    assert gpu_check.gpu_name_of("NVIDIA H200") == "h200" and gpu_check.gpu_name_of("Tesla T4") is None


@pytest.mark.slow   # a long test (every part's setup in subprocesses): CI runs it in a step of its own
@pytest.mark.long
def test_the_dry_run_needs_nothing_the_lent_image_lacks(tmp_path):
    """``--dry-run`` in a subprocess (and every process it starts) that cannot import mlflow, bitsandbytes, torchao
    or pytest-benchmark: every part's setup passes, the budgets sum to under 540 s, the table files are written."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "STABILITY_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(hide), *filter(None, [env.get("PYTHONPATH")])])
    code = f"import importlib.util as u; print([u.find_spec(n) is None for n in {NOT_ON_THE_IMAGE!r}])"
    probe = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert probe.stdout.strip() == "[True, True, True, True]", probe.stdout + probe.stderr
    out_dir = tmp_path / "out"
    out = subprocess.run([sys.executable, "-m", "validation.gpu_check", "--dry-run", "--out-dir", str(out_dir)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    data = json.loads((out_dir / gpu_check.TABLE_JSON).read_text())
    assert data["dry_run"] and data["failed"] == 0 and data["exit"] == 0
    assert data["budget_sum"] == sum(data["budgets"].values()) < 540 and list(data["budgets"]) == list(gpu_check.PARTS)
    assert all(part["state"] == "done" for part in data["parts"].values())
    rows = {(row["part"], row["item"]): row for row in data["rows"]}
    assert {part for part, _ in rows} == set(gpu_check.PARTS)
    subset = rows["kernel-tests", "the subset's node ids, collected by pytest"]
    chosen = (out_dir / "kernel-tests.txt").read_text().split("\n")[:-1]
    assert subset["verdict"] == "pass" and subset["value"].startswith(f"{len(chosen)} tests collected")
    assert len(chosen) < 40 and all(node.startswith("suites/test_kernel.py::") for node in chosen)
    assert "stop reason" in rows["step", "worker on the smoke preset, CPU"]["value"]
    text = (out_dir / gpu_check.TABLE).read_text()
    assert text.startswith("### GPU check, dry run") and f"sum {sum(gpu_check.BUDGETS.values())} of 540" in text
    assert "step 0 (warm-up): loss" in out.stdout and "stop: status completed" in out.stdout
