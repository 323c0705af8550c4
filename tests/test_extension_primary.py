"""What an extension adds can gate a job: a figure it declares primary (``register_primary``) joins the primary
family and fails a job when it regresses; a baseline made before the declaration is stale until calibrated
again; a stress case it registers is a name the settings' ``cases`` and ``--stability-cases`` accept, and the
suites train it.

docs/extending.md runs the same with real training runs (a probe figure made primary, a job failed through it).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap

import pytest
from _stability_records import edited, pair_record, with_replicates
from test_plugin import pytest_in, repository

from stability.check import baseline as baselines
from stability.check import baseline_schema
from stability.check import regression as reg
from stability.check.family import in_primary_family
from stability.record import figures as fig
from stability.record import paired_summary

TOY = fig.Figure("toy_spread_mean", "lower", "logit", "a team's own figure: spread of the attention logits",
                 floor=0.05, rel_floor=0.05)


@pytest.fixture
def table(monkeypatch):
    """The figure table and the declared rows as this test leaves them: the toy figure added. Returns the row
    that declares it primary (each arm's, not the paired difference)."""
    monkeypatch.setattr(fig, "FIGURES", dict(fig.FIGURES))
    monkeypatch.setattr(fig, "ADDED_PRIMARY", list(fig.ADDED_PRIMARY))
    fig.add(TOY)
    return fig.Primary("standard", TOY.name, arms="arms", why="the attention logits spread further")


def with_toy(record: dict) -> dict:
    """``record`` with the toy figure in every arm's final figures (per arm and seed)."""
    out = copy.deepcopy(record)
    for arm in out["arms"]:
        arm["final"][TOY.name] = 2.0 + 0.01 * arm["seed"] + (0.5 if arm["arm"] == "reference" else 0.0)
    out["paired"] = paired_summary(out["arms"])
    return out


@pytest.fixture
def record(table):
    return with_toy(pair_record(seeds=(0, 1, 2)))


@pytest.fixture
def row(table):
    return table


def test_a_declared_row_joins_the_primary_family_after_the_built_in_ones(table):
    row = table
    assert in_primary_family("standard", "gated", TOY.name) is None
    declared = fig.primary_rows()
    fig.register_primary(row)
    assert fig.primary_rows() == (*declared, row)
    assert in_primary_family("standard", "gated", TOY.name) is row
    assert in_primary_family("standard", "gated-reference", TOY.name) is None   # arms="arms": no paired row
    assert fig.primary_family()[-1] == {"case": "standard", "figure": TOY.name, "arms": "arms", "floor_only": False}
    with pytest.raises(ValueError, match=r"primary row standard/toy_spread_mean\[arms\] is declared already"):
        fig.register_primary(row)
    with pytest.raises(ValueError, match="expected a judged figure of the table"):
        fig.register_primary(fig.Primary("standard", "no_such_figure"))


def test_a_figure_that_declares_its_rows_is_primary_where_it_says_and_nowhere_else(monkeypatch):
    """One declaration: a figure added with ``primary=`` joins the family in the case and arms it names, its
    rows after the built-in figures'; a row on an unjudged figure, an outcome or another figure is refused."""
    monkeypatch.setattr(fig, "FIGURES", dict(fig.FIGURES))
    monkeypatch.setattr(fig, "ADDED_PRIMARY", list(fig.ADDED_PRIMARY))
    built_in = fig.primary_rows()
    declared = fig.add(fig.Figure("toy_max_*", "lower", "logit", "a family of a team's own", primary=(
        fig.Primary("lr_sweep", arms="paired", why="the spread grew"),
        fig.Primary("standard", "toy_max_q", presets=("ci",), elsewhere="too noisy at smoke"))))
    assert fig.primary_rows() == (*built_in, fig.Primary("lr_sweep", "toy_max_*", arms="paired", why="the spread grew"),
                                  fig.Primary("standard", "toy_max_q", presets=("ci",), elsewhere="too noisy at smoke"))
    assert declared.rows()[0].figure == "toy_max_*"
    assert in_primary_family("lr_sweep", "gated-reference", "toy_max_k") is not None
    assert in_primary_family("lr_sweep", "gated", "toy_max_k") is None           # paired only
    assert in_primary_family("standard", "gated", "toy_max_q", "ci") is not None
    assert in_primary_family("standard", "gated", "toy_max_q", "smoke") is None   # advisory there
    assert in_primary_family("standard", "gated", "toy_max_k", "ci") is None      # another member
    for bad, match in (({"better": None}, "a primary row needs a judged figure"),
                       ({"outcome": True, "kind": "run"}, "a primary row needs a judged figure that is not an outcome"),
                       ({"primary": (fig.Primary("standard", "heldout_loss"),)}, "names figure 'heldout_loss'")):
        fields = {"better": "lower", "primary": (fig.Primary("standard"),), **bad}
        with pytest.raises(ValueError, match=match):
            fig.Figure("toy_bad", fields.pop("better"), "", "", **fields)


def test_a_family_recorded_in_another_order_is_the_same_family():
    """Holm's procedure orders rows by p, never by declaration: a baseline calibrated when the rows were listed
    in another order is not stale; one row more or less, or another arm, is another family."""
    now = fig.primary_family()
    assert fig.same_family(list(reversed(now)), now)
    assert not fig.same_family(now[:-1], now)
    assert not fig.same_family([{**now[0], "arms": "paired"}, *now[1:]], now)
    assert not fig.same_family(None, now)


def test_an_extension_s_primary_figure_fails_a_job_when_it_regresses_and_passes_unchanged(record, row):
    fig.register_primary(row)
    baseline = baselines.make_baseline(with_replicates(record), commit="abc123")
    assert reg.check([record], baseline).exit_code == 0
    worse = edited(record, "gated", TOY.name, factor=1.5)
    result = reg.check([worse], baseline)
    assert result.exit_code == 1, result.table()
    row = next(r for r in result.rows if r.arm == "gated" and r.figure == TOY.name)
    assert row.verdict == "regressed" and row.tier == "primary"
    assert all(r.verdict != "regressed" for r in result.rows if r.figure != TOY.name)


def test_the_same_move_of_an_undeclared_figure_is_advisory(record):
    baseline = baselines.make_baseline(with_replicates(record), commit="abc123")
    result = reg.check([edited(record, "gated", TOY.name, factor=1.5)], baseline)
    assert result.exit_code == 0
    row = next(r for r in result.rows if r.arm == "gated" and r.figure == TOY.name)
    assert row.tier == "advisory"


def test_a_baseline_made_before_the_row_was_declared_is_stale_until_calibrated_again(tmp_path, record, row):
    path = tmp_path / "baseline.json"
    baselines.write_baseline(baselines.make_baseline(with_replicates(record), commit="abc123"), path)
    fig.register_primary(row)
    result = reg.check([record], baseline_schema.load_baseline(path), baseline_path=str(path))
    assert result.exit_code == 2 and "the primary family changed" in result.errors[0]
    assert "added standard/toy_spread_mean[arms]" in result.errors[0]
    assert result.errors[0].endswith(f"stability baseline calibrate --write {path}")
    from stability.cli import main

    assert main(["baseline", "calibrate", "--write", str(path)]) == 0
    assert reg.check([record], baseline_schema.load_baseline(path)).exit_code == 0
    assert reg.check([edited(record, "gated", TOY.name, factor=1.5)], baseline_schema.load_baseline(path)).exit_code == 1


EXTENSION = '''
from stability.record.figures import Figure, Primary, add, register_primary

add(Figure("toy_spread_mean", "lower", "logit", "spread of the attention logits", floor=0.05, rel_floor=0.05))
if PRIMARY:
    register_primary(Primary("standard", "toy_spread_mean", arms="arms"))
'''


def write_jobs(folder, record: dict, figure: str) -> None:
    """Under ``folder``: base/ (the record and its rounding replicates), same/ (the record) and worse/ (the
    gated arm's ``figure`` x1.5), one JSON file per record."""
    for name, entries in (("base", with_replicates(record)), ("same", [record]),
                          ("worse", [edited(record, "gated", figure, factor=1.5)])):
        (folder / name).mkdir()
        for number, entry in enumerate(entries):
            (folder / name / f"record-{number}.json").write_text(json.dumps(entry))


def command_in(folder):
    """``stability(*args)``: the command run in ``folder``, with only ``folder`` on PYTHONPATH."""
    def stability(*args):
        return subprocess.run([sys.executable, "-m", "stability.cli", *args], cwd=folder, capture_output=True,
                              text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(folder)}, timeout=600,
                              check=False)
    return stability


