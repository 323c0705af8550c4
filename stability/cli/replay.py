"""``stability replay BUNDLE``: re-run one flagged training step and show what happened inside it."""

from __future__ import annotations

import json
from pathlib import Path


def cmd_replay(args) -> int:
    """Exit 0 when the step reproduced bit for bit, 1 when it did not, 2 for a bundle that cannot be used."""
    from stability.replay import format_report, replay

    report = replay(args.bundle)
    print(format_report(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0 if report["reproduced"] else 1


def add_parsers(sub) -> None:
    parser = sub.add_parser("replay", help="re-run one flagged step from its replay bundle (exit 0 reproduced, "
                                           "1 not, 2 unusable bundle)")
    parser.add_argument("bundle", help="a replay bundle: <run dir>/replay/<case id>/<run>-step<N>.pt")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON here")
    parser.set_defaults(func=cmd_replay)
