"""torchao's fp8 and MX training through the precision policy (stability/precision/ao.py); small CPU tensors.

Emulated on the CPU: torchao's casts are real, the matmuls run in fp32 on the rounded operands.
"""

import copy
import sys

import pytest
import torch
from torch import nn

from stability import precision
from stability.config import ConfigError, PrecisionConfig, resolve
from stability.evaluate.quantize import full_precision_copy
from stability.precision import Fp8Linear, PrecisionPolicy, ao

FP8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread (restored after): on a CPU shared with other jobs, tiny ops on two threads
    wait on each other (measured here: 20 steps of the MLP below, 4.6 s on 2 threads, 0.08 s on 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def _relative_error(a, b):
    return ((a - b).norm() / b.norm()).item()


def _train(model, policy, steps=20):
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    target = x[:, :4] * 2  # a learnable target
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (model(x) - target).square().mean()
        policy.backward(loss)
        policy.unscale_(optimizer)
        policy.step(optimizer, grads_finite=True)
        losses.append(loss.item())
    return losses


# ----------------------------------------------------------------------------- fp8 through torchao.float8

def test_torchao_names_the_recipes_the_config_accepts():
    assert set(FP8_RECIPES) <= set(ao.fp8_recipes())


@pytest.mark.parametrize("recipe", FP8_RECIPES)
def test_torchao_fp8_recipe_converts_the_fitting_linears_and_trains(recipe):
    policy = PrecisionPolicy(PrecisionConfig(dtype="fp8", fp8_recipe=recipe), "cpu")
    model = policy.prepare(_mlp())
    assert [type(m).__name__ for m in model] == ["Float8Linear", "ReLU", "Float8Linear", "ReLU", "Linear"]
    assert policy.high_precision == ["4"]  # 4 outputs: not a multiple of 16, left in fp32
    assert model[0].config.emulate  # no fp8 tensor cores on the CPU
    source = policy.describe()
    assert (source["library"], source["recipe"], source["emulated"]) == ("torchao", f"float8 {recipe}", True)
    losses = _train(model, policy)
    assert losses[-1] < 0.2 * losses[0]


def test_own_emulation_and_torchao_tensorwise_agree_within_fp8_rounding():
    """The same casts (per-tensor current scaling, e4m3 forward, e5m2 output gradient): the two
    differ by far less than either differs from fp32 (torchao multiplies by 448 / amax, the own
    emulation divides by amax / 448, which can round a value to the neighbouring fp8 number)."""
    torch.manual_seed(2)
    reference = nn.Linear(64, 32)
    own = PrecisionPolicy(PrecisionConfig(dtype="fp8", fp8_recipe="own"), "cpu").prepare(copy.deepcopy(reference))
    tao = PrecisionPolicy(PrecisionConfig(dtype="fp8"), "cpu").prepare(nn.Sequential(copy.deepcopy(reference)))[0]
    assert isinstance(own, Fp8Linear) and ao.is_float8_linear(tao)
    x = torch.randn(16, 64)
    grad = torch.randn(16, 32)
    outputs = {}
    for name, layer in (("own", own), ("torchao", tao), ("fp32", reference)):
        xi = x.clone().requires_grad_()
        out = layer(xi)
        out.backward(grad)
        outputs[name] = (out.detach(), xi.grad, layer.weight.grad)
    for index in range(3):  # output, input gradient, weight gradient
        own_out, tao_out, fp32_out = (outputs[name][index] for name in ("own", "torchao", "fp32"))
        fp8_error = _relative_error(tao_out, fp32_out)
        assert 1e-3 < fp8_error < 0.1  # fp8 rounding is there ...
        assert _relative_error(own_out, tao_out) < 0.01 * fp8_error  # ... and the two share it (measured: 1e-7)


def _counted_underflow(policy, layer, x, grad=None):
    policy.watch(layer)
    try:
        xi = x.clone().requires_grad_(grad is not None)
        out = layer(xi)
        if grad is not None:
            out.backward(grad)
    finally:
        policy.unwatch()
    return policy.pop_stats()


def _tiny_beside_large():
    """(4, 64) values of magnitude 0.5-1, except row 0: one 1000 and eight 1e-6; row 1: all 1e-6."""
    torch.manual_seed(3)
    x = (0.5 + 0.5 * torch.rand(4, 64)) * torch.sign(torch.randn(4, 64))
    x[0, 0], x[0, 1:9], x[1] = 1000.0, 1e-6, 1e-6
    return x


@pytest.mark.parametrize("recipe, flushed", [("tensorwise", 8 + 64), ("rowwise", 8)])
def test_watch_counts_exactly_what_the_torchao_cast_flushes(recipe, flushed):
    """Injected: tiny values beside a large one. A per-tensor scale (448 / 1000) flushes every tiny
    value; a per-row scale flushes only those that share a row with the large one."""
    policy = PrecisionPolicy(PrecisionConfig(dtype="fp8", fp8_recipe=recipe), "cpu")
    layer = policy.prepare(nn.Sequential(nn.Linear(64, 32)))
    stats = _counted_underflow(policy, layer, _tiny_beside_large())
    weights = 64 * 32  # U(-1/8, 1/8): none is small enough to flush
    assert stats["underflow_fraction"] == pytest.approx(flushed / (4 * 64 + weights))
    assert stats["overflow_fraction"] == 0.0


def test_watch_counts_the_output_gradient_and_nonfinite_values():
    policy = PrecisionPolicy(PrecisionConfig(dtype="fp8"), "cpu")
    layer = policy.prepare(nn.Sequential(nn.Linear(64, 32)))
    x = 0.5 + 0.5 * torch.rand(4, 64)
    grad = 0.5 + 0.5 * torch.rand(4, 32)
    grad[0, 0], grad[0, 1:5] = 1000.0, 1e-9  # e5m2, scale 57344 / 1000: 1e-9 flushes
    stats = _counted_underflow(policy, layer, x, grad)
    assert stats["underflow_fraction"] == pytest.approx(4 / (4 * 64 + 64 * 32 + 4 * 32))
    x[2, 3] = float("inf")
    stats = _counted_underflow(policy, layer, x)
    assert stats["overflow_fraction"] == pytest.approx(1 / (4 * 64 + 64 * 32))
    # the inf makes the per-tensor scale 0: every other finite input value comes out 0 (or NaN)
    assert stats["underflow_fraction"] >= (4 * 64 - 1) / (4 * 64 + 64 * 32)


def test_counting_skips_steps_it_is_told_to_skip():
    policy = PrecisionPolicy(PrecisionConfig(dtype="fp8"), "cpu")
    layer = policy.prepare(nn.Sequential(nn.Linear(64, 32)))
    policy.count_step(3, every=4)
    assert _counted_underflow(policy, layer, _tiny_beside_large())["underflow_fraction"] == 0.0
    policy.count_step(4, every=4)
    assert _counted_underflow(policy, layer, _tiny_beside_large())["underflow_fraction"] > 0.0


# ----------------------------------------------------------------------------- MX

@pytest.mark.parametrize("dtype", ["mxfp8", "mxfp4"])
def test_mx_formats_convert_and_train(dtype):
    policy = PrecisionPolicy(PrecisionConfig(dtype=dtype), "cpu")
    model = policy.prepare(_mlp())
    assert [type(m).__name__ for m in model] == ["MXLinear", "ReLU", "MXLinear", "ReLU", "Linear"]
    assert policy.high_precision == ["4"]
    assert policy.describe()["emulated"] and ("e2m1" in policy.describe()["recipe"]) == (dtype == "mxfp4")
    losses = _train(model, policy)
    assert losses[-1] < 0.2 * losses[0]


def test_mxfp4_weights_lose_more_than_mxfp8_and_both_keep_small_values_in_their_own_blocks():
    torch.manual_seed(4)
    reference = nn.Sequential(nn.Linear(64, 32))
    x = _tiny_beside_large()
    errors, stats = {}, {}
    for dtype in ("mxfp8", "mxfp4"):
        policy = PrecisionPolicy(PrecisionConfig(dtype=dtype), "cpu")
        layer = policy.prepare(copy.deepcopy(reference))
        y = x.clone()
        y[0, 0] = 1.0  # no outlier here: compare the weight formats alone
        errors[dtype] = _relative_error(layer(y), reference(y))
        stats[dtype] = _counted_underflow(policy, layer, x)
    assert 0 < errors["mxfp8"] < errors["mxfp4"] < 0.5
    # one scale per block of 32: only the 8 tiny values in the 1000's block flush, row 1 keeps its own scale
    inputs, weights = 4 * 64, 64 * 32
    assert stats["mxfp8"]["underflow_fraction"] == pytest.approx(8 / (inputs + weights))
    assert stats["mxfp4"]["underflow_fraction"] > stats["mxfp8"]["underflow_fraction"]  # e2m1 flushes weights


def test_full_precision_copy_undoes_torchao_conversions():
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64))
    x = torch.randn(4, 32)
    for config in (PrecisionConfig(dtype="fp8"), PrecisionConfig(dtype="mxfp8")):
        converted = PrecisionPolicy(config, "cpu").prepare(copy.deepcopy(model))
        plain = full_precision_copy(converted)
        assert all(type(m) is nn.Linear for m in plain if not isinstance(m, nn.ReLU))
        with torch.no_grad():
            assert torch.equal(plain(x), model(x))
            assert not torch.equal(converted(x), model(x))  # the converted one still rounds


