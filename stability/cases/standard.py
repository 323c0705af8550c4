"""The plain pair (``standard``): every arm of the config at the preset's settings, what ``stability run`` and
``stability stress standard`` train. It is quantized after training with every registered post-training
scheme (those the device cannot run are recorded as skipped, with the reason), so the damage per scheme and
arm (``quant_<scheme>_kl``, ``quant_<scheme>_damage_loss``) is in the baseline and in every job
(docs/quantization.md); a repository's own model (a factory) is not quantized.
"""

from __future__ import annotations

from dataclasses import replace

from stability import config as cfg
from stability.cases.case import StressCase, cpu_threads
from stability.cases.checks import arm_names, gated, learns, require


def run_standard(stress_case: StressCase, config: cfg.ExperimentConfig, session=None, runner=None) -> dict:
    """The plain pair (every arm of the config) at the preset's settings: what ``stability run`` and
    ``stability stress standard`` run."""
    from stability.cases.experiment import run_pair  # training imports torch when the case runs

    with cpu_threads(config.stress.threads):
        return run_pair(quantized_by_default(config), session=session, runner=runner)


def quantized_by_default(config: cfg.ExperimentConfig) -> cfg.ExperimentConfig:
    """The plain pair of the harness's own model is quantized after training with every registered scheme
    (``stability.evaluate.quantize.SCHEMES``) unless the config names its schemes: the damage per scheme
    and arm is in every baseline and job (docs/quantization.md). A repository's own model (a factory or a
    Hugging Face config) is left as it is."""
    if config.quant_schemes or config.run.model.kind != "harness":
        return config
    from stability.evaluate.quantize import SCHEMES

    return replace(config, quant_schemes=tuple(SCHEMES))


# ----------------------------------------------------------------------------- what its record must show

def both_arms_complete_and_learn(record, invariant):
    """Every arm of the config trained every seed (an assertion); each completes and learns (model invariants)."""
    trained = sorted((a["arm"], a["seed"]) for a in record["arms"])
    expected = sorted((name, seed) for name in arm_names(record) for seed in record["config"]["seeds"])
    require(trained == expected, f"runs trained {trained}, expected {expected}")
    for arm in record["arms"]:
        learns(record, arm, arm["series"]["loss"][0], invariant)


def the_gated_arm_carries_a_gate_and_reports_its_score(record, invariant):
    """An arm has gate parameters and a gate score exactly when its config gives it a gate; the mean gate
    value lies strictly between 0 (closed) and 1 (open) (a model invariant)."""
    for arm in record["arms"]:
        on = gated(record, arm["arm"])
        score = arm["final"]["gate_score_mean"]
        require((arm["gate_parameters"] > 0) == on and (score is not None) == on,
                f"{arm['arm']} seed {arm['seed']}: gate {'on' if on else 'off'} in the config, "
                f"{arm['gate_parameters']} gate parameters, gate score {score}")
        if on:
            invariant(record, "gate_score_within_0_1", arm["arm"], arm["seed"], 0.0 < score < 1.0, score,
                      message="mean gate value strictly between 0 (closed) and 1 (open)")


def every_scheme_is_measured_or_skipped_with_its_reason(record, invariant):
    """Each arm of the quantized pair holds, per registered scheme, its KL and loss damage, or why it was
    skipped; at least one scheme ran on every device."""
    for arm in record["arms"]:
        schemes = (arm.get("quant") or {}).get("schemes")
        if schemes is None:
            require(not record["config"]["quant_schemes"], "the pair was asked to quantize and holds no result")
            continue
        ran = [name for name, result in schemes.items() if "skipped" not in result]
        require(ran, f"no scheme ran: {schemes}")
        for name, result in schemes.items():
            require(result.get("skipped") or (f"quant_{name}_kl" in arm["final"] and result["kl"] >= 0),
                    f"{arm['arm']} seed {arm['seed']}: scheme {name}: {result}")


CASE = StressCase("standard", run_standard, title="standard pair",
                  reported=lambda record: ["heldout_loss", "m_act_mean", "f_attn_mean", "sink_rate_mean",
                                           "max_attn_logit", "loss_spike_score"],
                  checks=(both_arms_complete_and_learn, the_gated_arm_carries_a_gate_and_reports_its_score,
                          every_scheme_is_measured_or_skipped_with_its_reason))
