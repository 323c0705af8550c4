"""Properties of the precision policies (stability/precision/__init__.py); small CPU tensors only."""

import copy

import pytest
import torch
from torch import nn

from stability import precision
from stability.config import ConfigError, PrecisionConfig
from stability.precision import Fp8Linear, PrecisionPolicy, format_limits
from stability.record import Status

_CONFIG_FIELDS = ("loss_scaling", "init_loss_scale", "growth_factor", "backoff_factor", "growth_interval",
                  "fp8_recipe", "fp8_scaling", "fp8_history")


def _policy(dtype="fp32", device="cpu", **kwargs):
    """A policy; PrecisionConfig fields and PrecisionPolicy keywords may be mixed in kwargs."""
    fields = {k: kwargs.pop(k) for k in list(kwargs) if k in _CONFIG_FIELDS}
    return PrecisionPolicy(PrecisionConfig(dtype=dtype, **fields), device, **kwargs)


def _linear(seed=0, d_in=64, d_out=32, bias=True):
    torch.manual_seed(seed)
    return nn.Linear(d_in, d_out, bias=bias)


def _relative_error(a, b):
    return ((a - b).norm() / b.norm()).item()


# ----------------------------------------------------------------------------- formats

@pytest.mark.parametrize("name, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16),
                                         ("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)])
def test_format_limits_match_what_torch_casts_do(name, dtype):
    limits = format_limits(name)
    info = torch.finfo(dtype)
    assert limits["max"] == info.max
    assert limits["min_normal"] == info.smallest_normal
    tiny = limits["min_subnormal"]
    cast = torch.tensor([tiny, tiny / 2, tiny * 0.51, limits["max"]], dtype=torch.float64).to(dtype).double()
    # the smallest subnormal survives, half of it flushes to zero, a bit more rounds up
    assert cast.tolist() == [tiny, 0.0, tiny, limits["max"]]


# ----------------------------------------------------------------------------- fp32 / autocast

def test_fp32_policy_is_a_no_op():
    policy = _policy("fp32")
    model = _linear()
    reference = copy.deepcopy(model)
    assert policy.prepare(model) is model and type(model) is nn.Linear
    assert policy.loss_scale == 1.0
    x = torch.randn(8, 64)
    with policy.autocast():
        out = model(x)
    assert out.dtype == torch.float32
    policy.backward(out.square().mean())
    reference(x).square().mean().backward()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    policy.unscale_(optimizer)
    assert torch.equal(model.weight.grad, reference.weight.grad)  # neither scaled nor unscaled
    assert policy.step(optimizer, grads_finite=False) is True      # fp32 always steps
    assert not torch.equal(model.weight, reference.weight)
    assert policy.pop_stats() == {"overflow_fraction": 0.0, "underflow_fraction": 0.0, "scale_drops": 0.0}


@pytest.mark.parametrize("dtype, expected", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_runs_matmuls_in_low_precision(dtype, expected):
    policy = _policy(dtype)
    model = policy.prepare(_linear())
    x = torch.randn(4, 64)
    with policy.autocast():
        assert model(x).dtype == expected
    assert model(x).dtype == torch.float32  # only inside the context
    assert type(model) is nn.Linear         # prepare leaves the model alone


# ----------------------------------------------------------------------------- loss scaling

def _grads_of(model, policy, x, scale_inf=False):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.zero_grad()
    with policy.autocast():
        loss = model(x).float().square().mean()
    policy.backward(loss)
    if scale_inf:
        model.weight.grad[0, 0] = float("inf")
    policy.unscale_(optimizer)
    return optimizer


def test_nonfinite_step_is_skipped_and_scale_halves():
    policy = _policy("fp16", init_loss_scale=1024.0)
    model = _linear()
    before = copy.deepcopy(model.state_dict())
    optimizer = _grads_of(model, policy, torch.randn(8, 64), scale_inf=True)
    assert policy.step(optimizer, grads_finite=False) is False
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # params unchanged
    assert policy.loss_scale == 512.0
    assert policy.pop_stats()["scale_drops"] == 1.0
    assert policy.pop_stats()["scale_drops"] == 0.0  # counters reset by pop


def test_scale_grows_after_growth_interval_clean_steps():
    policy = _policy("fp16", init_loss_scale=64.0, growth_interval=3)
    model = _linear()
    x = torch.randn(8, 64)
    scales, ran = [], []
    for finite in (True, True, False, True, True, True, True):  # the skip resets the clean-step count
        optimizer = _grads_of(model, policy, x, scale_inf=not finite)
        ran.append(policy.step(optimizer, grads_finite=finite))
        scales.append(policy.loss_scale)
    assert scales == [64.0, 64.0, 32.0, 32.0, 32.0, 64.0, 64.0]
    assert ran == [True, True, False, True, True, True, True]


def test_growth_and_backoff_factors_come_from_the_config():
    policy = _policy("fp16", init_loss_scale=1024.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=2)
    assert isinstance(policy.scaler, torch.amp.GradScaler)
    model = _linear()
    x = torch.randn(8, 64)
    scales = []
    for finite in (False, True, True, False):
        optimizer = _grads_of(model, policy, x, scale_inf=not finite)
        policy.step(optimizer, grads_finite=finite)
        scales.append(policy.loss_scale)
    assert scales == [256.0, 256.0, 1024.0, 256.0]
    assert policy.pop_stats()["scale_drops"] == 2.0


def test_unscaled_grads_equal_fp32_grads_of_the_same_loss():
    x = torch.randn(16, 64)
    model, reference = _linear(), _linear()
    policy = _policy("fp16", init_loss_scale=2.0 ** 12)
    _grads_of(model, policy, x)
    _grads_of(reference, _policy("fp32"), x)
    assert policy.loss_scale == 2.0 ** 12
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-2, atol=1e-4)


def test_loss_scaling_rescues_gradients_that_underflow_in_fp16():
    x = torch.randn(16, 64)

    def weight_grad(policy):
        model = _linear()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with policy.autocast():
            loss = model(x).float().square().mean() * 1e-6  # grads ~1e-8, below fp16's normal range
        policy.backward(loss)
        policy.unscale_(optimizer)
        return model.weight.grad

    unscaled = weight_grad(_policy("fp16", loss_scaling=False))
    scaled = weight_grad(_policy("fp16", init_loss_scale=2.0 ** 16))
    reference = weight_grad(_policy("fp32"))
    assert (unscaled == 0).float().mean() > 0.2          # many flushed to zero without scaling
    assert _relative_error(scaled, reference) < 2e-2     # scaling keeps them


def test_fp16_without_loss_scaling_never_skips():
    policy = _policy("fp16", loss_scaling=False)
    assert policy.loss_scale == 1.0
    model = _linear()
    before = model.weight.detach().clone()
    optimizer = _grads_of(model, policy, torch.randn(8, 64), scale_inf=True)
    assert policy.step(optimizer, grads_finite=False) is True
    assert not torch.equal(model.weight, before)
    assert policy.loss_scale == 1.0 and policy.pop_stats()["scale_drops"] == 0.0


def test_watch_counts_fp16_overflow_and_underflow_of_linear_inputs_only_while_watched():
    policy = _policy("fp16")
    model = _linear(d_in=4, d_out=4)
    x = torch.tensor([[1e5, 1e-9, 1.0, 0.0]])  # 1 overflow of 4 values, 1 flush of 3 non-zero
    policy.watch(model)
    with policy.autocast():
        out = model(x)
    stats = policy.pop_stats()
    inf_outputs = out.isinf().sum().item()  # the overflowed input makes the outputs inf as well
    assert inf_outputs == 4
    assert stats["overflow_fraction"] == pytest.approx((1 + inf_outputs) / (4 + 4))
    assert stats["underflow_fraction"] == pytest.approx(1 / 3)
    policy.unwatch()
    with policy.autocast():
        model(x)
    assert policy.pop_stats()["overflow_fraction"] == 0.0


def test_watch_counts_fp16_matmul_outputs_that_overflow_from_finite_inputs():
    policy = _policy("fp16")
    model = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 1.0], [0.0, 1e-3]]))
    policy.watch(model)
    with policy.autocast():
        model(torch.tensor([[60000.0, 60000.0]]))  # 120000 > 65504: the first output overflows
    assert policy.pop_stats()["overflow_fraction"] == pytest.approx(1 / 4)  # 0 of 2 inputs + 1 of 2 outputs


