"""The model trains with the Triton kernel as its attention backend, matching the torch backend.

On a machine without CUDA the kernel runs in the Triton interpreter (``stability.kernels`` sets
TRITON_INTERPRET=1 when imported there), so shapes here are tiny."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stability.config import DataConfig, GateConfig, ModelConfig, OptimConfig, ProbeConfig, RunConfig
from stability.record import Status
from stability.train.trainer import train

pytestmark = pytest.mark.kernel

TINY = RunConfig(
    model=ModelConfig(d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, context=32),
    data=DataConfig(batch_size=2, builtin_bytes=50_000),
    optim=OptimConfig(lr=3e-3, warmup_steps=2),
    probes=ProbeConfig(every=100, spike_window=10, spike_min_history=5, eval_batches=1, probe_batch_size=1),
    steps=4,
)


@pytest.mark.parametrize("gate", [GateConfig(), GateConfig(position="G1"),
                                  GateConfig(position="G1", granularity="headwise", shared_heads=True),
                                  GateConfig(position="G2", activation="silu", mode="additive")],
                         ids=lambda g: g.label)
def test_training_with_the_triton_backend_matches_the_torch_backend(gate):
    run = replace(TINY, model=replace(TINY.model, gate=gate))
    torch_record = train(run)
    triton_record = train(replace(run, model=replace(run.model, backend="triton")))
    assert triton_record["status"] == Status.COMPLETED, triton_record.get("stop_reason")
    assert triton_record["series"]["loss"] == pytest.approx(torch_record["series"]["loss"], rel=1e-4, abs=1e-4)
    assert triton_record["final"]["heldout_loss"] == pytest.approx(torch_record["final"]["heldout_loss"], rel=1e-4)
