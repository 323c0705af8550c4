"""Extensions reach every process: an entry point or the config's ``plugins`` is imported once, before any
work, by the command, the pytest plugin and a Ray worker; what was loaded is in the record; one that fails
to import stops the command with exit 2 and its name, before anything is written.

docs/extending.md runs the same through an installed package under torchrun (2 processes) and Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stability import config as cfg
from stability.config import extensions
from stability.plugin.settings import parse

COUNTING = """
import os
from pathlib import Path

Path(os.environ["MARK_FILE"]).open("a").write("{name} imported\\n")


def register():
    Path(os.environ["MARK_FILE"]).open("a").write("{name} registered\\n")
"""


def write_module(folder: Path, name: str, body: str | None = None) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(body if body is not None else COUNTING.format(name=name)))


def write_distribution(site: Path, name: str, entry: str, version: str = "1.2.3") -> None:
    """An installed distribution as importlib.metadata finds it: its dist-info with one entry point."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{extensions.GROUP}]\n{name} = {entry}\n")


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A process state in which nothing is loaded yet, ``tmp_path`` on sys.path and a mark file."""
    monkeypatch.setattr(extensions, "_LOADED", {})
    monkeypatch.setattr(extensions, "_SCANNED", [])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MARK_FILE", str(tmp_path / "marks.txt"))
    return tmp_path


def marks(folder: Path) -> list[str]:
    path = folder / "marks.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_a_plugin_is_imported_once_and_its_function_called_once(fresh):
    write_module(fresh, "ext_once")
    write_module(fresh, "ext_call")
    for _ in range(3):
        loaded = extensions.load(("ext_once", "ext_call:register"))
    assert marks(fresh) == ["ext_once imported", "ext_call imported", "ext_call registered"]
    assert [(e.spec, e.source, e.version) for e in loaded] == [("ext_once", "config", None),
                                                                ("ext_call:register", "config", None)]


def test_an_entry_point_is_loaded_with_its_distribution_s_version(fresh):
    write_module(fresh, "ext_entry")
    write_distribution(fresh, "toy_dist", "ext_entry:register")
    loaded = extensions.load()
    assert marks(fresh) == ["ext_entry imported", "ext_entry registered"]
    toy = [e for e in loaded if e.name == "toy_dist"]
    assert toy == [extensions.Extension("toy_dist", "ext_entry:register", "entry point", "1.2.3")]


def test_the_config_s_plugins_load_before_its_names_are_resolved(fresh):
    """An extension may define what the rest of the overrides name: an arm set here."""
    write_module(fresh, "ext_arms", """
        from stability.config import ARM_SETS
        ARM_SETS.setdefault("toy_pair", ("gated",))
    """)
    try:
        config = cfg.resolve("smoke", {"arms": "toy_pair", "plugins": "ext_arms"})
    finally:
        cfg.ARM_SETS.pop("toy_pair", None)
    assert config.plugins == ("ext_arms",) and config.arm_names == ("reference", "gated")
    assert [e.spec for e in extensions.loaded()] == ["ext_arms"]


@pytest.mark.parametrize("spec", ["", "a:b:c", "module:", ":function"])
def test_a_malformed_plugin_is_refused_naming_it(spec):
    with pytest.raises(cfg.ConfigError, match="plugins entry .* is invalid: expected 'module' or 'module:function'"):
        cfg.ExperimentConfig(plugins=(spec,))


def test_a_plugin_that_fails_names_itself_and_its_error(fresh):
    write_module(fresh, "ext_broken", "raise RuntimeError('the registry is closed')\n")
    with pytest.raises(extensions.ExtensionError, match=r"extension 'ext_broken' \(plugins\) failed to load: "
                                                        r"RuntimeError: the registry is closed"):
        extensions.load(("ext_broken",))
    assert extensions.loaded() == []


def test_a_broken_entry_point_names_itself_and_its_group(fresh):
    write_distribution(fresh, "gone_dist", "no_such_module_here")
    with pytest.raises(extensions.ExtensionError, match="entry point 'gone_dist' of stability.extensions"):
        extensions.load()


def test_the_settings_table_names_plugins_for_the_config(tmp_path):
    settings = parse({"plugins": ["a.b", "c:d"]}, "[tool.stability]", tmp_path)
    assert settings.overrides()["plugins"] == "a.b,c:d"
    with pytest.raises(cfg.ConfigError, match=r"plugins = \[3\] is invalid: expected a list of modules"):
        parse({"plugins": [3]}, "[tool.stability]", tmp_path)


def command(args: list[str], folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=folder, env=command_env(folder), capture_output=True, text=True, timeout=600,
                          check=False)


def command_env(folder: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STABILITY_", "PYTEST_"))}
    env.update(PYTHONPATH=str(folder), MARK_FILE=str(folder / "marks.txt"))
    return env


PROBE = """
from stability.record.figures import Figure
from stability.train.probes import LayerProbe, register

