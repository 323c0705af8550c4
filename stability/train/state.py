"""What carries over from one training step to the next besides the model, the optimiser and the
precision policy: the arm record being filled, the monitor (spike detectors, initial loss), the
counters and the timings. A checkpoint holds its ``state_dict`` (plain values), so a resumed arm
continues where it stopped.
"""

from __future__ import annotations

import dataclasses
import time

from stability.record import start_timing
from stability.train.monitor import Monitor


@dataclasses.dataclass
class TrainState:
    """One arm's training state.

    record: the arm record being filled (series, events, probes, final, timing).
    monitor: spike detectors, initial loss, steps above it.
    first_step: the first step this call trains (0, or after a resume the checkpoint's step + 1).
    step: the step in flight (-1 before the first); the fault hooks read it.
    between_steps: no step is in flight, so the state is consistent and may be checkpointed.
    tokens_seen: tokens of the global batches trained so far. train_seconds / probe_seconds: time inside
    the steps / the heavy probes. started_at: epoch seconds when the arm first started (kept by a resume).
    wall_before: wall seconds of the calls this one resumes. clock: ``time.perf_counter()`` at this call's start.
    """

    record: dict
    monitor: Monitor
    first_step: int = 0
    step: int = -1
    between_steps: bool = True
    tokens_seen: int = 0
    train_seconds: float = 0.0
    probe_seconds: float = 0.0
    started_at: float = dataclasses.field(default_factory=time.time)
    wall_before: float = 0.0
    clock: float = 0.0

    def start_clock(self) -> None:
        """Start this call's wall clock; the record's timing carries a resumed run's wall seconds over."""
        self.wall_before = self.record.get("timing", {}).get("wall_seconds", 0.0)
        self.clock = time.perf_counter()
        start_timing(self.record, self.started_at, self.wall_before)

    def wall_seconds(self) -> float:
        """Wall seconds of this arm so far, the calls it resumes included."""
        return self.wall_before + time.perf_counter() - self.clock

    def state_dict(self) -> dict:
        """Plain values only (a checkpoint is read with ``weights_only``)."""
        monitor = self.monitor.state_dict()
        return {"record": self.record, "initial_loss": monitor["initial_loss"],
                "above_initial": monitor["above_initial"], "tokens_seen": self.tokens_seen,
                "train_seconds": self.train_seconds, "probe_seconds": self.probe_seconds,
                "started_at": self.started_at, "detectors": monitor["detectors"]}

    def load_state_dict(self, state: dict) -> None:
        self.record = state["record"]
        self.tokens_seen, self.train_seconds = state["tokens_seen"], state["train_seconds"]
        self.probe_seconds, self.started_at = state["probe_seconds"], state["started_at"]
        self.monitor.load_state_dict(state)
