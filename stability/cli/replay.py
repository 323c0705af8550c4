"""``stability replay BUNDLE ...``: re-run flagged training steps and show what happened inside them."""

from __future__ import annotations

import json
from pathlib import Path


def cmd_replay(args) -> int:
    """Exit 0 when every step reproduced bit for bit, 1 when one did not, 2 for a bundle that cannot be used
    (checked before any replay)."""
    from stability.record import RecordError
    from stability.report.replay import replay_text
    from stability.train.replay import replay

    for bundle in args.bundles:
        if not Path(bundle).is_file():
            raise RecordError(f"bundle {bundle!r} does not exist: expected a file <run dir>/replay/<case id>/"
                              f"<run>-step<N>.pt")
    reports = []
    for index, bundle in enumerate(args.bundles):
        report = replay(bundle, trust_factory=args.trust_factory)
        reports.append(report)
        print(("\n" if index else "") + replay_text(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(reports, indent=1, default=str))
    return 0 if all(r["reproduced"] for r in reports) else 1


def add_parsers(sub) -> None:
    parser = sub.add_parser("replay", help="re-run flagged steps from their replay bundles (exit 0 reproduced, "
                                           "1 not, 2 unusable bundle)")
    parser.add_argument("bundles", nargs="+", metavar="BUNDLE",
                        help="replay bundles: <run dir>/replay/<case id>/<run>-step<N>.pt")
    parser.add_argument("--json", metavar="PATH", help="also write the reports as a JSON list here")
    parser.add_argument("--trust-factory", action="store_true",
                        help="import the model.factory a bundle names (runs that module's code; off: refused, exit 2)")
    parser.set_defaults(func=cmd_replay)
