"""Arms: what each arm of an experiment changes on top of the shared run, the named arms and the named sets.

An experiment trains the reference arm and any number of treatment arms side by side, each a named
``ArmConfig`` (a gate, QK-norm, z-loss, attention soft-capping) applied on top of the one shared run.
``NAMED_ARMS`` holds the named arms and ``ARM_SETS`` named groups of them (docs/arms-and-controls.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from stability.config.errors import check, check_strength
from stability.config.run import GateConfig, RunConfig

REFERENCE_ARM = "reference"  # the reference arm: every other arm is compared with it
# its name before schema 3 records (a record or override of that time still reads); no arm may take it, since
# "baseline" names the document a job is judged against
OLD_REFERENCE_ARM = "baseline"


def current_arm_name(name: str) -> str:
    """An arm's name as it is today: the reference arm's old name read as its name."""
    return REFERENCE_ARM if name == OLD_REFERENCE_ARM else name


@dataclass(frozen=True)
class ArmConfig:
    """One arm of an experiment: what it changes on top of the shared run.

    gate: the arm's attention gate (position "none": no gate). qk_norm, z_loss, attn_softcap:
    the arm's stabilizers, each None to keep the shared run's ``model.qk_norm``,
    ``optim.z_loss`` and ``model.attn_softcap``. treatments: names of registered mechanisms applied to the
    arm's built model (``stability.model.treatments``: a stabilizer of your own), None to keep the shared
    run's ``model.treatments``. Everything else (model shape, data, optimiser,
    seeds) is shared, so arms of a seed read the same batches and start from the same values in
    every parameter they have in common.
    """

    name: str
    gate: GateConfig = field(default_factory=GateConfig)
    qk_norm: bool | None = None
    z_loss: float | None = None
    attn_softcap: float | None = None
    treatments: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check(isinstance(self.name, str) and ARM_NAME.fullmatch(self.name) is not None, "arm name", self.name,
              "letters, digits and '_', starting with a letter (it names records, rows and MLflow runs)")
        check(self.name not in ARM_SETS, "arm name", self.name,
              f"a name that is not an arm set ({', '.join(ARM_SETS)})")
        check(self.name != OLD_REFERENCE_ARM, "arm name", self.name,
              f"another name: {OLD_REFERENCE_ARM!r} names the document a job is judged against (the reference "
              f"arm is {REFERENCE_ARM!r})")
        if self.z_loss is not None:
            check_strength(self.z_loss, f"arms.{self.name}.z_loss", "coefficient")
        if self.attn_softcap is not None:
            check_strength(self.attn_softcap, f"arms.{self.name}.attn_softcap", "cap")

    def apply(self, run: RunConfig) -> RunConfig:
        """``run`` with this arm's gate and stabilizers."""
        model = replace(run.model, gate=self.gate,
                        qk_norm=run.model.qk_norm if self.qk_norm is None else self.qk_norm,
                        attn_softcap=run.model.attn_softcap if self.attn_softcap is None else self.attn_softcap,
                        treatments=run.model.treatments if self.treatments is None else self.treatments)
        optim = run.optim if self.z_loss is None else replace(run.optim, z_loss=self.z_loss)
        return replace(run, model=model, optim=optim)


ARM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
PAPER_GATE = GateConfig(position="G1")  # Qiu et al.'s recommendation: elementwise, head-specific, sigmoid
Z_LOSS = 1e-4      # PaLM's z-loss coefficient
SOFTCAP = 50.0     # Gemma 2's attention-logit soft-cap

# named groups of treatment arms: ``arms=controls`` trains the reference arm and these
ARM_SETS: dict[str, tuple[str, ...]] = {
    "pair": ("gated",),
    "controls": ("gated", "gated_headwise", "gated_floored", "gated_value"),
    "stabilizers": ("gated", "qk_norm", "z_loss", "softcap"),
    "stabilizers_gated": ("gated", "gated_qk_norm", "gated_z_loss", "gated_softcap"),
}


NAMED_ARMS: dict[str, ArmConfig] = {arm.name: arm for arm in (
    ArmConfig(REFERENCE_ARM),
    # the gate and the paper's controls (Qiu et al. 2025: G1 elementwise; headwise; floored; G2 value gate)
    ArmConfig("gated", gate=PAPER_GATE),
    ArmConfig("gated_headwise", gate=GateConfig(position="G1", granularity="headwise")),
    ArmConfig("gated_floored", gate=GateConfig(position="G1", floor=0.5)),
    ArmConfig("gated_value", gate=GateConfig(position="G2")),
    # the usual stabilizers, alone and with the gate
    ArmConfig("qk_norm", qk_norm=True),
    ArmConfig("z_loss", z_loss=Z_LOSS),
    ArmConfig("softcap", attn_softcap=SOFTCAP),
    ArmConfig("gated_qk_norm", gate=PAPER_GATE, qk_norm=True),
    ArmConfig("gated_z_loss", gate=PAPER_GATE, z_loss=Z_LOSS),
    ArmConfig("gated_softcap", gate=PAPER_GATE, attn_softcap=SOFTCAP),
)}
