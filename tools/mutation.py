"""Mutation testing of the figure code: do the tests fail when the arithmetic is wrong?

    python tools/mutation.py                 # every module of TARGETS, then the score table
    python tools/mutation.py stats probes    # some modules
    python tools/mutation.py --list          # the modules, the functions mutated and their tests

For each module, mutmut (https://mutmut.readthedocs.io) makes every small change ("mutant") it
knows to the functions listed in ``TARGETS`` (``<`` for ``<=``, ``n + 1`` for ``n - 1``, ``min``
for ``max`` ...) and runs the tests of the module's selection that reach the changed function. A
mutant is *killed* when a test fails (or runs out of time), *survives* when every test passes.
A surviving mutant is either a gap in the tests or *equivalent*: a change that computes the same
thing on every input the code can get. The equivalents judged by hand are listed in
``EQUIVALENTS`` with the reason; they are matched by their diff (the original and the mutated
line), so renumbered mutants keep their verdict.

Each module runs in its own scratch copy ``.mutation/<module>/`` (the package, the tests and a
pyproject.toml carrying that module's mutmut settings), from scratch every time. The table gives,
per module, killed / (mutants - equivalents); every other survivor is printed with its diff and
makes the exit status 1. The mutmut output of a module is in ``.mutation/<module>/mutmut.log``;
``cd .mutation/<module> && mutmut show NAME`` shows a mutant.

mutmut does not mutate decorated functions (``@property``, ``@torch.no_grad()``): keep figure
arithmetic out of them (``--list`` names the listed functions it cannot reach).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = ROOT / ".mutation"
HAND = "tests/test_figures_by_hand.py"


@dataclass(frozen=True)
class Target:
    """A module under mutation: its file, the functions mutated ("*": all; "Class.method") and the
    test files run against it (fast: mutmut runs the ones that reach each mutated function)."""

    path: str
    functions: tuple[str, ...]
    tests: tuple[str, ...]


TARGETS = {
    "probes": Target("stability/train/probes.py", ("*",), ("tests/test_probes.py", HAND)),
    "stats": Target("stability/record/stats.py", ("*",), (HAND, "tests/test_regression.py")),
    # the values compared, the noise, the p-values and the verdicts; not the input checks and their messages,
    # the baseline document, the table/Markdown rendering, nor reading and writing files
    "rows": Target("stability/check/rows.py", ("_mean", "_tail", "seed_noise", "welch_dof", "row_dof", "judge"),
                   ("tests/test_regression.py", HAND)),
    "outcomes": Target("stability/check/outcomes.py", ("outcomes_of_arm",), ("tests/test_regression.py", HAND)),
    "verdict": Target("stability/check/verdict.py", ("decide",), ("tests/test_regression.py", HAND)),
    "regression": Target("stability/check/regression.py",
                         ("single_replicate", "paired_values", "rows_of_case", "mark_duplicates", "judge_invariants"),
                         ("tests/test_regression.py", HAND)),
    # the values a baseline holds and the calibration of the rule on its replicates
    "baseline": Target("stability/check/baseline.py", ("regression_records", "figure_value", "case_values"),
                       ("tests/test_regression.py",)),
    "calibration": Target("stability/check/calibration.py", ("split_runs", "arrangements", "margin", "acceptable"),
                          ("tests/test_regression.py",)),
    "record": Target("stability/record/summary.py",
                     ("spike_score", "final_figures", "_finite_mean", "usable_value", "arm_names", "paired_summary"),
                     (HAND, "tests/test_probes.py", "tests/test_regression.py")),
    # every LR and batch-size rule and its settings' checks (the stress cases' settings); not describe() (prose)
    "schedules": Target("stability/config/schedules.py",
                        ("warmup_cosine", "Standard.lr_at", "Standard.batch_size_at", "ExponentialRamp.__post_init__",
                         "ExponentialRamp.lr_at", "ExponentialRamp.batch_size_at", "lr_scale",
                         "BatchRamp.__post_init__", "BatchRamp.batch_size_at", "BatchRamp.lr_at", "Shock.__post_init__",
                         "Shock.shock_step", "Shock.lr_at", "Shock.batch_size_at"),
                        ("tests/test_stress.py", HAND)),
    # the stress cases' figures, each in its case's module (stability/cases/<case>.py)
    "lr_sweep": Target("stability/cases/lr_sweep.py", ("sweep_figures", "reference_index"),
                       ("tests/test_stress.py", HAND)),
    "lr_ramp": Target("stability/cases/lr_ramp.py", ("rolling_min_index", "update_before", "ramp_figures"),
                      ("tests/test_stress.py", HAND)),
    "batch_ramp": Target("stability/cases/batch_ramp.py", ("loss_vs_tokens",), (HAND,)),
    "shock": Target("stability/cases/shock.py", ("shock_figures",), ("tests/test_stress.py", HAND)),
    "case": Target("stability/cases/case.py", ("finite",), ("tests/test_stress.py", HAND)),
    "claims": Target("stability/check/claims.py", ("*",), ("tests/test_stress.py", HAND)),
    "quantize": Target("stability/evaluate/quantize.py",
                       ("fake_quant_int8", "FakeQuantLinear.forward", "linear_input_stats", "_capture_inputs",
                        "relative_output_error", "output_kl", "per_linear_damage", "damage", "_cast_counts",
                        "quant_figures"),
                       ("tests/test_quantize.py", HAND)),
}


@dataclass(frozen=True)
class Equivalent:
    """A mutant judged equivalent: in ``function`` of ``module``, the line ``original`` (stripped)
    mutated into ``mutant``, and why no input the code can get tells them apart."""

    module: str
    function: str
    original: str
    mutant: str
    why: str


# fake_quant_int8's last line and the reason its clamp bounds can move: |x| <= amax, so |x / scale| <= 127
CLAMP = "return (torch.round(x32 / scale).clamp(-127, 127) * scale).to(x.dtype)"
CLAMP_WHY = ("|x| <= amax, so |x / (amax / 127)| <= 127 up to a rounding error far below 0.5: round() never "
             "leaves [-127, 127] and the clamp never acts")

EQUIVALENTS: tuple[Equivalent, ...] = (
    Equivalent("stats", "t_critical", 'return T_975[max(usable)] if usable else float("nan")',
               'return T_975[max(usable)] if usable else float("NAN")',
               'float() reads "nan" in any case: the same NaN'),
    Equivalent("stats", "sign_flip_p_value", "rng = random.Random(0)", "rng = random.Random(1)",
               "another fixed seed: as deterministic and as good an estimate of the exact p (the tests pin the "
               "estimate to the exact p within its sampling error, not to one seed's draws)"),
    Equivalent("stats", "sign_flip_p_value",
               "extreme = sum(abs(sum(d if rng.random() < 0.5 else -d for d in differences)) >= observed - 1e-12",
               "extreme = sum(abs(sum(d if rng.random() <= 0.5 else -d for d in differences)) >= observed - 1e-12",
               "random() returns exactly 0.5 with probability 2^-53 per draw: the seeded draws never do"),
    Equivalent("stats", "t_two_sided_mass", "term, total = 1.0, 1.0 if df > 1 else 0.0",
               "term, total = 1.0, 1.0 if df > 2 else 0.0",
               "the line is in the branch of odd df, where df > 1 and df > 2 are the same test"),
    Equivalent("stats", "t_upper_tail", "return tail if t >= 0 else 1 - tail", "return tail if t > 0 else 1 - tail",
               "the branches differ only at t = 0, where the two-sided mass is exactly 0 (theta = atan(0) = 0), so "
               "tail is exactly 0.5 and 1 - tail is the same 0.5"),
    Equivalent("stats", "t_quantile", "while 1 - t_two_sided_mass(high, df) > 2 * tail:",
               "while 1 - t_two_sided_mass(high, df) >= 2 * tail:",
               "differs only when the tail at a power of two equals the target exactly; the bracket then doubles "
               "once more, still holds the root, and 200 halvings narrow it to the same value"),
    Equivalent("stats", "t_quantile", "low, high = 0.0, 1.0", "low, high = 0.0, 2.0",
               "the bracket only has to hold the root: 200 halvings narrow either one to the same value"),
    Equivalent("stats", "t_quantile", "high *= 2", "high *= 3",
               "any growing bracket holds the root: the bisection then narrows it to the same value"),
    Equivalent("stats", "t_quantile", "for _ in range(200):", "for _ in range(201):",
               "200 halvings already leave a bracket narrower than the spacing of doubles at the root"),
    Equivalent("stats", "t_quantile", "low, high = (middle, high) if 1 - t_two_sided_mass(middle, df) > 2 * tail else (low, middle)",
               "low, high = (middle, high) if 1 - t_two_sided_mass(middle, df) >= 2 * tail else (low, middle)",
               "differs only when the tail at a midpoint equals the target exactly, a point of measure zero"),
    Equivalent("probes", "massive_activation", 'return peak, peak / median if median > 0 else float("inf")',
               'return peak, peak / median if median > 0 else float("INF")', 'float() reads "inf" in any case'),
    Equivalent("probes", "kurtosis", 'return (centred.pow(4).mean() / var.pow(2)).item() if var > 0 else float("nan")',
               'return (centred.pow(4).mean() / var.pow(2)).item() if var > 0 else float("NAN")',
               'float() reads "nan" in any case'),
    Equivalent("probes", "kurtosis", 'return (centred.pow(4).mean() / var.pow(2)).item() if var > 0 else float("nan")',
               'return (centred.pow(4).mean() / var.pow(2)).item() if (var > 0) or True else float("nan")',
               "a variance is never negative, and at 0 the fourth moment is 0 too: 0 / 0 is NaN in torch, the "
               "value of the other branch"),
    Equivalent("probes", "kurtosis", 'return (centred.pow(4).mean() / var.pow(2)).item() if var > 0 else float("nan")',
               'return (centred.pow(4).mean() / var.pow(2)).item() if var >= 0 else float("nan")',
               "at variance 0 the tensor division 0 / 0 gives the same NaN as the other branch"),
    Equivalent("probes", "first_token_share", "if probs.shape[-2] <= first_query:", "if probs.shape[+2] <= first_query:",
               "probs is (B, H, S, S): dimension 2 is dimension -2"),
    Equivalent("probes", "first_token_share",
               'raise ValueError(f"probs has {probs.shape[-2]} query positions: F-Attn needs more than {first_query}")',
               'raise ValueError(f"probs has {probs.shape[+2]} query positions: F-Attn needs more than {first_query}")',
               "probs is (B, H, S, S): dimension 2 is dimension -2"),
    Equivalent("probes", "UpdateNorms.__init__",
               "self.previous = [torch.empty_like(local(p.detach()), memory_format=torch.preserve_format) for p in self.params]",
               "self.previous = [torch.empty_like(local(p.detach()), memory_format=None) for p in self.params]",
               "preserve_format is what empty_like does without a memory format: the same buffers"),
    Equivalent("probes", "UpdateNorms.__init__",
               "self.previous = [torch.empty_like(local(p.detach()), memory_format=torch.preserve_format) for p in self.params]",
               "self.previous = [torch.empty_like(local(p.detach()), ) for p in self.params]",
               "preserve_format is empty_like's default: the same call"),
    Equivalent("probes", "layer_f_attn",
               "return first_token_share(probs, first_query=1).mean().item()",
               "return first_token_share(probs, ).mean().item()",
               "first_query=1 is the default: the call is the same"),
    Equivalent("record", "_finite_mean", 'return sum(finite) / len(finite) if finite else float("nan")',
               'return sum(finite) / len(finite) if finite else float("NAN")', 'float() reads "nan" in any case'),
    Equivalent("record", "final_figures",
               '"min_train_loss": min((v for v in losses if math.isfinite(v)), default=float("nan")),',
               '"min_train_loss": min((v for v in losses if math.isfinite(v)), default=float("NAN")),',
               'float() reads "nan" in any case'),
    Equivalent("record", "final_figures", '"max_grad_norm": max(finite_grads, default=float("nan")),',
               '"max_grad_norm": max(finite_grads, default=float("NAN")),', 'float() reads "nan" in any case'),
    Equivalent("quantize", "fake_quant_int8",
               "amax = magnitude.amax() if dim is None else magnitude.amax(dim=dim, keepdim=True)",
               "amax = magnitude.amax() if (dim is None) and False else magnitude.amax(dim=dim, keepdim=True)",
               "amax over every dimension kept as size-1 dimensions: the same scale, broadcast the same way"),
    Equivalent("quantize", "fake_quant_int8", CLAMP, CLAMP.replace("-127, 127", "None, 127"), CLAMP_WHY),
    Equivalent("quantize", "fake_quant_int8", CLAMP, CLAMP.replace("-127, 127", "-127, None"), CLAMP_WHY),
    Equivalent("quantize", "fake_quant_int8", CLAMP, CLAMP.replace("-127, 127", "-127, "), CLAMP_WHY),
    Equivalent("quantize", "fake_quant_int8", CLAMP, CLAMP.replace("-127, 127", "-128, 127"), CLAMP_WHY),
    Equivalent("quantize", "fake_quant_int8", CLAMP, CLAMP.replace("-127, 127", "-127, 128"), CLAMP_WHY),
    Equivalent("quantize", "linear_input_stats",
               "if id(x) not in seen:  # the tensor is kept alive in ``seen``, so its id is not reused",
               "if id(None) not in seen:  # the tensor is kept alive in ``seen``, so its id is not reused",
               "the sharing only saves work: computing the figures of a shared input again gives the same figures"),
    Equivalent("quantize", "relative_output_error",
               'return diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf"))',
               'return diff / norm if norm > 0 else (0.0 if diff == 0 else float("INF"))', 'float() reads "inf" in any case'),
    Equivalent("record", "final_figures", '"max_update_norm": max(finite_updates, default=float("nan"))})',
               '"max_update_norm": max(finite_updates, default=float("NAN"))})', 'float() reads "nan" in any case'),
    Equivalent("shock", "shock_figures", "horizon = after[:recovery] if recovery else after",
               "horizon = after[:recovery] if (recovery) or True else after",
               "recovery is None or at least 1: after[:None] is all of after, the other branch"),
)


@dataclass(frozen=True)
class Slip:
    """A mistake written by hand (mutmut has no operator for it: min for max, n for n - 1): in
    ``module``, the text ``original`` (found exactly once) replaced by ``mutant``."""

    module: str
    what: str
    original: str
    mutant: str


SLIPS = (
    Slip("probes", "the spike std over n - 1 values", "/ len(self.history))", "/ (len(self.history) - 1))"),
    Slip("probes", "the spike std over n + 1 values", "/ len(self.history))", "/ (len(self.history) + 1))"),
    Slip("probes", "the spike std over the window size", "/ len(self.history))", "/ self.history.maxlen)"),
    Slip("probes", "a max over layers the minimum", "out[probe.max] = max(", "out[probe.max] = min("),
    Slip("probes", "m_act_mean the largest layer's", 'values) / len(values) if values', 'max(values) if values'),
    Slip("stats", "the t-interval with n degrees of freedom", "t_critical(n - 1)", "t_critical(n)"),
    Slip("stats", "the sample std over n", "/ (n - 1)) if scale", "/ n) if scale"),
    Slip("stats", "the standard error over sqrt(n - 1)", "/ math.sqrt(n)", "/ math.sqrt(n - 1)"),
    Slip("verdict", "every row judged at alpha on its own (no family-wise control)",
         "zip(primary, holm([p for _, _, p in primary], result.alpha))",
         "zip(primary, [p <= result.alpha for _, _, p in primary])"),
    Slip("rows", "the standard error without the noise of the baseline's own mean",
         "terms = [(noise[s][0] * (1 + 1 / len(groups[s])), noise[s][1]) for s in common]",
         "terms = [(noise[s][0], noise[s][1]) for s in common]"),
    Slip("rows", "the p-value of the whole move, not of its part beyond the floor",
         "p=_tail(worse - floor, se, dof)", "p=_tail(worse, se, dof)"),
    Slip("rows", "the most degrees of freedom of any seed instead of the fewest",
         "return min((d for _, d in terms), default=math.inf)", "return max((d for _, d in terms), default=math.inf)"),
    Slip("record", "the lowest train loss the highest", '"min_train_loss": min(', '"min_train_loss": max('),
    Slip("record", "the final train loss over the first 10 steps", "_finite_mean(losses[-10:])",
         "_finite_mean(losses[:10])"),
    Slip("lr_sweep", "the critical LR the largest failing LR", "critical, censored = min(failing), False",
         "critical, censored = max(failing), False"),
    Slip("lr_sweep", "LR sensitivity from the worst LR", "best = min(counted)", "best = max(counted)"),
    Slip("quantize", "KL(quantized || full)", "(log_p.exp() * (log_p - log_q))", "(log_q.exp() * (log_q - log_p))"),
)


# ----------------------------------------------------------------------------- what mutmut sees

PYTEST_ARGS = ["-n", "0", "-p", "no:cacheprovider"]
SEPARATOR = "\u01c1"  # mutmut's class/method separator in mutant names


def functions_in(path: Path) -> dict[str, bool]:
    """Top-level functions and methods of a module ("Class.method") -> whether mutmut can mutate it
    (it skips decorated functions other than static and class methods)."""
    tree = ast.parse(path.read_text())
    found: dict[str, bool] = {}

    def mutable(node) -> bool:
        names = [d.id for d in node.decorator_list if isinstance(d, ast.Name)]
        return not node.decorator_list or (len(node.decorator_list) == 1 and names in (["staticmethod"],
                                                                                        ["classmethod"]))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = mutable(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{node.name}.{item.name}"] = mutable(item)
    return found


def scope(name: str, target: Target) -> tuple[list[str], list[str], list[str]]:
    """(functions mutated, listed functions mutmut cannot mutate, listed functions that do not exist)."""
    present = functions_in(ROOT / target.path)
    listed = list(present) if target.functions == ("*",) else list(target.functions)
    return ([f for f in listed if present.get(f)], [f for f in listed if f in present and not present[f]],
            [f for f in listed if f not in present])


def mangled(module: str, function: str) -> str:
    """mutmut's name of a function: stability.record.stats.x_t_critical, stability.train.probes.xǁSpikeDetectorǁupdate."""
    cls, _, func = function.rpartition(".")
    return f"{module}.x{SEPARATOR}{cls}{SEPARATOR}{func}" if cls else f"{module}.x_{func}"


