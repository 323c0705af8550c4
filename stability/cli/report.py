"""``stability report``: a self-contained HTML report (and its Markdown twin) of a run directory.

Exit 0 when the report is written, whatever its verdicts say (a regression is shown in the report; the
merge check, ``stability check``, is what fails a job on it); 2 when the input is unusable (bad records,
or a ``--baseline`` that cannot judge them): one ``error:`` line and nothing written."""

from __future__ import annotations

from stability.cli.check import add_record_arguments, one_line, read_inputs
from stability.record import RecordError


def cmd_report(args) -> int:
    from stability.check import check, load_tolerances
    from stability.check.baseline import run_invariants
    from stability.check.baseline_schema import load_baseline
    from stability.report.html import write_report

    records, notes = read_inputs(args)
    result = None
    if args.baseline:
        tolerances = load_tolerances(args.tolerances) if args.tolerances else None
        cases = [c for c in args.cases.split(",") if c] if args.cases else None
        result = check(records, load_baseline(args.baseline), tolerances, cases=cases, invariants=run_invariants(records))
        if result.exit_code == 2:
            raise RecordError(f"the verdicts against baseline {args.baseline!r} are unusable: "
                              f"{one_line(result.errors)}; no report written")
        result.notes[:0] = notes
    paths = write_report(records, args.out, result)
    print(f"report: {paths['html']} (Markdown {paths['markdown']}, {len(paths['plots'])} plot(s))")
    if result is not None:
        print(result.summary_line())
    return 0


def add_parsers(sub) -> None:
    rep = sub.add_parser("report", help="write a self-contained HTML report (+ Markdown twin) of records (exit 0 "
                                        "written, whatever the verdicts; 2 unusable input, nothing written)")
    add_record_arguments(rep)
    rep.add_argument("--out", default="reports/report.html", help="HTML file (Markdown twin next to it, .md)")
    rep.add_argument("--baseline", help="also show the regression verdicts against this baseline")
    rep.add_argument("--tolerances", help="tolerance overrides for the verdicts (JSON or TOML)")
    rep.add_argument("--cases", metavar="NAMES", help="judge only these stress cases of the baseline (comma-separated)")
    rep.set_defaults(func=cmd_report)
