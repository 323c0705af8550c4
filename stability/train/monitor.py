"""Watches every step for spikes, non-finite values and divergence, and says why an arm stops.

    monitor = Monitor(run.probes)
    nonfinite = monitor.nonfinite(loss, grad_norm)            # "", "loss" or "grad"
    loss_spike, grad_spike = monitor.gradients(loss, grad_norm)   # before the update
    update_spike = monitor.update_spike(update_norm)           # after it
    reason = monitor.verdict(row)                              # None: the arm goes on

Three ``probes.SpikeDetector``s flag a loss, gradient-norm or update-norm spike (a value ``spike_k``
standard deviations above the previous ``spike_window`` finite values). An arm diverges (a result,
not an error) on a non-finite loss, on a non-finite gradient the optimiser stepped with anyway, or
when its loss stays above ``diverge_factor`` times its first finite loss for ``diverge_patience``
consecutive steps.
"""

from __future__ import annotations

import math

from stability.config import ProbeConfig
from stability.train.probes import SpikeDetector


class Monitor:
    """The spike detectors and the divergence rule of one arm; ``state_dict`` is what a checkpoint keeps."""

    def __init__(self, config: ProbeConfig):
        self.config = config
        self.detectors = {name: SpikeDetector(config.spike_window, config.spike_k, config.spike_min_history)
                          for name in ("loss", "grad", "update")}
        self.initial_loss: float | None = None   # the first finite loss
        self.above_initial = 0                   # consecutive steps with loss > diverge_factor x initial loss

    @staticmethod
    def nonfinite(loss: float, grad_norm: float) -> str:
        """What went non-finite in a step: "" (nothing), "loss", or "grad" (the loss is finite)."""
        loss_finite = math.isfinite(loss)
        return "" if loss_finite and math.isfinite(grad_norm) else ("loss" if not loss_finite else "grad")

    def gradients(self, loss: float, grad_norm: float) -> tuple[bool, bool]:
        """(loss spike, gradient-norm spike) of a step, decided before its update."""
        return self.detectors["loss"].update(loss), self.detectors["grad"].update(grad_norm)

    def update_spike(self, update_norm: float) -> bool:
        return self.detectors["update"].update(update_norm)

    def severity(self, loss_spike: bool, grad_spike: bool, nonfinite: str) -> float:
        """How bad a flagged step is: infinite when non-finite, else its largest spike score (standard deviations)."""
        return math.inf if nonfinite else max(self.detectors["loss"].score if loss_spike else 0.0,
                                              self.detectors["grad"].score if grad_spike else 0.0)

    def verdict(self, row: dict) -> str | None:
        """Count a trained step (its series row) against the initial loss; the reason the arm stops after
        it ("diverged"), or None."""
        loss, nonfinite, cfg = row["loss"], row["nonfinite"], self.config
        finite = math.isfinite(loss)
        if self.initial_loss is None and finite:
            self.initial_loss = loss
        initial = self.initial_loss
        self.above_initial = self.above_initial + 1 if (
            initial is not None and finite and loss > cfg.diverge_factor * initial) else 0
        if not finite or (nonfinite == "grad" and not row["skipped"]):
            return f"non-finite {nonfinite} at step {row['step']}"
        if self.above_initial >= cfg.diverge_patience:
            return (f"loss above {cfg.diverge_factor:g} x initial loss {initial:.3f} for "
                    f"{cfg.diverge_patience} consecutive steps")
        return None

    def state_dict(self) -> dict:
        return {"initial_loss": self.initial_loss, "above_initial": self.above_initial,
                "detectors": {name: list(d.history) for name, d in self.detectors.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.initial_loss, self.above_initial = state["initial_loss"], state["above_initial"]
        for name, history in state["detectors"].items():
            self.detectors[name].history.extend(history)
