"""``stability check`` (the merge check) and ``stability baseline make|update|calibrate``.

``check``, ``baseline update`` and ``baseline calibrate`` read JSON only (no torch); ``baseline make``
runs the stress suites (reference and rounding replicates) in a subprocess, then ``update``. ``baseline
make`` and ``update`` take their defaults (preset, replicates, the baselines directory) from the settings
of the repository in the current directory (``stability.plugin.settings``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from stability.plugin.settings import DEFAULT_BASELINES, find_settings
from stability.record import RecordError, git_info, record_device
from stability.record.rundir import DEFAULT_ROOT, load_records, unique_arms

INSTALLED_SUITES = "stability.suites"
DEFAULT_REPLICATES = 4


def read_inputs(args) -> tuple[list[dict], list[str]]:
    """The records named on the command line (default: the newest run directory), each (case, arm, seed)
    once; and the notes on what was left out."""
    records = load_records(args.records or [DEFAULT_ROOT], all_sessions=getattr(args, "all_sessions", False))
    return unique_arms(records)


def baseline_from_mlflow(branch: str, tracking_uri: str | None, preset: str | None, device: str | None) -> dict:
    """A baseline from the JSON records of the latest parent run per case tagged git.branch=BRANCH."""
    from stability.check.regression import make_baseline
    from stability.track.runs import fetch_records

    try:
        records = fetch_records(branch=branch, tracking_uri=tracking_uri, preset=preset)
    except RecordError:
        raise
    except Exception as error:  # noqa: BLE001  (the store is the input here: any failure -> unusable input)
        raise RecordError(f"cannot read baseline runs for branch {branch!r} from the tracking store: "
                          f"{type(error).__name__}: {str(error).splitlines()[0][:300]}") from None
    if device is not None:
        records = [r for r in records if record_device(r) == device]
    if not records:
        raise RecordError(f"no parent run tagged git.branch={branch!r}{f' with preset {preset!r}' if preset else ''} "
                          f"holds a JSON record in the tracking store")
    return make_baseline(records)


def write_step_summary(text: str, path: str | None = None) -> Path | None:
    """Append Markdown to $GITHUB_STEP_SUMMARY (or ``path``) when set."""
    target = path or os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    with open(target, "a") as handle:
        handle.write(text + "\n")
    return Path(target)


def cmd_check(args) -> int:
    """Table on stdout, Markdown to $GITHUB_STEP_SUMMARY / --markdown; exit 0 ok, 1 regressed, 2 unusable."""
    from stability.check.regression import CheckResult, check, load_baseline, load_tolerances

    try:
        records, notes = read_inputs(args)
        tolerances = load_tolerances(args.tolerances) if args.tolerances else None
        if args.from_mlflow:
            first = records[0]
            baseline = baseline_from_mlflow(args.from_mlflow, args.tracking_uri, first.get("preset"),
                                            record_device(first))
        elif args.baseline:
            baseline = load_baseline(args.baseline)
        else:
            raise RecordError("give --baseline PATH (e.g. reports/baselines/smoke-cpu.json) or --from-mlflow BRANCH")
        result = check(records, baseline, tolerances, alpha=args.alpha)
        result.notes[:0] = notes
    except RecordError as error:
        result = CheckResult(errors=[str(error)])
    print(result.table(only_changed=not args.all_rows))
    summary = write_step_summary(result.markdown(), args.markdown)
    if summary is not None:
        print(f"markdown summary appended to {summary}", file=sys.stderr)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=1))
    return result.exit_code


def cmd_baseline_update(args) -> int:
    from stability.check.regression import default_baseline_path, make_baseline, write_baseline

    records, notes = read_inputs(args)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    baseline = make_baseline(records, commit=args.commit or git_info().get("commit"))
    out = Path(args.out) if args.out else default_baseline_path(baseline["preset"], baseline["device"],
                                                                 baseline_dir(args))
    write_baseline(baseline, out)
    cases = ", ".join(f"{key} (seeds {max(len(a['status']) for a in case['arms'].values())})"
                      for key, case in baseline["cases"].items())
    print(f"baseline written: {out} (preset {baseline['preset']}, device {baseline['device']}, commit "
          f"{str(baseline['commit'])[:12]}, draws {baseline['draws']}: the reference and "
          f"{len(baseline['draws']) - 1} rounding replicates per seed; cases: {cases})")
    print_calibration(baseline, args.alpha)
    return 0


def print_calibration(baseline: dict, alpha: float) -> int:
    """Judge each draw of the baseline against the others and print how many such harmless jobs failed."""
    from stability.check.regression import null_jobs

    results = null_jobs(baseline, alpha)
    failed = [r for r in results if r.exit_code != 0]
    for result in results:
        worst = min((r for r in result.rows if r.p is not None), key=lambda r: r.p, default=None)
        print(f"  {result.notes[0]}: {result.verdict} ({result.judged} rows"
              + (f"; smallest p {worst.p:.2g}: {worst.case} {worst.arm} {worst.figure}" if worst else "") + ")")
    print(f"calibration: {len(failed)} of {len(results)} rounding draws, each judged against the others, failed "
          f"the check at alpha = {alpha:g}")
    return len(failed)


def cmd_baseline_calibrate(args) -> int:
    from stability.check.regression import load_baseline

    failed = print_calibration(load_baseline(args.baseline), args.alpha)
    return 1 if failed else 0


def baseline_dir(args) -> Path:
    """The baselines directory of the repository's settings (reports/baselines without any)."""
    settings = find_settings(Path.cwd(), getattr(args, "stability_config", None))
    return settings.baseline_dir if settings is not None else Path(DEFAULT_BASELINES)