# ----------------------------------------------------------------------------- fp8

def _fp8_pair(scaling="current", history=16, seed=0, **linear):
    """(fp32 Linear, identical Linear converted to fp8, policy)."""
    reference = _linear(seed, **linear)
    policy = _policy("fp8", fp8_recipe="own", fp8_scaling=scaling, fp8_history=history)
    model = policy.prepare(copy.deepcopy(reference))
    return reference, model, policy


def test_fp8_output_is_close_to_fp32_but_quantized():
    reference, model, _ = _fp8_pair()
    assert isinstance(model, Fp8Linear) and not model.fp8_state.real_mm  # CPU: emulated
    x = torch.randn(32, 64)
    error = _relative_error(model(x), reference(x))
    assert 1e-4 < error < 0.06  # e4m3 has 3 mantissa bits: a few % at most, never exact


def test_fp8_gradients_flow_and_are_close_to_fp32():
    reference, model, _ = _fp8_pair()
    x = torch.randn(32, 64)
    x8, x32 = x.clone().requires_grad_(), x.clone().requires_grad_()
    model(x8).sin().sum().backward()
    reference(x32).sin().sum().backward()
    for got, want in ((x8.grad, x32.grad), (model.weight.grad, reference.weight.grad),
                      (model.bias.grad, reference.bias.grad)):
        assert got is not None and torch.isfinite(got).all()
        assert 1e-4 < _relative_error(got, want) < 0.1


