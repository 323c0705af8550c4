"""The docs' worked examples, recomputed from the code they describe: a rule change that leaves a
doc behind fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stability.check.rows import DOF_RULE, judge
from stability.check.verdict import DEFAULT_ALPHA, VERDICT_OF_EXIT
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


BASELINES = sorted((ROOT / "reports" / "baselines").glob("*-cpu.json"))
"""The committed CPU baselines (the ``example-*`` ones the docs' commands write are not committed)."""


def _hypotheses(preset: str) -> int:
    """The number of hypotheses Holm judged in the committed baseline's calibration (two per primary row that is
    not judged by its floor only: regressed and changed)."""
    curve = json.loads((ROOT / "reports" / "baselines" / f"{preset}-cpu.json").read_text())["calibration"]
    return int(re.search(r"of (\d+) hypotheses", curve["closest"]["reason"][0]).group(1))


def _close(text: str, value: float) -> bool:
    """A number as the doc prints it (two significant figures) against the computed one."""
    return float(text) == pytest.approx(float(f"{value:.2g}"), rel=1e-9, abs=1e-12)


def test_figures_worked_example_is_what_the_check_computes():
    doc = (ROOT / "docs" / "figures.md").read_text()
    rows = _table(doc)
    assert len(rows) >= 3
    family = _hypotheses("smoke")
    assert f"two of the {family} hypotheses at `smoke`" in doc
    base = {s: {str(d): m + dev for d, dev in enumerate(DEVIATIONS)} for s, m in SEEDS.items()}
    verdicts = set()
    for move, delta, z, df, p, changed, asks, verdict in rows:
        step = float(move)
        stats = judge(base, {s: m + step for s, m in SEEDS.items()}, "heldout_loss")
        assert _close(delta, stats["delta"]) and _close(z, stats["z"]), move
        assert stats["mode"] == f"n=3 df={df}", move
        assert _close(p, stats["p"]) and _close(changed, stats["p_change"]), move
        assert _close(asks, DEFAULT_ALPHA / family), move
        regressed, moved = holm([stats["p"], stats["p_change"]] + [1.0] * (family - 2), DEFAULT_ALPHA)[:2]
        assert verdict == ("regressed" if regressed else "changed" if moved else "ok"), move
        verdicts.add(verdict)
    assert verdicts == {"ok", "changed", "regressed"}


def test_quantization_doc_says_whether_quant_rows_are_judged():
    doc = " ".join((ROOT / "docs" / "quantization.md").read_text().split())
    primary = any(p.figure.startswith("quant") for p in primary_rows())
    assert ("no `quant_*` row is primary" in doc) == (not primary)
    assert "checked for regressions" not in doc or primary


def test_your_repository_names_every_exit_code_of_the_check():
    doc = " ".join((ROOT / "docs" / "your-repository.md").read_text().split())
    section = doc.split("## What the suites can and cannot see on your model", 1)[1].split("It cannot see:")[0]
    for code, verdict in VERDICT_OF_EXIT.items():
        assert f"exit {code}" in section, (code, verdict)
    assert "Holm" in section and "fewest degrees of freedom" in section and DOF_RULE == "min"


def calibration_row(preset: str) -> str:
    """docs/merge-gate.md's row for the committed baseline of ``preset``, made from the curve it holds."""
    curve = json.loads((ROOT / "reports" / "baselines" / f"{preset}-cpu.json").read_text())["calibration"]
    case, arm, figure_and_p = re.fullmatch(rf"{preset}/(\S+) (\S+) (.+)", curve["closest"]["reason"][0]).groups()
    figure, p = figure_and_p.split(": ", 1)
    playing = curve.get("playing")
    players = (f"replicates {playing[0]}-{playing[-1]}" if playing and playing == list(range(playing[0], playing[-1] + 1))
               else f"{curve['replicates']} replicates")
    return (f"| `{preset}-cpu.json` | {curve['arrangements']} ({players} ^ {curve['seeds']} seeds) | {' / '.join(str(n) for n in curve['failed'])} | {curve['margin']:.3g} | `{case}` {arm} "
            f"`{figure}`: {p} |")


def test_merge_gate_quotes_the_committed_baselines_calibration():
    """The calibration table of docs/merge-gate.md is the curve each committed baseline holds: a baseline made
    or calibrated again (a rule change: `stability baseline calibrate --write`) leaves the doc behind here."""
    doc = (ROOT / "docs" / "merge-gate.md").read_text()
    assert "| baseline | arrangements | fail at alpha 0.01 / 0.02 / 0.05 / 0.10 |" in doc
    assert BASELINES, "no committed CPU baseline"
    for path in BASELINES:
        preset = path.name.removesuffix("-cpu.json")
        curve = json.loads(path.read_text())["calibration"]
        assert curve["alphas"] == [0.01, 0.02, 0.05, 0.1]
        assert calibration_row(preset) in doc, calibration_row(preset)
        assert f"{curve['margin']:.3g}x" in doc and f"{_hypotheses(preset)} hypotheses" in doc


def three_figures(value: float) -> str:
    """A margin as the docs print it: three significant figures, no exponent (2630, 89.1)."""
    return f"{float(f'{value:.3g}'):g}"


def _zoo_summary(report: str) -> dict[str, str]:
    """The first table of a zoo report: group -> the check's count."""
    rows = [line.strip("|").split("|") for line in report.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): cells[1].strip() for cells in rows[1:] if len(cells) == 5}


