"""The one ``--preset`` option of the evidence scripts (validation/) and benchmarks (benchmarks/).

    add_preset_option(parser)                  # --preset NAME, args.preset; choices: presets with a CPU baseline
    add_preset_option(parser, baseline=False)  # choices: every preset

The choices are read from the presets (``stability.config.PRESETS``), and, for a script that judges against a
committed baseline, from the baselines it has (``reports/baselines/<preset>-cpu.json``). ``--scale``, the
option's old spelling, is still read.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stability.config.presets import PRESETS

BASELINES = Path(__file__).resolve().parents[1] / "reports" / "baselines"


def cpu_baseline_presets() -> tuple[str, ...]:
    """The presets with a committed CPU baseline, in the presets' order."""
    return tuple(name for name in PRESETS if (BASELINES / f"{name}-cpu.json").is_file())


def add_preset_option(parser: argparse.ArgumentParser, default: str = "smoke", baseline: bool = True) -> None:
    """``--preset`` (``args.preset``), one of the presets (with a committed CPU baseline when ``baseline``)."""
    choices = cpu_baseline_presets() if baseline else tuple(PRESETS)
    parser.add_argument("--preset", "--scale", dest="preset", default=default, choices=choices,
                        help=f"the preset (default {default}; one of {', '.join(choices)})")
