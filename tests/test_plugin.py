"""The pytest plugin (stability.plugin.pytest_plugin) and the settings it reads (stability.plugin.settings),
each run in a repository of its own: pytest in a temporary directory, the plugin loaded through its entry
point as in any repository where the package is installed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stability.plugin.settings import SettingsError, find_settings, parse

ENV = {k: v for k, v in os.environ.items() if not k.startswith(("STABILITY_", "PYTEST_", "MLFLOW_"))}


def repository(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def pytest_in(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=root, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=600,
                          check=False)


# ----------------------------------------------------------------------------- settings

def test_settings_name_an_unknown_or_malformed_key():
    source, root = "[tool.stability] in pyproject.toml", Path(".")
    assert parse({"seeds": [3, 4, 5], "arms": "controls"}, source, root).arms == ("controls",)
    for table, named in [({"preset": "huge"}, "preset = 'huge'"), ({"seeds": "0,1,2"}, "seeds = '0,1,2'"),
                         ({"seeds": [0, 0, 1]}, "distinct integers"), ({"cases": ["standard", "standard"]}, "cases = "),
                         ({"replicates": 1}, "replicates = 1"), ({"device": "gpu"}, "device = 'gpu'"),
                         ({"seed": [0]}, "unknown key 'seed'"), ({"model": {"width": 64}}, "model.width"),
                         ({"model": {"factory": "a.b:c", "hf_config": "qwen3"}}, "both set")]:
        with pytest.raises(SettingsError, match="pyproject.toml") as error:
            parse(table, source, root)
        assert named in str(error.value), (table, str(error.value))


def test_settings_come_from_pyproject_or_stability_toml_but_not_both(tmp_path):
    assert find_settings(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert find_settings(tmp_path) is None
    (tmp_path / "stability.toml").write_text('preset = "ci"\n[set]\n"optim.lr" = 1e-3\n')
    found = find_settings(tmp_path)
    assert found.preset == "ci" and found.overrides() == {"optim.lr": 1e-3} and found.root == tmp_path
    (tmp_path / "pyproject.toml").write_text('[tool.stability]\npreset = "smoke"\n')
    with pytest.raises(SettingsError, match="both hold stability settings"):
        find_settings(tmp_path)
    assert find_settings(tmp_path, tmp_path / "pyproject.toml").preset == "smoke"


# ----------------------------------------------------------------------------- the plugin in a repository

def test_a_repository_without_settings_keeps_its_options_and_markers_and_imports_no_torch(tmp_path):
    """A repository whose conftest has its own --device and its own `slow` marker: the plugin adds neither
    option nor skip, pins no GPU, and imports no torch."""
    root = repository(tmp_path, {
        "pyproject.toml": """\
            [tool.pytest.ini_options]
            markers = ["slow: this repository's own slow tests"]
            """,
        "conftest.py": """\
            def pytest_addoption(parser):
                parser.addoption("--device", default="tpu")
            """,
        "test_mine.py": """\
            import os, sys
            import pytest

            @pytest.mark.slow
            def test_own_option_and_marker(request):
                assert request.config.getoption("--device") == "gpu0"
                assert request.config.getoption("--stability-device") is None
                assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,5"
                assert "torch" not in sys.modules
            """})
    result = pytest_in(root, "--device", "gpu0", "-p", "no:xdist", "-q",
                       env={"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "3,5"})
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout + result.stderr


FACTORY_REPO = {
    "mymodels.py": "from stability.model.lm import GatedLM\n\n\ndef build(config):\n    return GatedLM(config, seed=0)\n",
    "pyproject.toml": """\
        [tool.pytest.ini_options]
        pythonpath = ["."]

        [tool.stability]
        preset = "smoke"
        seeds = [4, 5, 6]
        arms = ["gated_headwise"]
        cases = ["standard"]
        baselines = "gate"
        model.factory = "mymodels:build"

        [tool.stability.set]
        steps = 7
        "optim.lr" = 1e-3
        """,
}


def test_the_settings_reach_the_fixtures_and_the_command_line_wins(tmp_path):
    root = repository(tmp_path, {**FACTORY_REPO, "test_settings.py": """\
        import os, sys

        def test_fixtures(stress_config, preset, scale, device, seeds, stability_settings):
            config = stress_config({"probes.every": 3})
            assert config.run.model.factory == "mymodels:build" and config.arm_names == ("reference", "gated_headwise")
            assert (config.run.steps, config.run.optim.lr, config.run.probes.every) == (7, 1e-3, 3)
            assert config.seeds == seeds == tuple(int(s) for s in os.environ["EXPECTED_SEEDS"].split(","))
            assert (preset, scale, device) == ("smoke", "smoke", "cpu")
            assert stability_settings.baseline_dir.name == "gate"
            assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"   # worker gw1 pinned: the plugin is in use
            assert "torch" not in sys.modules
        """})
    env = {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "3,5"}
    result = pytest_in(root, "-p", "no:xdist", "-q", "test_settings.py", env={**env, "EXPECTED_SEEDS": "4,5,6"})
    assert result.returncode == 0, result.stdout + result.stderr
    result = pytest_in(root, "-p", "no:xdist", "-q", "test_settings.py", "--seeds", "1,2,3",
                       env={**env, "EXPECTED_SEEDS": "1,2,3"})
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("args", "env"), [
    (("--preset", "ci"), {}), (("--stability-preset", "ci"), {}), ((), {"STABILITY_PRESET": "ci"}),
    (("--scale", "ci"), {}), (("--stability-scale", "ci"), {}), ((), {"STABILITY_SCALE": "ci"}),   # old names
])
def test_the_preset_is_named_by_its_option_or_environment_and_its_old_names_still_read(tmp_path, args, env):
    """--preset (its old spelling --scale, which workflows an earlier `stability init` wrote use) and
    $STABILITY_PRESET ($STABILITY_SCALE) reach the ``preset`` fixture and its old name ``scale``."""
    root = repository(tmp_path, {"test_preset.py": """\
        def test_preset(preset, scale):
            assert preset == scale == "ci"
        """})
    result = pytest_in(root, "-p", "no:xdist", "-q", "test_preset.py", *args, env=env)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("table", "named"), [
    ('seeds = "0,1,2"', "seeds = '0,1,2' is invalid: expected a non-empty list of distinct integers"),
    ('model.factory = "nowhere.model:build"', "module 'nowhere.model' cannot be found"),
    ('[tool.stability.set]\n"optim.lr" = -1.0', "optim.lr"),
    ('arms = ["gated", "no_such_arm"]', "no_such_arm"),
    ('cases = ["standard", "sweep"]', "unknown stress case(s) ['sweep']"),
])
def test_a_bad_setting_is_a_usage_error_naming_it_before_anything_trains(tmp_path, table, named):
    root = repository(tmp_path, {"pyproject.toml": f"[tool.stability]\n{table}\n"})
    result = pytest_in(root, "--pyargs", "stability.suites", "-m", "stress", "-p", "no:xdist")
    assert result.returncode == 4, result.stdout + result.stderr   # pytest's usage error
    assert "[tool.stability] in" in result.stderr and named in result.stderr, result.stderr
    assert not (root / "reports").exists()   # no run directory: nothing trained


def test_the_settings_select_the_suites(tmp_path):
    """cases = ["standard"] with a factory: the standard case's suite only (the harness's own model and
    detectors are not this repository's); with the harness's own model its self-checks stay."""
    root = repository(tmp_path, FACTORY_REPO)
    result = pytest_in(root, "--co", "-q", "--pyargs", "stability.suites", "-m", "stress", "-p", "no:xdist")
    assert result.returncode == 0, result.stdout + result.stderr
    collected = [line for line in result.stdout.splitlines() if "::" in line]
    assert collected and all(line.startswith("test_stress_cases.py::") and ("[standard" in line)
                             for line in collected), collected
    (root / "pyproject.toml").write_text('[tool.stability]\ncases = ["standard"]\n')
    result = pytest_in(root, "--co", "-q", "--pyargs", "stability.suites", "-m", "stress", "-p", "no:xdist")
    files = {line.split("::")[0] for line in result.stdout.splitlines() if "::" in line}
    assert files == {"test_stress_cases.py", "test_faults.py", "test_configs_property.py", "test_quant.py"}, result.stdout
    cases = {line.split("[")[1].split("/")[0].rstrip("]") for line in result.stdout.splitlines()
             if line.startswith("test_stress_cases.py::")}
    assert cases == {"standard"}, result.stdout


@pytest.mark.parametrize(("factory", "arms", "named"), [
    ("return build_harness(config), config", "gated", ("model.factory='mymodels:build' returned tuple: expected a "
                                                       "torch.nn.Module")),
    ("return build_harness(replace(config, gate=GateConfig(position='G1') if config.gate.enabled else config.gate))",
     "gated_headwise", "model.factory='mymodels:build' does not honour gate.granularity='headwise'"),
], ids=["a tuple", "a gate setting ignored"])
def test_a_factory_the_suites_cannot_use_is_one_usage_error_before_anything_trains(tmp_path, factory, arms, named):
    """The factory is called once per arm at collection (in the controller, under xdist too): a wrong return type
    or a gate setting it does not honour is pytest's usage error, one line, nothing trained."""
    root = repository(tmp_path, {
        "mymodels.py": f"""\
            from dataclasses import replace

            from stability.config import GateConfig
            from stability.model.lm import GatedLM


            def build_harness(config):
                return GatedLM(config, seed=0)


            def build(config):
                {factory}
            """,
        "pyproject.toml": f"""\
            [tool.pytest.ini_options]
            pythonpath = ["."]

            [tool.stability]
            arms = ["{arms}"]
            cases = ["standard"]
            model.factory = "mymodels:build"
            """})
    result = pytest_in(root, "--pyargs", "stability.suites", "-m", "stress", "-n", "2")
    assert result.returncode == 4, result.stdout + result.stderr   # pytest's usage error
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ERROR: [tool.stability] in ") and named in lines[0], lines
    assert not (root / "reports").exists()


