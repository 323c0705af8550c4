"""The shape of the package: no import cycles, parsers only in the CLI, JSON commands without torch; and the
folders around it: scripts run as modules (no sys.path edits), nothing imports the tests."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from _stability_records import pair_record, with_replicates

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
    assert "stability.record" in graph["stability.check.regression"]         # and function-level imports count
    assert cycles(graph) == [], "import cycles"


def test_only_the_cli_package_builds_parsers():
    offenders = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                 if "argparse" in p.read_text() and p.parent.name != "cli"]
    assert offenders == []


# Which rooms of the package each room may import (docs: README "What is where"). Data flows one way:
# config -> data + model -> precision -> train -> evaluate -> session -> cases -> record -> track / check / report, with the CLI,
# the plan (what a preset costs, from the runs its cases declare) and the pytest plugin on top; record, check, report and track read JSON and never need torch.
ALLOWED = {
    "config": set(),
    "record": {"config"},
    "report": {"config", "record"},
    "check": {"config", "record", "report", "cases"},   # cases: the registry only (its declarations; no torch)
    "track": {"config", "record"},
    "data": {"config"},
    "model": {"config", "kernels"},
    "precision": {"config", "record"},
    "train": {"config", "record", "data", "model", "precision"},
    "evaluate": {"config", "record", "data", "model", "precision", "train"},
    "session": {"config", "record", "track", "train"},
    "cases": {"config", "record", "report", "track", "data", "model", "precision", "train", "evaluate", "session"},
    "plan": {"config", "model", "precision", "train", "cases"},   # counts the runs each case declares; measures the CPU
    "plugin": {"config", "record", "cases", "session"},
    "cli": {"config", "record", "report", "track", "check", "data", "model", "precision", "train", "evaluate", "cases",
            "session", "plugin", "plan"},
}
TORCH_FREE = ("config", "record", "report", "check", "track")


def room(module: str) -> str:
    """stability.train.trainer -> "train"; stability.kernels.* (mapped from kernels/) -> "kernels"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def package_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(importing room, imported room) -> the module imports behind it."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, targets in graph.items():
        for target in targets:
            if room(module) != room(target):
                edges.setdefault((room(module), room(target)), []).append(f"{module} -> {target}")
    return edges


def test_every_module_lives_in_a_room():
    flat = sorted(m for m in import_graph() if m.count(".") == 1 and room(m) not in ALLOWED)
    assert flat == [], f"modules outside the rooms of ALLOWED: {flat}"


