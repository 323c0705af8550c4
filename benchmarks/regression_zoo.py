"""Detection power of the merge gate: the CPU workflow job, run on every entry of the regression zoo.

    python benchmarks/regression_zoo.py --scale smoke                 # every entry, about 4 min each
    python benchmarks/regression_zoo.py --scale ci --entries init_std_x3,two_threads
    python benchmarks/regression_zoo.py --scale smoke --rejudge       # re-check the kept records only

For each entry of ``tests/_zoo.py`` (plus ``unchanged``, the code as it is): a fresh copy of the
repository, the entry's patch, then the steps of the ``stress-cpu`` job of
``.github/workflows/stability.yml`` exactly as written (``--scale``/``BASELINE`` switched to the
chosen preset), run by ``tests/_workflow.py``. A harmful entry is *caught* when the job fails; a
harmless one is *flagged* when it fails. The table says which step failed (stress tests other than
the per-case regression check, the kernel step, ``stability check``) and which figures the check
named, and is written to ``reports/zoo-<scale>.md``. The copies (with their run directories) are kept
under ``--work`` so ``--rejudge`` can apply the current check to the same records without training
again: the stress suites' own regression tests apply the same rule per case, so a rejudged entry's
stress step counts as failed only for its other tests (from the step's JUnit file); its kernel step is
the one it ran (none, for a copy made before the step existed). Nothing is asserted here;
tests/test_zoo.py checks a few entries of each kind.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _workflow import WORKFLOW, apply_patch, fresh_copy, prepare_venv, run_job
from _zoo import ZOO, Entry

UNCHANGED = Entry("unchanged", False, "the code as it is", ())


def scaled_workflow(scale: str, work: Path) -> Path:
    """The workflow file with the CPU job switched to ``scale`` (smoke: unchanged)."""
    text = WORKFLOW.read_text()
    if scale != "smoke":
        text = text.replace("--scale smoke", f"--scale {scale}").replace("smoke-cpu.json", f"{scale}-cpu.json")
    path = work / f"stability-{scale}.yml"
    path.write_text(text)
    return path


def regressed_figures(copy: Path) -> list[str]:
    check = copy / "reports" / "check.json"
    if not check.is_file():
        return []
    rows = json.loads(check.read_text())["rows"]
    return [f"{r['case'].split('/', 1)[1]} {r['arm']} {r['figure']}" for r in rows if r["verdict"] == "regressed"]


def other_stress_failures(copy: Path) -> list[str]:
    """Stress tests that failed, other than the per-case regression check (``TestRegression``)."""
    junit = copy / "reports" / "junit-stress-smoke.xml"   # the name the workflow gives it, at any scale
    if not junit.is_file():
        return ["(no JUnit file: the stress step did not finish)"]
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in ElementTree.parse(junit).iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    return [name for name in failed if ".TestRegression::" not in name]


def failed(row: dict) -> bool:
    return bool(row["stress_other"]) or row["kernel_exit"] not in (0, None) or row["check_exit"] != 0


def run_entry(entry: Entry, scale: str, work: Path) -> dict:
    copy = work / entry.name
    if copy.exists():
        shutil.rmtree(copy)
    fresh_copy(copy)
    apply_patch(copy, entry.edits)
    started = time.perf_counter()
    job = run_job(scaled_workflow(scale, work), "stress-cpu", copy, install=prepare_venv, timeout=6 * 3600)
    seconds = time.perf_counter() - started
    (copy / "job.log").write_text(job.log())
    stress, kernel, check = job.steps.get("stress"), job.steps.get("kernel"), job.steps.get("check")
    return {"entry": entry.name, "harmful": entry.harmful, "what": entry.what, "job_failed": job.failed,
            "stress_exit": stress.code if stress else None, "stress_other": other_stress_failures(copy),
            "kernel_exit": kernel.code if kernel and kernel.ran else None,
            "check_exit": int(check.outputs.get("code", -1)) if check and check.outputs else None,
            "regressed": regressed_figures(copy), "seconds": seconds}


def rejudge(entry: Entry, scale: str, work: Path) -> dict:
    """The current ``stability check`` on the records an earlier run of this entry left."""
    copy = work / entry.name
    baseline = ROOT / "reports" / "baselines" / f"{scale}-cpu.json"
    result = subprocess.run([sys.executable, "-m", "stability.cli", "check", "--baseline", str(baseline),
                             str(copy / "reports" / "runs"), "--json", str(copy / "reports" / "check.json")],
                            capture_output=True, text=True, check=False)
    previous = json.loads((work / f"zoo-{scale}.json").read_text())
    before = next(r for r in previous if r["entry"] == entry.name)
    row = {**before, "check_exit": result.returncode, "regressed": regressed_figures(copy),
           "stress_other": other_stress_failures(copy), "kernel_exit": before.get("kernel_exit"),
           "rejudged": True}
    return {**row, "job_failed": failed(row)}


def verdict(row: dict) -> str:
    if row["harmful"]:
        return "caught" if row["job_failed"] else "MISSED"
    return "FLAGGED" if row["job_failed"] else "passed"


def table(rows: list[dict], scale: str) -> str:
    harmful = [r for r in rows if r["harmful"]]
    harmless = [r for r in rows if not r["harmful"] and r["entry"] != "unchanged"]
    caught = sum(r["job_failed"] for r in harmful)
    flagged = sum(r["job_failed"] for r in harmless)
    lines = [f"## Regression zoo at `{scale}`", "",
             (f"Harmful changes caught: **{caught} of {len(harmful)}**; harmless changes flagged: "
              f"**{flagged} of {len(harmless)}**."), "",
             ("| entry | kind | change | verdict | stress tests failed (besides the check) | kernel step exit | "
              "check exit | figures the check named |"),
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        named = r["regressed"]
        shown = ", ".join(named[:6]) + (f" (+{len(named) - 6} more)" if len(named) > 6 else "")
        kind = "harmful" if r["harmful"] else ("reference" if r["entry"] == "unchanged" else "harmless")
        other = r.get("stress_other") or []
        stress = ", ".join(name.rsplit(".", 1)[-1] for name in other) if other else "none"
        kernel = "not run" if r.get("kernel_exit") is None else r["kernel_exit"]
        rejudged = " (rejudged)" if r.get("rejudged") else ""
        lines.append(f"| `{r['entry']}` | {kind} | {r['what']} | {verdict(r)}{rejudged} | {stress} | {kernel} | "
                     f"{r['check_exit']} | {shown or '-'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="smoke", choices=("smoke", "ci"))
    parser.add_argument("--entries", help="comma-separated entry names (default: unchanged and every entry)")
    parser.add_argument("--work", default="/tmp/stability-zoo", help="where the copies and their records are kept")
    parser.add_argument("--rejudge", action="store_true", help="re-check the kept records, train nothing")
    parser.add_argument("--out", help="Markdown table (default reports/zoo-<scale>.md)")
    args = parser.parse_args()
    entries = [UNCHANGED, *ZOO]
    if args.entries:
        wanted = args.entries.split(",")
        entries = [e for e in entries if e.name in wanted]
    work = Path(args.work) / args.scale
    work.mkdir(parents=True, exist_ok=True)
    state = work / f"zoo-{args.scale}.json"
    rows = {r["entry"]: r for r in (json.loads(state.read_text()) if state.is_file() else [])}
    for entry in entries:
        print(f"{entry.name}: {'rejudging' if args.rejudge else 'running the CPU job'} ...", flush=True)
        rows[entry.name] = rejudge(entry, args.scale, work) if args.rejudge else run_entry(entry, args.scale, work)
        print(f"  {verdict(rows[entry.name])}: {rows[entry.name]['regressed'][:4]}", flush=True)
        state.write_text(json.dumps(list(rows.values()), indent=1))
    order = [e.name for e in (UNCHANGED, *ZOO)]
    text = table(sorted(rows.values(), key=lambda r: order.index(r["entry"])), args.scale)
    out = Path(args.out) if args.out else ROOT / "reports" / f"zoo-{args.scale}.md"
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
