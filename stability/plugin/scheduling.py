"""How pytest-xdist spreads the suites over its workers under ``--dist loadfile``: one file per worker at a
time, as loadfile does, except that the tests of the stress suite (``test_stress_cases.py``) go by case, so
that the stress cases train side by side on different workers, each once per session.

A test of the stress suite carries its case first in its parameter id (``[lr_ramp]``,
``[lr_ramp/the_lr_rises_exponentially]``); the scope of such a test is the file and the case. Imported only
where pytest-xdist is (``stability.plugin.pytest_plugin.pytest_xdist_make_scheduler``).
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

STRESS_SUITE = "test_stress_cases.py"


def scope_of(nodeid: str) -> str:
    """The group a test runs in: its file, or for a test of the stress suite its file and case."""
    path, _, rest = nodeid.partition("::")
    if path.endswith(STRESS_SUITE) and "[" in rest:
        return f"{path}::{rest.split('[', 1)[1].split('/', 1)[0].rstrip(']')}"
    return path


class CaseScheduling(LoadScopeScheduling):
    """``--dist loadfile`` with the stress suite split by case (``scope_of``)."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)
