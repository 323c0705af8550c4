"""Overrides: a preset plus dotted overrides (``--set``, ``--config``) -> a validated ``ExperimentConfig``;
configs to and from plain dicts (the record).

``resolve(preset, overrides)`` builds a full ``ExperimentConfig`` from a preset name plus dotted
overrides such as ``{"model.d_model": 256}``; ``arms=gated,gated_floored`` selects arms by name
(``select_arms``) and ``arms.<name>.<field>=VALUE`` defines or changes one. Two older spellings are still
accepted: ``gated_gate.X`` (``arms.gated.gate.X``, ``GATE_ALIASES``) and the stress schedules' flat names
(``stress.shock_step`` is ``stress.shock.at_step``: ``stability.config.stress.FLAT_NAMES``). A setting a
stress case declares with itself is ``stress.case_settings.<case>.<name>`` (``StressConfig.case_settings``).
"""

from __future__ import annotations

import dataclasses
import json
import types
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from stability.config.arms import ARM_SETS, NAMED_ARMS, REFERENCE_ARM, ArmConfig, current_arm_name
from stability.config.errors import ConfigError
from stability.config.experiment import ExperimentConfig
from stability.config.extensions import load as load_extensions
from stability.config.presets import preset
from stability.config.stress import FLAT_NAMES, StressConfig, declared_settings, nested_names


def select_arms(config: ExperimentConfig, value: Any, custom: tuple[str, ...] = ()) -> ExperimentConfig:
    """``config`` with the arms named in ``value`` ("gated,gated_floored", an arm set such as "controls",
    or a list); the reference arm is added first when not named ("baseline", its old name, names it too).
    Names come from the config's own arms, then ``NAMED_ARMS``; names in ``custom`` (defined by
    ``arms.<name>.<field>`` overrides) start blank."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in (str(x).strip() for x in items):
        if item:
            names.extend(ARM_SETS.get(item, (current_arm_name(item),)))
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"arms={value!r} is invalid: arm name(s) {', '.join(map(repr, twice))} used twice: "
                          f"expected distinct arms")
    if REFERENCE_ARM not in names:
        names.insert(0, REFERENCE_ARM)
    names.sort(key=lambda n: n != REFERENCE_ARM)
    own = {arm.name: arm for arm in config.arms}
    arms = []
    for name in names:
        if name in own:
            arms.append(own[name])
        elif name in NAMED_ARMS:
            arms.append(NAMED_ARMS[name])
        elif name in custom:
            arms.append(ArmConfig(name))
        else:
            raise ConfigError(f"arms={value!r} is invalid: {name!r} is not a named arm: expected names from "
                              f"{tuple(NAMED_ARMS)} or the sets {tuple(ARM_SETS)}, or define it with "
                              f"arms.{name}.<field>=VALUE")
    return replace(config, arms=tuple(arms))


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """Turn a command-line string (or JSON value) into the type a field expects."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):  # ``X | None``: "none" (or null) is None, else an X
        if value is None or str(value).strip().lower() in ("none", "null"):
            return None
        return _coerce(value, next(a for a in get_args(hint) if a is not type(None)), name)
    if origin is tuple:
        items = value.split(",") if isinstance(value, str) else list(value)
        args = get_args(hint)
        item_type = args[0] if args else str
        items = [x for x in items if str(x).strip() != ""] if isinstance(value, str) else items
        return tuple(_coerce(x.strip() if isinstance(x, str) else x, item_type, name) for x in items)
    if hint is bool:
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}={value!r} is invalid: expected true or false")
    try:
        if hint is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if hint is float:
            return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r} is invalid: expected {'an' if hint is int else 'a'} "
                          f"{'integer' if hint is int else 'number'}") from None
    return value if not isinstance(value, str) else str(value)


# the spelling before arms existed: gated_gate.X is arms.gated.gate.X, baseline_gate.X is arms.reference.gate.X
GATE_ALIASES = {"gated_gate": "gated", "baseline_gate": REFERENCE_ARM}


def _override_arm(config: ExperimentConfig, dotted: str, value: Any) -> ExperimentConfig:
    """``arms.<name>.<field>=value``: change arm <name>, adding it (from NAMED_ARMS, else blank) when absent."""
    name, _, path = dotted.partition(".")[2].partition(".")
    name = current_arm_name(name)
    if not name or not path:
        raise ConfigError(f"{dotted!r} is not a config field: expected arms=NAMES or arms.<name>.<field>=VALUE")
    if path.partition(".")[0] == "name":
        raise ConfigError(f"{dotted!r} is not settable: an arm's name is its key in arms.<name>.<field>")
    arms = list(config.arms)
    index = next((i for i, arm in enumerate(arms) if arm.name == name), None)
    if index is None:
        arms.append(NAMED_ARMS.get(name) or ArmConfig(name))
        index = len(arms) - 1
    arms[index] = override(arms[index], path, value, f"arms.{name}.")
    return replace(config, arms=tuple(arms))


