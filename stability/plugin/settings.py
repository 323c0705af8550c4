"""A repository's stability settings: ``[tool.stability]`` in its pyproject.toml, or a stability.toml.

    settings = find_settings(Path("."))     # None: the repository has none
    settings.preset, settings.overrides()   # "smoke", {"arms": "gated", "model.factory": "mypackage.model:build"}
    check(settings)                         # the whole config built once: SettingsError naming a bad key

Every key is optional (``KEYS`` lists them, with what each expects); a key left out falls back to the
preset (or to the command line, which always wins). ``stability init`` writes the table with every key
and its comment; the pytest plugin (``stability.plugin.pytest_plugin``) and ``stability baseline make``
read it. In a stability.toml the keys stand at the top level. Reads TOML only: no torch.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from stability.config import PRESETS, ConfigError, ModelConfig, flatten, resolve

PYPROJECT = "pyproject.toml"
OWN_FILE = "stability.toml"
DEFAULT_BASELINES = "reports/baselines"


class SettingsError(ConfigError):
    """A settings file or key is unusable; the message names the file, the key and what was expected."""


@dataclass(frozen=True)
class Key:
    """One key of the table: what its value must be, the comment ``stability init`` writes above it and
    the value it writes."""

    name: str
    expected: str
    comment: str
    initial: Any


MODEL_FIELDS = tuple(f.name for f in fields(ModelConfig) if f.name != "gate")

KEYS = (
    Key("preset", f"one of {tuple(PRESETS)}",
        "Scale preset of the stress suites: smoke (CPU, minutes), ci (CPU, longer runs), gpu-pr (GPU, a pull "
        "request's job), full (GPU, nightly). "
        "--preset overrides it.", "smoke"),
    Key("device", "'cpu', 'cuda' or 'cuda:N'",
        "Device of the suites: cpu or cuda. --device overrides it (the workflow's GPU job passes --device cuda).",
        "cpu"),
    Key("seeds", "a non-empty list of distinct integers",
        "Seeds of every run (a baseline needs 3 or more). --seeds overrides them.", [0, 1, 2]),
    Key("arms", "a non-empty list of arm names or arm sets (`stability arms` lists them)",
        "Arms trained beside the reference arm: names or sets from `stability arms`.", ["gated"]),
    Key("cases", "a non-empty list of distinct stress case names (the registry stability.cases.stress.CASES; "
        "`stability stress --help` names them)",
        "Stress cases the suites train and `stability check` judges.", None),
    Key("baselines", "a directory (a path relative to this file)",
        "Directory of the committed baselines: one file per preset and device, <preset>-<device>.json.",
        DEFAULT_BASELINES),
    Key("tracking_uri", "an MLflow tracking URI (a string)",
        "MLflow store of the suites' runs; $MLFLOW_TRACKING_URI and --tracking-uri override it.",
        "sqlite:///reports/mlflow.db"),
    Key("replicates", "an integer >= 2",
        "Rounding replicates per run in a baseline (`stability baseline make`): its measure of noise (19: a "
        "heavy tail shows; without this key, the preset's).", 19),
    Key("model", f"a table of model fields from {MODEL_FIELDS}, e.g. factory = 'package.module:function'",
        "The model each arm trains: model.factory = \"package.module:function\" (your factory: it builds one "
        "arm's model from its config), or model.hf_config = \"qwen3\" (a Hugging Face config), or neither "
        "(the harness's own model).", {"factory": ""}),
    Key("plugins", "a list of modules (or module:function) to import before any work",
        "Extensions of the harness (stress cases, formats, probes, schemes, arms) that are not installed with an "
        "entry point: modules every process imports first (docs/extending.md).", []),
    Key("set", "a table of config fields and values, as `stability run --set FIELD=VALUE` takes them",
        "Any other config field, as `stability run --set FIELD=VALUE` takes it, e.g. \"optim.lr\" = 1e-3.", {}),
)
KEY_NAMES = tuple(key.name for key in KEYS)


@dataclass(frozen=True)
class Settings:
    """The keys a table holds (None: not set). ``source`` names the table; ``root`` is its directory."""

    source: str
    root: Path
    preset: str | None = None
    device: str | None = None
    seeds: tuple[int, ...] | None = None
    arms: tuple[str, ...] | None = None
    cases: tuple[str, ...] | None = None
    baselines: str | None = None
    tracking_uri: str | None = None
    replicates: int | None = None
    plugins: tuple[str, ...] | None = None
    model: dict = field(default_factory=dict)
    set: dict = field(default_factory=dict)

    def overrides(self) -> dict[str, Any]:
        """The config overrides of the table (plugins, arms, model, set), dotted as ``resolve`` takes them."""
        out: dict[str, Any] = {}
        if self.plugins:
            out["plugins"] = ",".join(self.plugins)
        if self.arms:
            out["arms"] = ",".join(self.arms)
        for name, value in self.model.items():
            out[f"model.{name}"] = value
        if self.model.get("hf_config") and "source" not in self.model:
            out["model.source"] = "hf"
        out.update(flatten(self.set))
        return out

    @property
    def factory(self) -> str:
        return str(self.model.get("factory") or "")

    @property
    def own_model(self) -> bool:
        """Whether the arms train the harness's own model (no factory, no Hugging Face config)."""
        return not self.factory and not self.model.get("hf_config") and self.model.get("source", "harness") == "harness"

    @property
    def baseline_dir(self) -> Path:
        return self.root / (self.baselines or DEFAULT_BASELINES)


