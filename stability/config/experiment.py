"""``ExperimentConfig``: a paired experiment (the run, its arms, seeds, stress settings, post-training
quantization and length extrapolation), and ``ExtrapolationConfig``."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from stability.config.arms import NAMED_ARMS, REFERENCE_ARM, ArmConfig
from stability.config.errors import ConfigError, check, is_number
from stability.config.extensions import check_spec
from stability.config.run import RunConfig
from stability.config.stress import StressConfig

ROPE_SCALINGS = ("ntk", "none")


@dataclass(frozen=True)
class ExtrapolationConfig:
    """The length-extrapolation probe, run on every arm after training (off while ``factors`` is empty).

    factors: evaluation lengths as multiples of ``model.context`` (1 is always evaluated; 2 and 4
    are the usual). At each length the held-out loss, F-Attn and sink rate are measured with the
    plain rotary tables extended to that length, and (``scaling="ntk"``) with NTK-aware scaled RoPE
    (base ``theta * s ** (d / (d - 2))`` for factor s and head dim d; Peng et al. 2023, YaRN, sec. 3.1).
    eval_batches: held-out batches of ``data.batch_size`` sequences per length.
    """

    factors: tuple[float, ...] = ()
    scaling: str = "ntk"
    eval_batches: int = 4

    def __post_init__(self) -> None:
        check(all(is_number(f) and f >= 1 for f in self.factors), "extrapolation.factors", self.factors,
              "factors >= 1 (multiples of model.context; 1 is the training context)")
        check(len(set(self.factors)) == len(self.factors), "extrapolation.factors", self.factors,
              "distinct factors")
        check(self.scaling in ROPE_SCALINGS, "extrapolation.scaling", self.scaling, f"one of {ROPE_SCALINGS}")
        check(isinstance(self.eval_batches, int) and self.eval_batches > 0, "extrapolation.eval_batches",
              self.eval_batches, "a positive integer")

    @property
    def enabled(self) -> bool:
        return bool(self.factors)

    def lengths(self, context: int) -> list[tuple[float, int]]:
        """(factor, sequence length) of every evaluated length, 1 first."""
        return [(f, round(context * f)) for f in sorted({1.0, *map(float, self.factors)})]


def _default_arms() -> tuple[ArmConfig, ...]:
    return NAMED_ARMS[REFERENCE_ARM], NAMED_ARMS["gated"]


@dataclass(frozen=True)
class ExperimentConfig:
    """A paired experiment: the same run under each arm (the reference arm first), for several seeds."""

    name: str = "pair"
    preset: str = "custom"
    run: RunConfig = field(default_factory=RunConfig)
    arms: tuple[ArmConfig, ...] = field(default_factory=_default_arms)
    seeds: tuple[int, ...] = (0,)
    quant_schemes: tuple[str, ...] = ()
    extrapolation: ExtrapolationConfig = field(default_factory=ExtrapolationConfig)
    stress: StressConfig = field(default_factory=StressConfig)
    replicates: int = 4  # rounding replicates per run of a regression baseline (stability baseline make; the presets')
    plugins: tuple[str, ...] = ()  # extensions imported before any work (stability.config.extensions)

    def __post_init__(self) -> None:
        for name in self.plugins:
            check_spec(name)
        check(len(set(self.plugins)) == len(self.plugins), "plugins", self.plugins, "distinct extensions")
        check(isinstance(self.replicates, int) and not isinstance(self.replicates, bool) and self.replicates >= 2,
              "replicates", self.replicates, "an integer >= 2 (rounding replicates per run of a baseline)")
        check(len(self.seeds) > 0 and len(set(self.seeds)) == len(self.seeds), "seeds", self.seeds,
              "a non-empty tuple of distinct seeds")
        check(all(isinstance(s, str) and s != "" for s in self.quant_schemes), "quant_schemes", self.quant_schemes,
              "names of post-training quantization schemes (stability.evaluate.quantize.SCHEMES)")
        model = self.run.model
        check(not self.quant_schemes or model.kind == "harness", "quant_schemes",
              self.quant_schemes, "() unless the model is the harness's own (model.source='harness', no factory)")
        rope_model = model.kind == "harness" and model.family == "llama"
        check(not self.extrapolation.enabled or rope_model, "extrapolation.factors", self.extrapolation.factors,
              "() unless the model is the harness's own RoPE model (model.source='harness', no factory, "
              "model.family='llama')")
        names = self.arm_names
        check(len(names) >= 2 and names[0] == REFERENCE_ARM, "arms", names,
              f"the {REFERENCE_ARM!r} arm first and at least one treatment arm")
        twice = sorted({n for n in names if names.count(n) > 1})
        check(not twice, "arms", names, f"distinct arm names (used twice: {', '.join(twice)})")
        for arm in self.arms:  # every arm's run must be valid on its own (e.g. no soft-cap with triton)
            try:
                arm.apply(self.run)
            except ConfigError as error:
                raise ConfigError(f"arm {arm.name!r}: {error}") from None

    @property
    def arm_names(self) -> tuple[str, ...]:
        return tuple(arm.name for arm in self.arms)

    def arm(self, name: str) -> ArmConfig:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ConfigError(f"arm={name!r} is invalid: expected one of this experiment's arms {self.arm_names}")

    def arm_config(self, arm: str, seed: int) -> RunConfig:
        """The run config of one arm (by name) at one seed."""
        return replace(self.arm(arm).apply(self.run), seed=seed)