def suites_arguments(suites: str) -> list[str]:
    """pytest's arguments for ``--suites``: a path as it is, else a package (``--pyargs``)."""
    return [suites] if Path(suites).exists() else ["--pyargs", suites]


def cmd_baseline_make(args) -> int:
    """Run the stress suites with the reference and ``--replicates`` rounding replicates of every run into
    one new run directory, then write the baseline from it. The plugin's own option names
    (--stability-scale, ...) are used: no other plugin or conftest can have taken them."""
    import subprocess

    from stability.record.rundir import ENV_VAR, new_run_dir

    settings = find_settings(Path.cwd(), args.stability_config)
    preset = args.preset or (settings and settings.preset) or "smoke"
    replicates = args.replicates or (settings and settings.replicates) or DEFAULT_REPLICATES
    run_dir = new_run_dir(args.root, label="baseline")
    command = [sys.executable, "-m", "pytest", *suites_arguments(args.suites), "-m", "stress",
               "--stability-scale", preset, "--stability-replicates", str(replicates), "-p", "no:cacheprovider",
               *args.pytest_args]
    if args.device:
        command += ["--stability-device", args.device]
    if args.stability_config:
        command += ["--stability-config", args.stability_config]
    print(f"stability baseline make: {' '.join(command[2:])} (records into {run_dir})", flush=True)
    code = subprocess.run(command, env={**os.environ, ENV_VAR: str(run_dir)}, check=False).returncode
    if code != 0:
        why = " (a usage error, named above: nothing trained)" if code == 4 else ""
        kept = f"the records so far are in {run_dir}" if run_dir.is_dir() else "nothing was recorded"
        raise RecordError(f"the stress suites failed (pytest exit {code}{why}): no baseline written; {kept}")
    args.records, args.all_sessions = [str(run_dir)], False
    written = cmd_baseline_update(args)
    print_invariants(run_dir)
    return written


def print_invariants(run_dir: Path) -> None:
    """List the model invariants that did not hold in the suites' run (``stability.record.invariants``): the
    baseline was written with them, as what this model does."""
    from stability.record.invariants import describe, failed, read_invariants

    found = read_invariants(run_dir)
    broken = failed(found)
    if not broken:
        print(f"model invariants: all {len(found)} held")
        return
    print(f"model invariants that did not hold on this model: {len(broken)} of {len(found)}. The baseline was written "
          f"with them as this model's behaviour: `stability check` fails a change where one that held here stops "
          f"holding, not where one already failed here:")
    for line in broken:
        print(f"  {describe(line)}")
    print("to hold the model to them instead, fix it and run `stability baseline make` again; to leave a case out "
          "of the suites and the check, remove it from `cases` in the settings ([tool.stability])")