# ----------------------------------------------------------------------------- bad input

def test_mx_needs_batch_tokens_in_whole_blocks():
    with pytest.raises(ConfigError, match="80"):
        precision.check(PrecisionConfig(dtype="mxfp8"), "cpu", tokens_per_batch=8 * 10)
    precision.check(PrecisionConfig(dtype="mxfp8"), "cpu", tokens_per_batch=8 * 64)


def test_mx_on_a_torchao_without_it_is_a_config_error_naming_the_format(monkeypatch):
    for where in ("torchao.prototype.moe_training.mxfp8_linear", "torchao.prototype.mx_formats.mx_linear"):
        monkeypatch.setitem(sys.modules, where, None)  # importing it now fails
    with pytest.raises(ConfigError, match="MX format") as error:
        precision.check(PrecisionConfig(dtype="mxfp8"), "cpu")
    assert not isinstance(error.value, ao.TorchaoMissing)  # torchao is there: this is not a skip
    with pytest.raises(ConfigError, match="MX format"):
        precision.check(PrecisionConfig(dtype="mxfp4"), "cpu")
    from stability.cases.precision_ladder import ladder_skips

    with pytest.raises(ConfigError, match="MX format"):
        ladder_skips(resolve("smoke"))


def test_mxfp4_on_a_torch_without_fp4_is_a_config_error(monkeypatch):
    monkeypatch.delattr(torch, "float4_e2m1fn_x2", raising=False)
    with pytest.raises(ConfigError, match="precision.dtype='mxfp4'"):
        precision.check(PrecisionConfig(dtype="mxfp4"), "cpu")
    precision.check(PrecisionConfig(dtype="mxfp8"), "cpu")


