"""Models the harness did not write: Hugging Face causal LMs (model.source=hf) and factories (model.factory).

Paired init, the injected G1 gate, the probes cross-checked against the harness's own model with the
same weights, a trained pair with its JSON record and MLflow runs, and every bad input as a
ConfigError (exit 2) before training."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch

from stability import config as cfg
from stability.cases.standard import run_pair
from stability.cli import main
from stability.config import ConfigError, GateConfig, ModelConfig
from stability.model.build import build_model
from stability.model.lm import GatedLM
from stability.record import Status
from stability.train.probes import heavy_probes

transformers = pytest.importorskip("transformers")

TINY = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, context=32, source="hf")
FAST = {"steps": 6, "seeds": "0", "probes.every": 3, "probes.eval_batches": 1, "data.batch_size": 4,
        "data.builtin_bytes": 60_000, "model.context": 32}
G1 = GateConfig(position="G1")


def _tokens(seed=0):
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("hf_config", ["llama", "qwen2", "qwen3"])
def test_hf_arms_share_every_common_parameter_and_differ_by_the_injected_gate(hf_config):
    config = replace(TINY, hf_config=hf_config)
    baseline = build_model(config, seed=5)
    gated = build_model(replace(config, gate=GateConfig(position="G1", granularity="headwise")), seed=5)
    shared = dict(baseline.named_parameters())
    extra = {n: p.shape for n, p in gated.named_parameters() if n not in shared}
    assert extra == {f"inner.model.layers.{i}.self_attn.attn_gate.weight": (4, 32) for i in range(2)}
    for name, param in gated.named_parameters():
        if name in shared:
            assert torch.equal(param, shared[name]), name
    assert gated.num_gate_parameters() == 2 * 4 * 32 and baseline.num_gate_parameters() == 0
    assert baseline.block_names == ["inner.model.layers.0", "inner.model.layers.1"]
    x = _tokens()
    assert not torch.allclose(gated(x), baseline(x))
    other_seed = build_model(config, seed=6)
    assert not torch.equal(other_seed.inner.model.embed_tokens.weight, baseline.inner.model.embed_tokens.weight)


def _harness_to_hf(state: dict) -> dict:
    """The harness llama model's weights under the names of the wrapped HF Llama."""
    names = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm", "attn.gate_proj": "self_attn.attn_gate",
             "attn.": "self_attn.", "mlp.w_gate": "mlp.gate_proj", "mlp.w_up": "mlp.up_proj",
             "mlp.w_down": "mlp.down_proj"}
    out = {}
    for name, value in state.items():
        if name == "embed.weight":
            new = "model.embed_tokens.weight"
        elif name == "norm.weight":
            new = "model.norm.weight"
        else:
            new = "model.layers." + name.removeprefix("blocks.")
            for old, hf in names.items():
                new = new.replace(old, hf, 1) if old in new and hf not in new else new
        out["inner." + new] = value
    return out


@pytest.mark.parametrize("granularity", ["elementwise", "headwise"])
def test_probes_on_an_hf_model_match_the_harness_model_with_the_same_weights(granularity):
    gate = GateConfig(position="G1", granularity=granularity)
    ours = GatedLM(replace(TINY, source="harness", gate=gate), seed=1).eval()
    hf = build_model(replace(TINY, gate=gate), seed=1).eval()
    missing, unexpected = hf.load_state_dict(_harness_to_hf(ours.state_dict()), strict=False)
    assert not unexpected and missing == ["inner.lm_head.weight"]  # tied to the embeddings
    with torch.no_grad():  # a planted massive activation (channel 3 of the residual stream), so M-Act is not noise
        ours.embed.weight[:, 3] = 50.0
        hf.inner.model.embed_tokens.weight[:, 3] = 50.0
    x = _tokens(1)
    assert torch.allclose(hf(x), ours(x), atol=1e-5)
    a, b = heavy_probes(ours, x), heavy_probes(hf, x)
    for key in ("m_act_max", "m_act_mean", "f_attn_mean", "sink_rate_mean", "max_attn_logit", "gate_score_mean",
                "logit_max", "log_z_mean"):
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    for layer_a, layer_b in zip(a["layers"], b["layers"], strict=True):
        assert layer_b == pytest.approx(layer_a, rel=1e-4, abs=1e-6)
    assert a["m_act_max"] > 10 and a["f_attn_mean"] > 0
    assert hf.inner.config._attn_implementation == "sdpa"  # the probe attention was switched back
    assert torch.allclose(hf(x), ours(x), atol=1e-5)


