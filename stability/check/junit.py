"""The tests of the job's suites that failed, read from their JUnit XML files (``stability check --junit``),
so that the check's verdict holds every step of the job.

This module reads XML only: no torch, no MLflow.
"""

from __future__ import annotations

from pathlib import Path

from stability.record import RecordError
from stability.record.io import check_size


def suite_failures(paths) -> list[str]:
    """The failed and erroring tests of the job's JUnit XML files ("<class>::<test>: <first line of the
    message>"), so that one verdict holds every step of the job; RecordError (exit 2) for a file that is
    missing, too large (``MAX_BYTES``), cannot be read or is not JUnit XML (the suites' outcome is then unknown)."""
    from xml.etree import ElementTree

    failed = []
    for path in paths:
        try:
            check_size(Path(path), "the suites' outcome")
            root = ElementTree.parse(path).getroot()
            cases = list(root.iter("testcase"))
        except RecordError:
            raise
        except (OSError, ElementTree.ParseError, LookupError, ValueError, RecursionError) as error:
            raise RecordError(f"the suites' outcome {str(path)!r} cannot be read ({type(error).__name__}: "
                              f"{error}): a job whose tests did not report cannot be judged") from None
        if root.tag not in ("testsuites", "testsuite"):
            raise RecordError(f"the suites' outcome {str(path)!r} is not JUnit XML (its root is <{root.tag}>): "
                              f"expected <testsuites> or <testsuite>, as pytest --junitxml writes")
        for case in cases:
            problem = case.find("failure") if case.find("failure") is not None else case.find("error")
            if problem is not None:
                message = (problem.get("message") or problem.text or "").strip().splitlines()
                failed.append(f"test {case.get('classname')}::{case.get('name')} "
                              f"{'failed' if problem.tag == 'failure' else 'errored'}"
                              + (f": {message[0][:200]}" if message else ""))
    return failed
