"""Post-training quantization of both arms of a trained pair, and low-precision training stress.

One smoke pair (baseline vs G1-gated) is trained once for the module with every scheme of
``SCHEMES`` evaluated on both arms. The invariants here hold at any scale:

* full-precision figures reproduce, and equal the trainer's final held-out figures;
* the trained model is never modified by the evaluation;
* LLM.int8() (outlier decomposition) loses less than plain int8 on a model with PLANTED
  outlier features (function-preserving: norm gains x64 on a few channels, the Linears that
  read them divided by 64);
* the same planted massive activation makes per-tensor W8A8 lose more than without it.

"Loses" in the two planted checks is measured by ``kl`` (KL(full || quantized) of the
next-token distributions, never negative) and by the per-Linear output error, not by the
held-out loss damage: on a 60-step smoke model the loss damage is noise-signed (measured:
planting x64 made w8a8-tensor LOWER the held-out loss by 0.009 nats while its KL rose from
~1e-7 to 2e-3, the quantizer blurring an overconfident, barely trained model). The loss
damages are printed beside the KL;
* an unknown scheme is a ConfigError, a scheme that cannot run is recorded as skipped.

The paired question (does the gate reduce quantization damage?) is printed and recorded for
every scheme, but NOT asserted: a 2-layer, 60-step smoke model has no massive activations
(input infinity norms of a few units), so both arms lose ~1e-4 nats and the sign of the
difference is noise. Qiu et al. see the effect at 1B+ parameters and 100B+ tokens.
"""

from __future__ import annotations

import copy
import math
import sys

import pytest
import torch

from stability.cases.standard import run_pair
from stability.cli import build_parser, main
from stability.cli.options import check_here, resolve_from_args
from stability.config import ConfigError
from stability.evaluate import quantize
from stability.record import Status
from stability.report.tables import quant_rows, quant_table
from stability.track.runs import log_to_mlflow
from stability.train.optimizer import make_optimizer
from stability.train.trainer import train

pytestmark = pytest.mark.quant
QUANT_SCHEMES = tuple(quantize.SCHEMES)

PLANT = {"channels": (3, 17, 40), "factor": 64.0}


def cannot_run(record) -> tuple[str, ...]:
    """The schemes torchao refuses on the record's device: float8 dynamic quantization needs a GPU of
    compute capability 8.9 or above."""
    device = record["config"]["run"]["device"]
    fp8_tensor_cores = device.startswith("cuda") and torch.cuda.get_device_capability(device) >= (8, 9)
    return () if fp8_tensor_cores else ("torchao-fp8dq",)


