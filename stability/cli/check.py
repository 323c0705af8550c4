"""``stability check`` (the merge check) and ``stability baseline make|update|calibrate``.

``check``, ``baseline update`` and ``baseline calibrate`` read JSON only (no torch); ``baseline make``
runs the stress suites (reference and rounding replicates) in a subprocess, then ``update``. ``baseline
make`` and ``update`` take their defaults (preset, replicates, the baselines directory) from the settings
of the repository in the current directory (``stability.plugin.settings``)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from stability.plugin.settings import DEFAULT_BASELINES, find_settings
from stability.record import RecordError, record_device
from stability.record.rundir import DEFAULT_ROOT, chosen_sessions, duplicate_runs, load_records

INSTALLED_SUITES = "stability.suites"


def read_inputs(args) -> tuple[list[dict], list[str]]:
    """The records named on the command line (default: the newest run directory) and notes on what was read.
    RecordError when two records hold one run (case, arm, seed, replicate), and, for a command that takes
    ``--expect-commit``, when the records come from several commits or from another commit than the one
    expected (``expected_commit``)."""
    paths = args.records or [DEFAULT_ROOT]
    all_sessions = getattr(args, "all_sessions", False)
    records = load_records(paths, all_sessions=all_sessions)
    notes = chosen_sessions(paths, all_sessions)
    duplicates = duplicate_runs(records)
    if duplicates:
        more = f" (and {len(duplicates) - 1} more)" if len(duplicates) > 1 else ""
        raise RecordError(duplicates[0] + more)
    if hasattr(args, "expect_commit"):
        notes += check_commits(records, args.expect_commit)
    return records, notes


def check_commits(records: list[dict], expected: str) -> list[str]:
    """Notes, or RecordError when the records were trained from several commits, or from another commit than
    ``expected``: "HEAD" (the repository in the current directory), a commit (a prefix of 7 or more hex digits)
    or "any" (whichever one commit the records come from, e.g. a job's artifacts judged elsewhere)."""
    from stability.record import git_info

    commits = sorted({str((r.get("git") or {}).get("commit")) for r in records})
    if len(commits) > 1:
        raise RecordError(f"the records were trained from {len(commits)} commits ({', '.join(c[:12] for c in commits)}): "
                          f"a job judges the runs of one commit; pass the run directory of one job")
    if expected == "any":
        return [f"records of commit {commits[0][:12]} (--expect-commit any)"]
    if expected != "HEAD" and not re.fullmatch(r"[0-9a-f]{7,40}", expected):
        raise RecordError(f"--expect-commit {expected!r}: expected HEAD, any, or a commit (7 to 40 hex digits)")
    wanted = git_info()["commit"] if expected == "HEAD" else expected
    if wanted is None:
        return ["the current directory is not in a git repository: the records' commit is not compared with HEAD"]
    if not commits[0].startswith(wanted):
        raise RecordError(f"the records were trained from commit {commits[0][:12]}, not {expected} ({wanted[:12]}): "
                          f"a job judges runs of the code it checks; run the suites again, or pass "
                          f"--expect-commit {commits[0][:12] if commits[0] != 'None' else 'any'} to judge them anyway")
    return []


def baseline_from_mlflow(branch: str, tracking_uri: str | None, preset: str | None, device: str | None) -> dict:
    """A baseline from the JSON records of the latest parent run per case tagged git.branch=BRANCH."""
    from stability.check.baseline import make_baseline
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
    """Table on stdout, Markdown to $GITHUB_STEP_SUMMARY / --markdown; exit 0 ok, 1 regressed or failed, 2
    unusable (and why, in one ``error:`` line on stderr, as every command says it)."""
    from stability.check import CheckResult, check, load_tolerances, suite_failures
    from stability.check.baseline import run_invariants
    from stability.check.baseline_schema import load_baseline

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
        cases = [c for c in args.cases.split(",") if c] if args.cases else None
        result = check(records, baseline, tolerances, alpha=args.alpha, cases=cases, invariants=run_invariants(records),
                       baseline_path=args.baseline)
        result.suite_failures = suite_failures(args.junit or [])
        result.notes[:0] = notes
    except RecordError as error:
        result = CheckResult(errors=[str(error)])
    print(result.table(only_changed=not args.all_rows))
    summary = write_step_summary(result.markdown(), args.markdown)
    if summary is not None:
        print(f"markdown summary appended to {summary}", file=sys.stderr)
    if args.json and result.exit_code != 2:   # unusable input: one error line, no verdict file
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=1))
    if result.exit_code == 2:
        print(f"error: {one_line(result.errors)}", file=sys.stderr)
    return result.exit_code


