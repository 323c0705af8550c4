"""This repository's own CI workflow, .github/workflows/stability.yml: the workflow `stability init` writes (its
template, stability/cli/workflow.yml.in) with this repository's values.

    python tools/workflow.py            # write .github/workflows/stability.yml from the template
    python tools/workflow.py --check    # exit 1, printing the lines that differ, when the file is not that

The values differ from those `stability init` gives another repository in that this one tests its checkout:
the suites from suites/, the package installed editable with its test extra, the MLflow store of the jobs
named, and the job that compiles the kernel (only this repository has the kernel's source). The preset and the
baselines folder are its [tool.stability] table's; the header and the kernel job are the text files of
tools/workflow/. tests/test_workflow.py fails while the file and the rendering differ: edit the template, the
values here or those files, never the file itself, then run this script.
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

# this repository's own parts of the file, kept as text beside this script: the comment at its top and the
# job that compiles the kernel (stability init writes neither: another repository has no kernel source)
OWN = Path(__file__).resolve().parent / "workflow"


def values() -> dict[str, str]:
    """This repository's values of the template's markers (stability.cli.init.workflow_values: another's)."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["stability"]
    return {
        "HEADER": (OWN / "header.txt").read_text(),
        "BRANCH": "main",
        "PRESET": table["preset"],
        "BASELINES": table["baselines"],
        "ENV": "MLFLOW_TRACKING_URI: sqlite:///reports/mlflow.db\n",
        "CPU_ENV": "",
        "TORCH": "torch==2.13.0",
        "INSTALL": 'pip install -e ".[test]"\n',
        "SUITES": "suites/",
        "KERNEL_SUITE": "suites/test_kernel.py",
        "EXTRA_JOBS": (OWN / "kernel-compile.yml").read_text(),
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
              f"edit stability/cli/workflow.yml.in, tools/workflow.py or tools/workflow/, then run {REGENERATE}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
