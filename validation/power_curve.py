"""The sensitivity of the merge gate: the smallest graded regression the CPU job catches every time.

    python -m validation.power_curve --preset smoke                   # train, keep, judge
    python -m validation.power_curve --preset ci --dials 2,1,0.5
    python -m validation.power_curve --preset smoke --rejudge         # judge the kept records again

The dial: the initial weights' standard deviation multiplied by ``1 + e`` (a patch of
``stability/model/lm.py``, as a pull request would make it). For each ``e`` of ``--dials`` (largest first)
the CPU job of ``.github/workflows/stability.yml`` runs three times on the dialled code, each time as
another rounding replicate (``--replicate 101``, ``102``, ``103``: the runs' initial parameters moved by
one rounding step, so the three replicates differ as three harmless rewrites of the same change would).
Records are kept in ``reports/power/<scale>/`` like the zoo's (``e<e>-draw<N>.json.xz`` for replicate N,
``name_of``). Both rules judge every replicate: the check as it is and the earlier seed-spread rule
(validation/seed_spread_rule.py). The table (``reports/power-<scale>.md``) gives, per e and rule, the
replicates caught, and the smallest e caught in 3 of 3 replicates. The descent stops below the first e that
neither rule catches 3 of 3 times.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from stability.check.baseline_schema import load_baseline
from validation import regression_zoo as zoo
from validation.options import add_preset_option
from validation.zoo import Entry

ROOT = Path(__file__).resolve().parents[1]

REPLICATES = (101, 102, 103)
DEFAULT_DIALS = {"smoke": (2.0, 1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01), "ci": (2.0, 1.0, 0.5, 0.2, 0.1, 0.05)}
INIT_LINE = "std = self.config.init_std"


def dialled(e: float) -> Entry:
    return Entry(f"init_std_x{1 + e:g}", True, f"initial weights' std x {1 + e:g}",
                 (("stability/model/lm.py", INIT_LINE, f"{INIT_LINE} * {1 + e!r}"),))


def name_of(e: float, replicate: int) -> str:
    """The name the job of dial ``e`` and rounding replicate ``replicate`` is kept under: ``e<e>-draw<N>``,
    as the records kept in reports/power/ are named."""
    return f"e{e:g}-draw{replicate}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_preset_option(parser)
    parser.add_argument("--dials", help="comma-separated e values, largest first (default: the preset's grid)")
    parser.add_argument("--work", help="where the patched copies are made (default: a new temporary folder)")
    parser.add_argument("--rejudge", action="store_true", help="judge the kept records again, train nothing")
    args = parser.parse_args()
    dials = [float(v) for v in args.dials.split(",")] if args.dials else list(DEFAULT_DIALS[args.preset])
    work = Path(args.work or tempfile.mkdtemp(prefix="stability-power-")) / args.preset
    work.mkdir(parents=True, exist_ok=True)
    zoo.KEPT = ROOT / "reports" / "power"
    baseline = load_baseline(ROOT / "reports" / "baselines" / f"{args.preset}-cpu.json")
    rows = []
    for e in dials:
        caught = {"check": 0, "earlier": 0, "judged": 0}
        for replicate in REPLICATES:
            name = name_of(e, replicate)
            document = None if not args.rejudge else zoo.read_kept(args.preset, name)
            if document is None and not args.rejudge:
                print(f"e={e:g} replicate {replicate}: running the CPU job at {args.preset} ...", flush=True)
                document = zoo.run_entry(dialled(e), args.preset, work,
                                         env={"PYTEST_ADDOPTS": f"--replicate {replicate}"}, name=name)
                zoo.keep(args.preset, document)
            if document is None:
                continue
            row = zoo.judged(document, baseline)
            caught["judged"] += 1
            caught["check"] += row["failed"]
            caught["earlier"] += row["old_failed"]
            print(f"  e={e:g} replicate {replicate}: check {'caught' if row['failed'] else 'missed'} "
                  f"{row['regressed'][:3]}; earlier rule {'caught' if row['old_failed'] else 'missed'}", flush=True)
        if not caught["judged"]:   # --rejudge: no kept record of this dial (never run), not a dial missed
            print(f"  e={e:g}: no kept records, left out", flush=True)
            continue
        rows.append((e, caught))
        if not args.rejudge and caught["check"] < len(REPLICATES) and caught["earlier"] < len(REPLICATES):
            break
    text = table(rows, args.preset, baseline)
    (ROOT / "reports" / f"power-{args.preset}.md").write_text(text)
    print(text)
    return 0


def smallest(rows, rule: str) -> str:
    """The smallest e caught in every replicate, with every larger e of the grid caught every time too."""
    best = None
    for e, caught in sorted(rows, reverse=True):
        if caught[rule] < len(REPLICATES):
            break
        best = e
    return f"{best:g}" if best is not None else "none of the grid"


def table(rows, preset: str, baseline: dict) -> str:
    lines = [f"## Power curve at `{preset}`", "",
             (f"The dial: initial weights' standard deviation x (1 + e); {len(REPLICATES)} replicates per e, each "
              f"under another rounding perturbation. Baseline commit `{str(baseline.get('commit'))[:12]}`."), "",
             (f"Smallest e caught in {len(REPLICATES)} of {len(REPLICATES)} replicates: the check "
              f"**{smallest(rows, 'check')}**, the earlier seed-spread rule **{smallest(rows, 'earlier')}**."), "",
             "| e | std factor | check: replicates caught | earlier rule: replicates caught |", "|---|---|---|---|"]
    for e, caught in rows:
        lines.append(f"| {e:g} | {1 + e:g} | {caught['check']} of {caught['judged']} | "
                     f"{caught['earlier']} of {caught['judged']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
