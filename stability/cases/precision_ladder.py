"""The precision ladder (``precision_ladder``): the same run (the configured LR, the plain schedule) in fp32,
bf16, fp16 with torch.amp.GradScaler, fp8 through torchao's float8 training (the configured recipe,
"tensorwise" by default) and the MX formats mxfp8 and mxfp4 (mxfp8 with e2m1 weights) through torchao's MX
matmul, emulated on the CPU; the loss gap to fp32, non-finite events, loss-scale drops and overflow /
underflow fractions per rung, and the library, version and recipe that trained each rung.

* ``loss_gap_<p>``: held-out loss at precision ``p`` minus held-out loss in fp32, same arm and seed.
* ``first_loss_gap_<p>``: |training loss of step 0 at precision ``p`` minus that of fp32|, same arm and seed:
  the same initial weights and batch, so only the format moves it (where the held-out gaps of a short run are
  rounding noise, at ``smoke``), and a rung that did not train in its format shows ~0.
* ``linear_off_format_calls_<p>``, ``lr_off_log_steps_<p>``: a rung's proof that its Linears ran in its format
  and its optimiser stepped with the logged LR (``stability.train.applied``), outcomes clean at 0.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypedDict

from stability import config as cfg
from stability.cases.case import CaseRun, StressCase, finite, run_summary
from stability.cases.checks import arm_names, learns, require
from stability.cases.runs import precision_rung
from stability.config.schedules import Standard
from stability.record import CaseTable, Status, add_arm, add_figures, case_result, set_case_result
from stability.record.figures import GREW, Figure, Primary
from stability.record.schema import PrecisionInfo, RunSummary

# ----------------------------------------------------------------------------- its results
# record["results"]["precision_ladder"]: checked against these types where the case is registered

class PrecisionLadder(TypedDict, total=False):
    precisions: list[str]
    sources: dict[str, PrecisionInfo | None]  # per rung: who trained it
    skipped: dict[str, str]                   # per rung left out: why
    runs: list[RunSummary]


# Stated tolerance, nats per token, on the held-out loss at the configured LR: the systematic gap of a
# rung, |mean over seeds of (loss(p) - loss(fp32))|, must stay within MAX_MEAN_LOSS_GAP, and no
# single seed may move by more than MAX_SEED_LOSS_GAP. Measured: smoke (20 steps, 3 seeds) |gap| <= 0.004 on
# every rung (mxfp4 included); earlier, smoke at 60 steps and 1 seed: |gap| <= 0.035;
# ci (300 steps, no clipping, 3 seeds) single seeds move by up to 0.64 nats in either direction (the
# trajectory is chaotic there: fp32 seeds alone spread by 0.35); the means of bf16, fp16 and the own
# fp8 stayed within 0.08, those of torchao's fp8, mxfp8 and mxfp4 within 0.17 (mxfp8 of the reference arm: one seed
# +0.48, the others +0.03 and -0.004; reports/precision-ladder-ci.md). With a seed spread of 0.35, the
# mean of three seeds moves by ~0.2 by chance, hence the bound on the mean.
MAX_MEAN_LOSS_GAP = 0.25
MAX_SEED_LOSS_GAP = 1.0

# first_loss_gap_<p>, measured at smoke (3 seeds, both arms; the unperturbed run and rounding replicates 1 and 2):
# bf16 8e-6 to 5e-5 nats, and a replicate moves it by as much (autocast rounds the weights and activations to
# bf16, and one fp32 rounding step of the weights flips some of those roundings); fp16 5e-7 to 7e-6; fp8 2e-5 to
# 6e-4, mxfp8 7e-6 to 8e-4, mxfp4 8e-4 to 2e-3, the same to 3 digits in every replicate; a bf16 rung that trains
# in fp32: 0. Its floor: two fp32 rounding steps of a loss near 5.5 nats (one is 4.8e-7), or half its value.
FIRST_GAP_FLOOR = 1e-6


def ladder_skips(config: cfg.ExperimentConfig) -> dict[str, str]:
    """{rung: reason} for the rungs of ``stress.precisions`` that cannot train here because torchao
    cannot be imported. Any other reason a rung cannot train (an fp8 recipe the installed torchao
    does not know, MX on a torch / torchao without it) is a ConfigError, raised before any training."""
    from stability import precision  # the formats import torch: read when the ladder runs
    from stability.precision import ao

    skipped = {}
    tokens = config.run.data.batch_size * config.run.model.context
    for p in config.stress.precisions:
        try:
            precision.check(replace(config.run.precision, dtype=p), config.run.device, tokens)
        except ao.TorchaoMissing as error:
            skipped[p] = f"{p} trains through torchao: {error}"
    return skipped


def at_precision(run: cfg.RunConfig, dtype: str, ladder_steps: int) -> cfg.RunConfig:
    """``run`` in ``dtype`` for ``ladder_steps`` steps (0: the run's own)."""
    return replace(run, precision=replace(run.precision, dtype=dtype), steps=ladder_steps or run.steps)


def rung_steps(config: cfg.ExperimentConfig) -> int:
    """The steps one rung trains: ``stress.ladder_steps`` (0: the run's own)."""
    return config.stress.ladder_steps or config.run.steps


def ladder_runs(case: StressCase, config: cfg.ExperimentConfig) -> list:
    """Its runs: every seed and arm at every rung of ``stress.precisions``, rung by rung, for ``rung_steps``
    (``Standard`` schedule); a rung skipped for want of torchao is left out when the ladder trains."""
    return [case.unit(arm, seed, at_precision(config.arm_config(arm, seed), p, config.stress.ladder_steps), Standard())
            for seed in config.seeds for arm in config.arm_names for p in config.stress.precisions]


def first_loss_gap(rung: dict, fp32: dict) -> float | None:
    """|loss of step 0 in the run ``rung`` minus that of the fp32 run ``fp32``| (arm records), nats/token; None
    when either has no finite first loss."""
    first = [record["series"]["loss"][0] if record["series"]["loss"] else None for record in (rung, fp32)]
    return abs(first[0] - first[1]) if all(finite(value) for value in first) else None


def describe_ladder(config: cfg.ExperimentConfig) -> str:
    skipped = ladder_skips(config)
    precisions = [p for p in config.stress.precisions if p not in skipped]
    return (f"the same run in {', '.join(precisions)}"
            + (f" ({', '.join(skipped)} skipped: torchao missing)" if skipped else ""))


def train_precision_ladder(case: CaseRun) -> None:
    """The same run (the configured LR, Standard schedule) at every precision of ``stress.precisions``.

    The ``arms`` entries are the fp32 runs; ``final`` gains, per lower precision p, ``loss_gap_<p>``,
    ``nonfinite_events_<p>``, ``nonfinite_unhandled_<p>``, ``diverged_<p>``, ``overflow_fraction_<p>``, ``underflow_fraction_<p>``,
    ``loss_scale_drops_<p>``, ``loss_spike_score_<p>``, ``first_loss_gap_<p>``, ``linear_off_format_calls_<p>`` and
    ``lr_off_log_steps_<p>``. ``record["results"]["precision_ladder"]`` holds the
    rungs, per rung the library, version and recipe that trained it (``sources``), the rungs skipped
    with their reason (torchao not installed), and a summary of every run."""
    config = case.config
    skipped = ladder_skips(config)
    precisions = [p for p in config.stress.precisions if p not in skipped]
    runs, sources = [], {}
    trained = case.train_units([unit for unit in case.declared_units()
                                if unit.run.precision.dtype not in skipped])
    for seed in config.seeds:
        for arm in config.arm_names:
            by_precision = {}
            for p in precisions:
                arm_record = next(trained)
                by_precision[p] = arm_record
                sources.setdefault(p, arm_record.get("precision"))
                runs.append(run_summary(arm_record, precision=p))
            reference = by_precision[cfg.REFERENCE_PRECISION]
            ref_loss = reference["final"].get("heldout_loss")
            for p, rec in by_precision.items():
                if p == cfg.REFERENCE_PRECISION:
                    continue
                final = rec["final"]
                loss = final.get("heldout_loss")
                add_figures(reference, {
                    f"loss_gap_{p}": (loss - ref_loss) if finite(loss) and finite(ref_loss) and
                    rec["status"] == Status.COMPLETED else None,
                    f"nonfinite_events_{p}": final.get("nonfinite_events"),
                    f"nonfinite_unhandled_{p}": final.get("nonfinite_unhandled"),
                    f"diverged_{p}": rec["status"] != Status.COMPLETED,
                    f"overflow_fraction_{p}": final.get("overflow_fraction"),
                    f"underflow_fraction_{p}": final.get("underflow_fraction"),
                    f"loss_scale_drops_{p}": final.get("loss_scale_drops"),
                    f"loss_spike_score_{p}": final.get("loss_spike_score"),
                    f"first_loss_gap_{p}": first_loss_gap(rec, reference),
                    f"linear_off_format_calls_{p}": final.get("linear_off_format_calls"),
                    f"lr_off_log_steps_{p}": final.get("lr_off_log_steps"),
                })
            add_arm(case.record, reference)
    set_case_result(case.record, case.name,
                    {"precisions": precisions, "sources": sources, "skipped": skipped, "runs": runs})


# ----------------------------------------------------------------------------- its table

LADDER_FIGURES = ("loss_gap", "underflow_fraction", "overflow_fraction", "diverged")


def ladder_rows(record: dict) -> list[list[str]]:
    """The precision ladder, one row per rung below fp32 and treatment arm: the library (and version)
    that trained the rung, the held-out loss gap to fp32 of the reference arm and of the arm
    (means over seeds), their paired difference with its 95% interval, and each arm's underflow and
    overflow fractions and diverged share, and the recipe; a skipped rung gets one row with its
    reason. Only the header when the record holds no ladder."""
    from stability.report.tables import paired_cells, source_text

    ladder = case_result(record, CASE.name) or {}
    rows = [["precision", "library", "arm", "reference gap", "arm gap", "arm-reference", "95% CI",
             "reference underflow", "arm underflow", "reference overflow", "arm overflow", "reference diverged",
             "arm diverged", "recipe"]]
    for rung in ladder.get("precisions") or []:
        if rung == cfg.REFERENCE_PRECISION:
            continue
        library, recipe = source_text((ladder.get("sources") or {}).get(rung))
        for arm, paired in (record.get("paired") or {}).items():
            cells = [paired_cells(paired.get(f"{figure}_{rung}")) for figure in LADDER_FIGURES]
            rows.append([rung, library, arm, *cells[0], *cells[1][:2], *cells[2][:2], *cells[3][:2], recipe])
    for rung, reason in (ladder.get("skipped") or {}).items():
        rows.append([rung, "-", "all", "skipped", "skipped"] + ["-"] * 8 + [f"skipped: {reason}"])
    return rows


# ----------------------------------------------------------------------------- what its record must show

def rungs_of(record):
    """The rungs below fp32 that trained (a rung skipped for want of torchao has no figures)."""
    return [p for p in case_result(record, CASE.name)["precisions"] if p != cfg.REFERENCE_PRECISION]


def unhandled_events(record, rung, arm, seed):
    """The non-finite events of one rung's run that its recipe did not handle. fp16 trains under
    torch.amp.GradScaler, whose design is to meet gradient overflow, skip that step and lower the scale;
    such an event (non-finite gradients, step skipped) is the recipe working. Any other event (a
    non-finite loss or activation, or a non-finite step that was taken) is not."""
    run = next(r for r in case_result(record, CASE.name)["runs"]
               if r["precision"] == rung and r["arm"] == arm and r["seed"] == seed)
    return [e for e in run["events"] if not (rung == "fp16" and e["what"] == "grad" and e["skipped"])]


def every_rung_trained(record, invariant):
    """Every rung trained every arm and seed, except the rungs skipped for want of torchao (recorded with the
    reason; none where torchao is installed, as the package requires)."""
    result = case_result(record, CASE.name)
    skipped = result["skipped"]
    require(all("torchao" in reason for reason in skipped.values()), f"rungs skipped: {skipped}")
    require(sorted((r["precision"], r["arm"], r["seed"]) for r in result["runs"]) == sorted(
        (p, arm, s) for p in record["config"]["stress"]["precisions"] if p not in skipped
        for arm in arm_names(record) for s in record["config"]["seeds"]), "runs missing from the ladder")


def each_rung_names_its_library_and_recipe(record, invariant):
    """torchao trains fp8 (the configured float8 recipe) and the MX rungs, emulated on the CPU; torch's
    autocast and GradScaler the bf16 / fp16 ones; the versions are in the record and in the ladder's table."""
    from stability.report.tables import text_table

    sources = case_result(record, CASE.name)["sources"]
    recipe = record["config"]["run"]["precision"]["fp8_recipe"]
    for rung, source in sources.items():
        require(source["dtype"] == rung and source["version"], f"{rung}: source {source}")
        if rung in ("fp8", "mxfp8", "mxfp4") and (rung != "fp8" or recipe != "own"):
            require(source["library"] == "torchao" and source["version"] == record["env"]["torchao"],
                    f"{rung}: source {source}")
            require(record["config"]["run"]["device"] != "cpu" or source["emulated"], f"{rung}: not emulated")
        elif rung == "fp16":
            require("GradScaler" in source["recipe"], f"fp16: recipe {source['recipe']}")
    if "fp8" in sources and recipe != "own":
        require(sources["fp8"]["recipe"] == f"float8 {recipe}", f"fp8: recipe {sources['fp8']['recipe']}")
    table = text_table(ladder_rows(record))
    require(all(rung in table for rung in sources if rung != cfg.REFERENCE_PRECISION), f"rungs missing:\n{table}")
    require(("torchao" in table) == any(s["library"] == "torchao" for s in sources.values()), table)


def fp32_is_finite_and_learns(record, invariant):
    """The fp32 rung completes with no non-finite event and the loss falls (model invariants)."""
    for arm in record["arms"]:
        learns(record, arm, arm["series"]["loss"][0], invariant)


def each_rung_stays_within_its_loss_gap_of_fp32(record, invariant):
    """At the configured LR each rung trains without divergence or non-finite events other than the gradient
    overflows fp16's loss scaler skips, and its held-out loss stays within the stated gap of fp32 (module
    constants), per arm: model invariants (a model whose fp16 run is cut short by its loss scaler breaks
    them; the baseline says whether this model did)."""
    for rung in rungs_of(record):
        for name in arm_names(record):
            gaps = []
            for arm in (a for a in record["arms"] if a["arm"] == name):
                final, seed = arm["final"], arm["seed"]
                invariant(record, f"no_divergence_{rung}", name, seed, not final[f"diverged_{rung}"])
                events = unhandled_events(record, rung, name, seed)
                invariant(record, f"no_unhandled_events_{rung}", name, seed, not events, len(events), 0,
                          "; ".join(sorted({e["what"] for e in events})))
                gap = final[f"loss_gap_{rung}"]
                invariant(record, f"loss_gap_{rung}", name, seed, gap is not None and abs(gap) <= MAX_SEED_LOSS_GAP,
                          gap, MAX_SEED_LOSS_GAP, f"|held-out loss in {rung} - in fp32|, nats")
                gaps.append(gap)
            known = [g for g in gaps if g is not None]
            mean = sum(known) / len(known) if len(known) == len(gaps) else None
            invariant(record, f"mean_loss_gap_{rung}", name, None, mean is not None and abs(mean) <= MAX_MEAN_LOSS_GAP,
                      mean, MAX_MEAN_LOSS_GAP, f"|mean over seeds of the {rung} loss gap|, nats; per seed {gaps}")


def the_precision_statistics_are_recorded(record, invariant):
    """The policy's counters reach the record: overflow / underflow fractions for every low rung, loss-scale
    drops for fp16; fp32 has none of them."""
    for run in case_result(record, CASE.name)["runs"]:
        final, rung = run["final"], run["precision"]
        if rung == cfg.REFERENCE_PRECISION:
            require(final.get("overflow_fraction") is None, "fp32 reports an overflow fraction")
            continue
        for key in ("overflow_fraction", "underflow_fraction"):
            require(final[key] is not None and 0.0 <= final[key] <= 1.0, f"{rung}: {key} = {final[key]}")
        if rung == "fp16":
            require(final["loss_scale_drops"] is not None and final["loss_scale_drops"] >= 0,
                    f"fp16: loss_scale_drops = {final['loss_scale_drops']}")


# ----------------------------------------------------------------------------- its figures
# Its figures (``stability.record.figures.Figure``), one pattern per figure of a rung (``loss_gap_bf16`` ...),
# added to the table when the case is registered.
FIGURES = (
    Figure("loss_gap_*", "lower", "nats/token", "held-out loss at this precision minus fp32",
           floor=0.05, rel_floor=0.25,
           # the reference arm's mxfp4 gap of seed 1 has a second mode the baseline's 20 replicates do not hold (5 of
           # 133 null jobs at -0.00263 to -0.00257 nats, its replicates at -0.00306 to -0.00293): one seed, no change
           primary=(Primary(arms="arms", why="low-precision training loses more against fp32"),)),
    Figure("nonfinite_events_*", "lower", "count", "non-finite steps at this precision", kind="run", floor=0.5, quantum="count"),
    Figure("nonfinite_unhandled_*", "lower", "count", "non-finite steps at this precision that its recipe did not "
           "handle", kind="run", quantum="count", outcome=True),
    Figure("diverged_*", "lower", "fraction of seeds", "the run at this precision diverged", kind="run",
           floor=0.25, quantum="seed", outcome=True),
    Figure("overflow_fraction_*", "lower", "fraction", "values beyond this precision's range", kind="run",
           floor=0.001),
    Figure("underflow_fraction_*", "lower", "fraction", "non-zero values flushed to zero at this precision",
           kind="run", floor=0.001),
    Figure("loss_scale_drops_*", "lower", "count", "loss-scale reductions at this precision", kind="run",
           floor=2.0, rel_floor=0.5, quantum="count"),
    Figure("loss_spike_score_*", "lower", "% of steps", "loss-spike score at this precision", kind="run",
           floor=1.0, quantum="step_pct"),
    Figure("first_loss_gap_*", "lower", "nats/token", "|training loss of step 0 at this precision - in fp32|: the "
           "same weights and batch, so only the format's rounding moves it (~0: the rung did not train in its "
           "format)", kind="run", floor=FIRST_GAP_FLOOR, rel_floor=0.5,
           # primary where the format's own rounding stands clear of the rounding replicates': at smoke fp8, mxfp8 and
           # mxfp4 move the first step's loss by 2e-5 to 2e-3 nats and their replicates agree to 3 digits; bf16's
           # (1e-5 to 5e-5) and fp16's (5e-7 to 7e-6) move by their own size between replicates (a weight moved by one
           # rounding step flips its bf16 rounding), so those stay advisory, watched by linear_off_format_calls_<p>
           primary=tuple(Primary(figure=f"first_loss_gap_{p}", arms="arms", why="the rung's format no longer rounds "
                                 "as it did: not applied, or applied another way")
                         # about 1 replicate in 20 of a seed jumps by 4 to 8 units of the loss's last place (a weight
                         # moved by one rounding step flips its fp8 rounding): one seed at a time, no change
                         for p in ("fp8", "mxfp8", "mxfp4"))),
    Figure("linear_off_format_calls_*", "lower", "count", "Linear calls of the training forwards at this precision "
           "that did not run in its format", kind="run", quantum="count", outcome=True),
    Figure("lr_off_log_steps_*", "lower", "count", "steps at this precision whose optimiser stepped with another LR "
           "than the logged one", kind="run", quantum="count", outcome=True),
)

# Its rows on the figures of every run: every rung trains to its end, so a job that judges only the ladder (a
# team's first baseline often holds only the ladder) still sees its activations and logits.
PRIMARY = (
    Primary(figure="m_act_max", arms="arms", why=GREW),
    # the reference arm's spreads 1e-5 between replicates of seed 1 and 1e-7 at seeds 0 and 2 (a near-tie between
    # heads): each seed is judged against its own spread
    Primary(figure="max_attn_logit", arms="arms", why=GREW),
)


CASE = StressCase("precision_ladder", train_precision_ladder, describe=describe_ladder, figures=FIGURES, primary=PRIMARY, rung=precision_rung, result=PrecisionLadder,
                  steps=rung_steps, title="precision ladder",
                  reported=lambda record: [f"loss_gap_{p}" for p in rungs_of(record)]
                  + ["m_act_mean", "f_attn_mean", "max_attn_logit"],
                  checks=(every_rung_trained, each_rung_names_its_library_and_recipe, fp32_is_finite_and_learns,
                          each_rung_stays_within_its_loss_gap_of_fp32, the_precision_statistics_are_recorded),
                  runs=ladder_runs,
                  tables=(CaseTable("ladder", "Precision ladder: each rung's library, recipe and gap to fp32",
                                    ladder_rows),))
