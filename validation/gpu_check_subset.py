"""The kernel tests the GPU check runs: a subset of ``suites/test_kernel.py -m kernel``, chosen from the suite's own
parametrisation, that covers every gate mode, dtype and head dim (and causal, GQA group and test function).

    items = collect(ROOT)          # every kernel test: node id, function, marks, parameters (a pytest subprocess)
    chosen = select(items)         # the node ids to run, in collection order
    coverage(items, chosen)        # {"gate_mode": (covered, all values), ...}

Why a subset: on a GPU every new shape autotunes the kernels, and each config the autotuner tries is a compile
(0.7 to 4 s on the CPU); the whole file (143 tests, the hypothesis-drawn shapes among them) makes about 480
compiles, far over the kernel part's budget. The subset keeps what only a GPU can check and covers the rest:

1. every ``gpu``-marked test in bf16 (``test_gpu_shapes`` in bf16: head dims 64, 96, 128, 256, the three gate
   modes, causal and not, GQA groups 1, 2, 4, S from 1 to 1024; ``test_gpu_bf16_extremes``): bf16 is the dtype
   the model trains in, and no CPU job runs it (the interpreter cannot do bf16 arithmetic);
2. then, one at a time, the test that adds the most not yet covered per estimated compile: every test function
   (but the hypothesis property test, whose 15 drawn shapes would each autotune anew) and every value of
   ``COVERED`` that the collection holds. The estimate: a kernel variant (dtype, head dim, gate mode, causal) not
   run yet costs one autotuning (14 compiles in the fast tier on sm_90: fp16 / bf16 with D <= 128; 7 in the big
   one), anything else about one compile. Ties go to collection order.

29 of the 143 tests today. Counted once on the CPU (each test's kernel launches recorded with the launches stubbed,
then a compile counted for every config of the sm_90 list at each new autotune key and for every new
specialisation after): about 130 compiles, against about 480 for the whole file without its property test. An
estimate of the compiles, not a measurement on a GPU. The CPU job keeps running the whole file in the interpreter.

The collection runs pytest with this module as a plugin (``-p validation.gpu_check_subset``); it writes every
item to the file named by ``$GPU_CHECK_ITEMS``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SUITE = "suites/test_kernel.py"
MARKER = "kernel"
COVERED = ("gate_mode", "dtype", "head_dim", "causal", "group")
ITEMS_ENV = "GPU_CHECK_ITEMS"
# pytest without the repository's addopts (pytest-benchmark's --benchmark-disable: the lent GPU's image has no
# pytest-benchmark; -n auto) and without the plugins a bare image lacks
PYTEST = ("-o", "addopts=", "-p", "no:cacheprovider", "-p", "no:benchmark", "--strict-markers",
          "--import-mode=importlib")
FAST_COMPILES, BIG_COMPILES = 14, 7     # the sm_90 lists: fwd + dkdv + dq configs, fast and big tier
HALF = ("bf16", "fp16")


# ----------------------------------------------------------------------------- the collection plugin

def _value(value):
    """A parameter as JSON: dtypes by short name, anything else not JSON-ready by its repr."""
    name = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}.get(str(value))
    if name:
        return name
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def pytest_collection_modifyitems(session, config, items):
    """Write every collected item (after -m and -k) to $GPU_CHECK_ITEMS."""
    target = os.environ.get(ITEMS_ENV)
    if not target:
        return
    rows = []
    for item in items:
        spec = getattr(item, "callspec", None)
        rows.append({"nodeid": item.nodeid, "function": getattr(item, "originalname", item.name),
                     "marks": sorted({mark.name for mark in item.iter_markers()}),
                     "hypothesis": hasattr(getattr(item, "obj", None), "hypothesis"),
                     "params": {key: _value(value) for key, value in (spec.params.items() if spec else ())}})
    Path(target).write_text(json.dumps(rows))


def collect(root: Path, suite: str = SUITE, marker: str = MARKER, timeout: float = 120.0,
            env: dict | None = None) -> list[dict]:
    """Every test of ``suite -m marker``, collected by pytest in a subprocess (no test runs)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "items.json"
        environ = {**(env if env is not None else os.environ), ITEMS_ENV: str(out)}
        command = [sys.executable, "-m", "pytest", *PYTEST, "-p", "validation.gpu_check_subset", "--collect-only",
                   "-q", suite, "-m", marker]
        result = subprocess.run(command, cwd=root, env=environ, capture_output=True, text=True, timeout=timeout,
                                check=False)
        if result.returncode != 0 or not out.is_file():
            raise RuntimeError(f"collecting {suite} -m {marker} failed (exit {result.returncode}):\n"
                               f"{(result.stdout + result.stderr)[-3000:]}")
        return json.loads(out.read_text())