def one_line(errors: list[str]) -> str:
    """The reasons input is unusable, as one line."""
    return "; ".join(" ".join(str(error).split()) for error in errors) or "unusable input"


def cmd_baseline_update(args) -> int:
    """Write a baseline from the records of a run directory, calibrated: refused (exit 2, nothing written)
    when its calibration crosses the diagonal, unless
    --accept-calibration (then every check that uses it warns)."""
    from stability.check.baseline import default_baseline_path, make_baseline, run_invariants, write_baseline
    from stability.check.calibration import acceptable, calibrate, curve_lines, stored

    records, notes = read_inputs(args)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    baseline = make_baseline(records, commit=args.commit, allow_dirty=args.allow_dirty,
                             invariants=run_invariants(records))
    out = Path(args.out) if args.out else default_baseline_path(baseline["preset"], baseline["device"],
                                                                 baseline_dir(args))
    remade = [name for name in (getattr(args, "cases", None) or "").split(",") if name.strip()]
    before = None
    if remade:   # a baseline remade case by case: the other cases of the one at `out` are kept
        from stability.check.baseline import merge_cases
        from stability.check.baseline_schema import load_baseline

        if not out.is_file():
            raise RecordError(f"--cases {','.join(remade)}: no baseline {str(out)!r} to remake cases of: make it "
                              f"whole first (without --cases)")
        before = load_baseline(out)
        baseline = merge_cases(before, baseline, remade)
    cases = ", ".join(f"{key} (seeds {max(len(a['status']) for a in case['arms'].values())})"
                      for key, case in baseline["cases"].items())
    print(f"baseline of preset {baseline['preset']}, device {baseline['device']}, commit "
          f"{str(baseline['commit'])[:12]}{' (uncommitted changes: --allow-dirty)' if baseline['dirty'] else ''}, "
          f"replicates {baseline['replicates']}: the reference and {len(baseline['replicates']) - 1} rounding "
          f"replicates per seed; cases: {cases}")
    curve = calibrate(baseline, alphas=calibration_alphas(args.alpha))
    print("\n".join(curve_lines(curve)))
    reason = acceptable(curve)
    baseline["calibration"] = stored(curve, reason)
    if reason and not args.accept_calibration:
        raise RecordError(f"baseline not written: its calibration fails: {reason}; the rule's false-alarm rate "
                          f"on these replicates is not what it states (write it anyway with --accept-calibration)")
    if reason:
        print(f"warning: calibration fails ({reason}); written anyway (--accept-calibration): every check that "
              f"uses this baseline says so", file=sys.stderr)
    write_baseline(baseline, out)
    print(f"baseline written: {out}" + (f" (cases {', '.join(remade)} remade; the others kept)" if remade else ""))
    if before is not None:
        from stability.check.compare import compare, moved, moves_table

        shown = moved(compare(before["cases"], baseline["cases"], baseline["preset"]), 3.0)
        print(f"what moved from the baseline before (3 or more replicate noise): {len(shown)} row(s)")
        if shown:
            print(moves_table(shown))
    return 0


def calibration_alphas(alpha: float) -> tuple[float, ...]:
    """The alphas a calibration is judged at: the check's own first, then the standard ones."""
    from stability.check.calibration import ALPHAS

    return (alpha, *[a for a in ALPHAS if a != alpha])


