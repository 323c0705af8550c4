"""The factory contract the stress suites need (stability.model.contract), checked before anything trains: a
model that makes none of the observer calls the suites' figures come from, or one that ignores a gate setting
its arm has, is one error naming the block or the setting; a model that keeps the contract passes, with what
was found."""

from __future__ import annotations

import pytest

from stability import config as cfg
from stability.cases.experiment import check_arm_models
from stability.config import ConfigError


def arms(factory: str, arms: str = "gated") -> cfg.ExperimentConfig:
    return cfg.resolve("smoke", {"model.factory": f"_factories:{factory}", "arms": arms, "model.d_model": 32})


def test_a_factory_keeping_the_contract_passes_for_every_control_arm():
    found = check_arm_models(arms("harness_lm", "controls"), suites=True)
    assert [arm["arm"] for arm in found] == ["ungated", "G1-elementwise", "G1-headwise", "G1-elementwise-floor0.5",
                                             "G2-elementwise"]
    assert found[0]["observed"] == ["attn_logits", "attn_probs"] and found[0]["gate_parameters"] == 0
    assert all(arm["observed"] == ["attn_logits", "attn_probs", "gate_score"] and arm["gate_parameters"] > 0
               and arm["blocks"] == 2 for arm in found[1:])


@pytest.mark.parametrize(("factory", "arm_set", "said"), [
    ("tiny_lm", "gated", (r"block 0 \(inner\.layers\.0\) of the ungated arm never calls observer\('attn_logits', "
                          r"tensor\): expected each attention module to have an `observer` attribute")),
    ("hides_the_gate_score", "gated", (r"block 0 \(blocks\.0\) of the G1-elementwise arm never calls "
                                       r"observer\('gate_score', tensor\)")),
    ("reads_only_enabled", "gated_headwise", (r"does not honour gate\.granularity='headwise' of the G1-headwise arm: "
                                              r"it built the same model as with gate\.granularity='elementwise'")),
    ("reads_only_enabled", "gated_floored", r"does not honour gate\.floor=0\.5 of the G1-elementwise-floor0\.5 arm"),
    ("reads_only_enabled", "gated_value", r"does not honour gate\.position='G2'"),
])
def test_a_factory_breaking_the_suites_contract_is_one_error_naming_it(factory, arm_set, said):
    config = arms(factory, arm_set)
    with pytest.raises(ConfigError, match=said) as error:
        check_arm_models(config, suites=True)
    assert "\n" not in str(error.value) and f"model.factory='_factories:{factory}'" in str(error.value)


def test_outside_the_suites_the_observer_calls_stay_optional():
    """``stability run`` trains a model without observer calls (its attention figures are absent, not invented):
    only the suites, whose figures come from those calls, require them."""
    found = check_arm_models(arms("tiny_lm"))
    assert [arm["observed"] for arm in found] == [[], []]