def _override_case_settings(config: StressConfig, dotted: str, value: Any, prefix: str) -> StressConfig:
    """``stress.case_settings.<case>.<name>=value``: a setting a stress case declares with itself, checked by the
    dataclass it declares. A mapping sets several: ``stress.case_settings.<case>={name: value}``,
    ``stress.case_settings={case: {name: value}}``."""
    where = f"{prefix}case_settings"
    case, _, path = dotted.partition(".")
    if not case:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}={value!r} is invalid: expected a mapping of stress cases to their settings")
        for name, item in value.items():
            config = _override_case_settings(config, name, item, prefix)
        return config
    settings = config.settings_of(case)   # ConfigError naming the case where it declares no settings
    if not path and not isinstance(value, dict):
        raise ConfigError(f"{where}.{case}={value!r} is invalid: expected a mapping of its settings")
    try:
        for name, item in ({path: value} if path else value).items():
            settings = override(settings, name, item, f"{where}.{case}.")
    except ConfigError as error:
        raise _under(f"{where}.{case}", error) from None
    return config.with_settings(case, settings)


def _under(where: str, error: ConfigError) -> ConfigError:
    """``error`` naming the case settings ``where`` it is about (a case's own check may name its field alone:
    "factor=-1.0 is invalid ...")."""
    return error if where in str(error) else ConfigError(f"{where}: {error}")


def override(config: Any, dotted: str, value: Any, _prefix: str = "") -> Any:
    """Return ``config`` with the field at ``dotted`` (e.g. "run.model.d_model") set to ``value``.

    A path may skip the leading "run." ("model.d_model" works on an ExperimentConfig). On an
    ExperimentConfig, "arms" selects arms by name (``select_arms``) and "arms.<name>.<field>" changes
    (or adds) one arm. Errors name the full dotted field."""
    head, _, rest = dotted.partition(".")
    if isinstance(config, ExperimentConfig):
        if head in GATE_ALIASES:
            return override(config, f"arms.{GATE_ALIASES[head]}.gate{dotted[len(head):]}", value)
        if dotted == "arms":
            return select_arms(config, value)
        if head == "arms":
            return _override_arm(config, dotted, value)
    if isinstance(config, StressConfig) and head == "case_settings":
        return _override_case_settings(config, rest, value, _prefix)
    if isinstance(config, StressConfig) and dotted in FLAT_NAMES:   # stress.ramp_end_lr is stress.ramp.end_lr
        return override(config, ".".join(FLAT_NAMES[dotted]), value, _prefix)
    names = {f.name for f in fields(config)}
    if head not in names and "run" in names:
        return override(config, "run." + dotted, value, _prefix)
    full = f"{_prefix}{dotted}"
    if head not in names:
        raise ConfigError(f"{full!r} is not a config field: expected one of "
                          f"{sorted(_prefix + n for n in names)}")
    if (_prefix + head) == "run.model.gate" or (_prefix + head).endswith("model.gate"):
        raise ConfigError(f"{full!r} is not settable: each arm's gate comes from its arm definition; set "
                          f"arms.gated.gate.{rest or 'position'} (or arms.<arm>.gate.*) instead")
    current = getattr(config, head)
    if rest:
        if not is_dataclass(current):
            raise ConfigError(f"{full!r}: field {_prefix + head!r} has no sub-fields")
        return replace(config, **{head: override(current, rest, value, f"{_prefix}{head}.")})
    hint = get_type_hints(type(config))[head]
    if is_dataclass(current):
        if not isinstance(value, dict):
            raise ConfigError(f"{full}={value!r} is invalid: expected a mapping of its fields")
        for key, item in value.items():
            current = override(current, key, item, f"{_prefix}{head}.")
        return replace(config, **{head: current})
    return replace(config, **{head: _coerce(value, hint, full)})


def _named_items(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(item, dict) and isinstance(item.get("name"), str) for item in value)


def flatten(mapping: dict, prefix: str = "") -> dict[str, Any]:
    """{"run": {"model": {"d_model": 64}}} -> {"run.model.d_model": 64} (nested dicts to dotted keys).

    A list of named mappings (the arms; a TOML array of tables) becomes the list of names and each
    one's fields keyed by its name: {"arms": [{"name": "reference"}, {"name": "gated", "z_loss": 0.1}]}
    -> {"arms": "reference,gated", "arms.gated.z_loss": 0.1}."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        elif _named_items(value):
            out[f"{prefix}{key}"] = ",".join(item["name"] for item in value)
            for item in value:
                out.update(flatten({k: v for k, v in item.items() if k != "name"}, f"{prefix}{key}.{item['name']}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def load_overrides(path: str | Path) -> dict[str, Any]:
    """Read overrides from a JSON or TOML file (nested tables or dotted keys)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist: expected a JSON or TOML file")
    text = path.read_text()
    if path.suffix == ".toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"config file {str(path)!r} is not valid TOML: {error}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(f"config file {str(path)!r} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of fields")
    return flatten(data)


