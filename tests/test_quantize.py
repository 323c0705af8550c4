"""Unit tests of stability.evaluate.quantize's helpers (tiny untrained models; seconds on a CPU)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from stability.cli.options import check_here
from stability.config import ConfigError, GateConfig, ModelConfig, PrecisionConfig, resolve
from stability.data import load_corpus
from stability.evaluate import quantize as q
from stability.model.lm import GatedLM
from stability.precision import Fp8Linear, PrecisionPolicy
from stability.record import Status, paired_summary
from stability.train.probes import heavy_probes

QUANT_SCHEMES = tuple(q.SCHEMES)

TINY = {"model.d_model": 32, "model.n_layers": 1, "model.n_heads": 2, "model.n_kv_heads": 1,
        "model.context": 16, "data.batch_size": 2, "data.builtin_bytes": 20_000, "probes.eval_batches": 1,
        "probes.probe_batch_size": 2}


def tiny_model(gate: str = "G1") -> GatedLM:
    config = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, context=16,
                         gate=GateConfig(position=gate))
    return GatedLM(config, seed=0).eval()


@pytest.fixture(scope="module")
def tiny_run():
    config = resolve("smoke", TINY)
    run = config.arm_config("gated", 0)
    return run, load_corpus(run.data, run.model.vocab_size, run.model.context)


# ----------------------------------------------------------------------------- fake quant

@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=64))
def test_fake_quant_per_tensor_error_is_at_most_half_a_step(values):
    x = torch.tensor(values)
    out = q.fake_quant_int8(x)
    step = x.abs().max() / 127
    assert out.dtype == x.dtype and out.shape == x.shape
    assert torch.all((out - x).abs() <= step / 2 * (1 + 1e-5) + 1e-30)
    assert torch.equal(q.fake_quant_int8(out), out) or torch.allclose(q.fake_quant_int8(out), out, rtol=1e-6)


def test_fake_quant_zero_and_per_slice_scales():
    assert torch.equal(q.fake_quant_int8(torch.zeros(3, 4)), torch.zeros(3, 4))
    x = torch.tensor([[1000.0, 1.0, -0.5], [0.02, 0.01, -0.03]])
    per_tensor, per_token = q.fake_quant_int8(x), q.fake_quant_int8(x, -1)
    # one big value stretches the per-tensor scale: the small row collapses to zero ...
    assert torch.equal(per_tensor[1], torch.zeros(3))
    # ... while per-token scales keep it (each row's max is exact)
    assert per_token[1, 2] == pytest.approx(-0.03) and per_token[0, 0] == pytest.approx(1000.0)


def test_fake_quant_linear_counts_zeroed_inputs():
    linear = nn.Linear(4, 3, bias=True)
    fq = q.FakeQuantLinear(linear, None, None)
    x = torch.tensor([[500.0, 0.1, 0.2, 0.0]])
    out = fq(x)
    assert out.shape == (1, 3)
    assert (int(fq.zeroed), int(fq.nonzero)) == (2, 3)  # 0.1 and 0.2 fall below half a step of 500/127
    assert not fq.weight.requires_grad


# ----------------------------------------------------------------------------- names and config

def test_unknown_scheme_is_a_config_error_naming_it_and_the_known_ones():
    with pytest.raises(ConfigError, match="int3") as info:
        q.check_schemes(("int8", "int3"))
    assert all(name in str(info.value) for name in QUANT_SCHEMES)
    with pytest.raises(ConfigError, match=r"quant_schemes=\('int8', 'int3'\) is invalid"):
        check_here(resolve("smoke", {"quant_schemes": "int8,int3"}))  # once, before any work
    assert resolve("smoke", {"quant_schemes": "int8,w8a8-tensor"}).quant_schemes == ("int8", "w8a8-tensor")


def test_a_registered_scheme_is_known_once(monkeypatch):
    monkeypatch.setattr(q, "SCHEMES", dict(q.SCHEMES))
    with pytest.raises(ValueError, match="registered already"):
        q.register("int8", "stability", "again")(lambda device: None)
    q.register("identity", "stability", "no quantization at all")(lambda device: (lambda lin: lin, {}))
    assert q.check_schemes(["identity"]) == ("identity",) and q.scheme_source("identity")["method"] == (
        "no quantization at all")


def test_quant_figures_and_paired_summary_directions():
    quant = {"schemes": {"int8": {"damage_loss": 0.1, "damage_accuracy": -0.01, "kl": 0.02},
                         "nf4": {"skipped": "no"}}}
    figures = q.quant_figures(quant)
    assert figures == {"quant_int8_damage_loss": 0.1, "quant_int8_damage_accuracy": -0.01,
                       "quant_int8_kl": 0.02}
    arms = [{"arm": "reference", "seed": 0, "status": Status.COMPLETED, "final": {"heldout_loss": 3.0, **figures}},
            {"arm": "gated", "seed": 0, "status": Status.COMPLETED, "final": {"heldout_loss": 2.9, "quant_int8_damage_loss": 0.05,
                                                   "quant_int8_damage_accuracy": 0.0, "quant_int8_kl": 0.01}}]
    paired = paired_summary(arms)["gated"]
    assert paired["quant_int8_damage_loss"]["better"] == "lower"
    assert paired["quant_int8_damage_accuracy"]["better"] == "higher"
    assert paired["quant_int8_kl"]["better"] == "lower"
    assert paired["quant_int8_damage_loss"]["difference"] == pytest.approx(-0.05)


# ----------------------------------------------------------------------------- model surgery

def test_plant_outliers_keeps_the_function_and_makes_outliers():
    model = tiny_model()
    tokens = torch.randint(0, 256, (2, 16))
    planted = q.plant_outliers(copy.deepcopy(model), channels=(1, 5), factor=64.0)
    with torch.no_grad():
        torch.testing.assert_close(planted(tokens), model(tokens), rtol=1e-4, atol=1e-5)
    before = q.linear_input_stats(model, tokens)["blocks.0.attn.q_proj"]["inf_norm"]
    after = q.linear_input_stats(planted, tokens)["blocks.0.attn.q_proj"]["inf_norm"]
    assert after > 20 * before
    with pytest.raises(ConfigError, match="channels"):
        q.plant_outliers(model, channels=(99,))


def test_linear_input_stats_reuse_the_probe_definitions():
    model = tiny_model()
    tokens = torch.randint(0, 256, (2, 16))
    ours = q.linear_input_stats(model, tokens)
    theirs = heavy_probes(model, tokens)["linear_inputs"]
    assert set(ours) == set(q.target_linears(model)) == set(theirs)
    for name in ours:
        assert ours[name]["kurtosis"] == pytest.approx(theirs[name]["kurtosis"], rel=1e-4)
        assert ours[name]["inf_norm"] == pytest.approx(theirs[name]["inf_norm"], rel=1e-5)


EXPECTED_TYPES = {"int8": "Linear8bitLt", "int8-nooutlier": "Linear8bitLt", "nf4": "Linear4bit",
                  "fp4": "Linear4bit", "w8a8-tensor": "FakeQuantLinear", "w8a8-token": "FakeQuantLinear",
                  "fp8": "Fp8Linear", "torchao-int8wo": "Linear/torchao", "torchao-int4wo": "Linear/torchao",
                  "torchao-fp8dq": "Linear/torchao"}
FP8_TENSOR_CORES = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def _kind(module):
    """The module's class name; "Linear/torchao" for a plain Linear whose weight is a torchao tensor
    subclass (its class depends on the torchao version)."""
    weight = getattr(module, "weight", None)
    if type(module) is nn.Linear and weight is not None and type(weight).__module__.startswith("torchao."):
        return "Linear/torchao"
    return type(module).__name__


@pytest.mark.parametrize("scheme", QUANT_SCHEMES)
def test_quantize_model_swaps_every_block_linear_and_leaves_the_original(scheme):
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    if scheme == "torchao-fp8dq":  # torchao runs it on GPUs of compute capability >= 8.9 only
        if FP8_TENSOR_CORES:
            pytest.skip("a CPU model beside fp8 tensor cores: test_torchao_fp8dq_on_gpu covers it")
        with pytest.raises(Exception, match="8.9"):
            q.quantize_model(model, scheme)
        return
    quantized, facts = q.quantize_model(model, scheme)
    assert "compute_dtype" in facts
    for name in q.target_linears(model):
        assert _kind(quantized.get_submodule(name)) == EXPECTED_TYPES[scheme], name
        assert type(model.get_submodule(name)) is nn.Linear
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        reference, out = model(tokens), quantized(tokens)
    assert torch.isfinite(out).all()
    assert q.relative_output_error(reference, out) < 0.5


@pytest.mark.gpu
@pytest.mark.skipif(not FP8_TENSOR_CORES, reason="needs a CUDA GPU with fp8 tensor cores (compute capability >= 8.9)")
def test_torchao_fp8dq_on_gpu():
    model = tiny_model().cuda()
    quantized, _ = q.quantize_model(model, "torchao-fp8dq")
    for name in q.target_linears(model):
        assert _kind(quantized.get_submodule(name)) == "Linear/torchao", name
    tokens = torch.randint(0, 256, (2, 16), device="cuda")
    with torch.no_grad():
        assert q.relative_output_error(model(tokens), quantized(tokens)) < 0.5


def test_quantize_head_goes_through_the_scheme():
    model = tiny_model()
    quantized, _ = q.quantize_model(model, "w8a8-tensor", quantize_head=True)
    assert isinstance(quantized.head, q.FakeQuantLinear)
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert q.relative_output_error(model(tokens), quantized(tokens)) < 0.5


def test_full_precision_copy_undoes_fp8_training_linears():
    model = tiny_model()
    policy = PrecisionPolicy(PrecisionConfig(dtype="fp8", fp8_recipe="own"), "cpu", real_fp8=False)
    fp8_model = policy.prepare(copy.deepcopy(model))
    assert isinstance(fp8_model.blocks[0].attn.q_proj, Fp8Linear)
    reference = q.full_precision_copy(fp8_model)
    assert isinstance(fp8_model.blocks[0].attn.q_proj, Fp8Linear)  # the trained model is untouched
    assert all(type(m) is nn.Linear for m in reference.modules() if isinstance(m, nn.Linear))
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert torch.equal(reference(tokens), model(tokens))


def test_output_kl_is_zero_for_the_same_model_and_positive_after_quantization():
    model = tiny_model()
    tokens = torch.randint(0, 256, (2, 16))
    assert q.output_kl(model, model, tokens) == pytest.approx(0.0, abs=1e-7)
    quantized, _ = q.quantize_model(q.plant_outliers(copy.deepcopy(model), (1, 5), 64.0), "w8a8-tensor")
    assert q.output_kl(model, quantized, tokens) > 0


def test_capturing_inputs_never_changes_the_forward():
    model = tiny_model()
    tokens = torch.randint(0, 256, (2, 16))
    seen = []
    names = q.target_linears(model) + [q.HEAD]
    q._capture_inputs(model, names, tokens, lambda name, x: seen.append(name) or 1.0)  # a visit that returns
    assert sorted(seen) == sorted(names)
    with torch.no_grad():
        assert torch.isfinite(model(tokens)).all()


def test_relative_output_error():
    r = torch.tensor([3.0, 4.0])
    assert q.relative_output_error(r, r) == 0.0
    assert q.relative_output_error(r, torch.tensor([3.0, 4.5])) == pytest.approx(0.1)
    assert q.relative_output_error(torch.zeros(2), torch.ones(2)) == float("inf")


# ----------------------------------------------------------------------------- the entry point

def test_evaluate_schemes_shape_and_json(tiny_run):
    run, corpus = tiny_run
    model = GatedLM(run.model, seed=0)
    result = q.evaluate_schemes(model, corpus, run, ("w8a8-tensor", "nf4"))
    json.dumps(result, allow_nan=False)
    assert set(result["full_precision"]) == {"heldout_loss", "perplexity", "accuracy"}
    assert result["head_quantized"] is False and result["embeddings_quantized"] is False
    for scheme in ("w8a8-tensor", "nf4"):
        figures = result["schemes"][scheme]
        for key in ("heldout_loss", "perplexity", "accuracy", "damage_loss", "damage_accuracy", "kl",
                    "seconds", "compute_dtype", "per_linear"):
            assert key in figures, (scheme, key)
        assert figures["damage_loss"] == pytest.approx(figures["heldout_loss"]
                                                       - result["full_precision"]["heldout_loss"])
        assert set(figures["per_linear"]) == set(q.target_linears(model))
        assert all({"kurtosis", "inf_norm", "damage"} <= set(v) for v in figures["per_linear"].values())
    with pytest.raises(ConfigError, match="int3"):
        q.evaluate_schemes(model, corpus, run, ("int3",))


def test_evaluate_schemes_with_the_head_quantized(tiny_run):
    run, corpus = tiny_run
    result = q.evaluate_schemes(GatedLM(run.model, seed=0), corpus, run, ("w8a8-token",), quantize_head=True)
    assert result["head_quantized"] is True
    assert "damage" in result["schemes"]["w8a8-token"]["per_linear"][q.HEAD]


def test_a_failing_scheme_is_skipped_with_its_reason(tiny_run, monkeypatch):
    run, corpus = tiny_run

    def broken(*_args, **_kwargs):
        raise RuntimeError("no 4-bit kernel for this device")
    monkeypatch.setattr(q, "_bnb_4bit", broken)
    result = q.evaluate_schemes(GatedLM(run.model, seed=0), corpus, run, ("fp4", "w8a8-tensor"))
    assert result["schemes"]["fp4"]["skipped"] == "fp4 cannot run on cpu: RuntimeError: no 4-bit kernel for this device"
    assert result["schemes"]["fp4"]["library"] == "bitsandbytes"  # the row still says whose scheme it was
    assert "heldout_loss" not in result["schemes"]["fp4"]
    assert "heldout_loss" in result["schemes"]["w8a8-tensor"]


def test_a_diverged_model_is_not_quantized(tiny_run):
    run, corpus = tiny_run
    model = GatedLM(run.model, seed=0)
    with torch.no_grad():
        model.blocks[0].mlp.w_down.weight.fill_(float("nan"))
    result = q.evaluate_schemes(model, corpus, run, ("int8", "w8a8-tensor"))
    assert all("diverged" in figures["skipped"] for figures in result["schemes"].values())


# ----------------------------------------------------------------------------- what a scheme replaced, proved

BLOCK_LINEARS = ["blocks.0.attn.q_proj", "blocks.0.attn.k_proj", "blocks.0.attn.v_proj", "blocks.0.attn.o_proj",
                 "blocks.0.attn.gate_proj", "blocks.0.mlp.w_gate", "blocks.0.mlp.w_up", "blocks.0.mlp.w_down"]


def test_every_scheme_replaces_each_linear_it_targets_and_changes_the_model(tiny_run):
    run, corpus = tiny_run
    model = GatedLM(run.model, seed=0)
    assert q.declared_targets(model) == BLOCK_LINEARS and q.declared_targets(model, True) == [*BLOCK_LINEARS, q.HEAD]
    result = q.evaluate_schemes(model, corpus, run, QUANT_SCHEMES, per_linear=False)
    ran = {scheme: entry for scheme, entry in result["schemes"].items() if "skipped" not in entry}
    assert set(QUANT_SCHEMES) - set(ran) <= {"torchao-fp8dq"}   # GPUs of compute capability >= 8.9 only
    figures = q.quant_figures(result)
    for scheme, entry in ran.items():
        assert entry["targeted"] == entry["replaced"] == BLOCK_LINEARS and entry["unchanged"] is False, scheme
        assert (figures[f"quant_{scheme}_missed"], figures[f"quant_{scheme}_unchanged"]) == (0, 0), scheme
    json.dumps(result, allow_nan=False)


def test_a_replacement_that_skips_the_attention_projections_is_found_and_named(tiny_run, monkeypatch):
    """The fault: the loop that swaps the Linears walks a list without the attention's; the targets are read
    from the model's blocks apart from it."""
    run, corpus = tiny_run
    walked = q.target_linears
    monkeypatch.setattr(q, "target_linears", lambda model: [name for name in walked(model) if ".attn." not in name])
    result = q.evaluate_schemes(GatedLM(run.model, seed=0), corpus, run, ("w8a8-tensor", "torchao-int8wo"),
                                per_linear=False)
    figures = q.quant_figures(result)
    for scheme in ("w8a8-tensor", "torchao-int8wo"):
        entry = result["schemes"][scheme]
        assert [name for name in entry["targeted"] if name not in entry["replaced"]] == BLOCK_LINEARS[:5]
        assert (figures[f"quant_{scheme}_missed"], figures[f"quant_{scheme}_unchanged"]) == (5, 0)


def test_a_scheme_that_quantizes_nothing_is_found(tiny_run, monkeypatch):
    """The fault: a scheme whose quantizer hands back a plain copy of each Linear (the head included)."""
    run, corpus = tiny_run
    monkeypatch.setattr(q, "SCHEMES", dict(q.SCHEMES))
    q.register("identity", "stability", "no quantization at all")(lambda device: (copy.deepcopy, {}))
    result = q.evaluate_schemes(GatedLM(run.model, seed=0), corpus, run, ("identity",), quantize_head=True,
                                per_linear=False)
    entry = result["schemes"]["identity"]
    assert entry["targeted"] == [*BLOCK_LINEARS, q.HEAD] and entry["replaced"] == [] and entry["unchanged"] is True
    assert entry["kl"] == 0.0 and entry["damage_loss"] == 0.0
    assert q.quant_figures(result) == {"quant_identity_damage_loss": 0.0, "quant_identity_damage_accuracy": 0.0,
                                       "quant_identity_kl": 0.0, "quant_identity_missed": 9,
                                       "quant_identity_unchanged": 1}