def test_every_room_is_a_package_the_wheel_ships():
    """A room missing from pyproject's package list imports here (the source tree) and fails in an installed
    wheel; every directory of stability/ with an __init__.py is listed."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    rooms = {f"stability.{p.parent.name}" for p in (ROOT / "stability").glob("*/__init__.py")}
    assert rooms - listed == set(), f"rooms the wheel would not ship: {sorted(rooms - listed)}"


def test_rooms_import_only_the_rooms_below_them():
    graph = import_graph()
    graph["stability.model.attention"] |= {"stability.kernels.gated_attention"}   # mapped folder, not in PACKAGE
    wrong = {edge: modules for edge, modules in package_edges(graph).items()
             if edge[0] in ALLOWED and edge[1] and edge[1] not in ALLOWED[edge[0]]}
    assert wrong == {}, "imports against the package rules: " + "; ".join(
        f"{a} may not import {b} ({', '.join(m)})" for (a, b), m in wrong.items())


def test_the_package_rule_catches_a_planted_upward_import():
    planted = {"stability.record.figures": {"stability.train.trainer"}, "stability.train.trainer": set()}
    edges = package_edges(planted)
    assert ("record", "train") in edges and "train" not in ALLOWED["record"]


# The one module of a room above them that the JSON readers may import: the registry of stress cases, whose
# declarations import no torch (a case's training imports it inside the functions that train; run with torch
# blocked by test_the_case_registry_imports_without_torch and test_check_baseline_and_report_run_without_torch)
DECLARATIONS = "stability.cases.stress"


def test_the_json_readers_import_neither_torch_nor_mlflow():
    graph = import_graph()
    heavy = {m for m in graph if room(m) not in TORCH_FREE and room(m) not in ("cli", "")}

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for other in graph.get(node, ()) if node != DECLARATIONS else ():
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        return seen
    readers = [m for m in graph if room(m) in TORCH_FREE]
    assert "stability.check.regression" in readers and "stability.record.rundir" in readers
    assert DECLARATIONS in reach("stability.check")   # the check (its package) reads the cases' declarations
    for module in readers:
        assert not (reach(module) - {DECLARATIONS}) & heavy, (module, (reach(module) - {DECLARATIONS}) & heavy)


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
    """In a process where importing torch (or MLflow) fails, the JSON commands still work: on a plain pair and
    on a case with results of its own, whose declaration such a process never imports."""
    record = pair_record()
    sweep = {**pair_record(case_label="sweep", lrs=(1e-3, 3e-3, 1e-2)), "case": "lr_sweep", "run_steps": 30}
    for name, records in (("20260101T000000-run-abc123", with_replicates(record) + with_replicates(sweep)),
                          ("20260102T000000-run-def456", [record, sweep])):
        session = tmp_path / "runs" / name
        session.mkdir(parents=True)
        (session / "manifest.json").write_text("{}")
        for index, one in enumerate(records):
            (session / f"r{index}.json").write_text(json.dumps(one, allow_nan=False))
    env = {k: v for k, v in os.environ.items() if k != "STABILITY_RUN_DIR"}

    def stability(*args):
        return subprocess.run([sys.executable, "-c", BLOCK_TORCH, *args], check=False, cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
    baseline = stability("baseline", "update", "runs/20260101T000000-run-abc123", "--out", "b.json")
    assert baseline.returncode == 0, baseline.stderr
    assert stability("baseline", "calibrate", "b.json").returncode == 0
    check = stability("check", "--baseline", "b.json", "runs")
    assert check.returncode == 0 and "PASSED" in check.stdout, check.stdout + check.stderr
    report = stability("report", "runs", "--out", "r.html", "--baseline", "b.json")
    assert report.returncode == 0 and (tmp_path / "r.html").is_file(), report.stderr
    blocked = stability("run", "--preset", "smoke", "--no-track")
    assert blocked.returncode != 0 and "blocked in this test" in blocked.stderr   # the block is real


def test_the_case_registry_imports_without_torch():
    """The pytest plugin names the cases while it collects, before any test imports torch: the registry and
    every case's declaration import no torch (a case's training imports it when the case runs)."""
    block = BLOCK_TORCH.replace("from stability.cli import main\nsys.exit(main(sys.argv[1:]))\n",
                                "from stability.cases.stress import CASES\nprint(','.join(CASES))\n")
    done = subprocess.run([sys.executable, "-c", block], check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    from stability.cases.stress import CASES

    assert done.stdout.split() == [",".join(CASES)] and "standard" in CASES


# The registries' own packages, where a built-in name may be branched on: the config (it declares the
# defaults and the ladder's reference), the formats' package, the cases' registry, the precision ladder's case
# (its checks state which library trains each built-in rung) and the record's table of cases and figures.
# Anywhere else a comparison with a built-in case, format or figure name is a special case
# that an extension could never get.
REGISTRY_HOMES = ("stability/config/", "stability/precision/", "stability/cases/stress.py",
                  "stability/cases/precision_ladder.py", "stability/record/cases.py", "stability/record/figures.py")


def built_in_names() -> dict[str, str]:
    from stability.cases.stress import CASES
    from stability.precision.formats import FORMATS
    from stability.record.figures import FIGURES

    return {**{name: "figure" for name in FIGURES}, **{name: "format" for name in FORMATS},
            **{name: "case" for name in CASES}}


def branches_on_names(source: str, names: dict[str, str]) -> list[tuple[int, str, str]]:
    """(line, kind, name) of every comparison (==, !=, in, not in) with a string literal that is a built-in
    name, alone or in a literal tuple, list or set."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            for item in items:
                if isinstance(item, ast.Constant) and isinstance(item.value, str) and item.value in names:
                    found.append((node.lineno, names[item.value], item.value))
    return found


def own_names(where: str) -> set[str]:
    """The names a case's own module declares (its case's name and its figures): ``where`` names them freely."""
    from stability.cases.stress import CASES

    owner = next((case for case in CASES.values() if where == f"stability/cases/{case.name}.py"), None)
    return set() if owner is None else {owner.name, *(entry.name for entry in owner.figures)}


def test_no_module_outside_the_registries_branches_on_a_built_in_name():
    names = built_in_names()
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE.parent).as_posix()
        if not where.startswith(REGISTRY_HOMES):
            own = own_names(where)
            offenders += [f"{where}:{line} {kind} {name!r}" for line, kind, name in branches_on_names(
                path.read_text(), names) if name not in own]
    assert offenders == [], "special cases of built-in names outside their registries: " + "; ".join(offenders)


def test_the_name_rule_catches_a_planted_special_case():
    names = built_in_names()
    planted = 'def steps(record):\n    if record["case"] == "precision_ladder":\n        return 1\n' \
              'def gap(p):\n    return p in ("fp32", "bf16")\n'
    assert branches_on_names(planted, names) == [(2, "case", "precision_ladder"), (5, "format", "fp32"),
                                                 (5, "format", "bf16")]


