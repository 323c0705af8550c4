"""Properties of the report (stability/report/html.py, `stability report`), rendered in headless Chromium."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import pytest
from _stability_records import edited, pair_record, with_replicates

from stability.cases.precision_ladder import ladder_rows
from stability.check import regression as reg
from stability.check.baseline import make_baseline, write_baseline
from stability.cli import main
from stability.record import paired_summary
from stability.report import html as report
from stability.report import tables as table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def records():
    plain = pair_record(seeds=(0, 1, 2), quant=True)
    plain["tracking"] = {"status": "tracked", "uri": "sqlite:///m.db", "experiment": "stability-smoke",
                         "experiment_id": "1", "parent_run_id": "parent0123456789",
                         "child_run_ids": {"reference-seed0": "child-b0", "gated-seed0": "child-g0"}}
    sweep = {**pair_record(case_label="lr_sweep", seeds=(0,), lrs=[1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]),
             "case": "lr_sweep"}   # the sweep's plot is its case's (StressCase.plots)
    return [plain, sweep]


@pytest.fixture(scope="module")
def written(records, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    baseline = make_baseline(with_replicates(records[0]))
    result = reg.check([edited(records[0], "gated", "m_act_max", factor=3.0)], baseline)
    return report.write_report(records, out, result), result


def _data_uri_images(text: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)]


def test_html_is_self_contained_with_every_plot_as_a_png_data_uri(written):
    paths, _ = written
    text = paths["html"].read_text()
    images = _data_uri_images(text)
    assert len(images) == 2 + 1 + 1 + 2   # record 1: curves, layers, quant; record 2: curves, lr_sweep, layers
    assert all(image.startswith(PNG_MAGIC) and len(image) > 2000 for image in images)
    assert not re.search(r"(src|href)=['\"](?!data:)[^'\"]+['\"]", text)   # nothing loaded from elsewhere
    for plot in ("plot-0-curves", "plot-0-layers", "plot-0-quant", "plot-1-curves", "plot-1-lr_sweep"):
        assert f"id='{plot}'" in text


def test_report_has_summary_table_verdicts_environment_and_mlflow_ids(written, records):
    paths, result = written
    text = paths["html"].read_text()
    assert "<table class=\"summary\">" in text and ">heldout_loss<" in text and ">m_act_mean<" in text
    assert result.exit_code == 1 and "REGRESSED" in text and "Regression check" in text
    assert "torch" in text and "2.13.0+cpu" in text and "git.commit" in text
    assert "parent0123456789" in text and "child-g0" in text
    assert "fp8 needs a GPU here" in text   # a skipped quantization scheme says why


def test_markdown_twin_links_existing_pngs_and_holds_the_same_tables(written):
    paths, _ = written
    md = paths["markdown"].read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(links) == len(paths["plots"]) == 6
    assert all((paths["markdown"].parent / link).read_bytes().startswith(PNG_MAGIC) for link in links)
    assert "| arm | figure | better | unit | reference | arm value | arm-reference |" in md and "parent0123456789" in md and "REGRESSED" in md


def test_cli_report_writes_html_and_markdown_and_rejects_bad_records(tmp_path, records, capsys):
    good = tmp_path / "r.json"
    good.write_text(json.dumps(records[0], allow_nan=False))
    base = tmp_path / "b.json"
    write_baseline(make_baseline(with_replicates(records[0])), base)
    assert main(["report", str(good), "--out", str(tmp_path / "out" / "report.html"), "--baseline", str(base)]) == 0
    assert (tmp_path / "out" / "report.html").is_file() and (tmp_path / "out" / "report.md").is_file()
    assert "PASSED" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(records[0])[:300])
    assert main(["report", str(bad), "--out", str(tmp_path / "x.html")]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_report_renders_in_headless_chromium_with_loaded_figures_and_table(written, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium); the render check needs it")
    paths, _ = written
    flags = CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    url = paths["html"].resolve().as_uri()
    dom = subprocess.run([browser, *flags, "--dump-dom", url], check=False, capture_output=True, text=True,
                         timeout=600)
    assert dom.returncode == 0, dom.stderr[-2000:]
    images = re.findall(r"<img[^>]*class=\"plot\"[^>]*>", dom.stdout)
    assert len(images) == 6 and all('data-loaded="true"' in img for img in images), images[:1]
    assert 'data-plots-loaded="6"' in dom.stdout
    assert re.search(r"<table class=\"summary\">.*heldout_loss", dom.stdout, re.DOTALL)
    shot = tmp_path / "shot.png"
    run = subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1200,1600", url],
                         check=False, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and shot.read_bytes().startswith(PNG_MAGIC), run.stderr[-2000:]
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.std() > 0.05   # not a blank page: text, tables and plots were drawn


def test_ladder_and_quant_tables_name_the_library_and_recipe_of_each_row(tmp_path):
    """The precision ladder (one row per rung and arm, a skipped rung with its reason) and the
    quantization table (one row per scheme and arm) say which library, version and recipe made
    each row, in the HTML and the Markdown."""
    record = {**pair_record(case_label="precision_ladder", seeds=(0, 1), quant=True), "case": "precision_ladder"}
    for arm in record["arms"]:
        gated = arm["arm"] == "gated"
        arm["final"].update(loss_gap_fp8=0.01 if gated else 0.03, underflow_fraction_fp8=1e-4,
                            overflow_fraction_fp8=0.0, diverged_fp8=False, loss_gap_mxfp4=0.02)
    record["paired"] = paired_summary(record["arms"])
    record["precision_ladder"] = {   # where a record written before the results slot kept them
        "precisions": ["fp32", "fp8", "mxfp4"],
        "sources": {"fp32": {"dtype": "fp32", "library": "torch", "version": "2.13.0", "recipe": "fp32",
                             "emulated": False},
                    "fp8": {"dtype": "fp8", "library": "torchao", "version": "0.18.0", "recipe": "float8 tensorwise",
                            "emulated": True},
                    "mxfp4": {"dtype": "mxfp4", "library": "torchao", "version": "0.18.0",
                              "recipe": "MX mx_mm, e2m1 weights", "emulated": True}},
        "skipped": {"mxfp8": "mxfp8 trains through torchao: torchao cannot be imported here"}, "runs": []}
    paths = report.write_report([record], tmp_path / "ladder.html")
    for text in (paths["html"].read_text(), paths["markdown"].read_text()):
        assert "Precision ladder" in text and "Post-training quantization" in text
        assert "torchao 0.18.0" in text and "float8 tensorwise (emulated)" in text
        assert "MX mx_mm, e2m1 weights (emulated)" in text and "torchao cannot be imported here" in text
        assert "bitsandbytes 0.50.2" in text and "bitsandbytes int8 recipe" in text
    ladder = ladder_rows(record)
    fp8_gated = next(row for row in ladder if row[0] == "fp8" and row[2] == "gated")
    assert fp8_gated[3:6] == ["0.03", "0.01", "-0.02"]  # reference gap, gated gap, gated - reference
    assert (fp8_gated[1], fp8_gated[-1]) == ("torchao 0.18.0", "float8 tensorwise (emulated)")
    assert [row[0] for row in ladder[1:]] == ["fp8", "mxfp4", "mxfp8"]  # the trained rungs, then the skipped
    moved = {key: value for key, value in record.items() if key != "precision_ladder"}
    moved["results"] = {"precision_ladder": record["precision_ladder"]}
    assert ladder_rows(moved) == ladder   # the results slot and a record written before it read alike
    plain = report.write_report([pair_record(seeds=(0,))], tmp_path / "plain.html")["html"].read_text()
    assert "Precision ladder" not in plain and "Post-training quantization" not in plain


def test_a_figure_only_the_treatment_arm_has_shows_its_mean_in_the_tables(records):
    """The gate score: the baseline has no gate, so no seed pairs and the paired summary holds no means; the
    summary tables of `stability run` and of the report show the arm's own mean (and "-" for the baseline)."""
    record = records[0]
    summary = record["paired"]["gated"]["gate_score_mean"]
    assert summary["n"] == 0 and summary["treatment"] is None     # what the record holds: nothing paired
    expected = sum(a["final"]["gate_score_mean"] for a in record["arms"] if a["arm"] == "gated") / 3
    assert expected > 0
    (row,) = [line.split() for line in table.paired_table(record).splitlines() if " gate_score_mean " in line]
    assert row[:4] == ["gated", "gate_score_mean", "-", table.fmt(expected)] and row[-1] == "0"
    (html_row,) = [r for r in report.summary_rows(record) if r[1] == "gate_score_mean"]
    assert html_row[4:6] == ["-", table.fmt(expected)]
    heldout = next(line.split() for line in table.paired_table(record).splitlines() if " heldout_loss " in line)
    assert heldout[2] == table.fmt(record["paired"]["gated"]["heldout_loss"]["reference"])   # paired: unchanged
