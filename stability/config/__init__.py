"""Typed, validated configuration and the named scale presets.

Every config is a frozen dataclass checked in ``__post_init__``: a bad value raises ``ConfigError``
naming the field, the value and what was expected, before any training starts. The modules:

    errors.py      ConfigError and the checks the configs use
    run.py         one arm's run: GateConfig, ModelConfig, DataConfig, OptimConfig, PrecisionConfig,
                   ProbeConfig, FaultConfig, DistributedConfig, CheckpointConfig, RunConfig
    schedules.py   the per-step schedules (Standard, ExponentialRamp, BatchRamp, Shock): the LR and batch size
                   at each step; the stress cases' schedules are also their settings (StressConfig.ramp ...)
    stress.py      StressConfig, the settings of the stress cases; declare_case_settings, the settings a case
                   declares with itself (stress.case_settings.<case>.<name>)
    arms.py        ArmConfig, the named arms (NAMED_ARMS) and arm sets (ARM_SETS)
    experiment.py  ExperimentConfig (the run, its arms, seeds ...) and ExtrapolationConfig
    presets.py     the presets smoke, ci and full
    overrides.py   resolve(preset, overrides), override, select_arms, flatten, load_overrides,
                   to_dict, from_dict

Names that a registry of another package defines (training formats, quantization schemes, stress
cases) are checked by that registry, once, before any work (``stability.cli.options``): this package
imports nothing of the others. ``from stability import config as cfg; cfg.ExperimentConfig`` reaches
everything.
"""

from stability.config import extensions
from stability.config.arms import (
    ARM_NAME,
    ARM_SETS,
    NAMED_ARMS,
    OLD_REFERENCE_ARM,
    PAPER_GATE,
    REFERENCE_ARM,
    SOFTCAP,
    Z_LOSS,
    ArmConfig,
    current_arm_name,
)
from stability.config.errors import ConfigError, check, check_strength, is_number, positive_finite
from stability.config.experiment import ROPE_SCALINGS, ExperimentConfig, ExtrapolationConfig
from stability.config.overrides import (
    GATE_ALIASES,
    flatten,
    from_dict,
    load_overrides,
    override,
    resolve,
    select_arms,
    to_dict,
)
from stability.config.presets import PRESETS, preset
from stability.config.run import (
    BACKENDS,
    DISTRIBUTED_STRATEGIES,
    FAULT_KINDS,
    FP8_RECIPES,
    FP8_SCALINGS,
    GATE_ACTIVATIONS,
    GATE_GRANULARITIES,
    GATE_MODES,
    GATE_POSITIONS,
    HF_CONFIGS,
    INITS,
    LR_SCHEDULES,
    MODEL_FAMILIES,
    MODEL_SOURCES,
    OPTIMIZERS,
    CheckpointConfig,
    DataConfig,
    DistributedConfig,
    FaultConfig,
    GateConfig,
    ModelConfig,
    OptimConfig,
    PrecisionConfig,
    ProbeConfig,
    RunConfig,
)
from stability.config.schedules import (
    LR_SCALING_RULES,
    SHOCK_KINDS,
    BatchRamp,
    ExponentialRamp,
    Schedule,
    Shock,
    Standard,
    lr_scale,
    warmup_cosine,
)
from stability.config.stress import (
    FLAT_NAMES,
    LADDER,
    REFERENCE_PRECISION,
    StressConfig,
    declare_case_settings,
    declared_settings,
    flat_names,
    nested_names,
)

__all__ = [
    "ARM_NAME", "ARM_SETS", "BACKENDS", "DISTRIBUTED_STRATEGIES", "FAULT_KINDS", "FLAT_NAMES", "FP8_RECIPES",
    "FP8_SCALINGS", "GATE_ACTIVATIONS", "GATE_ALIASES", "GATE_GRANULARITIES", "GATE_MODES", "GATE_POSITIONS",
    "HF_CONFIGS", "INITS", "LADDER", "LR_SCALING_RULES", "LR_SCHEDULES", "MODEL_FAMILIES", "MODEL_SOURCES",
    "NAMED_ARMS", "OLD_REFERENCE_ARM", "OPTIMIZERS", "PAPER_GATE", "PRESETS", "REFERENCE_ARM", "REFERENCE_PRECISION",
    "ROPE_SCALINGS", "SHOCK_KINDS", "SOFTCAP", "Z_LOSS", "ArmConfig", "BatchRamp", "CheckpointConfig", "ConfigError",
    "DataConfig", "DistributedConfig", "ExperimentConfig", "ExponentialRamp", "ExtrapolationConfig", "FaultConfig",
    "GateConfig", "ModelConfig", "OptimConfig", "PrecisionConfig", "ProbeConfig", "RunConfig", "Schedule", "Shock",
    "Standard", "StressConfig", "check", "check_strength", "current_arm_name", "declare_case_settings",
    "declared_settings", "extensions", "flat_names", "flatten", "from_dict", "is_number", "load_overrides",
    "lr_scale", "nested_names", "override", "positive_finite", "preset", "resolve", "select_arms", "to_dict",
    "warmup_cosine"
]