def add_record_arguments(parser) -> None:
    parser.add_argument("records", nargs="*",
                        help=f"record files, run directories, or a directory of run directories (default "
                             f"{DEFAULT_ROOT}: its newest run directory)")
    parser.add_argument("--all-sessions", action="store_true",
                        help="read every run directory below a directory of them, not only the newest "
                             "(a (case, arm, seed) that repeats is taken from the newest record)")


def add_parsers(sub) -> None:
    from stability.check.regression import DEFAULT_ALPHA

    chk = sub.add_parser("check", help="compare records with a baseline (exit 0 ok, 1 regressed, 2 unusable)")
    add_record_arguments(chk)
    chk.add_argument("--baseline", help="baseline JSON, e.g. reports/baselines/<preset>-<device>.json")
    chk.add_argument("--from-mlflow", metavar="BRANCH",
                     help="take the baseline from the latest parent runs tagged git.branch=BRANCH")
    chk.add_argument("--tracking-uri", help="MLflow tracking URI for --from-mlflow")
    chk.add_argument("--tolerances", help="JSON or TOML overrides {figure: {floor, rel_floor}}")
    add_alpha(chk, DEFAULT_ALPHA)
    chk.add_argument("--markdown", help="also append the Markdown summary here (default $GITHUB_STEP_SUMMARY)")
    chk.add_argument("--json", help="write the verdict rows as JSON here")
    chk.add_argument("--all-rows", action="store_true", help="print every figure, not only those that moved")
    chk.set_defaults(func=cmd_check)

    base = sub.add_parser("baseline", help="make and inspect regression baselines")
    base_sub = base.add_subparsers(dest="baseline_command", required=True)
    make = base_sub.add_parser("make", help="run the stress suites with rounding replicates and write the baseline")
    make.add_argument("--preset", help="scale preset of the suites (default: the settings' preset, smoke)")
    make.add_argument("--device", help="cpu or cuda (default: the settings' device, the preset's)")
    make.add_argument("--replicates", type=int, default=None, metavar="R",
                      help=f"rounding replicates per run besides the reference (default: the settings' "
                           f"replicates, {DEFAULT_REPLICATES})")
    make.add_argument("--suites", default=INSTALLED_SUITES,
                      help=f"the stress suites to run: a path, or a package run with pytest --pyargs (default "
                           f"{INSTALLED_SUITES}, the installed suites)")
    make.add_argument("--stability-config", metavar="PATH",
                      help="settings file (default: [tool.stability] in ./pyproject.toml, or ./stability.toml)")
    make.add_argument("--root", default=str(DEFAULT_ROOT), help=f"root of the run directory (default {DEFAULT_ROOT})")
    make.add_argument("--out", help="baseline file (default <baselines>/<preset>-<device>.json, the settings' "
                                    "baselines directory, reports/baselines without settings)")
    make.add_argument("--commit", help="commit the baseline comes from (default: git HEAD)")
    make.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    add_alpha(make, DEFAULT_ALPHA)
    make.set_defaults(func=cmd_baseline_make)
    upd = base_sub.add_parser("update", help="write a baseline from the records of a run directory (its reference "
                                             "runs and their rounding replicates)")
    add_record_arguments(upd)
    upd.add_argument("--out", help="baseline file (default <baselines>/<preset>-<device>.json, the settings' "
                                   "baselines directory, reports/baselines without settings)")
    upd.add_argument("--commit", help="commit the baseline comes from (default: git HEAD)")
    add_alpha(upd, DEFAULT_ALPHA)
    upd.set_defaults(func=cmd_baseline_update)
    cal = base_sub.add_parser("calibrate", help="judge each draw of a baseline against the others (its false alarms)")
    cal.add_argument("baseline", help="baseline JSON")
    add_alpha(cal, DEFAULT_ALPHA)
    cal.set_defaults(func=cmd_baseline_calibrate)


def add_alpha(parser, default: float) -> None:
    parser.add_argument("--alpha", type=float, default=default,
                        help=f"the job's false-alarm rate: the chance that a harmless change fails the check "
                             f"(default {default:g})")