def cmd_baseline_calibrate(args) -> int:
    """Judge every arrangement of a baseline's replicates: the false-alarm curve and the margin; exit 1 when
    the curve crosses the diagonal. ``--write`` stores the curve in the
    baseline (a failing one only with --accept-calibration, as ``baseline update``), nothing else changed."""
    from stability.check.baseline import write_baseline
    from stability.check.baseline_schema import load_baseline
    from stability.check.calibration import acceptable, calibrate, curve_lines, stored
    from stability.check.power import moves_table, smallest_failing_moves

    baseline = load_baseline(args.baseline)
    curve = calibrate(baseline, alphas=calibration_alphas(args.alpha), playing=playing(args.playing, baseline))
    print("\n".join(curve_lines(curve)))
    moves = smallest_failing_moves(baseline, args.alpha)
    print(f"each primary row's smallest failing move: the smallest move in its worse direction that fails a job "
          f"alone (floor + t(alpha / H) x se), and the smallest move either way, the same in every seed, that "
          f"makes it CHANGED (t(alpha / 2H) x the largest seed's se); {len(moves)} rows (stability.check.power)")
    print(moves_table(moves))
    reason = acceptable(curve)
    if reason:
        print(f"error: calibration fails: {reason}", file=sys.stderr)
    if args.write and (not reason or args.accept_calibration):
        baseline["calibration"] = stored(curve, reason)
        if baseline.get("covers"):   # the rules the curve measured: the coverage's rules are the current code's
            from stability.check.coverage import rules

            baseline["covers"] = {**baseline["covers"], **rules(baseline["covers"]["figures"])}
        write_baseline(baseline, args.baseline)
        print(f"calibration written into {args.baseline}" + (" (failing: --accept-calibration)" if reason else ""))
    return 1 if reason and not (args.write and args.accept_calibration) else 0


def playing(text: str | None, baseline: dict) -> list[str] | None:
    """The replicates of ``--playing`` ("10-19" or "1,3,5") as the baseline's keys; None for all. RecordError (exit
    2) for a replicate the baseline does not hold."""
    if not text:
        return None
    chosen = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise RecordError(f"--playing {text}: expected replicates such as 10-19 or 1,3,5")
        chosen += list(range(int(low), int(high or low) + 1))
    unknown = sorted(set(chosen) - set(baseline["replicates"]))
    if unknown:
        raise RecordError(f"--playing {text}: replicates {unknown} are not the baseline's: expected some of "
                          f"{baseline['replicates']}")
    return [str(r) for r in chosen]


def cmd_baseline_compare(args) -> int:
    """What moved from a baseline to another baseline, or to a job's records, in units of the first one's
    replicate noise: the settings of each case that differ, every case, arm and figure that moved by at least
    --min-sigmas, primary rows first, and what one side lacks. Exit 0 (it judges nothing), 2 for input that cannot be read."""
    from stability.check.baseline import case_values, regression_records
    from stability.check.baseline_schema import load_baseline
    from stability.check.compare import compare, moved, moves_table, settings_differ
    from stability.record.io import read_json

    old = load_baseline(args.old)
    first = Path(args.new[0])
    is_baseline = len(args.new) == 1 and first.is_file() and \
        (read_json(first, "file") or {}).get("kind") == "stability-baseline"
    if is_baseline:
        new, what = load_baseline(first)["cases"], f"baseline {str(first)!r}"
    else:
        args.records, args.all_sessions = args.new, False
        records, notes = read_inputs(args)
        for note in notes:
            print(f"note: {note}")
        new, what = case_values(regression_records(records)[0]), f"the records of {', '.join(args.new)}"
    moves = compare(old["cases"], new, old["preset"])
    shown = moved(moves, args.min_sigmas)
    judged = sum(m.sigmas is not None for m in moves)
    print(f"from baseline {args.old!r} (commit {str(old.get('commit'))[:12]}) to {what}: {len(shown)} of "
          f"{len(moves)} rows moved by at least {args.min_sigmas:g} replicate noise or are on one side only "
          f"({judged} compared)")
    for line in settings_differ(old["cases"], new):
        print(line)
    if shown:
        print(moves_table(shown))
    return 0


def baseline_dir(args) -> Path:
    """The baselines directory of the repository's settings (reports/baselines without any)."""
    settings = find_settings(Path.cwd(), getattr(args, "stability_config", None))
    return settings.baseline_dir if settings is not None else Path(DEFAULT_BASELINES)


def suites_arguments(suites: str) -> list[str]:
    """pytest's arguments for ``--suites``: a path as it is, else a package (``--pyargs``)."""
    return [suites] if Path(suites).exists() else ["--pyargs", suites]


def check_make_arguments(args, settings) -> tuple[str, int]:
    """(preset, replicates) of ``baseline make``, every argument and the settings table checked before pytest
    starts or a run directory is written: ConfigError (exit 2) naming the bad value and what was expected."""
    from stability.cli.options import check_device
    from stability.plugin.settings import check, parse

    given = {key: value for key, value in (("preset", args.preset), ("device", args.device),
                                           ("replicates", args.replicates)) if value is not None}
    parse(given, "the command line", Path.cwd())      # the table's own rules: preset, device, replicates >= 2
    preset = args.preset or (settings and settings.preset) or "smoke"
    if settings is not None:
        check(settings, preset)                        # the config the suites will train, built once
    check_device(args.device or (settings and settings.device) or "cpu")   # a device this machine has
    return preset, args.replicates or (settings and settings.replicates) or preset_replicates(preset)


