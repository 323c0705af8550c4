"""docs/extending.md's count, checked: a built-in stress case is added by its module and its line in the
registry's list, nothing else. In a copy of the repository the two files are written (a case of its own name,
label, figure and setting: the setting declared with the case, read through the config); the stress suite trains
it and checks its record, `stability baseline make` makes a baseline of it alone, and `stability check` judges a
second job of it against that baseline: exit 0, its figure judged."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from validation.workflow import fresh_copy, prepare_venv

MODULE = '''"""The plain pair at a multiple of the configured learning rate (``double_lr``): a case added by its module
alone, its setting (the multiple) declared with it."""

from dataclasses import dataclass, replace

from stability.cases.case import StressCase
from stability.cases.checks import require
from stability.config import check, positive_finite
from stability.record.figures import Figure


@dataclass(frozen=True)
class DoubleLrSettings:
    """factor: what the peak LR is multiplied by (``--set stress.case_settings.double_lr.factor=3``)."""

    factor: float = 2.0

    def __post_init__(self):
        check(positive_finite(self.factor), "stress.case_settings.double_lr.factor", self.factor,
              "a positive finite number")


def factor(config):
    """The case's multiple of the peak LR, as the config sets it."""
    return config.stress.settings_of("double_lr").factor


def double_lr(config):
    """The config the case trains: every arm and seed at ``factor`` times the peak LR."""
    lr = factor(config) * config.run.optim.lr
    return replace(config, run=replace(config.run, optim=replace(config.run.optim, lr=lr)))


def train_double_lr(run):
    """Each run's largest training loss is its own figure."""
    run.train_declared(lambda _run, arm: ({"double_lr_peak_loss": max(arm["series"]["loss"])}, {}))


def every_run_reports_its_peak_loss(record, invariant):
    """Every run of every arm and seed holds the case's own figure."""
    for arm in record["arms"]:
        require("double_lr_peak_loss" in arm["final"], f"{arm['arm']} seed {arm['seed']}: no peak loss")


CASE = StressCase("double_lr", train_double_lr, prepare=double_lr, settings=DoubleLrSettings(),
                  describe=lambda config: f"the plain pair at {factor(config):g}x the peak LR",
                  qualifier=lambda config: f"x{factor(config):g}", title="a multiple of the LR",
                  figures=(Figure("double_lr_peak_loss", kind="run", unit="nats", better="lower", floor=0.05,
                                  meaning="the largest training loss of a run at a multiple of the peak LR"),),
                  checks=(every_run_reports_its_peak_loss,), reported=lambda record: ["double_lr_peak_loss"])
'''

SETTINGS = """preset = "smoke"
cases = ["double_lr"]
replicates = 2

[set]
steps = 12
"stress.case_settings.double_lr.factor" = 3.0
"""


def add_to_registry(registry: Path) -> None:
    """The case's line in the registry's list (the import and the tuple the registry registers)."""
    text = registry.read_text()
    edited = text.replace("precision_ladder, shock, standard\n", "precision_ladder, shock, standard, double_lr\n", 1)
    edited = edited.replace("precision_ladder, shock):", "precision_ladder, shock, double_lr):", 1)
    assert edited.count("double_lr") == 2, "the registry's list moved: update this test"
    registry.write_text(edited)


def run(copy: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python ARGS`` of the copy's own environment (the copy installed, as a team installs its checkout)."""
    return subprocess.run([str(copy / ".venv" / "bin" / "python"), *args], cwd=copy, capture_output=True, text=True,
                          timeout=timeout, check=False)


def said(done: subprocess.CompletedProcess) -> str:
    """What a command said, its summary lines first (the end of a long log)."""
    text = done.stdout + done.stderr
    return "\n".join(line for line in text.splitlines() if "FAILED" in line or "Error" in line)[:3000] + text[-2000:]


def test_a_case_added_by_its_module_and_registry_line_runs_its_suite_and_check(tmp_path):
    copy = fresh_copy(tmp_path / "copy")
    (copy / "stability" / "cases" / "double_lr.py").write_text(MODULE)
    add_to_registry(copy / "stability" / "cases" / "stress.py")
    prepare_venv(copy)
    settings = tmp_path / "stability.toml"
    settings.write_text(SETTINGS)

    made = run(copy, "-m", "stability.cli", "baseline", "make", "--stability-config",
               str(settings), "--out", str(tmp_path / "baseline.json"), "--root", str(tmp_path / "made"), "--",
               "-k", "double_lr", "-n", "0")
    assert made.returncode == 0, said(made)
    baseline = json.loads((tmp_path / "baseline.json").read_text())
    assert list(baseline["cases"]) == ["smoke/double_lr-x3"]
    assert baseline["cases"]["smoke/double_lr-x3"]["config"]["stress.case_settings.double_lr.factor"] == 3.0
    held = baseline["cases"]["smoke/double_lr-x3"]["arms"]["gated"]["figures"]["double_lr_peak_loss"]
    assert sorted(held) == ["0", "1", "2"] and all(len(runs) == 3 for runs in held.values())

    suite = run(copy, "-m", "pytest", "suites/test_stress_cases.py", "-m", "stress", "-n", "0", "-p",
                "no:cacheprovider", "--stability-config", str(settings), "-k", "double_lr")
    assert suite.returncode == 0, said(suite)
    passed = re.search(r"(\d+) passed", suite.stdout)
    assert passed and int(passed.group(1)) >= 2 and " failed" not in suite.stdout, said(suite)

    checked = run(copy, "-m", "stability.cli", "check", "--baseline", str(tmp_path / "baseline.json"),
                  "--expect-commit", "any", "--cases", "double_lr", "--json", str(tmp_path / "check.json"),
                  *[str(p) for p in sorted((copy / "reports" / "runs").iterdir())[-1:]], timeout=300)
    assert checked.returncode == 0, said(checked)
    verdict = json.loads((tmp_path / "check.json").read_text())
    judged = [row for row in verdict["rows"] if row["figure"] == "double_lr_peak_loss"]
    assert judged and all(row["case_key"] == "smoke/double_lr-x3" for row in judged), verdict["rows"][:3]