def test_an_hf_llama_pair_trains_with_a_record_and_mlflow_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sets = [x for key, value in {**FAST, "model.source": "hf", "model.d_model": 32, "model.n_layers": 2}.items()
            for x in ("--set", f"{key}={value}")]
    assert main(["run", "--preset", "smoke", *sets, "--tracking-uri", uri, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "model: hf (llama)" in out and "corpus: builtin" in out
    (path,) = [p for p in (tmp_path / "reports" / "runs").glob("*/*.json") if p.name != "manifest.json"]
    record = json.loads(path.read_text())
    assert [a["status"] for a in record["arms"]] == [Status.COMPLETED, Status.COMPLETED]
    assert record["config"]["run"]["model"]["source"] == "hf"
    assert {a["model"]["class"] for a in record["arms"]} == {"LlamaForCausalLM"}
    assert record["corpus"]["kind"] == "builtin" and record["tracking"]["status"] == "tracked"
    gated = record["arms"][1]["final"]
    assert gated["f_attn_mean"] is not None and gated["gate_score_mean"] is not None and gated["m_act_max"] > 0
    assert record["paired"]["gated"]["heldout_loss"]["n"] == 1

    from mlflow.tracking import MlflowClient

    runs = MlflowClient(tracking_uri=uri).search_runs(
        [e.experiment_id for e in MlflowClient(tracking_uri=uri).search_experiments()])
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(runs) == 3 and parent[0].data.tags["stability.model_source"] == "hf"


def test_a_factory_model_trains_as_a_pair_with_its_shared_parameters_paired():
    config = cfg.resolve("smoke", {**FAST, "model.factory": "_factories:tiny_lm", "model.d_model": 32})
    models = [build_model(config.arm_config(arm, 0).model, 0) for arm in ("reference", "gated")]
    shared = dict(models[0].named_parameters())
    gated_params = dict(models[1].named_parameters())
    assert set(gated_params) - set(shared) == {f"inner.layers.{i}.attention.attn_gate.weight" for i in range(2)}
    assert all(torch.equal(gated_params[n], p) for n, p in shared.items())
    assert models[1].block_names == ["inner.layers.0", "inner.layers.1"]
    record = run_pair(config)
    assert [a["status"] for a in record["arms"]] == [Status.COMPLETED, Status.COMPLETED]
    gated = record["arms"][1]
    assert gated["model"]["source"] == "factory" and gated["layer_names"] == ["head", "layer0", "layer1"]
    assert gated["final"]["m_act_max"] > 0 and gated["final"]["gate_score_mean"] is not None
    assert gated["final"]["f_attn_mean"] is None  # its attention shows no probabilities: absent, not invented
    harness = cfg.resolve("smoke", {**FAST, "model.factory": "_factories:harness_lm", "model.d_model": 32})
    assert isinstance(build_model(harness.arm_config("gated", 0).model, 0), GatedLM)


def _hf_dir(tmp_path, config) -> str:
    config.save_pretrained(tmp_path / "model")
    return str(tmp_path / "model")


@pytest.mark.parametrize(("sets", "message"), [
    ({"model.factory": "no_such_package.models:build"}, (r"model\.factory='no_such_package\.models:build' does not "
                                                        r"import: ModuleNotFoundError")),
    ({"model.factory": "_factories:missing"}, r"module '_factories' has no function 'missing'"),
    ({"model.factory": "_factories:not_a_module"}, (r"model\.factory='_factories:not_a_module' returned dict: "
                                                   r"expected a torch\.nn\.Module")),
    ({"model.factory": "_factories:ignores_the_gate"}, r"built the same parameters with and without the gate"),
    ({"model.factory": "_factories:wrong_output"}, (r"returned logits of shape \(2, 8, 8\): expected .*V >= "
                                                   r"model\.vocab_size=257")),
    ({"model.factory": "_factories:no_attention"}, (r"no attention module with q_proj and o_proj Linears: the G1 "
                                                   r"gate cannot be injected")),
    ({"model.factory": "not a path"}, (r"model\.factory='not a path' is invalid: expected '' or "
                                      r"'package\.module:function'")),
    ({"model.source": "hf", "model.hf_config": "no/such/dir"}, (r"model\.hf_config='no/such/dir' is invalid: "
                                                               r"expected one of \('llama', 'qwen2', 'qwen3'\)")),
    ({"model.source": "hf", "gated_gate.position": "G3"}, (r"gated_gate\.position='G3' is invalid: expected 'G1' "
                                                          r"with model\.source='hf'")),
    ({"model.source": "hf", "model.family": "gpt2"}, r"model\.family='gpt2' is invalid with model\.source='hf'"),
])
def test_bad_models_are_clear_errors_before_training(tmp_path, monkeypatch, capsys, sets, message):
    monkeypatch.chdir(tmp_path)
    args = [x for key, value in {**FAST, **sets}.items() for x in ("--set", f"{key}={value}")]
    assert main(["run", "--preset", "smoke", *args, "--no-track", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not list(tmp_path.glob("reports/runs/*/*-regression-*.json"))  # nothing trained, no record


def test_bad_hf_config_directories(tmp_path):
    vit = _hf_dir(tmp_path / "vit", transformers.ViTConfig(hidden_size=32, num_hidden_layers=1,
                                                           num_attention_heads=2, intermediate_size=64))
    with pytest.raises(ConfigError, match=rf"model\.hf_config='{vit}' is not a causal LM: its model_type 'vit'"):
        build_model(replace(TINY, hf_config=vit), 0)
    gpt2 = _hf_dir(tmp_path / "gpt2", transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=257,
                                                              n_positions=64))
    assert isinstance(build_model(replace(TINY, hf_config=gpt2), 0).inner, transformers.GPT2LMHeadModel)
    with pytest.raises(ConfigError, match=rf"model\.hf_config='{gpt2}' \(GPT2LMHeadModel\) has no attention module "
                                          r"with q_proj and o_proj"):
        build_model(replace(TINY, hf_config=gpt2, gate=G1), 0)
    llama = _hf_dir(tmp_path / "llama", transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=300,
        max_position_embeddings=16))
    with pytest.raises(ConfigError, match=r"model\.vocab_size=257 does not match .* whose vocab_size is 300: "
                                          r"expected model\.vocab_size=300"):
        build_model(replace(TINY, hf_config=llama), 0)
    with pytest.raises(ConfigError, match=r"model\.context=32 exceeds the max_position_embeddings=16"):
        build_model(replace(TINY, hf_config=llama, vocab_size=300), 0)
    model = build_model(replace(TINY, hf_config=llama, vocab_size=300, context=16, gate=G1), 0)
    assert model.num_gate_parameters() == 32 * 32 and model.describe()["class"] == "LlamaForCausalLM"
