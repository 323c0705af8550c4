"""kernels/ and suites/ ship as stability.kernels and stability.suites, never as usable top-level packages
(`kernels` is the name of the Hugging Face hub-kernels package): every usual way of starting Python in the
repository root works, and the pytest plugin is registered through the pytest11 entry point."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_maps_kernels_and_suites_into_the_stability_namespace(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path), str(ROOT)], check=False, capture_output=True, text=True,
                           timeout=300)
    if built.returncode != 0:
        pytest.skip(f"could not build a wheel here: {built.stderr[-300:]}")
    wheel = zipfile.ZipFile(next(tmp_path.glob("stability-*.whl")))
    names = wheel.namelist()
    assert "stability/kernels/gated_attention.py" in names
    suites = {p.name for p in (ROOT / "suites").glob("*.py")}
    assert suites >= {"__init__.py", "conftest.py", "test_stress_cases.py"}
    assert suites <= {name.removeprefix("stability/suites/") for name in names}
    assert "stability/plugin/pytest_plugin.py" in names
    assert {name.split("/")[0] for name in names} == {"stability", "stability-0.1.0.dist-info"}
    entry_points = wheel.read("stability-0.1.0.dist-info/entry_points.txt").decode()
    assert "[pytest11]\nstability = stability.plugin.pytest_plugin" in entry_points


def test_the_kernels_folder_is_never_the_top_level_package(monkeypatch):
    """With the repository root first on sys.path, ``import kernels`` gives the installed hub-kernels package
    (a dependency of transformers) when there is one, else an empty module: never the Triton kernels."""
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.delitem(sys.modules, "kernels", raising=False)
    top = importlib.import_module("kernels")
    assert not hasattr(top, "gated_attention")
    if Path(top.__file__).resolve().parent == ROOT / "kernels":
        assert not hasattr(top, "__version__")           # nothing installed under the name: empty
    else:
        assert "site-packages" in Path(top.__file__).parts   # the installed package
    assert importlib.import_module("stability.kernels").gated_attention is not None


def from_root(*command: str) -> subprocess.CompletedProcess:
    """``command`` run in the repository root, as a user starts it there (no pytest worker settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)


def test_transformers_imports_with_the_repository_root_on_sys_path():
    """``python -c`` in the repository root puts it on sys.path; transformers probes for the hub-kernels
    package ``kernels`` (a dependency of it) and finds the folder first: it must not fail, nor take the folder
    for that package."""
    probe = ("import stability.model.hf, transformers, sys\n"
             "from transformers import LlamaConfig, LlamaForCausalLM\n"
             "LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,\n"
             "                             num_attention_heads=2, num_key_value_heads=1, vocab_size=64))\n"
             "import stability.kernels\n"
             "import kernels\n"
             "assert not hasattr(kernels, 'gated_attention') and stability.kernels.gated_attention\n"
             "print('ok', sys.path[0] == '')\n")
    run = from_root(sys.executable, "-c", probe)
    assert run.returncode == 0 and run.stdout.split() == ["ok", "True"], run.stderr[-3000:]


@pytest.mark.parametrize("start", [["-m", "pytest"], ["-P", "-c", "import sys, pytest; sys.exit(pytest.console_main())"]],
                         ids=["python -m pytest", "pytest"])
def test_the_hf_tests_pass_however_pytest_is_started_in_the_repository_root(start):
    """``python -m pytest`` puts the repository root on sys.path, the ``pytest`` script does not (``-P``)."""
    run = from_root(sys.executable, *start, "tests/test_hf.py", "-k", "probes_on_an_hf_model or bad_hf_config",
                    "-n", "0", "-q", "-p", "no:cacheprovider")
    assert run.returncode == 0 and "3 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