@pytest.mark.parametrize("scale", ["smoke", "ci"])
def test_the_zoo_reports_are_what_the_check_says_of_the_kept_jobs_and_merge_gate_quotes_them(tmp_path, scale):
    """reports/zoo-<scale>.md is what today's check says of the kept jobs against the committed baseline
    (`python -m validation.regression_zoo --preset S --rejudge`, nothing trained), byte for byte; docs/merge-gate.md
    quotes its counts and the unchanged code's margin. A rule change that moves a verdict or a margin and
    leaves the evidence behind fails here, naming the command that judges it again."""
    import subprocess
    import sys

    out = tmp_path / f"zoo-{scale}.md"
    done = subprocess.run([sys.executable, "-m", "validation.regression_zoo", "--preset", scale, "--rejudge",
                           "--out", str(out), "--work", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    committed = (ROOT / "reports" / f"zoo-{scale}.md").read_text()
    assert out.read_text() == committed, (f"reports/zoo-{scale}.md is stale: run python -m "
                                          f"validation.regression_zoo --preset {scale} --rejudge")
    doc = (ROOT / "docs" / "merge-gate.md").read_text()
    section = doc.split(f"**The regression zoo at `{scale}`**")[1].split("\n\n**")[0]
    unchanged = next(line for line in committed.splitlines() if line.startswith("| `unchanged` |"))
    margin = float(unchanged.split("|")[7])
    assert f"| the code as it is | passes ({three_figures(margin)}x from failing) |" in section, section[:400]
    summary = _zoo_summary(committed)
    for group in ("entries held out from the per-step replicates", "entries held out from the applied-stress proofs"):
        assert f"**{summary[group]}**" in section, (group, summary[group])


@pytest.mark.parametrize("scale", ["smoke", "ci"])
def test_merge_gate_quotes_the_null_jobs_report(scale):
    """docs/merge-gate.md's paragraph on the null jobs at a preset quotes reports/null-<scale>.md's false-alarm
    count, upper bound and closest margin (`python -m validation.null_jobs --preset S --rejudge` writes that
    report from the kept jobs)."""
    report = (ROOT / "reports" / f"null-{scale}.md").read_text().splitlines()
    jobs, failed, _rate, bound = (cell.strip() for cell in report[report.index(
        "| jobs | failed | false-alarm rate | 95% upper bound (exact) | minutes per job: median (range) |") + 2]
        .strip("|").split("|")[:4])
    chose = next((set(re.findall(r"\d+", line.split(" chose the current rule")[0])) for line in report
                  if " chose the current rule" in line), set())   # listed, not counted
    margins = [float(line.split("|")[4]) for line in report if re.match(r"\| \d+ \| passed \|", line)
               and line.split("|")[1].strip() not in chose]
    assert len(margins) == int(jobs) - int(failed)
    doc = (ROOT / "docs" / "merge-gate.md").read_text().split(f"**Null jobs at `{scale}`.**")[1].split("\n\n")[0]
    assert f"**{failed} of {jobs} failed**" in doc and f"below {bound} at 95%" in doc, (scale, failed, jobs, bound)
    assert f"(closest {three_figures(min(margins))}x from failing)" in doc, (scale, three_figures(min(margins)))


@pytest.mark.parametrize("scale", ["smoke", "ci"])
def test_the_replicates_report_is_what_its_command_writes_of_the_kept_jobs(tmp_path, scale):
    """reports/replicates-<scale>.md (harmless rewrites against the rounding replicates) is what
    `python -m validation.replicate_spread --preset S` writes from the kept jobs and the committed baseline."""
    import subprocess
    import sys

    out = tmp_path / f"replicates-{scale}.md"
    done = subprocess.run([sys.executable, "-m", "validation.replicate_spread", "--preset", scale, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.read_text() == (ROOT / "reports" / f"replicates-{scale}.md").read_text(), (
        f"reports/replicates-{scale}.md is stale: run python -m validation.replicate_spread --preset {scale}")


def test_figures_md_numbers_are_read_from_the_committed_baselines():
    """docs/figures.md's tables of smallest failing moves and early-horizon noise are what
    `python -m validation.figure_numbers` computes from reports/baselines/; a number edited by hand is found."""
    from validation import figure_numbers

    text = figure_numbers.DOC.read_text()
    blocks = figure_numbers.BLOCK.findall(text)
    assert {(kind, preset) for _, kind, preset, _, _ in blocks} == {(k, p) for k in ("moves", "early")
                                                                  for p in ("smoke", "ci")}
    assert figure_numbers.rendered(text) == text, "run python -m validation.figure_numbers"
    assert "| `early_loss` | 4 | 0.05%" in text and "0.1%" not in text
    edited = text.replace("(median 1,385)", "(median 1,000)")
    assert edited != text and figure_numbers.rendered(edited) == text


def test_the_replicate_count_report_is_what_its_command_writes(tmp_path):
    """reports/replicate-count-smoke.md (4 replicates beside 19) is what `python -m validation.replicate_count`
    writes from the committed baselines; the cut it reads is the reference and replicates 1-4 of the whole."""
    from validation import replicate_count, replicate_subset

    cut_path = ROOT / "reports" / "baselines" / "smoke-cpu-r4.json"
    written = tmp_path / "replicate-count.md"
    assert replicate_count.main(["--preset", "smoke", "--cut", str(cut_path), "--out", str(written)]) == 0
    assert written.read_text() == (ROOT / "reports" / "replicate-count-smoke.md").read_text()
    whole = json.loads((ROOT / "reports" / "baselines" / "smoke-cpu.json").read_text())
    cut = json.loads(cut_path.read_text())
    assert replicate_subset.cut(whole, 4)["cases"] == cut["cases"] and cut["replicates"] == [0, 1, 2, 3, 4]
    assert cut["null_jobs"]["jobs"] >= 60 and cut["null_jobs"]["failed"] == 0
