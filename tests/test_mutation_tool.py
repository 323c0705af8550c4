"""The settings of the mutation run (tools/mutation.py) still name code that exists.

The mutation run itself takes minutes per module (``tox -e mutation``, docs/mutation.md); these checks
read files only, so a renamed figure function or an edited line it names fails here at once, with
the name to update."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_tool():
    spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


tool = load_tool()


def test_every_function_named_for_mutation_exists_and_its_tests_too():
    for name, target in tool.TARGETS.items():
        mutated, _, missing = tool.scope(name, target)
        assert not missing, f"tools/mutation.py TARGETS[{name!r}] names functions not in {target.path}: {missing}"
        assert mutated, name
        assert all((ROOT / test).is_file() for test in target.tests), target.tests


def test_every_hand_written_slip_and_equivalent_still_applies():
    for slip in tool.SLIPS:
        text = (ROOT / tool.TARGETS[slip.module].path).read_text()
        assert text.count(slip.original) == 1, f"slip {slip.what!r}: {slip.original!r} is not once in the module"
    for equivalent in tool.EQUIVALENTS:
        text = (ROOT / tool.TARGETS[equivalent.module].path).read_text()
        first = " ".join(equivalent.original.split(" / ")[0].split())
        assert first in " ".join(text.split()), f"equivalent of {equivalent.function}: {first!r} is gone"


def test_decorated_functions_are_out_of_mutmut_reach(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import functools\n\ndef plain():\n    return 1\n\n@functools.cache\ndef cached():\n    return 2\n\n"
                      "class C:\n    @property\n    def p(self):\n        return 3\n\n    @staticmethod\n"
                      "    def s():\n        return 4\n")
    assert tool.functions_in(source) == {"plain": True, "cached": False, "C.p": False, "C.s": True}
    assert tool.mangled("stability.record.stats", "t_critical") == "stability.record.stats.x_t_critical"
    assert tool.mangled("stability.train.probes", "SpikeDetector.update") == "stability.train.probes.x\u01c1SpikeDetector\u01c1update"


def test_the_changed_lines_of_a_mutant_diff():
    diff = "--- stability/record/stats.py\n+++ stability/record/stats.py\n@@ -1,2 +1,2 @@\n def f(n):\n-    return n - 1\n+    return n + 1\n"
    assert tool.changed_lines(diff) == ("return n - 1", "return n + 1")


def test_the_score_counts_timeouts_as_killed_and_leaves_equivalents_out():
    """10 mutants: 7 killed, 1 timed out, 1 equivalent, 1 survivor: (7 + 1) / (10 - 1) = 88.9%."""
    score = tool.Score("stats", mutants=10, killed=7, timeout=1, seconds=90.0,
                       equivalents=[("m1", "f", "a < b", "a <= b", "never equal")],
                       survivors=[("m2", "survived", "-    a\n+    b")], slips=[("slip", "killed")])
    assert score.score == 8 / 9 and score.failed
    lines = tool.report([score]).splitlines()
    assert lines[2].split() == ["module", "mutants", "killed", "timeout", "equivalent", "survived", "score", "slips",
                                "killed", "minutes"]
    assert lines[3].split() == ["stats", "10", "7", "1", "1", "1", "88.9%", "1/1", "1.5"]
    assert "stats: equivalent f: a < b -> a <= b: never equal" in lines
    assert not tool.Score("stats", mutants=2, killed=1, equivalents=[("m", "f", "a", "b", "why")]).failed
