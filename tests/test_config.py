"""Configs are validated at construction and round-trip through the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stability.config import (
    FLAT_NAMES,
    ConfigError,
    ExperimentConfig,
    GateConfig,
    ModelConfig,
    flatten,
    from_dict,
    load_overrides,
    resolve,
    to_dict,
)


@pytest.mark.parametrize("preset", ["smoke", "ci", "gpu-pr", "full", "sink"])
def test_every_preset_is_valid_and_round_trips_through_a_dict(preset):
    config = resolve(preset)
    assert from_dict(ExperimentConfig, to_dict(config)) == config


def test_dotted_overrides_reach_nested_fields_and_coerce_types():
    config = resolve("smoke", {"model.d_model": "96", "run.optim.lr": "1e-2", "seeds": "0,1,2",
                               "gated_gate.granularity": "headwise", "model.qk_norm": "true"})
    assert config.run.model.d_model == 96 and config.run.optim.lr == 0.01 and config.seeds == (0, 1, 2)
    assert config.arm("gated").gate.granularity == "headwise" and config.run.model.qk_norm is True


@pytest.mark.parametrize("dotted, value, message", [
    ("model.d_model", "abc", "run.model.d_model='abc' is invalid: expected an integer"),
    ("model.qk_norm", "maybe", "expected true or false"),
    ("seeds", "0,0", "distinct seeds"),
    ("gated_gate.position", "none", "trains the same run as the reference arm"),
    ("nothing.here", 1, "not a config field"),
])
def test_bad_overrides_name_the_field_and_what_was_expected(dotted, value, message):
    with pytest.raises(ConfigError, match=message):
        resolve("smoke", {dotted: value})


def test_g5_takes_no_heads():
    with pytest.raises(ConfigError, match="G5"):
        GateConfig(position="G5", granularity="headwise")


def test_gqa_needs_kv_heads_dividing_heads():
    with pytest.raises(ConfigError, match="n_kv_heads=3 is invalid: expected a divisor of model.n_heads=4"):
        ModelConfig(d_model=64, n_heads=4, n_kv_heads=3)


def test_overrides_file_must_exist_and_parse(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_overrides(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_overrides(bad)
    good = tmp_path / "good.json"
    good.write_text('{"model": {"d_model": 32}, "steps": 5}')
    assert load_overrides(good) == {"model.d_model": 32, "steps": 5}


def test_overrides_apply_in_any_order_and_a_lasting_error_still_names_its_field():
    # d_model=64 is invalid next to the preset's 12 heads until n_heads=4 is applied after it
    config = resolve("full", {"model.d_model": 64, "model.n_heads": 4, "model.n_kv_heads": 2})
    assert (config.run.model.d_model, config.run.model.n_heads, config.run.model.n_kv_heads) == (64, 4, 2)
    with pytest.raises(ConfigError, match=r"cannot hold together: model\.d_model=64 \(model\.n_heads=12 is invalid: "
                                          r"expected a divisor of model\.d_model=64.*; model\.n_heads=5 "):
        resolve("full", {"model.d_model": 64, "model.n_heads": 5})
    with pytest.raises(ConfigError, match=r"^model\.n_heads=4 is invalid: expected a divisor of model\.d_model=66"):
        resolve("full", {"model.n_heads": 4, "model.n_kv_heads": 2, "model.d_model": 66})


def test_one_table_says_what_may_differ_when_resuming_and_when_comparing():
    """FIELDS_ABOUT names real fields; resuming lets only how a run is kept and what is evaluated after
    training differ, the check the seeds and the rounding replicate, the device and the names (and how a run is
    kept)."""
    from stability.record import FIELDS_ABOUT, comparable_config, resume_config

    config = to_dict(resolve("smoke"))
    flat = flatten(config)
    assert all(any(k == field or (field.endswith(".") and k.startswith(field)) for k in flat) for field in FIELDS_ABOUT)
    other = to_dict(resolve("smoke", {"checkpoint.every": 7, "seeds": "5", "seed": 3, "device": "cuda:1", "name": "x",
                                      "run.replicate": 2, "replicates": 3}))
    assert comparable_config(other) == comparable_config(config)
    assert {k for k in resume_config(other) if resume_config(other)[k] != resume_config(config)[k]} == {
        "seeds", "run.seed", "run.device", "name", "run.replicate", "replicates"}
    quantized = to_dict(resolve("smoke", {"quant_schemes": "int8"}))   # measured after training: resumable, compared
    assert resume_config(quantized) == resume_config(config) and comparable_config(quantized) != comparable_config(config)
    assert "run.checkpoint.every" not in resume_config(other) and "run.checkpoint.every" not in comparable_config(other)
    assert "run.optim.lr" in resume_config(config) and "run.optim.lr" in comparable_config(config)


def flat_stress(config: dict) -> dict:
    """``config`` (a dict) with its stress section in the layout records had before the schedules were
    sub-configs: {"ramp": {"end_lr": 5.0}} -> {"ramp_end_lr": 5.0}."""
    stress = {k: v for k, v in config["stress"].items() if k not in ("ramp", "batch", "shock")}
    stress.update({flat: config["stress"][section][name] for flat, (section, name) in FLAT_NAMES.items()})
    return {**config, "stress": stress}


def test_the_stress_schedules_older_flat_names_still_work():
    """--set stress.shock_step=... (and the other flat names) set the sub-configs; a record's config written with
    them reads back as the same config and compares equal, by the same fingerprint as the baselines made then."""
    overrides = {"stress.ramp.start_lr": 1e-3, "stress.ramp.end_lr": 5.0, "stress.batch.double_every": 7,
                 "stress.batch.max_size": 64, "stress.batch.lr_rule": "linear", "stress.shock.kind": "no_warmup",
                 "stress.shock.at_step": 9, "stress.shock.factor": 4.0}
    older = {f"stress.{flat}": overrides[f"stress.{section}.{name}"] for flat, (section, name) in FLAT_NAMES.items()}
    config = resolve("smoke", overrides)
    assert resolve("smoke", older) == config and len(older) == len(overrides)
    with pytest.raises(ConfigError, match=r"^stress\.shock\.at_step=-1 is invalid"):
        resolve("smoke", {"stress.shock_step": -1})
    old_record_config = flat_stress(to_dict(config))
    assert "shock_step" in old_record_config["stress"] and "shock" not in old_record_config["stress"]
    assert from_dict(ExperimentConfig, old_record_config) == config
    from stability.record import comparable_config, config_fingerprint, resume_config

    assert config_fingerprint(old_record_config) == config_fingerprint(to_dict(config))
    assert resume_config(old_record_config) == resume_config(to_dict(config))
    assert comparable_config(to_dict(config))["stress.shock_step"] == 9   # the names baselines compare by
    # the committed smoke baseline compares by the same fingerprint (its stored config, fields added since at their
    # defaults: what `stability check` recomputes when the fingerprint stored beside it predates a field)
    baseline = json.loads((Path(__file__).resolve().parents[1] / "reports/baselines/smoke-cpu.json").read_text())
    from stability.evaluate.quantize import SCHEMES

    quantized = resolve("smoke", {"quant_schemes": ",".join(SCHEMES)})   # the plain pair's (stability/cases/standard.py)
    stored = {name: config_fingerprint(case["config"]) for name, case in baseline["cases"].items()}
    assert stored.pop("smoke/standard") == config_fingerprint(to_dict(quantized))
    assert set(stored.values()) == {config_fingerprint(to_dict(resolve("smoke")))}


def test_a_baseline_config_written_before_a_field_existed_compares_equal():
    from stability.record import comparable_config, config_fingerprint

    current = to_dict(resolve("smoke"))
    old = json.loads(json.dumps(current))
    for name in ("family", "source", "factory", "head_dim", "rope_fraction", "gate_in_q"):
        del old["run"]["model"][name]  # fields added since
    assert config_fingerprint(old) == config_fingerprint(current)
    old["run"]["model"]["d_model"] = 96
    assert comparable_config(old)["run.model.d_model"] == 96 and config_fingerprint(old) != config_fingerprint(current)