def test_model_invariants_are_recorded_and_listed_not_failed(tmp_path):
    """``model_invariant`` writes one line per call into the session's run directory, one file per xdist worker;
    the test passes, and the terminal summary lists the invariants that did not hold."""
    root = repository(tmp_path, {"test_model.py": """\
        def test_gap(model_invariant):
            assert model_invariant("smoke/precision_ladder", "mean_loss_gap_fp16", "reference", None, False, 0.8159,
                                   0.25, "per seed [0.74, 0.79, 0.91]") is False
            assert model_invariant({"name": "smoke", "case_label": "standard", "case": "standard",
                                    "preset": "smoke"}, "loss_falls", "gated", 1, True, 0.6, 0.9)
        """})
    for workers, name in ((["-p", "no:xdist"], "invariants-main.jsonl"), (["-n", "2"], "invariants-gw")):
        run_dir = tmp_path / f"run-{name}"
        result = pytest_in(root, "test_model.py", *workers, env={"STABILITY_RUN_DIR": str(run_dir)})
        assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout + result.stderr
        assert "model invariants that did not hold: 1 of 2" in result.stdout, result.stdout
        assert ("smoke/precision_ladder reference: mean_loss_gap_fp16 (0.8159 against bound 0.25) - per seed "
                "[0.74, 0.79, 0.91]") in result.stdout
        (written,) = list(run_dir.glob("invariants-*.jsonl"))
        assert written.name.startswith(name) and written.read_text().count("\n") == 2
        assert '"case_key": "smoke/standard", "name": "loss_falls"' in written.read_text()