def preset_replicates(preset: str) -> int:
    """The rounding replicates a baseline of ``preset`` takes by default (its config's ``replicates``)."""
    from stability import config as cfg

    return cfg.preset(preset).replicates


def cmd_baseline_make(args) -> int:
    """Run the stress suites with the reference and ``--replicates`` rounding replicates of every run into
    one new run directory, then write the baseline from it. The plugin's own option names
    (--stability-preset, ...) are used: no other plugin or conftest can have taken them."""
    import subprocess

    from stability.record.rundir import ENV_VAR, new_run_dir

    settings = find_settings(Path.cwd(), args.stability_config)
    preset, replicates = check_make_arguments(args, settings)
    if args.cases and args.out and not Path(args.out).is_file():
        raise RecordError(f"--cases {args.cases}: no baseline {args.out!r} to remake cases of: make it whole first "
                          f"(without --cases)")
    run_dir = new_run_dir(args.root, label="baseline")
    command = [sys.executable, "-m", "pytest", *suites_arguments(args.suites), "-m", "stress",
               "--stability-preset", preset, "--stability-replicates", str(replicates), "-p", "no:cacheprovider",
               *args.pytest_args]
    if args.device:
        command += ["--stability-device", args.device]
    if args.cases:
        command += ["--stability-cases", args.cases]
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
    from stability.check import DEFAULT_ALPHA
    from stability.check.verdict import VERDICT_OF_EXIT

    codes = ", ".join(f"{code} {verdict.lower()}" for code, verdict in VERDICT_OF_EXIT.items())
    chk = sub.add_parser("check", help=f"compare records with a baseline (exit {codes})",
                         description=f"Judge a job's records against a baseline. Exit codes: {codes}.")
    add_record_arguments(chk)
    chk.add_argument("--baseline", help="baseline JSON, e.g. reports/baselines/<preset>-<device>.json")
    chk.add_argument("--from-mlflow", metavar="BRANCH",
                     help="take the baseline from the latest parent runs tagged git.branch=BRANCH")
    chk.add_argument("--tracking-uri", help="MLflow tracking URI for --from-mlflow")
    chk.add_argument("--tolerances", help="JSON or TOML overrides {figure: {floor, rel_floor}}")
    chk.add_argument("--junit", action="append", metavar="XML",
                     help="a JUnit XML file of the job's test steps (repeatable): a failed test fails the verdict too, "
                          "so the check's exit, its table and the job summary are the job's one verdict")
    chk.add_argument("--expect-commit", default="HEAD", metavar="COMMIT",
                     help="the commit the records must come from: HEAD (default: the repository in the current "
                          "directory), a commit, or 'any' (any one commit: artifacts judged elsewhere)")
    chk.add_argument("--cases", metavar="NAMES",
                     help="judge only these stress cases of the baseline (comma-separated, e.g. standard); by default "
                          "every case the baseline holds must be in the records")
    add_alpha(chk, DEFAULT_ALPHA)
    chk.add_argument("--markdown", help="also append the Markdown summary here (default $GITHUB_STEP_SUMMARY)")
    chk.add_argument("--json", help="write the verdict rows as JSON here")
    chk.add_argument("--all-rows", action="store_true", help="print every figure, not only those that moved")
    chk.set_defaults(func=cmd_check)
    base = sub.add_parser("baseline", help="make and inspect regression baselines")
    base_sub = base.add_subparsers(dest="baseline_command", required=True)
    add_make_parsers(base_sub)
    add_reading_parsers(base_sub)