register(LayerProbe("toy_abs", "block", lambda x: x.abs().mean().item(), mean=Figure(
    "toy_abs_mean", None, "activation", "mean absolute activation of the blocks' outputs")))
"""


def test_the_command_records_what_it_loaded_and_stops_before_writing_on_a_broken_one(tmp_path):
    write_module(tmp_path, "ext_cmd")
    write_module(tmp_path, "ext_probe", PROBE)
    write_distribution(tmp_path, "toy_cmd", "ext_cmd")
    write_module(tmp_path, "ext_bad", "import no_such_dependency\n")
    stability = [sys.executable, "-m", "stability.cli", "run", "--preset", "smoke", "--set", "steps=2",
                 "--set", "seeds=0", "--no-track", "--quiet"]
    good = command([*stability, "--set", "plugins=ext_cmd:register,ext_probe", "--out", str(tmp_path / "good")],
                   tmp_path)
    assert good.returncode == 0, good.stderr[-2000:]
    (record_path,) = [p for p in (tmp_path / "good").rglob("*.json") if p.name != "manifest.json"]
    record = json.loads(record_path.read_text())
    assert [(e["name"], e["spec"], e["source"], e["version"]) for e in record["env"]["extensions"]] == [
        ("toy_cmd", "ext_cmd", "entry point", "1.2.3"), ("ext_cmd:register", "ext_cmd:register", "config", None),
        ("ext_probe", "ext_probe", "config", None)]
    assert marks(tmp_path) == ["ext_cmd imported", "ext_cmd registered"]
    assert all("toy_abs_mean" in arm["final"] for arm in record["arms"])
    # a reader started without --set plugins loads what the record was made with: its figure is known
    report = command([sys.executable, "-m", "stability.cli", "report", str(record_path.parent), "--out",
                      str(tmp_path / "report.html")], tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "toy_abs_mean" in (tmp_path / "report.md").read_text()

    bad = command([*stability, "--set", "plugins=ext_bad", "--out", str(tmp_path / "bad")], tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [(
        "error: extension 'ext_bad' (plugins) failed to load: ModuleNotFoundError: No module named "
        "'no_such_dependency': expected a module (or module:function) this Python can import")]
    assert not (tmp_path / "bad").exists()


def test_the_pytest_plugin_loads_the_table_s_plugins_before_collecting(tmp_path):
    write_module(tmp_path, "ext_suite")
    (tmp_path / "pyproject.toml").write_text('[tool.stability]\npreset = "smoke"\nplugins = ["ext_suite"]\n')
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    pytest_command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_nothing.py"]
    done = command(pytest_command, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "ext_suite imported" in marks(tmp_path)

    write_module(tmp_path, "ext_suite", "raise ImportError('half installed')\n")
    broken = command(pytest_command, tmp_path)
    assert broken.returncode == 4   # pytest's usage error: nothing collected, nothing run
    assert "extension 'ext_suite' (plugins) failed to load: ImportError: half installed" in broken.stderr


def test_a_treatment_changes_only_its_arm_s_model_and_keeps_the_paired_start(monkeypatch):
    import torch

    from stability.cli.options import check_here
    from stability.model.build import build_model
    from stability.model.treatments import TREATMENTS, register

    monkeypatch.setattr("stability.model.treatments.TREATMENTS", dict(TREATMENTS))

    @register("halve_logits", "logits / 2")
    def halve_logits(model, config):
        model.register_forward_hook(lambda module, args, logits: logits / 2)

    config = cfg.resolve("smoke", {"arms": "pair", "arms.halved.treatments": "halve_logits"})
    runs = {arm: config.arm_config(arm, 0) for arm in ("reference", "halved")}
    assert runs["reference"].model.treatments == () and runs["halved"].model.treatments == ("halve_logits",)
    check_here(config)
    models = {arm: build_model(run.model, run.seed) for arm, run in runs.items()}
    weights = {arm: model.state_dict() for arm, model in models.items()}
    assert weights["reference"].keys() == weights["halved"].keys()
    assert all(torch.equal(weights["reference"][k], weights["halved"][k]) for k in weights["reference"])
    tokens = torch.randint(0, config.run.model.vocab_size, (2, 8))
    torch.testing.assert_close(models["halved"](tokens), models["reference"](tokens) / 2, rtol=0, atol=0)

    unknown = cfg.resolve("smoke", {"arms": "pair", "arms.capped.treatments": "no_such_treatment"})
    with pytest.raises(cfg.ConfigError, match=r"arms.capped.treatments=\('no_such_treatment',\) is invalid: "
                                              r"'no_such_treatment' is not a registered treatment"):
        check_here(unknown)
