"""``StressConfig``: the settings of the stress cases (``stability.cases.stress``) and their schedules."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from stability.config.errors import check

LR_SCALING_RULES = ("none", "linear", "sqrt")
SHOCK_KINDS = ("jump", "no_warmup")
# the precision ladder's rungs unless stress.precisions says otherwise: every training format the harness
# ships (stability.precision.FORMATS), fp32 first
LADDER = ("fp32", "bf16", "fp16", "fp8", "mxfp8", "mxfp4")


@dataclass(frozen=True)
class StressConfig:
    """Settings of the stress cases (``stability.cases.stress``) and their schedules (``stability.train.schedules``).

    sweep_lrs: peak LRs of the learning-rate sweep, increasing (a log grid; Wortsman et al. 2023 use
        3e-4 ... 3e-1). ramp_start_lr / ramp_end_lr: the LR range test rises exponentially from start to
        end over ``run.steps`` (no warmup) until the arm diverges. batch_double_every / batch_max_size /
        batch_lr_rule: the batch ramp doubles the batch every N steps up to the cap and scales the LR by
        the batch growth ("none"), its square root ("sqrt") or linearly ("linear"). shock_kind "jump"
        multiplies the LR by ``shock_factor`` from ``shock_step`` to the end; "no_warmup" starts at the
        peak LR with no warmup (shock at step 0). recovery_smoothing: steps of the rolling mean used to
        decide that the loss is back to its pre-shock level. precisions: the rungs of the precision
        ladder, fp32 first, each a training format of ``stability.precision.FORMATS`` (the gaps are measured against it). ladder_steps: steps of each rung (0: the
        run's ``steps``; fewer keep a CPU ladder affordable). threads: CPU intra-op threads while a
        stress case runs (fixed so CPU figures are reproducible; 0 leaves torch's setting alone).
    """

    sweep_lrs: tuple[float, ...] = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
    ramp_start_lr: float = 1e-4
    ramp_end_lr: float = 10.0
    batch_double_every: int = 50
    batch_max_size: int = 256
    batch_lr_rule: str = "sqrt"
    shock_kind: str = "jump"
    shock_step: int = 100
    shock_factor: float = 10.0
    recovery_smoothing: int = 5
    precisions: tuple[str, ...] = LADDER
    ladder_steps: int = 0
    threads: int = 0

    def __post_init__(self) -> None:
        lrs = self.sweep_lrs
        check(len(lrs) > 0 and all(isinstance(v, (int, float)) and 0 < v and math.isfinite(v) for v in lrs)
              and all(a < b for a, b in itertools.pairwise(lrs)), "stress.sweep_lrs", lrs,
              "a non-empty, strictly increasing tuple of positive finite learning rates")
        check(isinstance(self.ramp_start_lr, (int, float)) and 0 < self.ramp_start_lr, "stress.ramp_start_lr",
              self.ramp_start_lr, "a positive learning rate")
        check(isinstance(self.ramp_end_lr, (int, float)) and self.ramp_start_lr < self.ramp_end_lr
              and math.isfinite(self.ramp_end_lr), "stress.ramp_end_lr", self.ramp_end_lr,
              f"a finite learning rate above stress.ramp_start_lr={self.ramp_start_lr!r}")
        check(isinstance(self.batch_double_every, int) and self.batch_double_every > 0,
              "stress.batch_double_every", self.batch_double_every, "a positive integer")
        check(isinstance(self.batch_max_size, int) and self.batch_max_size > 0, "stress.batch_max_size",
              self.batch_max_size, "a positive integer")
        check(self.batch_lr_rule in LR_SCALING_RULES, "stress.batch_lr_rule", self.batch_lr_rule,
              f"one of {LR_SCALING_RULES}")
        check(self.shock_kind in SHOCK_KINDS, "stress.shock_kind", self.shock_kind, f"one of {SHOCK_KINDS}")
        check(isinstance(self.shock_step, int) and self.shock_step >= 0, "stress.shock_step", self.shock_step,
              "a non-negative integer")
        check(isinstance(self.shock_factor, (int, float)) and 0 < self.shock_factor
              and math.isfinite(self.shock_factor), "stress.shock_factor", self.shock_factor,
              "a positive finite factor")
        check(isinstance(self.recovery_smoothing, int) and self.recovery_smoothing > 0,
              "stress.recovery_smoothing", self.recovery_smoothing, "a positive integer")
        check(len(self.precisions) > 0 and self.precisions[0] == "fp32"
              and all(isinstance(p, str) and p != "" for p in self.precisions)
              and len(set(self.precisions)) == len(self.precisions), "stress.precisions", self.precisions,
              "distinct training formats (stability.precision.FORMATS), starting with 'fp32'")
        check(isinstance(self.ladder_steps, int) and self.ladder_steps >= 0, "stress.ladder_steps",
              self.ladder_steps, "a non-negative integer (0 = the run's steps)")
        check(isinstance(self.threads, int) and self.threads >= 0, "stress.threads", self.threads,
              "a non-negative integer (0 = leave torch's setting)")

