"""Detection power of the merge gate: the CPU workflow job, run on every entry of the regression zoo.

    python -m validation.regression_zoo --preset smoke                 # every entry: train, keep, judge
    python -m validation.regression_zoo --preset ci --entries init_std_x3,two_threads
    python -m validation.regression_zoo --preset smoke --rejudge       # judge the kept records again

For each entry of ``validation/zoo.py`` (plus ``unchanged``, the code as it is): a fresh copy of the
repository, the entry's patch, then the steps of the ``stress-cpu`` job of
``.github/workflows/stability.yml`` exactly as written (``--preset``/``BASELINE`` switched to the chosen
preset), run by ``validation/workflow.py``. What the job measured is kept in
``reports/zoo/<scale>/<entry>.json.xz``: its regression records (without their per-step series and probe
snapshots, which the check never reads), which stress tests and which kernel step failed, its time, and what
ran: the commit (``code_of``), the git tree of the files as the job ran them (``tree_of``, the patch included)
and the machine (``stability.record.machine.describe``). Jobs kept before these were kept read as unrecorded.

Judging (also ``--rejudge``, which trains nothing) applies two rules to the kept records against the
committed baseline (``reports/baselines/<scale>-cpu.json``): the check as it is (``stability check``:
replicate noise, Holm at alpha) and the earlier seed-spread rule (``validation/seed_spread_rule.py``,
on the baseline's unperturbed runs). A harmful entry is *caught* when the job fails (a stress test, the
kernel step or the check); a harmless one is *flagged* when it fails. The table, first entries and
held-out entries apart, goes to ``reports/zoo-<scale>.md``. Nothing is asserted here; tests/test_zoo.py
checks a few entries of each kind.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from xml.etree import ElementTree

from stability.check import check
from stability.check.baseline_schema import load_baseline
from stability.check.calibration import margin
from stability.check.coverage import reported
from stability.record import figures as fig
from stability.record import git_info, upgraded
from stability.record.invariants import read_invariants
from stability.record.machine import describe, record_machine
from stability.record.rundir import load_records
from stability.record.upgrade import upgraded_invariant
from validation import seed_spread_rule
from validation.options import add_preset_option
from validation.workflow import WORKFLOW, apply_patch, fresh_copy, prepare_venv, run_job
from validation.zoo import (
    FAILURES,
    HELD_OUT,
    HELD_OUT_APPLIED,
    HELD_OUT_EARLY,
    HELD_OUT_MISSION,
    HELD_OUT_NOISE,
    HELD_OUT_PRIMARY,
    HELD_OUT_RULES,
    ZOO,
    Entry,
)

ROOT = Path(__file__).resolve().parents[1]
UNCHANGED = Entry("unchanged", False, "the code as it is", ())
GROUPS = (("the code as it is", [UNCHANGED]),
          ("first entries", list(ZOO)),
          ("entries held out from the replicate rule", list(HELD_OUT)),
          ("entries held out from the primary-family rule", list(HELD_OUT_PRIMARY)),
          ("entries held out from the early-horizon rows", list(HELD_OUT_EARLY)),
          ("entries held out from the quantization and spike rows", list(HELD_OUT_MISSION)),
          ("entries held out from the per-step replicates", list(HELD_OUT_NOISE)),
          ("entries held out from the applied-stress proofs", list(HELD_OUT_APPLIED)),
          ("entries written with the Linear rules stated apart", list(HELD_OUT_RULES)),
          ("failures the verdict must not pass", list(FAILURES)))
KEPT = ROOT / "reports" / "zoo"
LABELS = {e.name: (e.harmful, e.what) for _, entries in GROUPS for e in entries}   # a kept job is judged by these
DROPPED = ("series", "probes", "precision_stats", "events")   # per-step and per-snapshot detail: never judged


def preset_workflow(preset: str, work: Path, workflow: Path = WORKFLOW) -> Path:
    """The workflow file (this repository's, or another checkout's) with the CPU job switched to ``preset`` (smoke:
    unchanged)."""
    text = workflow.read_text()
    if preset != "smoke":
        for option in ("--preset", "--scale"):   # --scale: the suites' option in a checkout before its rename
            text = text.replace(f"{option} smoke", f"{option} {preset}")
        text = text.replace("smoke-cpu.json", f"{preset}-cpu.json")
    path = work / f"stability-{preset}.yml"
    path.write_text(text)
    return path


def stress_failures(copy: Path) -> list[str]:
    """The stress tests that failed (from the step's JUnit file)."""
    junit = copy / "reports" / "junit-stress-smoke.xml"   # the name the workflow gives it, at any scale
    if not junit.is_file():
        return ["(no JUnit file: the stress step did not finish)"]
    return [f"{case.get('classname')}::{case.get('name')}" for case in ElementTree.parse(junit).iter("testcase")
            if case.find("failure") is not None or case.find("error") is not None]


def slim(record: dict) -> dict:
    """A record without what the check never reads (per-step series, probe snapshots, run summaries' curves)."""
    out = {k: v for k, v in record.items() if not k.startswith("_")}
    out["arms"] = [{k: v for k, v in arm.items() if k not in DROPPED} for arm in record["arms"]]
    if out.get("results"):   # a case's run summaries without their loss curves
        out["results"] = {case: {**result, "runs": [{k: v for k, v in r.items() if k != "loss"} for r in result["runs"]]}
                          if isinstance(result, dict) and "runs" in result else result
                          for case, result in out["results"].items()}
    return out


def kept_path(preset: str, name: str) -> Path:
    return KEPT / preset / f"{name}.json.xz"


def keep(preset: str, document: dict) -> Path:
    path = kept_path(preset, document["entry"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(lzma.compress(json.dumps(document, allow_nan=False).encode(), preset=9))
    return path


def read_kept(preset: str, name: str) -> dict | None:
    """The kept job ``name``, its records and invariant lines read as this schema holds them
    (``stability.record.upgrade``: a job kept before a rename); None when it was never kept."""
    path = kept_path(preset, name)
    if not path.is_file():
        return None
    document = json.loads(lzma.decompress(path.read_bytes()))
    document["records"] = [upgraded(record) for record in document.get("records") or []]
    if document.get("invariants") is not None:
        document["invariants"] = [upgraded_invariant(line) for line in document["invariants"]]
    return document


def run_entry(entry: Entry, preset: str, work: Path, env: dict | None = None, name: str | None = None,
              source: Path = ROOT) -> dict:
    """Run the CPU job on a patched copy of ``source`` (a checkout: this repository, or another worktree that holds
    the commit to measure); the kept document (records, the suites' invariants, failures, time)."""
    copy = work / (name or entry.name)
    if copy.exists():
        shutil.rmtree(copy)
    fresh_copy(copy, source)
    apply_patch(copy, entry.edits)
    tree = tree_of(Path(source), copy)   # the files as the job runs them, the entry's patch included
    started = time.perf_counter()
    workflow = preset_workflow(preset, work, Path(source) / ".github" / "workflows" / "stability.yml")
    job = run_job(workflow, "stress-cpu", copy, install=prepare_venv, env=env,
                  timeout=6 * 3600)
    seconds = time.perf_counter() - started
    (copy / "job.log").write_text(job.log())
    stress, kernel = job.steps.get("stress"), job.steps.get("kernel")
    records = [slim(r) for r in load_records([copy / "reports" / "runs"])
               if r.get("purpose", "regression") == "regression"]
    invariants = [line for folder in sorted({Path(r["_path"]).parent for r in load_records([copy / "reports" / "runs"])
                                             if r.get("_path")}) for line in read_invariants(folder)]
    return {"entry": name or entry.name, "harmful": entry.harmful, "what": entry.what, "scale": preset,
            "code": code_of(Path(source)), "tree": tree, "machine": describe("cpu"),
            "stress_exit": stress.code if stress else None, "stress_failures": stress_failures(copy),
            "kernel_exit": kernel.code if kernel and kernel.ran else None,
            "stress_seconds": stress.seconds if stress else None, "seconds": seconds, "records": records,
            "invariants": invariants}


def code_of(source: Path) -> str | None:
    """The commit a checkout's code is (with "+changes" when tracked files differ from it), the entry's patch
    aside; None when ``source`` is not a git checkout. Kept with the job: its records do not name their code."""
    git = git_info(source)
    return git["commit"] and git["commit"] + ("+changes" if git["dirty"] else "")


def tree_of(source: Path, files: Path | None = None) -> str | None:
    """The git tree id of the checkout ``source``'s working files as they are (tracked, and untracked but not
    ignored: what ``fresh_copy`` copies; uncommitted changes included), or of ``files`` (a copy of it, e.g.
    with a zoo entry's patch applied) read as ``source``'s files; None when ``source`` is not a git checkout.
    Kept with the job beside ``code_of``: two jobs of one tree ran the same files. Written through a temporary
    index (a copy of the checkout's): the checkout's index, refs and work tree stay as they are (only blob and
    tree objects join its object store). The commit's own tree (``git rev-parse HEAD^{tree}``) when clean."""
    def git(*args: str, env: dict | None = None, where: Path = Path(source)) -> str:
        return subprocess.run(["git", "-C", str(where), *args], env=env, capture_output=True, text=True,
                              timeout=300, check=True).stdout.strip()
    try:
        repository = git("rev-parse", "--absolute-git-dir")
        index = Path(source) / git("rev-parse", "--git-path", "index")
        work = Path(files).resolve() if files is not None else Path(git("rev-parse", "--show-toplevel"))
        with tempfile.TemporaryDirectory(prefix="stability-tree-") as folder:
            env = {**os.environ, "GIT_DIR": repository, "GIT_WORK_TREE": str(work),
                   "GIT_INDEX_FILE": str(Path(folder) / "index")}
            if index.is_file():
                shutil.copyfile(index, env["GIT_INDEX_FILE"])
            git("add", "--all", env=env, where=work)
            return git("write-tree", env=env, where=work) or None
    except (OSError, subprocess.SubprocessError):
        return None


def job_machine(document: dict) -> dict | None:
    """The machine a kept job ran on: the one it was kept with, else the one its records name
    (``env.machine``); None for a job kept before jobs and records named their machine."""
    if isinstance(document.get("machine"), dict):
        return document["machine"]
    return next(filter(None, (record_machine(r) for r in document.get("records") or [])), None)


FLOOR_SCALES = (0.8, 1.25)


def scaled_floors(baseline: dict, scale: float) -> dict:
    """Tolerances that multiply every judged figure's floor and relative floor (stability.record.figures) by
    ``scale``, for each figure the baseline holds: how much the verdicts lean on the floors."""
    names = {name for case in baseline["cases"].values() for arm in case["arms"].values() for name in arm["figures"]}
    out = {}
    for name in names:
        entry = fig.figure(name)
        if entry is not None and entry.better is not None and not entry.outcome:
            out[name] = {"floor": entry.floor * scale, "rel_floor": entry.rel_floor * scale}
    return out


def judged(document: dict, baseline: dict) -> dict:
    """Both rules on one kept job: failed or not, and what each named (the check: its failed outcomes, its
    regressed primary rows, its errors; the margin of its closest primary row; its verdict with every floor
    scaled by each of FLOOR_SCALES)."""
    invariants = document.get("invariants")   # None: kept before jobs kept their suites' invariants
    result = check(document["records"], baseline, invariants=invariants)
    other = bool(document["stress_failures"]) or document["kernel_exit"] not in (0, None)
    by_floor = {scale: other or check(document["records"], baseline, scaled_floors(baseline, scale),
                                      invariants=invariants).exit_code != 0 for scale in FLOOR_SCALES}
    new = [f"{o.case_key.split('/', 1)[1]} {o.arm} seed {o.seed} {o.figure}" for o in result.outcomes]
    new += [f"{r.case_key.split('/', 1)[1]} {r.arm} {r.figure}{' (changed)' if r.verdict == 'changed' else ''}"
            for r in result.regressed]
    strongest = min(result.regressed, key=lambda r: r.p_judged, default=None)
    old = [name.split("/", 1)[1] for name in seed_spread_rule.judge(document["records"], baseline)]
    label = LABELS.get(document["entry"], (document["harmful"], document["what"]))   # the zoo's label, as it is now
    return {"entry": document["entry"], "harmful": label[0], "what": label[1],
            "stress_failures": document["stress_failures"], "kernel_exit": document["kernel_exit"],
            "check_exit": result.exit_code, "errors": result.errors, "regressed": new,
            "strongest": (f"{'changed' if strongest.verdict == 'changed' else f'z {strongest.z:.3g}'}, "
                          f"p {strongest.p_judged:.2g}" if strongest else ""),
            "margin": f"{margin(result):.3g}", "failed": other or result.exit_code != 0,
            **{f"failed_floors_x{scale:g}": failed for scale, failed in by_floor.items()},
            "old_regressed": old, "old_failed": other or bool(old), "seconds": document["seconds"],
            "code": document.get("code"), "tree": document.get("tree"), "machine": job_machine(document)}


def predates(document: dict, baseline: dict) -> list[str]:
    """The figures the baseline covers that the kept job's records do not report (an older job, made before
    those figures existed: not judged, since the check would count every such figure as lost)."""
    covered = (baseline.get("covers") or {}).get("figures") or {}
    found = reported(document["records"])
    return sorted({name for key, names in found.items() for name in covered.get(key, []) if name not in names})


def refused(row: dict) -> bool:
    """A harmless entry the check refused to judge (exit 2: a job of other seeds than the baseline's), with no
    other step failing: not a false alarm, a job that cannot be compared."""
    return not row["harmful"] and row["check_exit"] == 2 and not row["stress_failures"] \
        and row["kernel_exit"] in (0, None)


def verdict(row: dict, failed: bool) -> str:
    if row["harmful"]:
        return "caught" if failed else "MISSED"
    if failed and refused(row):
        return "refused (exit 2)"
    return "FLAGGED" if failed else "passed"


def _counts(rows: list[dict], key: str) -> str:
    if all(r["entry"] == "unchanged" for r in rows):
        return "failed" if any(r[key] for r in rows) else "passed"
    harmful = [r for r in rows if r["harmful"]]
    harmless = [r for r in rows if not r["harmful"] and r["entry"] != "unchanged"]
    judged = [r for r in harmless if not (key != "old_failed" and r[key] and refused(r))]
    text = (f"{sum(r[key] for r in harmful)} of {len(harmful)} harmful caught, "
            f"{sum(r[key] for r in judged)} of {len(judged)} harmless flagged")
    return text + (f" ({len(harmless) - len(judged)} refused: other seeds)" if len(judged) < len(harmless) else "")


def table(groups: list[tuple[str, list[dict]]], preset: str, baseline: dict) -> str:
    lines = [f"## Regression zoo at `{preset}`", "",
             (f"Baseline `reports/baselines/{preset}-cpu.json` (commit `{str(baseline.get('commit'))[:12]}`, "
              f"replicates {baseline.get('replicates')}). Check: outcomes seed by seed (failed where every replicate "
              f"stayed clean), each primary row judged twice (regressed beyond its floor; changed: every seed "
              f"beyond its replicate noise the same way, either way, exit 3, except rows judged by their floor only) in one Holm family at "
              f"alpha = 0.01, settings compared, inputs that fail closed; a changed job counts as flagged. Earlier rule: seed-spread bands, k = 3, every "
              f"row on its own (validation/seed_spread_rule.py). A job fails on a stress test, the kernel step or the "
              f"check. Margin: m x the smallest primary p / alpha (under 1: the check failed the job)."), "",
             ("Only entries whose kept records hold the figures this check judges are listed (records of an "
              "earlier commit are refused, not guessed; earlier tables are in the history of this file)."), "",
             "| entries | check | check, every floor x0.8 | check, every floor x1.25 | earlier rule |",
             "|---|---|---|---|---|"]
    for title, rows in groups:
        lines.append(f"| {title} | {_counts(rows, 'failed')} | {_counts(rows, 'failed_floors_x0.8')} | "
                     f"{_counts(rows, 'failed_floors_x1.25')} | {_counts(rows, 'old_failed')} |")
    for title, rows in groups:
        lines += ["", f"### {title}", "",
                  ("| entry | kind | change | check | what the check named | strongest | margin | floors x0.8 / x1.25 | "
                   "earlier rule | stress tests / kernel step failed | minutes |"),
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            named = r["regressed"]
            kind = "harmful" if r["harmful"] else ("reference" if r["entry"] == "unchanged" else "harmless")
            other = [n.rsplit("::", 1)[-1] for n in r["stress_failures"]]
            if r["kernel_exit"] not in (0, None):
                other.append(f"kernel exit {r['kernel_exit']}")
            old = verdict(r, r["old_failed"]) + (f" ({len(r['old_regressed'])} rows)" if r["old_regressed"] else "")
            named = ", ".join(named[:5]) + (f" (+{len(named) - 5} more)" if len(named) > 5 else "")
            lines.append(f"| `{r['entry']}` | {kind} | {r['what']} | {verdict(r, r['failed'])} | "
                         f"{named or '; '.join(e[:120] for e in r['errors']) or '-'} | {r['strongest'] or '-'} | "
                         f"{r['margin']} | {verdict(r, r['failed_floors_x0.8'])} / {verdict(r, r['failed_floors_x1.25'])} | "
                         f"{old} | {', '.join(other) or '-'} | {r['seconds'] / 60:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_preset_option(parser)
    parser.add_argument("--entries", help="comma-separated entry names (default: unchanged and every entry)")
    parser.add_argument("--work", help="where the patched copies are made (default: a new temporary folder)")
    parser.add_argument("--rejudge", action="store_true", help="judge the kept records again, train nothing")
    parser.add_argument("--train-only", action="store_true", help="train and keep the jobs, judge nothing")
    parser.add_argument("--source", default=str(ROOT), help="the checkout the copies are made from (default: this one)")
    parser.add_argument("--out", help="Markdown table (default reports/zoo-<scale>.md)")
    args = parser.parse_args()
    everything = [UNCHANGED, *ZOO, *HELD_OUT, *HELD_OUT_PRIMARY, *HELD_OUT_EARLY, *HELD_OUT_MISSION, *HELD_OUT_NOISE,
                  *HELD_OUT_APPLIED, *HELD_OUT_RULES, *FAILURES]
    wanted = args.entries.split(",") if args.entries else [e.name for e in everything]
    unknown = sorted(set(wanted) - {e.name for e in everything})
    if unknown:
        parser.error(f"unknown zoo entries {unknown}")
    work = Path(args.work or tempfile.mkdtemp(prefix="stability-zoo-")) / args.preset
    work.mkdir(parents=True, exist_ok=True)
    if not args.rejudge:
        for entry in (e for e in everything if e.name in wanted):
            print(f"{entry.name}: running the CPU job at {args.preset} ...", flush=True)
            document = run_entry(entry, args.preset, work, source=Path(args.source))
            print(f"  kept {keep(args.preset, document)} ({document['seconds'] / 60:.1f} min)", flush=True)
            shutil.rmtree(work / entry.name, ignore_errors=True)
    if args.train_only:
        return 0
    baseline = load_baseline(ROOT / "reports" / "baselines" / f"{args.preset}-cpu.json")
    groups = []
    for title, entries in GROUPS:
        rows = []
        for entry in (e for e in entries if e.name in wanted):
            document = read_kept(args.preset, entry.name)
            if document is not None and predates(document, baseline):
                print(f"{entry.name}: left out, its kept job predates {predates(document, baseline)[:3]} ...")
            elif document is not None:
                rows.append(judged(document, baseline))
                print(f"{entry.name}: {verdict(rows[-1], rows[-1]['failed'])} (earlier rule: "
                      f"{verdict(rows[-1], rows[-1]['old_failed'])}) {rows[-1]['regressed'][:3]}", flush=True)
        if rows:
            groups.append((title, rows))
    text = table(groups, args.preset, baseline)
    out = Path(args.out) if args.out else ROOT / "reports" / f"zoo-{args.preset}.md"
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