def test_the_command_loads_the_extension_before_it_judges(tmp_path, record):
    """`stability check` in a repository whose [tool.stability] names the extension: the row declared there
    fails the job (exit 1, REGRESSED); the baseline made before it was declared is stale (exit 2)."""
    for name, primary in (("toy_ext", True), ("toy_ext_plain", False)):
        (tmp_path / f"{name}.py").write_text(EXTENSION.replace("if PRIMARY:", f"if {primary}:"))
    settings = tmp_path / "pyproject.toml"
    write_jobs(tmp_path, record, TOY.name)
    stability = command_in(tmp_path)
    settings.write_text('[tool.stability]\nplugins = ["toy_ext_plain"]\n')
    made = stability("baseline", "update", "base", "--out", "before.json")
    assert made.returncode == 0, made.stderr
    settings.write_text('[tool.stability]\nplugins = ["toy_ext"]\n')
    stale = stability("check", "--baseline", "before.json", "same", "--expect-commit", "any")
    assert stale.returncode == 2 and "stability baseline calibrate --write before.json" in stale.stderr, stale.stderr
    made = stability("baseline", "update", "base", "--out", "after.json")
    assert made.returncode == 0, made.stderr
    same = stability("check", "--baseline", "after.json", "same", "--expect-commit", "any")
    assert same.returncode == 0, same.stdout + same.stderr
    worse = stability("check", "--baseline", "after.json", "worse", "--expect-commit", "any")
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert any("toy_spread_mean" in line and "REGRESSED" in line for line in worse.stdout.splitlines()), worse.stdout