def add_make_parsers(base_sub) -> None:
    """``stability baseline make`` and ``update``: the commands that write a baseline."""
    from stability.check import DEFAULT_ALPHA

    make = base_sub.add_parser("make", help="run the stress suites with rounding replicates and write the baseline")
    make.add_argument("--preset", help="scale preset of the suites (default: the settings' preset, smoke)")
    make.add_argument("--device", help="cpu or cuda (default: the settings' device, the preset's)")
    make.add_argument("--replicates", type=int, default=None, metavar="R",
                      help="rounding replicates per run besides the unperturbed one (default: the settings' "
                           "replicates, else the preset's: 19 at smoke and ci)")
    make.add_argument("--suites", default=INSTALLED_SUITES,
                      help=f"the stress suites to run: a path, or a package run with pytest --pyargs (default "
                           f"{INSTALLED_SUITES}, the installed suites)")
    make.add_argument("--stability-config", metavar="PATH",
                      help="settings file (default: [tool.stability] in ./pyproject.toml, or ./stability.toml)")
    make.add_argument("--root", default=str(DEFAULT_ROOT), help=f"root of the run directory (default {DEFAULT_ROOT})")
    make.add_argument("--out", help="baseline file (default <baselines>/<preset>-<device>.json, the settings' "
                                    "baselines directory, reports/baselines without settings)")
    make.add_argument("--commit", help="commit the baseline comes from (default: the commit that trained the records)")
    make.add_argument("--cases", metavar="NAMES",
                      help="remake only these stress cases (comma-separated, e.g. standard,lr_ramp) of the baseline at "
                           "--out, keeping its other cases: a wanted change accepted case by case")
    make.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    add_alpha(make, DEFAULT_ALPHA)
    add_baseline_flags(make)
    make.set_defaults(func=cmd_baseline_make)
    upd = base_sub.add_parser("update", help="write a baseline from the records of a run directory (its reference "
                                             "runs and their rounding replicates)")
    add_record_arguments(upd)
    upd.add_argument("--out", help="baseline file (default <baselines>/<preset>-<device>.json, the settings' "
                                   "baselines directory, reports/baselines without settings)")
    upd.add_argument("--commit", help="commit the baseline comes from (default: the commit that trained the records)")
    upd.add_argument("--cases", metavar="NAMES",
                     help="the records hold only these stress cases: replace them in the baseline at --out, keeping "
                          "its other cases")
    add_alpha(upd, DEFAULT_ALPHA)
    add_baseline_flags(upd)
    upd.set_defaults(func=cmd_baseline_update)


def add_reading_parsers(base_sub) -> None:
    """``stability baseline calibrate`` and ``compare``: the commands that read a baseline (calibrate may store
    its curve)."""
    from stability.check import DEFAULT_ALPHA

    cal = base_sub.add_parser("calibrate", help="judge every arrangement of a baseline's replicates as a harmless job "
                                                "(its false-alarm curve and margin)")
    cal.add_argument("baseline", help="baseline JSON")
    add_alpha(cal, DEFAULT_ALPHA)
    cal.add_argument("--write", action="store_true", help="store the curve (and the rule it measured) in the "
                                                         "baseline; a failing one only with --accept-calibration")
    cal.add_argument("--accept-calibration", action="store_true", help="with --write: store a failing curve "
                                                                      "anyway (every check then warns)")
    cal.add_argument("--playing", metavar="REPLICATES",
                     help="only these replicates play the change, e.g. 10-19 (a rule chosen by looking at the "
                          "others, measured out of sample); default: every replicate")
    cal.set_defaults(func=cmd_baseline_calibrate)
    cmp = base_sub.add_parser("compare", help="what moved from a baseline to another one, or to a job's records, in "
                                              "units of the replicate noise (a review before a baseline is committed)")
    cmp.add_argument("old", help="the baseline JSON moved from (e.g. the committed one)")
    cmp.add_argument("new", nargs="+", help="another baseline JSON, or a job's record files or run directory")
    cmp.add_argument("--min-sigmas", type=float, default=3.0,
                     help="show the rows that moved by at least this many replicate noise (default 3)")
    cmp.set_defaults(func=cmd_baseline_compare)


def add_baseline_flags(parser) -> None:
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write a baseline of records trained from a tree with uncommitted changes")
    parser.add_argument("--accept-calibration", action="store_true",
                        help="write the baseline although its calibration fails (every check then warns)")


def add_alpha(parser, default: float) -> None:
    parser.add_argument("--alpha", type=float, default=default,
                        help=f"Holm's alpha over the primary rows: the chance that a harmless change fails the "
                             f"check through its rows, their share of the job's false-alarm rate (which the "
                             f"baseline's null jobs measure, rows, outcomes and invariants together; default "
                             f"{default:g})")
