"""The fused kernel compiled for its GPU targets on the CPU (validation/compile_kernels.py): the workflow's compile
job, run here as written with one config per kernel and target, passes on the kernel as it is (each compile as
committed for this triton version) and fails when a list gains a config that spills or one that needs more shared
memory than its target has; the committed tables say what the kernel's lists hold."""

from __future__ import annotations

import pytest

from validation import compile_kernels, kernel_table
from validation.kernel_compile import SHARED_LIMIT, Spec, Usage, judge, kernels_module
from validation.workflow import WORKFLOW, apply_patch, fresh_copy, prepare_venv, run_job

# configs added to the last place of a list (the one --small compiles), each with what the job must say of it
SPILLING = ("fwd", 80, (128, 128, 4, 2), "spills")
TOO_BIG = ("dq", 90, (128, 128, 4, 8), "shared")


def add_to_list(copy, kernel: str, target: int, config: tuple) -> None:
    """In ``copy``, append ``config`` to the fast list of ``kernel`` for ``target`` in GPU_CONFIGS (the last place:
    the one --small compiles)."""
    text = (copy / "kernels" / "gated_attention.py").read_text()
    start = text.index(f"    {target}: {{")
    line_start = text.index(f'("{kernel}", "fast"): [', start)
    line = text[line_start:text.index("\n", line_start)]
    apply_patch(copy, [("kernels/gated_attention.py", text[start:line_start] + line,
                        text[start:line_start] + line.replace("],", f", {config}],"))])


def test_the_compile_job_passes_and_fails_on_an_added_spilling_or_oversized_config(tmp_path):
    copy = fresh_copy(tmp_path / "copy")
    env = {"COMPILE": "--small", "TRITON_CACHE_DIR": str(tmp_path / "triton-cache")}
    job = run_job(WORKFLOW, "kernel-compile", copy, install=prepare_venv, env=env)
    assert job.passed, job.log()
    output = job.steps["compile"].output
    assert "compile_kernels: 12 compiles" in output and "ok: every listed config compiles clean" in output
    for kernel, target, config, verdict in (SPILLING, TOO_BIG):
        add_to_list(copy, kernel, target, config)
    job = run_job(WORKFLOW, "kernel-compile", copy, install=lambda _copy: None, env=env)
    assert job.failed, job.log()
    output = job.steps["compile"].output
    for kernel, target, config, verdict in (SPILLING, TOO_BIG):
        named = [line for line in output.splitlines() if line.strip().startswith(f"{kernel} sm_{target} {config}")
                 and "is not ok" in line]
        assert named and f": {verdict}:" in named[0], (verdict, output[-3000:])


def test_the_verdicts():
    spec = Spec("fwd", 80, "fast", (128, 64, 8, 3), "bf16", 128, 1)
    assert judge(spec, 200, 0, 100 * 1024) == "ok"
    assert judge(spec, 255, 8, 100 * 1024) == "spills"
    assert judge(spec, 200, 0, SHARED_LIMIT[80] + 1) == "shared"
    assert judge(Spec("fwd", 90, "fast", (128, 64, 16, 3), "bf16", 128, 1), 255, 0, 1024) == "registers"


def test_problems_and_differences_name_the_config():
    lists = {90: {("dq", "fast"): [(64, 32, 4, 2), (32, 32, 4, 1)]}}
    a, b = (Spec("dq", 90, "fast", c, "bf16", 64) for c in ((64, 32, 4, 2), (32, 32, 4, 1)))
    assert kernel_table.problems([Usage(a, 100), Usage(b, 90)], lists) == []
    found = kernel_table.problems([Usage(a, 255, 16, verdict="spills"), Usage(b, 90)], lists)
    assert len(found) == 2 and "(64, 32, 4, 2)" in found[0] and "keeps 1 config(s)" in found[1]
    assert kernel_table.differences([Usage(a, 100)], [Usage(a, 100)]) == []
    assert "committed 99" in kernel_table.differences([Usage(a, 100)], [Usage(a, 99)])[0]


def test_the_committed_tables_hold_every_listed_config_clean_in_each_triton_version():
    """reports/kernel-compile.md has every compile of every listed config (every dtype, gate mode and head dim of
    its tier) for every target, in each triton version it holds, all ok, two or more per list; docs/kernel.md's
    summary is the one those sections make."""
    sections = kernel_table.read_report()
    assert len(sections) >= 1, "reports/kernel-compile.md holds no triton version"
    lists = compile_kernels.kernel_lists()
    wanted = set(compile_kernels.specs())
    for version, usages in sections.items():
        compiled = {u.spec for u in usages}
        assert wanted <= compiled, (version, sorted(wanted - compiled, key=str)[:5])
        assert kernel_table.problems([u for u in usages if u.spec in wanted], lists) == [], version
    assert kernel_table.committed_summary() == kernel_table.summary_table(sections, lists)


def test_an_interpreted_kernel_is_refused_for_compiling(monkeypatch):
    """In a process whose kernels run in the Triton interpreter (this one, without CUDA), compiling is refused."""
    import importlib

    if not importlib.import_module("stability.kernels.gated_attention").INTERPRETED:
        pytest.skip("the kernels are compiled in this process (a CUDA machine)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")   # kernels_module sets it to 0; restored after the test
    with pytest.raises(RuntimeError, match="cannot be compiled"):
        kernels_module()


def test_a_device_takes_the_lists_of_the_highest_target_at_or_below_it():
    import importlib

    import torch

    ga = importlib.import_module("stability.kernels.gated_attention")
    assert [ga.target_of(c) for c in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))] == [80, 80, 80, 90, 100, 100]
    with pytest.raises(ValueError, match="7.5"):
        ga.target_of((7, 5))
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    assert all(kernel_table.tier_of(name, d) == ga.tier(d, dtype) for name, dtype in dtypes.items()
               for d in compile_kernels.HEAD_DIMS)