# ----------------------------------------------------------------------------- reading

def _fail(source: str, key: str, value: Any, expected: str) -> SettingsError:
    return SettingsError(f"{source}: {key} = {value!r} is invalid: expected {expected}")


def _strings(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v.strip() for v in value)


def _read_key(key: Key, value: Any, source: str) -> Any:
    """The value of one key, checked for its shape (the config checks the rest)."""
    name, bad = key.name, _fail(source, key.name, value, key.expected)
    if name == "preset":
        if value not in PRESETS:
            raise bad
    elif name == "device":
        if not isinstance(value, str) or not (value in ("cpu", "cuda") or (value.startswith("cuda:")
                                                                            and value[5:].isdigit())):
            raise bad
    elif name == "seeds":
        if not (isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                          for v in value) and len(set(value)) == len(value)):
            raise bad
        return tuple(value)
    elif name == "arms":
        value = [value] if isinstance(value, str) else value
        if not _strings(value):
            raise bad
        return tuple(value)
    elif name == "cases":   # the names are the registry's: checked when the suites are collected
        if not (_strings(value) and len(set(value)) == len(value)):
            raise bad
        return tuple(value)
    elif name == "plugins":   # imported when the config is built (stability.config.extensions)
        if not (isinstance(value, list) and all(isinstance(v, str) and v.strip() for v in value)):
            raise bad
        return tuple(value)
    elif name in ("baselines", "tracking_uri"):
        if not isinstance(value, str) or (name == "baselines" and not value.strip()):
            raise bad
    elif name == "replicates":
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 2):
            raise bad
    elif name == "model":
        if not isinstance(value, dict):
            raise bad
        unknown = [k for k in value if k not in MODEL_FIELDS]
        if unknown:
            raise SettingsError(f"{source}: model.{unknown[0]} is not a model field: expected fields from "
                                f"{MODEL_FIELDS} (each arm's gate comes from its arm: set it with "
                                f"set.\"arms.gated.gate.position\" and the like)")
        if value.get("factory") and value.get("hf_config"):
            raise SettingsError(f"{source}: model.factory and model.hf_config are both set: expected one of them "
                                f"(a factory builds the model itself)")
    elif name == "set" and not isinstance(value, dict):
        raise bad
    return value


def parse(table: dict, source: str, root: Path) -> Settings:
    """Settings from the table's mapping; SettingsError naming the first unknown or malformed key."""
    unknown = [k for k in table if k not in KEY_NAMES]
    if unknown:
        raise SettingsError(f"{source}: unknown key {unknown[0]!r}: expected keys from {KEY_NAMES}")
    values = {key.name: _read_key(key, table[key.name], source) for key in KEYS if key.name in table}
    return Settings(source=source, root=root, **values)


def read_settings(path: Path, required: bool = False) -> Settings | None:
    """The settings in ``path`` (a pyproject.toml's [tool.stability] table, or a stability-style TOML file
    whose keys stand at the top level); None when a pyproject.toml has no table and none is required."""
    if not path.is_file():
        if required:
            raise SettingsError(f"settings file {str(path)!r} does not exist: expected a TOML file")
        return None
    text = path.read_text()
    pyproject = path.name == PYPROJECT
    if pyproject and not required and "stability" not in text:
        return None   # another project's pyproject.toml: never an error of ours
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SettingsError(f"{path} is not valid TOML: {error}") from None
    if pyproject:
        table, source = (data.get("tool") or {}).get("stability"), f"[tool.stability] in {path}"
    else:
        table, source = data, str(path)
    if table is None:
        if required:
            raise SettingsError(f"{path} has no [tool.stability] table: expected one (stability init writes it)")
        return None
    if not isinstance(table, dict):
        raise SettingsError(f"{source}: expected a table of keys from {KEY_NAMES}, got {type(table).__name__}")
    return parse(table, source, path.parent)


def find_settings(root: Path, path: str | Path | None = None) -> Settings | None:
    """The settings of the repository at ``root``: ``path`` when given, else the [tool.stability] table of
    its pyproject.toml, else its stability.toml; None when it has none. Both at once is an error."""
    if path:
        return read_settings(Path(path), required=True)
    found = [s for s in (read_settings(root / PYPROJECT), read_settings(root / OWN_FILE)) if s is not None]
    if len(found) > 1:
        raise SettingsError(f"{root / PYPROJECT} and {root / OWN_FILE} both hold stability settings: expected one "
                            f"of them")
    return found[0] if found else None


def check(settings: Settings, preset: str | None = None):
    """Build the config the suites will train (at ``preset``, default the table's) once: SettingsError
    naming the table and the field when a value is wrong. Returns the ExperimentConfig."""
    values = settings.overrides()
    if settings.seeds is not None:
        values["seeds"] = settings.seeds
    if settings.device:
        values["run.device"] = settings.device
    try:
        return resolve(preset or settings.preset or "smoke", values)
    except ConfigError as error:
        raise SettingsError(f"{settings.source}: {error}") from None
