"""The shape of the package: no import cycles, parsers only in the CLI, JSON commands without torch."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from _stability_records import pair_record

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "stability"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the stability modules it imports, at module level or inside functions (ast, no import)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
                module = ".".join(p for p in (base, node.module or "") if p)
                wanted = [module] + [f"{module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in wanted:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target != "stability":
                    targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(planted) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_the_package():
    graph = import_graph()
    assert "stability.record" in graph and "stability.cli" in graph   # the graph saw the package
    assert "stability.record" in graph["stability.regression"]         # and function-level imports count
    assert cycles(graph) == [], "import cycles"


def test_only_the_cli_package_builds_parsers():
    offenders = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                 if "argparse" in p.read_text() and p.parent.name != "cli"]
    assert offenders == []


def test_the_json_readers_import_neither_torch_nor_mlflow():
    graph = import_graph()
    heavy = {"stability.model", "stability.trainer", "stability.probes", "stability.attention",
             "stability.tracking", "stability.experiment", "stability.stress", "stability.precision"}

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for other in graph.get(node, ()):
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        return seen
    for module in ("stability.record", "stability.regression", "stability.report", "stability.rundir"):
        assert not reach(module) & heavy, (module, reach(module) & heavy)


BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "mlflow", "triton", "bitsandbytes"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
from stability.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_check_baseline_and_report_run_without_torch(tmp_path):
    """In a process where importing torch (or MLflow) fails, the JSON commands still work."""
    session = tmp_path / "runs" / "20260101T000000-run-abc123"
    session.mkdir(parents=True)
    (session / "manifest.json").write_text("{}")
    (session / "r.json").write_text(json.dumps(pair_record(), allow_nan=False))
    env = {k: v for k, v in os.environ.items() if k != "STABILITY_RUN_DIR"}

    def stability(*args):
        return subprocess.run([sys.executable, "-c", BLOCK_TORCH, *args], check=False, cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
    baseline = stability("baseline", "update", "runs", "--out", "b.json")
    assert baseline.returncode == 0, baseline.stderr
    check = stability("check", "--baseline", "b.json", "runs")
    assert check.returncode == 0 and "PASS" in check.stdout, check.stdout + check.stderr
    report = stability("report", "runs", "--out", "r.html", "--baseline", "b.json")
    assert report.returncode == 0 and (tmp_path / "r.html").is_file(), report.stderr
    blocked = stability("run", "--preset", "smoke", "--no-track")
    assert blocked.returncode != 0 and "blocked in this test" in blocked.stderr   # the block is real
