"""The docs' worked examples, recomputed from the code they describe: a rule change that leaves a
doc behind fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stability.check import regression as reg
from stability.record.figures import primary_rows
from stability.record.stats import holm

ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- computed by tests/test_docs_examples.py -->"
SEEDS = {"0": 3.200, "1": 3.250, "2": 3.150}
DEVIATIONS = [0.0, 0.002, -0.002, 0.001, -0.001]


def _table(doc: str) -> list[list[str]]:
    """The rows of the table under the marker, without header and rule."""
    lines = doc.split(MARKER, 1)[1].strip().splitlines()
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows[2:]


def _family_size(preset: str) -> int:
    """The primary family's size the committed baseline's calibration measured."""
    curve = json.loads((ROOT / "reports" / "baselines" / f"{preset}-cpu.json").read_text())["calibration"]
    return int(re.search(r"of (\d+) primary rows", curve["closest"]["reason"][0]).group(1))


def _close(text: str, value: float) -> bool:
    """A number as the doc prints it (two significant figures) against the computed one."""
    return float(text) == pytest.approx(float(f"{value:.2g}"), rel=1e-9, abs=1e-12)


def test_figures_worked_example_is_what_the_check_computes():
    doc = (ROOT / "docs" / "figures.md").read_text()
    rows = _table(doc)
    assert len(rows) >= 3
    family = _family_size("ci")
    assert f"one of the {family} primary rows at `ci`" in doc
    base = {s: {str(d): m + dev for d, dev in enumerate(DEVIATIONS)} for s, m in SEEDS.items()}
    verdicts = set()
    for move, delta, z, df, p, asks, verdict in rows:
        step = float(move)
        stats = reg.judge(base, {s: m + step for s, m in SEEDS.items()}, "heldout_loss")
        assert _close(delta, stats["delta"]) and _close(z, stats["z"]), move
        assert stats["mode"] == f"n=3 df={df}", move
        assert _close(p, stats["p"]), move
        assert _close(asks, reg.DEFAULT_ALPHA / family), move
        rejected = holm([stats["p"]] + [1.0] * (family - 1), reg.DEFAULT_ALPHA)[0]
        assert verdict == ("regressed" if rejected else "ok"), move
        verdicts.add(verdict)
    assert verdicts == {"ok", "regressed"}


def test_quantization_doc_says_whether_quant_rows_are_judged():
    doc = " ".join((ROOT / "docs" / "quantization.md").read_text().split())
    primary = any(p.figure.startswith("quant") for p in primary_rows())
    assert ("no `quant_*` row is primary" in doc) == (not primary)
    assert "checked for regressions" not in doc or primary


def test_your_repository_names_every_exit_code_of_the_check():
    doc = " ".join((ROOT / "docs" / "your-repository.md").read_text().split())
    section = doc.split("## What the suites can and cannot see on your model", 1)[1].split("It cannot see:")[0]
    for code, verdict in reg.VERDICT_OF_EXIT.items():
        assert f"exit {code}" in section, (code, verdict)
    assert "Holm" in section and "fewest degrees of freedom" in section and reg.DOF_RULE == "min"