def runs_here(record) -> tuple[str, ...]:
    return tuple(s for s in QUANT_SCHEMES if s not in cannot_run(record))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread while this module runs, restored after. On a CPU shared with other jobs a
    2-thread OpenMP region waits for a descheduled thread: measured here, a 60-step smoke arm took
    22 s with 2 threads and 3.7 s with 1 (benchmarks/bench_quant.py --threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pair(stress_config):
    """The trained pair record, plus a copy of each trained model as evaluate_schemes received it
    (a spy around the real function) and whether the evaluation left the model unchanged."""
    captured = {}
    real = quantize.evaluate_schemes

    def spy(model, corpus, run, schemes, **kwargs):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        types = [type(m) for m in model.modules()]
        result = real(model, corpus, run, schemes, **kwargs)
        unchanged = types == [type(m) for m in model.modules()] and all(
            torch.equal(v, before[k]) for k, v in model.state_dict().items())
        arm = "gated" if run.model.gate.enabled else "reference"
        captured[arm] = {"model": copy.deepcopy(model), "corpus": corpus, "run": run, "unchanged": unchanged}
        return result

    patch = pytest.MonkeyPatch()
    patch.setattr(quantize, "evaluate_schemes", spy)
    try:
        config = stress_config(quant_schemes=",".join(QUANT_SCHEMES), seeds="0")
        record = run_pair(config)
    finally:
        patch.undo()
    assert record["status"] == Status.COMPLETED, [a.get("stop_reason") for a in record["arms"]]
    return record, captured


def _arm(record, name):
    return next(a for a in record["arms"] if a["arm"] == name)


def test_every_scheme_runs_on_both_arms(pair):
    record, _ = pair
    for arm in record["arms"]:
        quant = arm["quant"]
        assert quant["head_quantized"] is False and quant["reference_dtype"] == "fp32"
        full = quant["full_precision"]
        for scheme in cannot_run(record):
            figures = quant["schemes"][scheme]
            assert "8.9" in figures["skipped"] and figures["library"] == "torchao", figures
            assert f"quant_{scheme}_damage_loss" not in arm["final"]
        for scheme in runs_here(record):
            figures = quant["schemes"][scheme]
            assert "skipped" not in figures, (arm["arm"], scheme, figures)
            assert math.isfinite(figures["heldout_loss"]) and 0 <= figures["accuracy"] <= 1
            assert figures["damage_loss"] == pytest.approx(figures["heldout_loss"] - full["heldout_loss"])
            assert figures["damage_accuracy"] == pytest.approx(figures["accuracy"] - full["accuracy"])
            assert figures["per_linear"] and all({"kurtosis", "inf_norm", "damage"} <= set(v)
                                                 for v in figures["per_linear"].values())
            assert arm["final"][f"quant_{scheme}_damage_loss"] == figures["damage_loss"]
            assert figures["kl"] >= -1e-6
        assert {"int8", "int8-nooutlier"} <= set(quant["schemes"])


def test_full_precision_figures_reproduce(pair):
    record, captured = pair
    for name in ("reference", "gated"):
        arm, seen = _arm(record, name), captured[name]
        full = arm["quant"]["full_precision"]
        if seen["run"].precision.dtype == "fp32":  # the trainer evaluated in the same format
            assert full["heldout_loss"] == arm["final"]["heldout_loss"]
            assert full["accuracy"] == arm["final"]["accuracy"]
        again = quantize.evaluate_schemes(seen["model"], seen["corpus"], seen["run"], ())
        twice = quantize.evaluate_schemes(seen["model"], seen["corpus"], seen["run"], ())
        assert again["full_precision"] == twice["full_precision"] == full
        assert seen["unchanged"], f"evaluate_schemes modified the trained {name} model"


def test_llm_int8_beats_plain_int8_on_planted_outliers(pair):
    _, captured = pair
    seen = captured["reference"]
    planted = quantize.plant_outliers(copy.deepcopy(seen["model"]), **PLANT)
    result = quantize.evaluate_schemes(planted, seen["corpus"], seen["run"], ("int8", "int8-nooutlier"))
    plain = quantize.evaluate_schemes(seen["model"], seen["corpus"], seen["run"], ())
    assert result["full_precision"]["heldout_loss"] == pytest.approx(plain["full_precision"]["heldout_loss"],
                                                                     rel=1e-4)  # planting keeps the function
    llm, naive = result["schemes"]["int8"], result["schemes"]["int8-nooutlier"]
    print(f"\nplanted outliers x{PLANT['factor']:g}: LLM.int8 KL {llm['kl']:.2e} (loss damage "
          f"{llm['damage_loss']:+.5f}), plain int8 KL {naive['kl']:.2e} "
          f"(loss damage {naive['damage_loss']:+.5f})")
    assert llm["kl"] < naive["kl"]
    q_proj = "blocks.0.attn.q_proj"
    assert llm["per_linear"][q_proj]["damage"] < naive["per_linear"][q_proj]["damage"]


def test_planted_massive_activation_hurts_per_tensor_w8a8(pair):
    record, captured = pair
    seen = captured["reference"]
    planted = quantize.plant_outliers(copy.deepcopy(seen["model"]), **PLANT)
    hit = quantize.evaluate_schemes(planted, seen["corpus"], seen["run"], ("w8a8-tensor",))
    hit = hit["schemes"]["w8a8-tensor"]
    clean = _arm(record, "reference")["quant"]["schemes"]["w8a8-tensor"]
    print(f"\nw8a8-tensor: KL clean {clean['kl']:.2e} -> planted {hit['kl']:.2e}; loss damage "
          f"{clean['damage_loss']:+.5f} -> {hit['damage_loss']:+.5f}; zeroed activations "
          f"{clean['activation_zeroed_fraction']:.3f} -> {hit['activation_zeroed_fraction']:.3f}")
    assert hit["kl"] > 10 * clean["kl"]
    assert hit["activation_zeroed_fraction"] > clean["activation_zeroed_fraction"]
    q_proj = "blocks.0.attn.q_proj"
    assert hit["per_linear"][q_proj]["inf_norm"] > 10 * clean["per_linear"][q_proj]["inf_norm"]
    assert hit["per_linear"][q_proj]["damage"] > clean["per_linear"][q_proj]["damage"]


def test_paired_comparison_is_reported(pair, tracking_uri):
    """Gated vs baseline damage per scheme: recorded in the paired summary, printed as the CLI's
    table, sent to MLflow; its sign is not asserted (see the module docstring)."""
    record, _ = pair
    for scheme in runs_here(record):
        paired = record["paired"]["gated"][f"quant_{scheme}_damage_loss"]
        assert paired["better"] == "lower" and paired["reference"] is not None and paired["treatment"] is not None
    table = quant_table(record)
    print("\n" + table)
    assert all(scheme in table for scheme in QUANT_SCHEMES)
    rows = {row[0]: row for row in quant_rows(record)[1:]}  # the library and recipe of every scheme
    assert rows["int8"][1].startswith("bitsandbytes ") and "Linear8bitLt" in rows["int8"][-1]
    assert rows["torchao-int8wo"][1] == f"torchao {record['env']['torchao']}"
    assert "Int8WeightOnlyConfig" in rows["torchao-int8wo"][-1]
    assert rows["w8a8-token"][1].startswith("stability")
    tracking = log_to_mlflow(copy.deepcopy(record), tracking_uri, "stability-quant-suite")
    assert tracking["status"] == "tracked", tracking
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    for run_id in tracking["child_run_ids"].values():
        metrics = client.get_run(run_id).data.metrics
        for scheme in runs_here(record):
            assert f"quant.{scheme}.damage_loss" in metrics, sorted(metrics)[:20]


def test_a_scheme_that_cannot_run_is_skipped_with_its_reason(pair, monkeypatch):
    _, captured = pair
    seen = captured["gated"]
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` now fails
    result = quantize.evaluate_schemes(seen["model"], seen["corpus"], seen["run"],
                                       ("int8", "nf4", "w8a8-token"))
    for scheme in ("int8", "nf4"):
        assert "heldout_loss" not in result["schemes"][scheme]
        assert "bitsandbytes" in result["schemes"][scheme]["skipped"]
    assert "heldout_loss" in result["schemes"]["w8a8-token"]


def test_without_torchao_its_schemes_are_skipped_with_the_reason(pair, monkeypatch):
    _, captured = pair
    seen = captured["gated"]
    monkeypatch.setitem(sys.modules, "torchao", None)  # `import torchao` now fails
    result = quantize.evaluate_schemes(seen["model"], seen["corpus"], seen["run"],
                                       ("torchao-int8wo", "torchao-int4wo", "int8"))
    for scheme in ("torchao-int8wo", "torchao-int4wo"):
        assert "heldout_loss" not in result["schemes"][scheme]
        assert "torchao cannot be imported" in result["schemes"][scheme]["skipped"]
    assert "heldout_loss" in result["schemes"]["int8"]  # bitsandbytes' schemes are not touched


def test_unknown_scheme_is_a_config_error(pair, stress_config):
    _, captured = pair
    seen = captured["gated"]
    with pytest.raises(ConfigError, match="int4"):
        check_here(stress_config(quant_schemes="int8,int4"))
    with pytest.raises(ConfigError, match="int4"):
        quantize.evaluate_schemes(seen["model"], seen["corpus"], seen["run"], ("int4",))
    args = build_parser().parse_args(["run", "--quant", "all"])
    assert resolve_from_args(args).quant_schemes == QUANT_SCHEMES
    assert main(["run", "--quant", "int8,int4", "--no-track"]) == 2


# ----------------------------------------------------------------------------- low-precision training stress

SHORT = {"steps": 4, "probes.every": 2}


@pytest.mark.stress
def test_adamw8bit_runs_on_the_cpu_with_8bit_state(stress_config):
    """bitsandbytes 0.50's AdamW8bit runs on CPU tensors: no ConfigError and no fallback needed.
    Tensors with fewer than 4096 values keep 32-bit state (bitsandbytes' min_8bit_size)."""
    config = stress_config({**SHORT, "optim.optimizer": "adamw8bit"})
    run = config.arm_config("gated", 0)
    record = train(run, arm="gated")
    assert record["status"] == Status.COMPLETED, record["stop_reason"]
    assert all(math.isfinite(v) for v in record["series"]["loss"])
    from stability.model.lm import GatedLM

    model = GatedLM(run.model).to(run.device)
    optimizer = make_optimizer(model, run)
    assert type(optimizer).__name__ == "AdamW8bit"
    model(torch.zeros(1, 4, dtype=torch.long, device=run.device)).sum().backward()
    optimizer.step()
    assert optimizer.state[model.embed.weight]["state1"].dtype == torch.uint8


@pytest.mark.stress
def test_fp16_without_loss_scaling_records_where_it_overflows(stress_config):
    """fp16 with no loss scaling at a learning rate that blows the activations past 65504: the arm
    stops as diverged (not an error) and the record says where (module, layer) and what the
    precision policy counted. No warmup: the `ci` preset's 30 warmup steps would keep the LR tiny for the
    whole run."""
    config = stress_config({**SHORT, "steps": 5, "precision.dtype": "fp16", "precision.loss_scaling": False,
                            "optim.lr": 3.0, "optim.warmup_steps": 0})
    record = train(config.arm_config("reference", 0), arm="reference")
    print("\nfp16 (no loss scaling):", record["stop_reason"], record["events"][:1], record["precision_stats"])
    assert record["status"] == Status.DIVERGED, record.get("traceback")
    event = record["events"][0]
    assert event["module"] and event["layer"] is not None
    assert set(record["series"]["loss_scale"]) == {1.0}
    assert record["precision_stats"] and "overflow_fraction" in record["final"]


@pytest.mark.stress
def test_fp8_run_trains_through_torchao_with_the_overflow_figures(tmp_path, capsys):
    """`stability run --set precision.dtype=fp8` (shortened): torchao's float8 "tensorwise" recipe,
    emulated on the CPU, named in every arm's record with torchao's version; the overflow and
    underflow fractions in its final figures."""
    from stability.record import read_record
    from stability.record.rundir import record_files

    code = main(["run", "--set", "precision.dtype=fp8", "--set", "steps=4", "--set", "seeds=0", "--set",
                 "probes.every=2", "--no-track", "--quiet", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    (path,) = record_files([tmp_path], all_sessions=True)
    record = read_record(path)
    for arm in record["arms"]:
        assert arm["status"] == Status.COMPLETED
        source = arm["precision"]
        assert (source["library"], source["recipe"], source["emulated"]) == ("torchao", "float8 tensorwise", True)
        assert source["version"] == record["env"]["torchao"]
        assert 0.0 <= arm["final"]["overflow_fraction"] <= 1 and 0.0 < arm["final"]["underflow_fraction"] < 1


@pytest.mark.stress
def test_fp8_delayed_and_current_scaling_both_run_and_differ(stress_config):
    records = {}
    for scaling in ("current", "delayed"):
        config = stress_config({**SHORT, "precision.dtype": "fp8", "precision.fp8_recipe": "own",
                                "precision.fp8_scaling": scaling})
        records[scaling] = train(config.arm_config("gated", 0), arm="gated")
        assert records[scaling]["status"] == Status.COMPLETED, records[scaling]["stop_reason"]
    current, delayed = records["current"], records["delayed"]
    print("\nfp8 current:", current["series"]["loss"], current["precision_stats"])
    print("fp8 delayed:", delayed["series"]["loss"], delayed["precision_stats"])
    assert current["series"]["loss"] != delayed["series"]["loss"]
    # current scaling fits every tensor by construction; delayed scaling saturates what outgrew its history
    assert all(s["overflow_fraction"] == 0 for s in current["precision_stats"])
    assert any(s["overflow_fraction"] > 0 for s in delayed["precision_stats"])
