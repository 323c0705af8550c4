"""This repository's own CI workflow, .github/workflows/stability.yml: the workflow `stability init` writes (its
template, stability/cli/workflow.yml.in) with this repository's values.

    python tools/workflow.py            # write .github/workflows/stability.yml from the template
    python tools/workflow.py --check    # exit 1, printing the lines that differ, when the file is not that

The values differ from those `stability init` gives another repository in that this one tests its checkout:
the suites from suites/, the package installed editable with its test extra, the MLflow store of the jobs
named, and the job that compiles the kernel (only this repository has the kernel's source). The preset and the
baselines folder are its [tool.stability] table's. tests/test_workflow.py fails while the file and the
rendering differ: edit the template or the values here, never the file, then run this script.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tomllib
from pathlib import Path

from stability.cli.init import render, workflow_template

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "stability.yml"
REGENERATE = "python tools/workflow.py"

HEADER = """\
# Stability check of the attention code: paired baseline/gated stress runs, their records written into the
# job's own run directory ($STABILITY_RUN_DIR, named by the workflow run: a session left under reports/runs
# by anything else is never read), then the regression check of exactly that directory against the
# committed baseline of the preset and device (reports/baselines/<preset>-<device>.json), reading the test
# steps' JUnit XML too, so that its exit, its table and the job summary are the job's one verdict. The check
# refuses records of another commit than the checkout's, of several commits, and two records of one run.
# No job passes without its baseline: a missing one fails the check step with the command that makes it.
# The regression table goes to the job summary; reports/ (records, report, JUnit XML) is uploaded; the job
# fails when a test or an outcome failed or a figure regressed (exit 1), a figure changed (exit 3) or the
# inputs are unusable (exit 2). tests/test_workflow.py runs the CPU jobs' steps end to end.
#
# Which job gates merges: on a pull request, the CPU job (smoke) and the GPU job (gpu-pr, one GPU, sized by
# `stability plan --preset gpu-pr --gpu h200` to about a third of its 240 minutes) and the kernel compile job.
# The `full` preset runs nightly on main (schedule), on a runner with 4 GPUs, one per pytest-xdist worker: it
# gates nothing, its failure is a failed nightly run. The GPU-hours of each job and baseline: docs/scale-out.md.
"""

KERNEL_COMPILE = """\
# The fused kernel compiled for sm_80, sm_90 and sm_100 on a CPU (triton's own ptxas, no GPU): every config of the
# autotuner's lists, dtype, gate mode and head dim; fails on a config that spills, exceeds a target's shared memory
# or does not compile, and on a compile that differs from reports/kernel-compile.md for this triton version.
# tests/test_kernel_compile.py runs its steps (with COMPILE=--small).
kernel-compile:
  name: kernel compiled for its GPU targets (cpu)
  if: github.event_name != 'schedule' && (github.event_name != 'workflow_dispatch' || inputs.baseline == '')
  runs-on: ubuntu-latest
  timeout-minutes: 120
  env:
    COMPILE: --jobs 4
  steps:
    - uses: actions/checkout@v4
    - uses: actions/setup-python@v5
      with:
        python-version: "3.11"
    - name: install (CPU build of torch)
      run: |
        python -m venv .venv
        . .venv/bin/activate
        pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
        pip install -e ".[test]"
    - name: compile every kernel config for its targets
      id: compile
      run: |
        . .venv/bin/activate
        mkdir -p reports
        python -m validation.compile_kernels --check $COMPILE | tee reports/kernel-compile-job.txt
    - name: upload the compile table
      if: always()
      uses: actions/upload-artifact@v4
      with:
        name: kernel-compile
        path: reports/kernel-compile-job.txt

"""


def values() -> dict[str, str]:
    """This repository's values of the template's markers (stability.cli.init.workflow_values: another's)."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["stability"]
    return {
        "HEADER": HEADER,
        "BRANCH": "main",
        "PRESET": table["preset"],
        "BASELINES": table["baselines"],
        "ENV": "MLFLOW_TRACKING_URI: sqlite:///reports/mlflow.db\n",
        "CPU_ENV": "",
        "TORCH": "torch==2.13.0",
        "INSTALL": 'pip install -e ".[test]"\n',
        "SUITES": "suites/",
        "KERNEL_SUITE": "suites/test_kernel.py",
        "EXTRA_JOBS": KERNEL_COMPILE,
    }


def rendered() -> str:
    """The workflow this repository should have: the template with its values."""
    return render(workflow_template(), values())


def differences(written: str, expected: str) -> list[str]:
    """The lines of a unified diff from ``expected`` (the rendering) to ``written`` (the file); none when equal."""
    return list(difflib.unified_diff(expected.splitlines(keepends=True), written.splitlines(keepends=True),
                                     "rendered from the template", str(WORKFLOW.relative_to(ROOT))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare the file with the rendering, write nothing")
    args = parser.parse_args(argv)
    if not args.check:
        WORKFLOW.write_text(rendered())
        print(f"wrote {WORKFLOW.relative_to(ROOT)}")
        return 0
    found = differences(WORKFLOW.read_text(), rendered())
    sys.stdout.writelines(found)
    if found:
        print(f"{WORKFLOW.relative_to(ROOT)} is not the template rendered with this repository's values: "
              f"edit stability/cli/workflow.yml.in or tools/workflow.py, then run {REGENERATE}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