def test_fp8_backward_rounds_the_incoming_gradient_to_e5m2():
    _, model, _ = _fp8_pair()
    torch.manual_seed(5)
    x, grad_out = torch.randn(8, 64), torch.randn(8, 32)
    model(x).backward(grad_out)
    scale = grad_out.abs().max() / format_limits("e5m2")["max"]  # current scaling
    rounded = (grad_out / scale).to(torch.float8_e5m2).float() * scale
    assert torch.equal(model.bias.grad, rounded.sum(0))  # grad_b = sum of q_e5m2(grad_out)
    assert not torch.equal(model.bias.grad, grad_out.sum(0))


def test_fp8_underflow_counts_values_the_cast_flushes_to_zero():
    _, model, policy = _fp8_pair(bias=False)
    torch.manual_seed(1)
    x = torch.randn(16, 64) * 1e-6
    x[:, 0] = 100.0  # amax 100: the 1e-6 values sit far below e4m3's smallest subnormal after scaling
    with torch.no_grad():
        model(x)
    stats = policy.pop_stats()
    flushed = ((x / (100.0 / 448)).to(torch.float8_e4m3fn).float() == 0).float().sum().item()
    weight_values, x_values = model.weight.numel(), x.numel()
    assert stats["underflow_fraction"] > 0
    # x's flushes are all but one column; the weight (~U(-1/8, 1/8)) loses few or none
    assert stats["underflow_fraction"] * (x_values + weight_values) >= flushed
    assert flushed == x_values - 16
    assert stats["overflow_fraction"] == 0.0


@pytest.mark.parametrize("scaling, overflows", [("delayed", True), ("current", False)])
def test_fp8_overflow_only_when_delayed_scale_lags_an_amax_jump(scaling, overflows):
    reference, model, policy = _fp8_pair(scaling, history=4)
    torch.manual_seed(2)
    with torch.no_grad():
        for _ in range(4):  # build the amax history
            model(torch.randn(8, 64))
        policy.pop_stats()
        x = torch.randn(8, 64) * 100  # amax jumps 100x
        out = model(x)
    stats = policy.pop_stats()
    assert (stats["overflow_fraction"] > 0) == overflows
    assert torch.isfinite(out).all()  # saturated, not inf / NaN
    if overflows:
        assert _relative_error(out, reference(x)) > 0.1  # the clamping shows in the output
    else:
        assert _relative_error(out, reference(x)) < 0.05