CASE = '''
from stability.cases.stress import CaseRun, StressCase, register
from stability.config.schedules import Standard


def train_toy(run: CaseRun):
    run.train_each_arm(Standard(), lambda _run, arm_record: ({}, {}))


register(StressCase("toy_case", train_toy, describe=lambda config: "the plain pair, as a case of its own"))
'''


def test_the_settings_accept_a_case_an_extension_registered_and_the_suites_train_it(tmp_path):
    root = repository(tmp_path, {"toy_case_ext.py": CASE, "pyproject.toml": """\
        [tool.stability]
        plugins = ["toy_case_ext"]
        cases = ["toy_case"]
        seeds = [0]

        [tool.stability.set]
        steps = 4
        """})
    env = {"PYTHONPATH": str(root)}
    collected = pytest_in(root, "--co", "-q", "--pyargs", "stability.suites", "-m", "stress", "-p", "no:xdist", env=env)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    cases = [line for line in collected.stdout.splitlines() if line.startswith("test_stress_cases.py::")]
    assert cases == ["test_stress_cases.py::test_the_record_is_written_then_tracked[toy_case]"], collected.stdout

    chosen = pytest_in(root, "-q", "--pyargs", "stability.suites", "-m", "stress", "-p", "no:xdist",
                       "--stability-cases", "toy_case", "-k", "test_stress_cases",
                       env={**env, "STABILITY_PLOTS": "0"})
    assert chosen.returncode == 0, chosen.stdout[-3000:] + chosen.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in (root / "reports" / "runs").rglob("*.json")
               if p.name != "manifest.json" and "stress" in p.read_text()]
    assert [r["case"] for r in records] == ["toy_case"]

    (root / "pyproject.toml").write_text(textwrap.dedent("""\
        [tool.stability]
        cases = ["toy_case"]
        """))
    unknown = pytest_in(root, "--co", "-q", "--pyargs", "stability.suites", "-m", "stress", "-p", "no:xdist", env=env)
    assert unknown.returncode == 4 and "unknown stress case(s) ['toy_case']" in unknown.stderr, unknown.stderr



CASE_WITH_A_FIGURE = '''
from stability.cases.stress import CaseRun, StressCase, register
from stability.config.schedules import Standard
from stability.record.figures import Figure, Primary


def train_toy(run: CaseRun):
    run.train_each_arm(Standard(), lambda _run, arm: ({"toy_case_peak": max(arm["series"]["loss"])}, {}))


register(StressCase("toy_peak_case", train_toy, describe=lambda config: "the plain pair, its peak loss a figure of "
                    "its own", figures=(Figure(
    "toy_case_peak", "lower", "nats/token", "the highest training loss of the run", kind="run", floor=0.05,
    rel_floor=0.05, primary=(Primary(arms="arms", why="the loss peaked higher"),)),)))
'''


def test_an_extension_case_declares_its_figure_and_row_in_one_file_and_the_check_fails_a_job_through_it(tmp_path):
    """One file of a team's own: a case whose figure declares its primary row (the case's name left out). With
    the file loaded by the repository's settings, the check judges the figure in that case's row and fails a
    job whose figure rose (exit 1, REGRESSED, primary); the unchanged job passes."""
    (tmp_path / "toy_peak_ext.py").write_text(CASE_WITH_A_FIGURE)
    (tmp_path / "pyproject.toml").write_text('[tool.stability]\nplugins = ["toy_peak_ext"]\n')
    record = {**pair_record(seeds=(0, 1, 2)), "case": "toy_peak_case"}
    for arm in record["arms"]:
        arm["final"]["toy_case_peak"] = 4.0 + 0.01 * arm["seed"]
    record["paired"] = paired_summary(record["arms"])
    write_jobs(tmp_path, record, "toy_case_peak")
    stability = command_in(tmp_path)
    made = stability("baseline", "update", "base", "--out", "baseline.json")
    assert made.returncode == 0, made.stderr
    same = stability("check", "--baseline", "baseline.json", "same", "--expect-commit", "any")
    assert same.returncode == 0, same.stdout + same.stderr
    worse = stability("check", "--baseline", "baseline.json", "worse", "--expect-commit", "any", "--json", "v.json")
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert any("toy_case_peak" in line and "primary" in line and "REGRESSED" in line
               for line in worse.stdout.splitlines()), worse.stdout
    family = json.loads((tmp_path / "v.json").read_text())["primary_family"]
    assert {"case": "toy_peak_case", "figure": "toy_case_peak", "arms": "arms"}.items() <= family[-1].items()
