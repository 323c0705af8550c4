"""kernels/ and suites/ ship as stability.kernels and stability.suites, never as top-level modules; the
pytest plugin is registered through the pytest11 entry point."""

from __future__ import annotations

import importlib
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
    assert suites >= {"__init__.py", "conftest.py", "test_standard.py"}
    assert suites <= {name.removeprefix("stability/suites/") for name in names}
    assert "stability/plugin/pytest_plugin.py" in names
    assert {name.split("/")[0] for name in names} == {"stability", "stability-0.1.0.dist-info"}
    entry_points = wheel.read("stability-0.1.0.dist-info/entry_points.txt").decode()
    assert "[pytest11]\nstability = stability.plugin.pytest_plugin" in entry_points


def test_the_kernels_folder_refuses_the_top_level_name(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.delitem(sys.modules, "kernels", raising=False)
    with pytest.raises(ImportError, match="hub-kernels"):
        importlib.import_module("kernels")
    assert importlib.import_module("stability.kernels").gated_attention is not None