@pytest.mark.parametrize("scaling", ["current", "delayed"])
def test_prepare_converts_every_linear_and_fp8_model_trains(scaling):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    policy = _policy("fp8", fp8_recipe="own", fp8_scaling=scaling)
    assert policy.prepare(model) is model
    assert all(isinstance(m, Fp8Linear) for m in model if not isinstance(m, nn.ReLU))
    x = torch.randn(64, 16)
    target = x @ torch.randn(16, 4)  # a learnable (linear) target
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(40):
        optimizer.zero_grad()
        with policy.autocast():
            loss = (model(x) - target).square().mean()
        policy.backward(loss)
        policy.unscale_(optimizer)
        assert policy.step(optimizer, grads_finite=True)
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_fp8_without_float8_dtypes_raises_config_error(monkeypatch):
    from stability.precision import formats

    monkeypatch.setattr(formats, "has_float8", lambda: False)
    with pytest.raises(ConfigError, match=r"torch .*cpu"):
        precision.check(PrecisionConfig(dtype="fp8", fp8_recipe="own"), "cpu")
    with pytest.raises(ConfigError, match=r"torch .*cpu"):
        precision.check(PrecisionConfig(dtype="fp8"), "cpu")  # torchao's recipes need the dtypes too
    precision.check(PrecisionConfig(dtype="bf16"), "cpu")  # the other formats do not need float8


def test_a_format_no_one_registered_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"precision.dtype='fp64' is invalid: expected one of \('fp32', 'bf16'"):
        precision.check(PrecisionConfig(dtype="fp64"), "cpu")
    with pytest.raises(ConfigError, match="precision.dtype='fp64'"):
        PrecisionPolicy(PrecisionConfig(dtype="fp64"), "cpu")
    with pytest.raises(ConfigError, match=r"stress.precisions=\('fp32', 'fp64'\) is invalid: .*unknown: \['fp64'\]"):
        precision.check_formats(("fp32", "fp64"), "stress.precisions")


def test_the_format_registry_takes_a_new_name_once(monkeypatch):
    from stability.precision import formats, rules

    assert list(precision.FORMATS) == ["fp32", "bf16", "fp16", "fp8", "mxfp8", "mxfp4"]
    monkeypatch.setattr(formats, "FORMATS", dict(formats.FORMATS))
    monkeypatch.setattr(rules, "LINEAR_RULES", dict(rules.LINEAR_RULES))
    with pytest.raises(ValueError, match="fp16"):
        formats.register(type("Again", (formats.Format,), {"name": "fp16"}))
    with pytest.raises(ValueError, match="declare_linear_rule"):   # its Linear rule comes first
        formats.register(type("Plain", (formats.Format,), {"name": "plain"}))
    rules.declare_linear_rule("plain", "float32")
    formats.register(type("Plain", (formats.Format,), {"name": "plain"}))
    policy = PrecisionPolicy(PrecisionConfig(dtype="plain"), "cpu")
    assert not policy.scaling and policy.describe()["recipe"] == "plain"


