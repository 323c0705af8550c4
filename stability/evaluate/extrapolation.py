"""Length extrapolation: a trained arm read at 1x, 2x, 4x ... its training context.

After training, the model is evaluated on held-out sequences longer than any it saw, with two ways
of giving positions beyond the trained range to its rotary embedding:

* ``plain``: the rotary tables extended with the trained base theta (positions the model never saw);
* ``ntk``: NTK-aware scaled RoPE: the base becomes ``theta * s ** (d / (d - 2))`` for length factor
  s and head dim d, so the lowest frequency is interpolated by s while the highest stays as trained
  (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models", sec. 3.1,
  after bloc97's "NTK-aware scaled RoPE", 2023). At factor 1 it is the plain table.

At each length: held-out loss (``extrapolation.eval_batches`` batches of ``data.batch_size``), and
F-Attn and sink rate on one probe batch (the explicit attention path; ``stability.train.probes``). The
figures go into the arm's ``final`` as ``extrap_<figure>_<rope>_x<factor>`` with ``<figure>`` one of
``loss``, ``gap`` (loss minus the plain loss at 1x: the degradation; factors above 1), ``f_attn``,
``sink_rate``; the
points themselves into the arm record's ``extrapolation`` entry.
"""

from __future__ import annotations

import time

import torch

from stability.config import ConfigError, ExperimentConfig, ExtrapolationConfig, RunConfig
from stability.data import Corpus, eval_batches, probe_batch
from stability.model.lm import GatedLM
from stability.precision import PrecisionPolicy
from stability.train.evaluate import evaluate
from stability.train.probes import first_token_share, sink_rate


def ntk_theta(theta: float, factor: float, head_dim: int) -> float:
    """The NTK-aware RoPE base for a length factor: ``theta * factor ** (head_dim / (head_dim - 2))``."""
    return theta * factor ** (head_dim / (head_dim - 2))


def factor_name(factor: float) -> str:
    """2.0 -> "x2", 1.5 -> "x1.5" (the suffix of the figure names)."""
    return f"x{factor:g}"


def check_corpus(corpus: Corpus, config: ExperimentConfig) -> None:
    """ConfigError unless the held-out split holds one sequence at the longest evaluated length."""
    extrapolation, run = config.extrapolation, config.run
    if not extrapolation.enabled:
        return
    factor, length = extrapolation.lengths(run.model.context)[-1]
    need = length if run.data.bos else length + 1
    have = len(corpus.heldout)
    if have < need:
        raise ConfigError(
            f"extrapolation.factors={extrapolation.factors!r} is invalid here: factor {factor:g} reads held-out "
            f"sequences of {length} tokens (model.context={run.model.context} x {factor:g}) but the held-out split "
            f"of data.corpus={corpus.name!r} has {have} tokens: expected a factor of at most "
            f"{max(1.0, (have - (0 if run.data.bos else 1)) / run.model.context):.3g} or a longer corpus")


@torch.no_grad()
def attention_at_first_token(model: GatedLM, tokens: torch.Tensor) -> dict[str, float]:
    """F-Attn (queries >= 1) and sink rate, each the mean over layers, on one batch (B, S)."""
    f_attn: list[float] = []
    sinks: list[float] = []

    def observe(_layer, name, tensor):
        if name == "attn_probs":
            f_attn.append(first_token_share(tensor, first_query=1).mean().item())
            sinks.append(sink_rate(first_token_share(tensor, first_query=0)))

    was_training = model.training
    model.eval()
    model.set_observer(observe)
    try:
        model(tokens)
    finally:
        model.set_observer(None)
        model.train(was_training)
    return {"f_attn": sum(f_attn) / len(f_attn), "sink_rate": sum(sinks) / len(sinks)}


def evaluate_lengths(model: GatedLM, corpus: Corpus, run: RunConfig, extrapolation: ExtrapolationConfig) -> dict:
    """The extrapolation points of a trained ``model`` (see the module docstring).

    Returns {"scaling", "factors", "points": [{"factor", "length", "rope", "theta", "heldout_loss",
    "f_attn", "sink_rate", "seconds"}], "seconds"}. The model's rotary tables are restored afterwards."""
    policy = PrecisionPolicy(run.precision, run.device)
    started = time.perf_counter()
    ropes = ["plain"] + (["ntk"] if extrapolation.scaling == "ntk" else [])
    points = []
    trained = (model.rope_cos, model.rope_sin)
    try:
        for factor, length in extrapolation.lengths(run.model.context):
            batches = eval_batches(corpus, extrapolation.eval_batches, run.data.batch_size, length, run.data.bos,
                                   run.device)
            probe_x, _ = probe_batch(corpus, run.probes.probe_batch_size, length, run.data.bos, run.device)
            for rope in ropes:
                if rope == "ntk" and factor == 1.0:
                    continue  # the same table as plain
                t0 = time.perf_counter()
                theta = ntk_theta(run.model.rope_theta, factor, run.model.rotary_dim) if rope == "ntk" \
                    else run.model.rope_theta
                model.set_positions(length, theta)
                loss = evaluate(model, batches, policy)["heldout_loss"]
                with policy.autocast():
                    attention = attention_at_first_token(model, probe_x)
                points.append({"factor": factor, "length": length, "rope": rope, "theta": theta,
                               "heldout_loss": loss, **attention, "seconds": time.perf_counter() - t0})
    finally:
        model.rope_cos, model.rope_sin = trained
    return {"scaling": extrapolation.scaling, "factors": [f for f, _ in extrapolation.lengths(run.model.context)],
            "points": points, "seconds": time.perf_counter() - started}


def extrapolation_figures(result: dict) -> dict[str, float]:
    """``extrap_{loss,gap,f_attn,sink_rate}_<rope>_x<factor>`` from ``evaluate_lengths`` output. The NTK
    curve starts from the plain 1x point (the same table), so it has figures at the factors above 1 only."""
    points = result["points"]
    base = next((p["heldout_loss"] for p in points if p["factor"] == 1.0 and p["rope"] == "plain"), None)
    out: dict[str, float] = {}
    for point in points:
        suffix = f"{point['rope']}_{factor_name(point['factor'])}"
        out[f"extrap_loss_{suffix}"] = point["heldout_loss"]
        if point["factor"] != 1.0:
            out[f"extrap_gap_{suffix}"] = point["heldout_loss"] - base if base is not None else None
        out[f"extrap_f_attn_{suffix}"] = point["f_attn"]
        out[f"extrap_sink_rate_{suffix}"] = point["sink_rate"]
    return out