# ----------------------------------------------------------------------------- the rule

def _features(item: dict) -> set[tuple[str, str]]:
    return {(key, repr(item["params"][key])) for key in COVERED if key in item["params"]}


def _variant(item: dict) -> tuple | None:
    """(dtype, head dim, gate mode, causal) as far as the parameters say; None where they say nothing."""
    params = item["params"]
    if not any(key in params for key in ("dtype", "head_dim", "gate_mode", "causal")):
        return None
    return tuple(params.get(key, "*") for key in ("dtype", "head_dim", "gate_mode", "causal"))


def _matches(variant: tuple, known: tuple) -> bool:
    return all(a == "*" or b == "*" or a == b for a, b in zip(variant, known))


def estimated_compiles(item: dict, variants: list[tuple]) -> int:
    """The estimate of what ``item`` compiles after ``variants`` ran: a new kernel variant autotunes (a compile
    per config of its tier), anything else about one compile."""
    variant = _variant(item)
    if variant is None or any(_matches(variant, known) for known in variants):
        return 1
    dtype, head_dim = variant[0], variant[1]
    fast = dtype in HALF and (head_dim == "*" or int(head_dim) <= 128)
    return FAST_COMPILES if fast else BIG_COMPILES


def is_first_part(item: dict) -> bool:
    """Part 1 of the rule: a gpu-marked test in bf16 (or without a dtype parameter)."""
    return "gpu" in item["marks"] and item["params"].get("dtype", "bf16") == "bf16"


def select(items: list[dict]) -> list[str]:
    """The node ids of the subset (the module docstring's rule), in collection order."""
    order = {item["nodeid"]: index for index, item in enumerate(items)}
    chosen = [item for item in items if is_first_part(item)]
    candidates = [item for item in items if not item["hypothesis"] and item not in chosen]
    wanted_functions = {item["function"] for item in candidates} | {item["function"] for item in chosen}
    wanted = set().union(*(_features(item) for item in items if not item["hypothesis"]))
    covered = set().union(set(), *(_features(item) for item in chosen))
    functions = {item["function"] for item in chosen}
    variants = [v for v in map(_variant, chosen) if v is not None]
    while covered < wanted or functions < wanted_functions:
        best = None
        for item in candidates:
            gain = len(_features(item) & (wanted - covered)) + (item["function"] not in functions)
            if not gain:
                continue
            score = (estimated_compiles(item, variants) / gain, order[item["nodeid"]])
            if best is None or score < best[0]:
                best = (score, item)
        if best is None:
            break
        item = best[1]
        chosen.append(item)
        candidates.remove(item)
        covered |= _features(item)
        functions.add(item["function"])
        if _variant(item) is not None:
            variants.append(_variant(item))
    return sorted((item["nodeid"] for item in chosen), key=order.__getitem__)


def _in_order(shown: str) -> tuple:
    return (len(shown), shown) if shown.isdigit() else (0, shown)


def coverage(items: list[dict], chosen: list[str]) -> dict[str, tuple[list, list]]:
    """{parameter: (values the subset covers, values the collection holds)} for each of ``COVERED``, and
    "function" (test functions, the hypothesis ones left out of the wanted list)."""
    picked = [item for item in items if item["nodeid"] in set(chosen)]
    out = {}
    for key in COVERED:
        every = sorted({repr(item["params"][key]) for item in items if key in item["params"]}, key=_in_order)
        have = sorted({repr(item["params"][key]) for item in picked if key in item["params"]}, key=_in_order)
        out[key] = (have, every)
    out["function"] = (sorted({item["function"] for item in picked}),
                       sorted({item["function"] for item in items if not item["hypothesis"]}))
    return out


def missing(items: list[dict], chosen: list[str]) -> dict[str, list]:
    """What the subset leaves uncovered (empty when it covers everything)."""
    return {key: sorted(set(every) - set(have)) for key, (have, every) in coverage(items, chosen).items()
            if set(every) - set(have)}