def test_real_fp8_requested_without_tensor_cores_raises_config_error():
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9):
        pytest.skip("this device has fp8 tensor cores")
    with pytest.raises(ConfigError, match="8.9"):
        _policy("fp8", device="cpu", real_fp8=True)
    with pytest.raises(ConfigError, match="8.9"):
        _policy("fp8", fp8_recipe="own", device="cpu", real_fp8=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs a CUDA GPU with fp8 tensor cores (compute capability >= 8.9)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_real_fp8_matmul_matches_emulation_on_gpu(dtype):
    torch.manual_seed(4)
    layer = nn.Linear(128, 256).cuda().to(dtype)
    real = _policy("fp8", fp8_recipe="own", device="cuda").prepare(copy.deepcopy(layer))
    emulated = _policy("fp8", fp8_recipe="own", device="cuda", real_fp8=False).prepare(copy.deepcopy(layer))
    assert real.fp8_state.real_mm and not emulated.fp8_state.real_mm
    x = torch.randn(4, 16, 128, device="cuda", dtype=dtype, requires_grad=True)
    out_real, out_emulated = real(x), emulated(x)
    assert real.fp8_state.real_mm, "torch._scaled_mm failed and fell back to emulation"
    assert out_real.dtype == dtype and out_real.shape == (4, 16, 256)
    tolerance = 1e-4 if dtype == torch.float32 else 1e-2  # same fp8 products; differs only in summation order
    assert _relative_error(out_real.float(), out_emulated.float()) < tolerance
    out_real.float().square().sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(real.weight.grad).all()
    # a shape _scaled_mm cannot take (K = 24) falls back to emulation, same result bit for bit
    odd = nn.Linear(24, 32).cuda()
    odd_real = _policy("fp8", fp8_recipe="own", device="cuda").prepare(copy.deepcopy(odd))
    odd_emulated = _policy("fp8", fp8_recipe="own", device="cuda", real_fp8=False).prepare(copy.deepcopy(odd))
    y = torch.randn(16, 24, device="cuda")
    assert torch.equal(odd_real(y), odd_emulated(y))


def test_gradscaler_trajectory_of_a_training_run_that_overflows():
    """fp16 training whose initial loss scale makes the fp16 gradients overflow: GradScaler skips
    those steps and backs off by the configured factor, then grows by the configured factor after
    the configured number of clean steps; the record's per-step scale, skipped flags, skipped-step
    count, scale drops and non-finite events all tell the same story."""
    from stability.config import resolve
    from stability.train.trainer import train

    growth, backoff, interval = 4.0, 0.25, 3
    config = resolve("smoke", {"steps": 12, "precision.dtype": "fp16", "precision.init_loss_scale": 2.0 ** 30,
                               "precision.growth_factor": growth, "precision.backoff_factor": backoff,
                               "precision.growth_interval": interval, "model.n_layers": 1, "probes.every": 4,
                               "probes.eval_batches": 1})
    torch.set_num_threads(1)
    record = train(config.arm_config("reference", 0), arm="reference")
    assert record["status"] == Status.COMPLETED, record["stop_reason"]
    scales, skipped = record["series"]["loss_scale"], record["series"]["skipped"]
    assert skipped[0] and not all(skipped)  # 2^30 overflows at first; the scale comes down until it fits
    expected, scale, clean = [], 2.0 ** 30, 0
    for was_skipped in skipped:  # the GradScaler rule, from the skipped flags alone
        if was_skipped:
            scale, clean = scale * backoff, 0
        else:
            clean += 1
            if clean == interval:
                scale, clean = scale * growth, 0
        expected.append(scale)
    assert scales == expected
    assert growth * min(scales) in scales  # it grew at least once after backing off
    final = record["final"]
    assert final["skipped_steps"] == sum(skipped) == final["loss_scale_drops"] == final["nonfinite_events"]
    assert all(event["skipped"] for event in record["events"])
    assert "GradScaler" in record["precision"]["recipe"]


@pytest.mark.parametrize("field, value", [("init_loss_scale", float("inf")), ("init_loss_scale", 0.0),
                                          ("growth_factor", float("nan")), ("growth_factor", 1.0),
                                          ("backoff_factor", 1.5), ("backoff_factor", -0.5),
                                          ("growth_interval", 0), ("fp8_recipe", "blockwise")])
def test_bad_scaler_settings_and_recipe_names_are_config_errors(field, value):
    with pytest.raises(ConfigError, match=f"precision.{field}={value!r}"):
        PrecisionConfig(dtype="fp16", **{field: value})
