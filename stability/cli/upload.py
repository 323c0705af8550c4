"""``stability upload``: send records that could not be tracked to MLflow later."""

from __future__ import annotations

import sys

from stability.record import RecordError, read_record


def cmd_upload(args) -> int:
    from stability.track.runs import log_to_mlflow

    code = 0
    for path in args.records:
        try:
            record = read_record(path)
        except RecordError as error:
            print(f"error: {error}", file=sys.stderr)
            code = 2
            continue
        tracking = log_to_mlflow(record, args.tracking_uri, args.experiment)
        print(f"{path}: {tracking['status']}" + (f" ({tracking['error']})" if "error" in tracking else ""))
        if tracking["status"] != "tracked" and code == 0:
            code = 1
    return code


def add_parsers(sub) -> None:
    upload = sub.add_parser("upload", help="send JSON records to MLflow (exit 2 bad record, 1 store failed)")
    upload.add_argument("records", nargs="+")
    upload.add_argument("--tracking-uri")
    upload.add_argument("--experiment")
    upload.set_defaults(func=cmd_upload)