def resolve(preset_name: str = "smoke", overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """A preset with overrides applied, fully validated.

    The arm selection ``arms`` is applied first, wherever it stands. The other overrides are applied in
    order; one that is invalid only until another is applied (model.d_model=64 before model.n_heads=4 on
    a 12-head preset) is retried after the others, so their order does not matter (``arms.<name>.<field>``
    changes a selected arm, or adds a new one). An override that stays invalid raises its error; several
    that stay invalid raise one error naming each with its reason. Every treatment arm must train a run
    other than the reference arm's."""
    config = preset(preset_name)
    overrides = dict(overrides or {})
    if "plugins" in overrides:   # first: an extension may define the arms, cases or formats named below
        config = override(config, "plugins", overrides.pop("plugins"))
        load_extensions(config.plugins)
    if "arms" in overrides:
        defined = tuple(key.split(".")[1] for key in overrides if key.startswith("arms.") and key.count(".") >= 2)
        config = select_arms(config, overrides.pop("arms"), custom=defined)
    pending = list(overrides.items())
    while pending:
        failed: list[tuple[str, Any, ConfigError]] = []
        for dotted, value in pending:
            try:
                config = override(config, dotted, value)
            except ConfigError as error:
                failed.append((dotted, value, error))
        if len(failed) == len(pending) == 1:
            raise failed[0][2]
        if len(failed) == len(pending):
            reasons = "; ".join(f"{dotted}={value!r} ({error})" for dotted, value, error in failed)
            raise ConfigError(f"these overrides cannot hold together: {reasons}")
        pending = [(dotted, value) for dotted, value, _ in failed]
    reference = config.arm_config(REFERENCE_ARM, 0)
    for name in config.arm_names[1:]:
        if config.arm_config(name, 0) == reference:
            raise ConfigError(f"arms.{name} is invalid: it trains the same run as the reference arm (same gate and "
                              f"stabilizers): expected an arm that differs in its gate, qk_norm, z_loss, "
                              f"attn_softcap or treatments")
    return config


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready nested dict of a config."""
    return dataclasses.asdict(config)


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild a config dataclass from ``to_dict`` output (nested dataclasses and tuples; an older record's stress
    section with the schedules' flat names too; the settings of the cases that declare their own, as the
    dataclasses they declare)."""
    if cls is StressConfig:
        data = nested_names(data)
        if "case_settings" in data:
            data = {**data, "case_settings": {case: _case_settings_from_dict(case, settings)
                                              for case, settings in data["case_settings"].items()}}
    hints = get_type_hints(cls)
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value, hint = data[f.name], hints[f.name]
        if is_dataclass(hint):
            value = from_dict(hint, value)
        elif get_origin(hint) is tuple:
            item = (get_args(hint) or (None,))[0]
            value = tuple(from_dict(item, v) if is_dataclass(item) else v for v in value)
        kwargs[f.name] = value
    return cls(**kwargs)


def _case_settings_from_dict(case: str, data: dict[str, Any]) -> Any:
    """The settings of the stress case ``case`` rebuilt from a dict; ConfigError naming a case that declares
    none, or a setting it does not declare."""
    kind = type(declared_settings(case))
    names = [f.name for f in fields(kind)]
    unknown = [name for name in data if name not in names]
    if unknown:
        raise ConfigError(f"'stress.case_settings.{case}.{unknown[0]}' is not a config field: expected one of "
                          f"{sorted(f'stress.case_settings.{case}.{name}' for name in names)}")
    try:
        return from_dict(kind, data)
    except ConfigError as error:
        raise _under(f"stress.case_settings.{case}", error) from None


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the type ``hint`` as it stands (no coercion); a hint this check does not know
    (a dict, Any) fits anything."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_fits(value, option) for option in get_args(hint))
    if origin is Literal:
        return value in get_args(hint)
    if origin is tuple:
        args = [a for a in get_args(hint) if a is not Ellipsis]
        return isinstance(value, tuple) and all(_fits(v, args[0]) for v in value) if args else isinstance(value, tuple)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if is_dataclass(hint):
        return isinstance(value, hint)
    return True


def check_types(config: Any, prefix: str = "") -> None:
    """ConfigError naming the first field of the dataclass ``config`` (and of those inside it) whose value is
    not of its declared type: ``from_dict`` builds a config from data (a record, a replay bundle) without
    coercing, and a field's own checks assume its type."""
    hints = get_type_hints(type(config))
    for f in fields(config):
        value, hint = getattr(config, f.name), hints[f.name]
        name = f"{prefix}{f.name}"
        if not _fits(value, hint):
            raise ConfigError(f"{name}={value!r:.80} is invalid: expected a value of type {hint}")
        if is_dataclass(value):
            check_types(value, f"{name}.")
        elif isinstance(value, dict):   # stress.case_settings: a dataclass per case
            for key, item in value.items():
                if is_dataclass(item):
                    check_types(item, f"{name}.{key}.")
        elif isinstance(value, tuple):
            for index, item in enumerate(value):
                if is_dataclass(item):
                    check_types(item, f"{name}[{index}].")
