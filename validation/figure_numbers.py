"""The numbers docs/figures.md states about the committed baselines, computed from them.

    python -m validation.figure_numbers            # rewrite the blocks of docs/figures.md
    python -m validation.figure_numbers --check    # exit 1 when a block differs from the baselines

Each block sits between ``<!-- numbers: NAME PRESET -->`` and ``<!-- end numbers -->`` in docs/figures.md;
tests/test_docs_examples.py fails while one differs from what this module computes from
``reports/baselines/<preset>-cpu.json``. Blocks:

* ``moves``: per figure of the primary family, the smallest move that fails a job alone, as a share of the
  baseline mean (``stability.check.power.smallest_failing_moves``), over the rows of that figure;
* ``early``: the early-horizon rows' noise per seed: the relative standard deviation of a seed's baseline
  runs, and the figure's floor over that standard deviation.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

from stability.check.baseline_schema import load_baseline
from stability.check.power import smallest_failing_moves
from stability.record import figures as fig

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "figures.md"
BLOCK = re.compile(r"(<!-- numbers: (\w+) ([\w-]+) -->\n)(.*?)(<!-- end numbers -->)", re.DOTALL)
EARLY = ("early_loss", "early_grad_norm")


def baseline(preset: str) -> dict:
    """The committed CPU baseline of ``preset``, read as the current schema holds it."""
    return load_baseline(ROOT / "reports" / "baselines" / f"{preset}-cpu.json")


def percent(value: float) -> str:
    """A share as a percentage: two significant digits under 10% (0.0005 -> "0.05%"), whole per cents above."""
    return f"{100 * value:.2g}%" if value < 0.1 else f"{100 * value:,.0f}%"


def number(value: float) -> str:
    """A positive number: two significant digits under 100, a whole number above."""
    return f"{value:.2g}" if value < 100 else f"{value:,.0f}"


def span(values: list[float], show=percent) -> str:
    low, high = min(values), max(values)
    return show(low) if show(low) == show(high) else f"{show(low)} to {show(high)}"


def moves_block(preset: str) -> str:
    """Per figure: the rows, the smallest failing move as a share of the mean (min to max) and the floor's share."""
    moves = smallest_failing_moves(baseline(preset))
    by_figure: dict[str, list] = {}
    for move in moves:
        by_figure.setdefault(move.figure, []).append(move)
    lines = ["| figure | rows | smallest failing move, of the mean | its floor, of the mean |", "|---|---:|---|---|"]
    for figure, rows in sorted(by_figure.items(), key=lambda item: min(abs(m.relative or 0) for m in item[1])):
        shares = [abs(m.relative) for m in rows if m.relative is not None]
        floors = [m.floor / abs(m.baseline) for m in rows if m.baseline]
        lines.append(f"| `{figure}` | {len(rows)} | {span(shares) if shares else '-'} | "
                     f"{span(floors) if floors else '-'} |")
    return "\n".join(lines) + "\n"


def early_noise(preset: str) -> list[tuple[str, str, str, str, float, float]]:
    """(case, arm, figure, seed, relative SD of the seed's runs, floor / SD) of every early-horizon seed."""
    out = []
    for case, base in sorted(baseline(preset)["cases"].items()):
        for arm, entry in sorted(base["arms"].items()):
            for name in EARLY:
                for seed, runs in sorted(entry["figures"].get(name, {}).items()):
                    values = [v for v in runs.values() if v is not None]
                    mean, sd = statistics.mean(values), statistics.stdev(values)
                    figure = fig.figure(name)
                    floor = max(figure.floor or 0.0, figure.rel_floor * abs(mean))
                    out.append((case, arm, name, seed, sd / abs(mean), floor / sd if sd else float("inf")))
    return out


def early_block(preset: str) -> str:
    seeds = early_noise(preset)
    spread = [s[4] for s in seeds if s[4] > 0]
    ratios = [s[5] for s in seeds if s[5] != float("inf")]
    exact = len(seeds) - len(ratios)
    lines = [("| seeds (case, arm, figure) | agree exactly | relative SD of the other seeds | floor / SD | "
             "floor under 10 SD | under 1 SD |"), "|---:|---:|---|---|---:|---:|",
             (f"| {len(seeds)} | {exact} | {span(spread, number)} | {span(ratios, number)} (median "
             f"{number(statistics.median(ratios))}) | {sum(r < 10 for r in ratios)} | {sum(r < 1 for r in ratios)} |")]
    return "\n".join(lines) + "\n"


BLOCKS = {"moves": moves_block, "early": early_block}


def rendered(text: str) -> str:
    """``text`` with every block recomputed."""
    return BLOCK.sub(lambda m: m.group(1) + BLOCKS[m.group(2)](m.group(3)) + m.group(5), text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    new = rendered(text)
    if args.check:
        if new != text:
            print("docs/figures.md's numbers differ from the baselines: run python -m validation.figure_numbers")
        return int(new != text)
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
