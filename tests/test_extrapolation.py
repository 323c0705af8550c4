"""The length-extrapolation probe: NTK-aware RoPE, the points it measures, and its bad input."""

from __future__ import annotations

import math

import pytest
import torch

from stability.cases.stress import cpu_threads
from stability.config import ConfigError, ExtrapolationConfig, resolve
from stability.data import eval_batches, load_corpus
from stability.evaluate.extrapolation import check_corpus, evaluate_lengths, extrapolation_figures, ntk_theta
from stability.model.attention import rope_tables
from stability.model.lm import GatedLM
from stability.precision import PrecisionPolicy
from stability.train.evaluate import evaluate

CONFIG = resolve("smoke", {"model.d_model": 32, "model.n_layers": 1, "model.n_heads": 2, "model.n_kv_heads": 1,
                           "model.context": 16, "data.batch_size": 2, "data.builtin_bytes": 20_000,
                           "probes.probe_batch_size": 2, "extrapolation.factors": "2,4",
                           "extrapolation.eval_batches": 2})


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread, as the stress cases use: tiny models gain nothing from more."""
    with cpu_threads(1):
        yield


def frequencies(theta: float, head_dim: int) -> torch.Tensor:
    """The rotary angular frequencies, read back from the tables (the angle at position 1)."""
    cos, sin = rope_tables(2, head_dim, theta)
    return torch.atan2(sin[1].double(), cos[1].double())


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_ntk_aware_base_interpolates_the_lowest_frequency_and_keeps_the_highest(factor):
    """Peng et al. (2023), sec. 3.1: b' = b * s^(d/(d-2)) stretches the slowest rotation by exactly s and
    leaves the fastest one as trained."""
    head_dim = 16
    plain, scaled = frequencies(1e4, head_dim), frequencies(ntk_theta(1e4, factor, head_dim), head_dim)
    assert scaled[0].item() == pytest.approx(plain[0].item())
    assert scaled[-1].item() == pytest.approx(plain[-1].item() / factor, rel=1e-6)
    assert all(scaled[i] <= plain[i] for i in range(len(plain)))


@pytest.fixture(scope="module")
def points():
    corpus = load_corpus(CONFIG.run.data, CONFIG.run.model.vocab_size, CONFIG.run.model.context)
    model = GatedLM(CONFIG.arm_config("gated", 0).model, seed=0)
    trained_table = model.rope_cos.clone()
    result = evaluate_lengths(model, corpus, CONFIG.run, CONFIG.extrapolation)
    return model, corpus, result, trained_table


def test_every_length_is_read_with_plain_and_ntk_rope(points):
    model, _, result, trained_table = points
    assert [(p["factor"], p["length"], p["rope"]) for p in result["points"]] == [
        (1.0, 16, "plain"), (2.0, 32, "plain"), (2.0, 32, "ntk"), (4.0, 64, "plain"), (4.0, 64, "ntk")]
    assert all(math.isfinite(p["heldout_loss"]) and 0.0 <= p["f_attn"] <= 1.0 and 0.0 <= p["sink_rate"] <= 1.0
               for p in result["points"])
    at_4 = {p["rope"]: p["heldout_loss"] for p in result["points"] if p["factor"] == 4.0}
    assert at_4["plain"] != at_4["ntk"]                     # the scaled table is really used
    assert torch.equal(model.rope_cos, trained_table)       # and the trained one is back afterwards


def test_the_1x_point_is_the_ordinary_held_out_loss(points):
    model, corpus, result, _ = points
    run = CONFIG.run
    batches = eval_batches(corpus, CONFIG.extrapolation.eval_batches, run.data.batch_size, run.model.context)
    ordinary = evaluate(model, batches, PrecisionPolicy(run.precision, run.device))["heldout_loss"]
    assert result["points"][0]["heldout_loss"] == pytest.approx(ordinary, rel=1e-6)


def test_figures_are_named_by_rope_and_factor_and_the_gap_is_against_1x(points):
    figures = extrapolation_figures(points[2])
    assert set(figures) == {f"extrap_{f}_{r}" for f in ("loss", "f_attn", "sink_rate")
                            for r in ("plain_x1", "plain_x2", "ntk_x2", "plain_x4", "ntk_x4")} | {
        f"extrap_gap_{r}" for r in ("plain_x2", "ntk_x2", "plain_x4", "ntk_x4")}
    assert figures["extrap_gap_ntk_x4"] == pytest.approx(figures["extrap_loss_ntk_x4"] - figures["extrap_loss_plain_x1"])


def test_a_context_beyond_the_held_out_split_is_a_clear_error(tmp_path):
    text = tmp_path / "small.txt"
    text.write_bytes(bytes(range(32, 127)) * 20)   # 1900 bytes: 190 held out
    config = resolve("smoke", {"data.corpus": str(text), "extrapolation.factors": "2,4"})  # context 64: 256 > 190
    corpus = load_corpus(config.run.data, config.run.model.vocab_size, config.run.model.context)
    with pytest.raises(ConfigError) as error:
        check_corpus(corpus, config)
    message = str(error.value)
    assert "extrapolation.factors=(2.0, 4.0)" in message and "256 tokens" in message and "has 190" in message
    assert "at most 2.97" in message
    check_corpus(corpus, resolve("smoke", {"data.corpus": str(text), "extrapolation.factors": "2"}))   # 128 fits


def test_lengths_always_include_the_training_context():
    assert ExtrapolationConfig(factors=(4, 2)).lengths(64) == [(1.0, 64), (2.0, 128), (4.0, 256)]
    assert ExtrapolationConfig(factors=(1.5,)).lengths(64) == [(1.0, 64), (1.5, 96)]
    assert not ExtrapolationConfig().enabled