def test_a_recipe_the_installed_torchao_does_not_know_is_a_config_error(monkeypatch):
    monkeypatch.setattr(ao, "fp8_recipes", lambda: ("tensorwise",))  # as an older torchao would say
    with pytest.raises(ConfigError, match="precision.fp8_recipe='rowwise'.*torchao"):
        precision.check(PrecisionConfig(dtype="fp8", fp8_recipe="rowwise"), "cpu")


def test_without_torchao_its_rungs_are_skipped_and_nothing_else_breaks(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # `import torchao` now fails
    with pytest.raises(ao.TorchaoMissing, match="torchao cannot be imported") as error:
        precision.check(PrecisionConfig(dtype="fp8"), "cpu")
    assert isinstance(error.value, ConfigError)  # a run that asks for it stops with exit 2
    for config in (PrecisionConfig(dtype="fp32"), PrecisionConfig(dtype="bf16"), PrecisionConfig(dtype="fp16"),
                   PrecisionConfig(dtype="fp8", fp8_recipe="own")):
        precision.check(config, "cpu")
        PrecisionPolicy(config, "cpu").prepare(_mlp())
    from stability.cases.precision_ladder import ladder_skips

    skipped = ladder_skips(resolve("smoke"))
    assert set(skipped) == {"fp8", "mxfp8", "mxfp4"}
    assert all("torchao" in reason for reason in skipped.values())


# ----------------------------------------------------------------------------- real fp8 (GPU)

FP8_TENSOR_CORES = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.gpu
@pytest.mark.skipif(not FP8_TENSOR_CORES, reason="needs a CUDA GPU with fp8 tensor cores (compute capability >= 8.9)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe", FP8_RECIPES)
def test_real_torchao_fp8_matches_its_emulation_on_gpu(recipe, dtype):
    """On fp8 tensor cores torchao's Float8Linear runs torch._scaled_mm; the same casts emulated
    give the same result up to the accumulation order."""
    torch.manual_seed(6)
    layer = nn.Sequential(nn.Linear(128, 256)).cuda().to(dtype)
    config = PrecisionConfig(dtype="fp8", fp8_recipe=recipe)
    real = PrecisionPolicy(config, "cuda").prepare(copy.deepcopy(layer))
    emulated = PrecisionPolicy(config, "cuda", real_fp8=False).prepare(copy.deepcopy(layer))
    assert not real[0].config.emulate and emulated[0].config.emulate
    x = torch.randn(4, 16, 128, device="cuda", dtype=dtype, requires_grad=True)
    out_real, out_emulated = real(x), emulated(x)
    assert out_real.dtype == dtype and out_real.shape == (4, 16, 256)
    assert _relative_error(out_real.float(), out_emulated.float()) < (1e-3 if dtype == torch.float32 else 1e-2)
    out_real.float().square().sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(real[0].weight.grad).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["mxfp8", "mxfp4"])
def test_mx_trains_on_gpu(dtype):
    """MX on a GPU: real matmuls on compute capability 10.0 (mxfp8), emulated below."""
    policy = PrecisionPolicy(PrecisionConfig(dtype=dtype), "cuda")
    model = policy.prepare(_mlp().cuda())
    x = torch.randn(64, 32, device="cuda")
    target = x[:, :4] * 2
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        optimizer.zero_grad()
        loss = (model(x) - target).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_the_cli_refuses_a_torchao_format_without_torchao_before_any_work(monkeypatch, tmp_path, capsys):
    from stability.cli import main

    monkeypatch.setitem(sys.modules, "torchao", None)
    for dtype in ("fp8", "mxfp8"):
        assert main(["run", "--set", f"precision.dtype={dtype}", "--no-track", "--out", str(tmp_path)]) == 2
        assert "torchao cannot be imported" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing was written