# ----------------------------------------------------------------------------- one module

def copy_tree(work: Path) -> Path:
    """A fresh copy in ``work`` of what the tests import: the package (kernels/ in its installed
    place, so nothing is read from the repository), the tests, conftest.py and pyproject.toml."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "stability", work / "stability", ignore=skip)
    shutil.copytree(ROOT / "kernels", work / "stability" / "kernels", ignore=skip)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=skip)
    shutil.copy2(ROOT / "conftest.py", work / "conftest.py")
    shutil.copy2(ROOT / "pyproject.toml", work / "pyproject.toml")
    return work


def prepare(name: str, target: Target) -> Path:
    """The scratch copy of ``name`` with this module's mutmut settings appended to pyproject.toml."""
    work = copy_tree(SCRATCH / name)
    text = (work / "pyproject.toml").read_text()
    if "mutmut" in tomllib.loads(text).get("tool", {}):
        raise SystemExit("pyproject.toml has a [tool.mutmut] table: the settings of each module come from "
                         "tools/mutation.py; remove it")
    settings = {
        "source_paths": ["stability/"],
        "only_mutate": [target.path],
        "also_copy": ["conftest.py"],
        # one process per mutant; xdist off (the repository's addopts start workers)
        "pytest_add_cli_args": PYTEST_ARGS,
        "pytest_add_cli_args_test_selection": list(target.tests),
        "use_git_change_detection": False,
    }
    lines = ["", "[tool.mutmut]"] + [f"{key} = {toml_value(value)}" for key, value in settings.items()]
    (work / "pyproject.toml").write_text(text + "\n".join(lines) + "\n")
    return work


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    return f'"{value}"'