# The rooms that read records (record, report, cli) name no built-in stress case in code: what a case shows is
# declared with it (StressCase.tables, plots), what a command trains is found in the registry. The only
# literals allowed are about records written before a field existed (the upgrade path), each with its reason.
CASE_FREE_ROOMS = ("stability/record/", "stability/report/", "stability/cli/")
OLD_RECORD_NAMES = {
    ("stability/record/identity.py", "standard"): "STANDARD: what a record without a stress field measured",
    ("stability/record/schema.py", "lr_sweep"): "RESULTS_BEFORE_THE_SLOT: where older records kept results",
    ("stability/record/schema.py", "lr_ramp"): "RESULTS_BEFORE_THE_SLOT",
    ("stability/record/schema.py", "batch_ramp"): "RESULTS_BEFORE_THE_SLOT",
    ("stability/record/schema.py", "precision_ladder"): "RESULTS_BEFORE_THE_SLOT",
    ("stability/record/schema.py", "shock"): "RESULTS_BEFORE_THE_SLOT",
    ("stability/record/cases.py", "precision_ladder"): "RUN_LENGTH_SETTINGS_OF_OLD_RECORDS: the run length "
                                                       "of records written before run_steps",
}


def case_name_literals(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every string literal equal to one of ``names``, docstrings left out (they document)."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings)


def test_record_report_and_cli_name_no_built_in_case():
    from stability.cases.stress import CASES
    from stability.record import STANDARD

    assert STANDARD in CASES
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE.parent).as_posix()
        if where.startswith(CASE_FREE_ROOMS):
            offenders += [f"{where}:{line} {name!r}" for line, name in case_name_literals(path.read_text(), set(CASES))
                          if (where, name) not in OLD_RECORD_NAMES]
    assert offenders == [], "built-in case names outside their modules (declare it with the case): " + "; ".join(
        offenders)


def test_the_case_name_rule_catches_a_planted_literal():
    planted = '''"""The ladder's table ("precision_ladder" in a docstring is documentation)."""
ROWS = {"precision_ladder": 1}


def plot(record):
    return make(record, kind="lr_sweep")
'''
    assert case_name_literals(planted, {"precision_ladder", "lr_sweep"}) == [(2, "precision_ladder"), (6, "lr_sweep")]


# ----------------------------------------------------------------------------- the folders around the package

# validation/ (the gate's evidence), studies/ and benchmarks/ run as modules from the repository root: none
# edits sys.path. The package imports none of them, and none of them imports the tests' modules. validation/
# may import the package and benchmarks/ (the GPU check runs the kernel benchmark), benchmarks/ may import
# validation/ (bench_stores.py starts its throwaway servers), studies/ only the package.
SCRIPT_FOLDERS = ("validation", "studies", "benchmarks")
NOT_IMPORTED = {"stability": {"tests", "validation", "studies", "benchmarks"},
                "validation": {"tests", "studies"},
                "studies": {"tests", "validation", "benchmarks"},
                "benchmarks": {"tests", "studies"}}


def sys_path_edits(source: str) -> list[int]:
    """Lines of ``sys.path.insert / append / extend`` calls."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("insert", "append", "extend") and ast.unparse(node.func.value) == "sys.path"]


def imported_names(source: str) -> set[str]:
    """The first part of every absolute import's module name (``from validation.zoo import X`` -> validation)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module.split(".")[0])
    return names


def folder_of(name: str) -> str | None:
    """The repository folder an imported top-level name comes from (the tests' modules are found by their own
    names: tests/ is on pytest's pythonpath)."""
    if name in ("tests", "stability", *SCRIPT_FOLDERS):
        return name
    return "tests" if (ROOT / "tests" / f"{name}.py").is_file() else None


def test_no_script_folder_edits_sys_path():
    offenders = [f"{path.relative_to(ROOT)}:{line}" for folder in SCRIPT_FOLDERS
                 for path in sorted((ROOT / folder).rglob("*.py")) for line in sys_path_edits(path.read_text())]
    assert offenders == [], f"sys.path edited (run the script as a module from the repository root): {offenders}"


def test_the_sys_path_rule_catches_a_planted_insert():
    planted = 'import sys\nsys.path.insert(0, "tests")\nprint(sys.path)\nsys.path.append("x")\n'
    assert sys_path_edits(planted) == [2, 4]


def test_each_folder_imports_only_what_it_may():
    offenders = []
    for folder, forbidden in NOT_IMPORTED.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            wrong = {folder_of(name) for name in imported_names(path.read_text())} & forbidden
            offenders += [f"{path.relative_to(ROOT)} imports {w}" for w in sorted(wrong)]
    assert offenders == [], "; ".join(offenders)


def test_the_folder_rule_catches_planted_imports():
    planted = "import _stability_records\nfrom validation.zoo import ZOO\nfrom . import sibling\nimport torch\n"
    assert {folder_of(name) for name in imported_names(planted)} == {"tests", "validation", None}
    assert folder_of("stability") == "stability" and folder_of("benchmarks") == "benchmarks"
