"""The fused kernel compiled for its GPU targets on the CPU (validation/compile_kernels.py): the workflow's compile
job, run here as written with one config per kernel and target, passes on the kernel as it is (each compile as
committed for this triton version) and fails when a list gains a config that spills or one that needs more shared
memory than its target has; the committed tables say what the kernel's lists hold, in each triton version of the
job's matrix (the oldest the package accepts, and the newest compiled), and which tensor-core instruction each
compile uses (a Hopper dK/dV with 64 or more keys per block on wgmma among them)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from validation import compile_kernels, kernel_table
from validation.kernel_compile import SHARED_LIMIT, Spec, Usage, instruction, judge, kernels_module
from validation.workflow import WORKFLOW, apply_patch, fresh_copy, prepare_venv, run_job

ROOT = Path(__file__).resolve().parents[1]

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


def test_the_instruction_is_read_from_the_ptx():
    assert instruction("mov.b32 %r1, 0;\nfma.rn.f32 %f1, %f2, %f3, %f4;") == "none"
    assert instruction("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {..};\n"
                       "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {..};") == "mma.sync m16n8k16"
    hopper = ("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {..};\n"
              "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {..};\nwgmma.fence.sync.aligned;")
    assert instruction(hopper) == "wgmma m64n16k16 + wgmma m64n128k16"
    assert instruction("tcgen05.mma.cta_group::1.kind::f16 [%r1], ..;\ntcgen05.commit.cta_group::1") == \
        "tcgen05.mma kind::f16"
    group = [Usage(Spec("dq", 90, "big", (16, 16, 4, 1), dtype, d), instruction=mma)
             for dtype, d, mma in (("bf16", 256, "mma.sync m16n8k16"), ("fp32", 64, "none"))]
    assert kernel_table.instructions(group) == "mma.sync m16n8k16; none (fp32)"


def test_problems_and_differences_name_the_config():
    lists = {90: {("dq", "fast"): [(64, 32, 4, 2), (32, 32, 4, 1)]}}
    a, b = (Spec("dq", 90, "fast", c, "bf16", 64) for c in ((64, 32, 4, 2), (32, 32, 4, 1)))
    assert kernel_table.problems([Usage(a, 100), Usage(b, 90)], lists) == []
    found = kernel_table.problems([Usage(a, 255, 16, verdict="spills"), Usage(b, 90)], lists)
    assert len(found) == 2 and "(64, 32, 4, 2)" in found[0] and "keeps 1 config(s)" in found[1]
    assert kernel_table.differences([Usage(a, 100)], [Usage(a, 100)]) == []
    assert "committed 99" in kernel_table.differences([Usage(a, 100)], [Usage(a, 99)])[0]
    now, before = Usage(a, 100, instruction="wgmma m64n64k16"), Usage(a, 100, instruction="mma.sync m16n8k16")
    assert "committed 100, 0, 0, mma.sync m16n8k16" in kernel_table.differences([now], [before])[0]


def matrix_versions() -> list[str]:
    """The triton versions the workflow's compile job runs under (its matrix)."""
    job = yaml.safe_load(WORKFLOW.read_text())["jobs"]["kernel-compile"]
    return [str(v) for v in job["strategy"]["matrix"]["triton"]]


def test_the_table_holds_each_triton_version_of_the_job_from_the_oldest_the_package_accepts():
    """reports/kernel-compile.md has a section for each triton version the compile job's matrix installs, and those
    are the oldest version the package accepts (pyproject's ``triton>=``) and a newer one."""
    sections = kernel_table.read_report()
    versions = matrix_versions()
    assert sorted(sections, key=kernel_table.version_key) == sorted(versions, key=kernel_table.version_key)
    requirement = next(d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
                       if d.startswith("triton"))
    lowest = re.search(r">=\s*([\d.]+)", requirement).group(1)
    oldest = min(versions, key=kernel_table.version_key)
    assert kernel_table.version_key(oldest)[:2] == kernel_table.version_key(lowest)[:2], (oldest, requirement)
    assert len(versions) >= 2


def test_writing_one_version_keeps_the_others(tmp_path, monkeypatch):
    """``--write`` under one triton rewrites its section only: the committed report read and written back (each
    version's rows and header line) is the committed report, byte for byte."""
    text = kernel_table.REPORT.read_text()
    sections, headers = kernel_table.read_report(text), kernel_table.headers_of(text)
    monkeypatch.setattr(kernel_table, "REPORT", tmp_path / "kernel-compile.md")
    kernel_table.write_report(sections, headers)
    assert kernel_table.REPORT.read_text() == text
    assert len(sections) >= 2 and all(sections.values())


def test_the_committed_tables_hold_every_listed_config_clean_in_each_triton_version():
    """reports/kernel-compile.md has every compile of every listed config (every dtype, gate mode and head dim of
    its tier) for every target, in each triton version it holds (the job's matrix), all ok, two or more per list,
    each with the tensor-core instruction its PTX names (none for fp32 tiles and the preprocess); docs/kernel.md's
    summary is the one those sections make."""
    sections = kernel_table.read_report()
    assert set(matrix_versions()) <= set(sections), (matrix_versions(), list(sections))
    lists = compile_kernels.kernel_lists()
    wanted = set(compile_kernels.specs())
    for version, usages in sections.items():
        compiled = {u.spec for u in usages}
        assert wanted <= compiled, (version, sorted(wanted - compiled, key=str)[:5])
        assert kernel_table.problems([u for u in usages if u.spec in wanted], lists) == [], version
        for u in usages:
            if u.verdict != "error":
                none = u.spec.kernel == "preprocess" or u.spec.dtype == "fp32"
                assert (u.instruction == "none") == none and u.instruction, (version, u.describe())
    assert kernel_table.committed_summary() == kernel_table.summary_table(sections, lists)


def test_the_hopper_dkdv_list_has_a_wgmma_config_with_64_or_more_keys_in_each_version():
    """On sm_90 the dK/dV list keeps a config of BLOCK_N >= 64 whose every fast compile (bf16 and fp16, D = 64 and
    128) is clean on wgmma, in each triton version of the table (docs/kernel.md says so)."""
    listed = compile_kernels.kernel_lists()[90]["dkdv", "fast"]
    for version, usages in kernel_table.read_report().items():
        wide = [config for config in listed if config[1] >= 64
                and all(u.verdict == "ok" and u.instruction.startswith("wgmma") for u in usages
                        if (u.spec.kernel, u.spec.target, u.spec.config) == ("dkdv", 90, config))]
        assert wide, (version, listed)


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