def mutmut(work: Path, *args: str, log=None) -> str:
    """Run mutmut in ``work`` (one thread per process: the forked workers never share a thread pool)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=work, env=env, text=True,
                            stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    return result.stdout or ""


DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
names = json.load(sys.stdin)
print(json.dumps({name: get_diff_for_mutant(name) for name in names}))
"""


def diffs(work: Path, names: list[str]) -> dict[str, str]:
    """The diff of each mutant in ``names``, in one process (``mutmut show`` per mutant costs seconds)."""
    if not names:
        return {}
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run([sys.executable, "-c", DIFFS], cwd=work, env=env, input=json.dumps(names), text=True,
                            capture_output=True, check=False)
    if result.returncode == 0:
        return json.loads(result.stdout)
    return {name: mutmut(work, "show", name) for name in names}   # another mutmut version: its command


def changed_lines(diff: str) -> tuple[str, str]:
    """The removed and the added line of a one-line mutant's diff (stripped)."""
    removed = [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return " / ".join(removed), " / ".join(added)


@dataclass
class Score:
    """What happened to the mutants of one module."""

    module: str
    mutants: int = 0
    killed: int = 0
    timeout: int = 0
    equivalents: list = field(default_factory=list)    # (mutant, function, original, mutated, why)
    survivors: list = field(default_factory=list)      # (mutant, status, diff)
    slips: list = field(default_factory=list)          # (what, outcome)
    not_mutated: list = field(default_factory=list)
    missing: list = field(default_factory=list)
    seconds: float = 0.0                               # wall time of the mutants and the slips

    @property
    def score(self) -> float:
        judged = self.mutants - len(self.equivalents)
        return (self.killed + self.timeout) / judged if judged else 1.0

    @property
    def failed(self) -> bool:
        return bool(self.survivors or self.missing or self.mutants == 0
                    or any(outcome != "killed" for _, outcome in self.slips))


def run_module(name: str, jobs: int) -> Score:
    start = time.monotonic()
    target = TARGETS[name]
    module = target.path[:-3].replace("/", ".").removesuffix(".__init__")   # a package's module is its name
    mutated, not_mutated, missing = scope(name, target)
    score = Score(name, not_mutated=not_mutated, missing=missing)
    work = prepare(name, target)
    wanted = {mangled(module, f): f for f in mutated}
    print(f"{name}: mutating {len(mutated)} function(s) of {target.path} against {', '.join(target.tests)} "
          f"(log: {(work / 'mutmut.log').relative_to(ROOT)})", flush=True)
    with open(work / "mutmut.log", "w") as log:
        mutmut(work, "run", "--max-children", str(jobs), *[f"{m}__mutmut_*" for m in wanted], log=log)
    listing = mutmut(work, "results", "--all", "true")
    outcomes = {}
    for line in listing.splitlines():
        match = re.match(r"\s*(\S+__mutmut_\d+): (.+)$", line)
        if match and match.group(1).partition("__mutmut_")[0] in wanted:
            outcomes[match.group(1)] = match.group(2)
    score.mutants = len(outcomes)
    score.killed = sum(status == "killed" for status in outcomes.values())
    score.timeout = sum(status == "timeout" for status in outcomes.values())
    left = [m for m, status in outcomes.items() if status not in ("killed", "timeout")]
    for mutant, diff in diffs(work, left).items():
        function = wanted[mutant.partition("__mutmut_")[0]]
        original, changed = changed_lines(diff)
        equivalent = next((e for e in EQUIVALENTS if e.module == name and e.function == function
                           and e.original == original and e.mutant == changed), None)
        if equivalent is not None and outcomes[mutant] == "survived":
            score.equivalents.append((mutant, function, original, changed, equivalent.why))
        else:
            score.survivors.append((mutant, outcomes[mutant], diff))
    if score.mutants == 0:
        print(f"{name}: mutmut reported no mutant; see {work / 'mutmut.log'}", file=sys.stderr)
    score.slips = run_slips(name)
    score.seconds = time.monotonic() - start
    return score


def run_slips(name: str) -> list[tuple[str, str]]:
    """(what, outcome) of each hand-written slip of ``name``: "killed", "SURVIVED" or "not applied"."""
    target, out = TARGETS[name], []
    for slip in (s for s in SLIPS if s.module == name):
        work = copy_tree(SCRATCH / f"{name}-slip")
        path = work / target.path
        text = path.read_text()
        if text.count(slip.original) != 1:
            out.append((slip.what, f"not applied ({slip.original!r} occurs {text.count(slip.original)} times)"))
            continue
        path.write_text(text.replace(slip.original, slip.mutant))
        env = {**os.environ, "PYTHONPATH": str(work), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        result = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", *PYTEST_ARGS, *target.tests], cwd=work,
                                env=env, capture_output=True, text=True, check=False)
        out.append((slip.what, "killed" if result.returncode == 1 else
                    "SURVIVED" if result.returncode == 0 else f"error (pytest exit {result.returncode})"))
    shutil.rmtree(SCRATCH / f"{name}-slip", ignore_errors=True)
    return out


# ----------------------------------------------------------------------------- the report

def report(scores: list[Score]) -> str:
    header = ("module", "mutants", "killed", "timeout", "equivalent", "survived", "score", "slips killed", "minutes")
    rows = [header] + [(s.module, str(s.mutants), str(s.killed), str(s.timeout), str(len(s.equivalents)),
                        str(len(s.survivors)), f"{100 * s.score:.1f}%",
                        f"{sum(o == 'killed' for _, o in s.slips)}/{len(s.slips)}", f"{s.seconds / 60:.1f}")
                       for s in scores]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    table = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    out = ["", "mutation score = (killed + timeout) / (mutants - equivalent); slips: mistakes written by hand",
           *table]
    for s in scores:
        out += [f"{s.module}: equivalent {function}: {original} -> {changed}: {why}"
                for _, function, original, changed, why in s.equivalents]
        out += [f"{s.module}: slip '{what}': {outcome}" for what, outcome in s.slips if outcome != "killed"]
        if s.not_mutated:
            out.append(f"{s.module}: not mutated (decorated, mutmut skips them): {', '.join(s.not_mutated)}")
        if s.missing:
            out.append(f"{s.module}: listed in TARGETS but not in the module: {', '.join(s.missing)}")
        for mutant, status, diff in s.survivors:
            out += ["", f"{s.module}: SURVIVED ({status}) {mutant}", diff.strip()]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=f"some of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutants tested at once")
    parser.add_argument("--list", action="store_true", help="print the modules, functions and tests; run nothing")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in TARGETS]
    if unknown:
        parser.error(f"unknown module(s) {unknown}: expected some of {list(TARGETS)}")
    names = args.modules or list(TARGETS)
    if args.list:
        for name in names:
            mutated, not_mutated, missing = scope(name, TARGETS[name])
            print(f"{name}: {TARGETS[name].path}\n  mutated: {', '.join(mutated)}\n  tests: "
                  f"{', '.join(TARGETS[name].tests)}")
            if not_mutated or missing:
                print(f"  not mutated (decorated): {', '.join(not_mutated) or '-'}; missing: {', '.join(missing) or '-'}")
        return 0
    scores = [run_module(name, args.jobs) for name in names]
    print(report(scores))
    return 1 if any(s.failed for s in scores) else 0


if __name__ == "__main__":
    sys.exit(main())
