"""Property-based checks of the configs (hypothesis: fixed examples, no deadline, in any repository):

* any valid small config trains one finite step at a tiny LR, in every precision and gate variant (with
  or without a floored gate, soft-capped attention scores, z-loss);
* any invalid value raises ``ConfigError`` before training, with the value in the message.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stability.cases.stress import cpu_threads
from stability.cli.options import check_here
from stability.config import FP8_RECIPES, ConfigError, GateConfig, resolve
from stability.record import Status
from stability.train.trainer import train

pytestmark = pytest.mark.stress


@st.composite
def small_configs(draw):
    """A valid small run config: the smoke preset with a drawn model, gate, batch and precision
    (built with ``dataclasses.replace``, validated once as a whole)."""
    n_kv_heads = draw(st.sampled_from([1, 2]))
    n_heads = n_kv_heads * draw(st.sampled_from([1, 2]))
    head_dim = draw(st.sampled_from([4, 8, 16]))
    position = draw(st.sampled_from(["none", "G1", "G2", "G3", "G4", "G5"]))
    g5 = position == "G5"
    gate = GateConfig(
        position=position,
        granularity="elementwise" if g5 else draw(st.sampled_from(["elementwise", "headwise"])),
        activation=draw(st.sampled_from(["sigmoid", "silu"])),
        mode=draw(st.sampled_from(["multiplicative", "additive"])),
        shared_heads=False if g5 else draw(st.booleans()))
    if gate.activation == "sigmoid":
        gate = replace(gate, floor=draw(st.sampled_from([0.0, 0.0, 0.5])))
    base = resolve("smoke").run
    batch_size, context = draw(st.integers(1, 4)), draw(st.sampled_from([8, 16, 32]))
    # the MX formats need the tokens of a batch in whole blocks of 32
    formats = ["fp32", "bf16", "fp16", "fp8"] + (["mxfp8", "mxfp4"] if batch_size * context % 32 == 0 else [])
    model = replace(base.model, n_heads=n_heads, n_kv_heads=n_kv_heads, d_model=n_heads * head_dim,
                    n_layers=draw(st.integers(1, 2)), context=context,
                    qk_norm=draw(st.booleans()), tie_embeddings=draw(st.booleans()), gate=gate,
                    attn_softcap=draw(st.sampled_from([0.0, 0.0, 1.0, 50.0])))
    return replace(
        base, model=model, steps=1, seed=draw(st.integers(0, 3)),
        data=replace(base.data, batch_size=batch_size),
        precision=replace(base.precision, dtype=draw(st.sampled_from(formats)),
                          fp8_recipe=draw(st.sampled_from(FP8_RECIPES))),
        optim=replace(base.optim, lr=draw(st.sampled_from([1e-6, 1e-5])), warmup_steps=draw(st.integers(0, 3)),
                      z_loss=draw(st.sampled_from([0.0, 1e-4]))),
        probes=replace(base.probes, every=1, eval_batches=1, probe_batch_size=1))


@settings(max_examples=12, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=small_configs())
def test_valid_small_config_trains_one_finite_step(run):
    with cpu_threads(1):
        record = train(run, arm="property")
    assert record["status"] == Status.COMPLETED, (run, record["stop_reason"])
    assert len(record["series"]["loss"]) == 1
    loss = record["series"]["loss"][0]
    assert math.isfinite(loss) and math.isfinite(record["series"]["grad_norm"][0]), run
    # at init the loss is near log(vocab): a finite step at a tiny LR, not a lucky number
    assert abs(loss - math.log(run.model.vocab_size)) < 1.5, (loss, run)
    assert math.isfinite(record["final"]["heldout_loss"])


def _bad_numbers(positive_int: bool):
    if positive_int:
        return st.integers(-1000, 0)
    return st.one_of(st.floats(max_value=0.0, allow_nan=False), st.just(math.nan), st.just(math.inf))


# (dotted field, strategy of invalid values)
INVALID = [
    ("model.d_model", _bad_numbers(True)),
    ("model.n_layers", _bad_numbers(True)),
    ("model.n_heads", st.sampled_from([3, 5, 7, 6])),          # smoke d_model=64: not a divisor, or odd head dim
    ("model.context", _bad_numbers(True)),
    ("model.backend", st.text(min_size=1, max_size=8).filter(lambda s: s not in ("torch", "explicit", "triton"))),
    ("gated_gate.position", st.sampled_from(["G0", "G6", "gate", "softmax"])),
    ("gated_gate.activation", st.sampled_from(["relu", "tanh", "Sigmoid"])),
    ("data.batch_size", _bad_numbers(True)),
    ("data.holdout_fraction", st.floats(0.5, 10.0) | st.floats(-10.0, 0.0)),
    ("optim.lr", _bad_numbers(False)),
    ("optim.warmup_steps", st.integers(-100, -1)),
    ("optim.grad_clip", st.floats(-100.0, -1e-6)),
    ("optim.lr_schedule", st.sampled_from(["linear", "step", "Cosine"])),
    ("precision.dtype", st.sampled_from(["fp64", "int8", "fp4", "half", "mxfp6"])),
    ("precision.fp8_recipe", st.sampled_from(["blockwise", "Tensorwise", "delayed", "te"])),
    ("precision.init_loss_scale", _bad_numbers(False)),
    ("precision.growth_factor", _bad_numbers(False) | st.floats(0.01, 1.0)),
    ("precision.backoff_factor", _bad_numbers(False) | st.floats(1.0, 100.0)),
    ("precision.growth_interval", _bad_numbers(True)),
    ("probes.every", _bad_numbers(True)),
    ("probes.cast_every", _bad_numbers(True)),
    ("probes.spike_k", st.floats(max_value=0.0, allow_nan=False)),
    ("steps", _bad_numbers(True)),
    ("seed", st.integers(-100, -1)),
    ("stress.sweep_lrs", st.lists(st.floats(1e-5, 1.0), min_size=2, max_size=4, unique=True).map(
        lambda v: tuple(sorted(v, reverse=True)))),                       # decreasing grid
    ("stress.ramp_end_lr", st.floats(1e-9, 1e-3)),                       # below the smoke ramp start (1e-3)
    ("stress.batch_lr_rule", st.sampled_from(["cube", "log", "Linear"])),
    ("stress.shock_kind", st.sampled_from(["spike", "warmup", ""])),
    ("stress.shock_factor", _bad_numbers(False)),
    ("stress.precisions", st.sampled_from([("bf16", "fp32"), ("fp32", "fp32"), ("fp32", "fp64")])),
    ("stress.threads", st.integers(-8, -1)),
    ("arms.gated.gate.floor", st.floats(1.0, 10.0) | st.floats(-10.0, -1e-6)),
    ("arms.z_loss.z_loss", st.floats(max_value=-1e-9, allow_nan=False) | st.just(math.nan) | st.just(math.inf)),
    ("model.attn_softcap", st.floats(max_value=-1e-9, allow_nan=False) | st.just(math.nan) | st.just(math.inf)),
    ("optim.z_loss", st.floats(max_value=-1e-9, allow_nan=False) | st.just(math.inf)),
    ("extrapolation.factors", st.lists(st.floats(-10.0, 0.999), min_size=1, max_size=3).map(tuple)),
    ("extrapolation.eval_batches", st.integers(-10, 0)),
]


@settings(max_examples=25, derandomize=True, deadline=None)
@given(data=st.data())
def test_invalid_config_raises_config_error_naming_the_value(data):
    field, values = data.draw(st.sampled_from(INVALID), label="field")
    value = data.draw(values, label="value")
    with pytest.raises(ConfigError) as error:
        check_here(resolve("smoke", {field: value}))  # the registries' names are checked there, before any work
    message = str(error.value)
    shown = repr(tuple(value)) if isinstance(value, tuple) else repr(value)
    assert shown in message or str(value) in message, f"{field}={value!r}: message {message!r} lacks the value"
