"""A stress case's own settings are declared with the case (``StressCase(..., settings=...)``): registering it
declares them to the config, ``--set stress.case_settings.<case>.<name>=VALUE`` sets one, a record's config
rebuilds them, and the configs of the built-in cases (which declare none) fingerprint as before."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from stability import config as cfg
from stability.cases.stress import CASES, StressCase, register
from stability.cli.options import parse_sets
from stability.config import (
    ConfigError,
    ExperimentConfig,
    flatten,
    from_dict,
    load_overrides,
    resolve,
    to_dict,
)
from stability.config.overrides import check_types
from stability.config.stress import DECLARED_SETTINGS
from stability.record import cases as record_cases
from stability.record import comparable_config, config_fingerprint

BASELINES = Path(__file__).resolve().parents[1] / "reports" / "baselines"


@dataclass(frozen=True)
class DoubleLr:
    """The toy case's settings: the factor its peak LR is multiplied by."""

    factor: float = 2.0

    def __post_init__(self) -> None:
        cfg.check(cfg.positive_finite(self.factor), "factor", self.factor, "a positive finite number")


def scaled_lr(config):
    """The toy case's config: the peak LR times its factor, read from the config."""
    factor = config.stress.settings_of("lr_factor_toy").factor
    return replace(config, run=replace(config.run, optim=replace(config.run.optim, lr=factor * config.run.optim.lr)))


@pytest.fixture
def lr_factor_toy():
    """The toy case registered with its settings; the registries it fills restored afterwards (they are
    process-wide, and the tests of one worker share them)."""
    tables = (CASES, record_cases.RECORDED_CASES, DECLARED_SETTINGS)
    saved = [dict(table) for table in tables]
    yield register(StressCase("lr_factor_toy", lambda run: None, prepare=scaled_lr, settings=DoubleLr()))
    for table, content in zip(tables, saved):
        table.clear()
        table.update(content)


def test_registering_a_case_declares_its_settings_at_their_defaults(lr_factor_toy):
    config = resolve("smoke")
    assert config.stress.case_settings == {} and config.stress.settings_of("lr_factor_toy") == DoubleLr()
    assert lr_factor_toy.prepare(config).run.optim.lr == 2 * config.run.optim.lr
    with pytest.raises(ValueError, match="'lr_factor_toy' declares its settings already"):
        cfg.declare_case_settings("lr_factor_toy", DoubleLr(3.0))
    with pytest.raises(ValueError, match=r"settings=\{'factor': 2.0\} is invalid: expected an instance of a frozen"):
        register(StressCase("loose", lambda run: None, settings={"factor": 2.0}))
    assert "loose" not in CASES and "loose" not in DECLARED_SETTINGS   # refused before anything was added


def test_a_setting_is_set_as_set_and_a_settings_file_set_it_and_the_case_reads_it(lr_factor_toy, tmp_path):
    config = resolve("smoke", parse_sets(["stress.case_settings.lr_factor_toy.factor=3"]))
    assert config.stress.settings_of("lr_factor_toy") == DoubleLr(3.0)
    assert lr_factor_toy.prepare(config).run.optim.lr == 3 * config.run.optim.lr
    table = tmp_path / "stability.toml"
    table.write_text("[stress.case_settings.lr_factor_toy]\nfactor = 3\n")
    assert load_overrides(table) == {"stress.case_settings.lr_factor_toy.factor": 3}
    assert resolve("smoke", load_overrides(table)) == config
    assert resolve("smoke", {"stress": {"case_settings": {"lr_factor_toy": {"factor": 3}}}}) == config
    # set back to its default, a setting leaves no trace: the config is the preset's
    assert resolve("smoke", {"stress.case_settings.lr_factor_toy.factor": "2"}) == resolve("smoke")


def test_a_config_with_case_settings_round_trips_through_its_record_form(lr_factor_toy):
    config = resolve("smoke", {"stress.case_settings.lr_factor_toy.factor": "3"})
    back = from_dict(ExperimentConfig, json.loads(json.dumps(to_dict(config))))
    check_types(back)
    assert back == config and type(back.stress.settings_of("lr_factor_toy")) is DoubleLr


@pytest.mark.parametrize("dotted, value, message", [
    ("stress.case_settings.nope.factor", "3", r"case_settings\.nope is unknown: .* expected one of \(.*'lr_factor_toy'"),
    ("stress.case_settings.lr_factor_toy.speed", "3", (r"lr_factor_toy\.speed' is not a config field: expected one of "
                                                   r"\['stress\.case_settings\.lr_factor_toy\.factor'\]")),
    ("stress.case_settings.lr_factor_toy.factor", "-1", r"lr_factor_toy: factor=-1\.0 is invalid: expected a positive finite"),
    ("stress.case_settings.lr_factor_toy.factor", "fast", r"lr_factor_toy\.factor='fast' is invalid: expected a number"),
    ("stress.case_settings.lr_factor_toy", "3", r"lr_factor_toy='3' is invalid: expected a mapping of its settings"),
])
def test_a_bad_case_setting_names_the_value_and_what_was_expected(lr_factor_toy, dotted, value, message):
    with pytest.raises(ConfigError, match=message):
        resolve("smoke", {dotted: value})


def test_a_record_config_with_settings_nobody_declares_is_refused_naming_them(lr_factor_toy):
    record_config = to_dict(resolve("smoke", {"stress.case_settings.lr_factor_toy.factor": "3"}))
    record_config["stress"]["case_settings"]["lr_factor_toy"]["speed"] = 1
    with pytest.raises(ConfigError, match=r"'stress\.case_settings\.lr_factor_toy\.speed' is not a config field"):
        from_dict(ExperimentConfig, record_config)
    record_config["stress"]["case_settings"] = {"gone": {"factor": 3.0}}
    with pytest.raises(ConfigError, match=r"stress\.case_settings\.gone is unknown"):
        from_dict(ExperimentConfig, record_config)


@pytest.mark.parametrize("baseline", sorted(BASELINES.glob("*.json")), ids=lambda path: path.name)
def test_the_built_in_cases_configs_fingerprint_as_the_committed_baselines_store(lr_factor_toy, baseline):
    """The new field leaves no trace while empty, a case with settings registered or not: each case of a
    committed baseline has the fingerprint stored for it (computed from the preset, prepared by its case)."""
    stored = json.loads(baseline.read_text())
    config = resolve(stored["preset"])
    assert "case_settings" not in " ".join(flatten(to_dict(config)))
    by_label = {case.label(config): case for case in CASES.values()}
    for key, entry in stored["cases"].items():
        case = by_label[key.split("/", 1)[1]]
        prepared = case.prepare(config) if case.prepare is not None else config
        assert config_fingerprint(to_dict(prepared)) == entry["fingerprint"], key


def test_a_non_default_setting_shows_in_the_flattened_config(lr_factor_toy):
    plain, tripled = resolve("smoke"), resolve("smoke", {"stress.case_settings.lr_factor_toy.factor": "3"})
    assert flatten(to_dict(tripled))["stress.case_settings.lr_factor_toy.factor"] == 3.0
    changed = {k for k, v in comparable_config(to_dict(tripled)).items() if comparable_config(to_dict(plain)).get(k) != v}
    assert changed == {"stress.case_settings.lr_factor_toy.factor"}
    assert config_fingerprint(to_dict(tripled)) != config_fingerprint(to_dict(plain))
