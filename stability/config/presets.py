"""The named scale presets: ``smoke`` (CPU, seconds), ``ci`` (CPU, the stress suites in minutes), ``gpu-pr``
(GPU, the stress suites of a pull request on one GPU in about 1.5 hours) and ``full`` (GPU, nightly, on
several GPUs); and the study ``sink`` (CPU, the positive control of the first-token share: reports/sink.md).
What the GPU presets cost, by the plan (``stability plan --preset NAME``): docs/scale-out.md."""

from __future__ import annotations

from stability.config.arms import NAMED_ARMS, REFERENCE_ARM
from stability.config.errors import ConfigError
from stability.config.experiment import ExperimentConfig
from stability.config.run import (
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    PrecisionConfig,
    ProbeConfig,
    RunConfig,
)
from stability.config.schedules import BatchRamp, ExponentialRamp, Shock
from stability.config.stress import StressConfig


def _smoke() -> ExperimentConfig:
    """CPU, seconds per arm: proves the machinery, says little about stability."""
    return ExperimentConfig(
        name="smoke", preset="smoke",
        run=RunConfig(
            model=ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, context=64),
            data=DataConfig(batch_size=8, builtin_bytes=300_000),
            optim=OptimConfig(lr=3e-3, warmup_steps=10),
            probes=ProbeConfig(every=25, spike_window=30, diverge_patience=15, eval_batches=4),
            checkpoint=CheckpointConfig(every=50),
            steps=60,
        ),
        seeds=(0, 1, 2),  # the fewest a regression baseline takes (its noise comes from the seed spread)
        # 19 rounding replicates besides the unperturbed run: a seed's rank p-value can reach 1/20 and a heavy tail
        # shows (a baseline: 20 smoke jobs, about 40 minutes on 2 cores)
        replicates=19,
        # decade grid around the configured LR 3e-3 up to one that diverges; a ramp that crosses
        # LR 1 a third of the way before the end; two batch doublings; a x10 jump at mid-run
        stress=StressConfig(sweep_lrs=(3e-4, 3e-3, 3e-2, 3e-1, 3.0), ramp=ExponentialRamp(1e-3, 1e4),
                            batch=BatchRamp(double_every=20, max_size=32), shock=Shock(at_step=30, factor=10.0),
                            ladder_steps=20, threads=1),
    )


def _ci() -> ExperimentConfig:
    """CPU, about 10 s per arm on one thread: the stress suites in about 5 minutes on 2 idle cores.

    The smoke model trained 5x longer, three seeds, in the regime where the CPU-scale search
    (reports/effects.md) found the arms to differ: peak LR 1e-2, no weight decay, beta2 0.999,
    no gradient clipping (the knobs the literature links to sinks and massive activations). The
    precision ladder trains its rungs for half the run and leaves out mxfp8: the emulated rungs cost
    most of the job (fp16 about 7x an fp32 step on the CPU, mxfp8 6x), and mxfp8's e4m3 elements and MX
    block scales are each measured by another rung (fp8, mxfp4)."""
    return ExperimentConfig(
        name="ci", preset="ci",
        run=RunConfig(
            model=ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, context=64),
            data=DataConfig(batch_size=8, builtin_bytes=1_000_000),
            optim=OptimConfig(lr=1e-2, warmup_steps=30, weight_decay=0.0, betas=(0.9, 0.999), grad_clip=0.0),
            probes=ProbeConfig(every=100, spike_window=50, eval_batches=8),
            checkpoint=CheckpointConfig(every=100),
            steps=300,
        ),
        seeds=(0, 1, 2),  # three seeds: intervals over seeds, and what a regression baseline needs
        # as at smoke: a heavy tail shows in 19 replicates (a baseline: 20 ci jobs, 97 minutes on 2 cores two at a time)
        replicates=19,
        # half-decade grid from the configured LR to one that diverges; LR 1 crossed at ~40% of the
        # ramp; two batch doublings; a x10 jump at mid-run
        stress=StressConfig(sweep_lrs=(1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0), ramp=ExponentialRamp(1e-3, 1e4),
                            batch=BatchRamp(double_every=100, max_size=32), shock=Shock(at_step=150, factor=10.0),
                            precisions=("fp32", "bf16", "fp16", "fp8", "mxfp4"), ladder_steps=150, threads=1),
    )


# What the first GPU run of ``full`` should show, from the CPU curves of the sink study (reports/sink.md), each
# refuted as stated there: (1) each arm's F-Attn at step 1000 within 0.05 of its value at step 5000; (2) gated
# F-Attn below the reference arm's in every seed; (3) the reference arm's F-Attn below 0.3 and gated below 0.1 at step 5000 (not
# the paper's 0.467 from 164M tokens); (4) gated M-Act at most half the reference arm's; (5) with
# arms=gated,gated_floored, the floored gate's F-Attn between the gate's and the reference arm's.


def _full_model() -> ModelConfig:
    """The GPU presets' model: 76M parameters (83M gated), byte-level, the Triton kernel."""
    return ModelConfig(vocab_size=257, d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, context=1024,
                       backend="triton")


def _full() -> ExperimentConfig:
    """GPU, nightly: a 76M-parameter byte-level model (83M gated), bf16, the Triton kernel, on the Python standard
    library's source files (real text every machine has). A tokenized corpus is an override: data.corpus=<file.bin>
    (or a text/JSONL/Parquet file with data.tokenizer=<dir>) and model.vocab_size to match. What its first
    run should show: the comment above. The precision ladder's rungs train 1000 steps (fp32 and the MX formats
    torchao emulates on a GPU without MX tensor cores run at the FP32 rate: at 5000 steps the ladder alone
    would be a day on one GPU, docs/scale-out.md)."""
    return ExperimentConfig(
        name="full", preset="full",
        run=RunConfig(
            model=_full_model(),
            data=DataConfig(corpus="stdlib", batch_size=32),
            optim=OptimConfig(lr=1e-3, warmup_steps=200),
            precision=PrecisionConfig(dtype="bf16"),
            probes=ProbeConfig(every=250, spike_window=200, spike_k=6.0, eval_batches=32, probe_batch_size=8),
            checkpoint=CheckpointConfig(every=500),
            steps=5000,
            device="cuda",
        ),
        seeds=(0, 1, 2),
        replicates=GPU_REPLICATES,
        # Wortsman et al.'s grid plus 1.0; the ramp crosses 1e-2 at mid-run; batch 32 -> 128
        stress=StressConfig(sweep_lrs=(3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0),
                            ramp=ExponentialRamp(1e-5, 10.0), batch=BatchRamp(double_every=1000, max_size=128),
                            shock=Shock(at_step=2500, factor=10.0), ladder_steps=1000, threads=0),
    )


# The GPU presets' rounding replicates per run of a baseline, chosen by measurement on the CPU
# (reports/replicate-count-smoke.md, reports/null-{smoke,ci}-r4.md, reports/null-ci-r9.md): cut from the 19 of the
# committed baselines, 4 and 9 replicates each failed none of the null jobs (152 at smoke, 60 at ci), but at `ci`,
# where training is as chaotic as a long GPU run, 4 make the median smallest failing move 2.5x that of 19 (the
# changed hypothesis 3.7x) and 9 only 1.2x (1.4x). A baseline of 9 costs twice one of 4 by the plan: gpu-pr
# 12.6 GPU-hours on an H200 (6.3 at 4, 25 at 19), full 110 (55, 219).
GPU_REPLICATES = 9


def _gpu_pr() -> ExperimentConfig:
    """GPU, every pull request: the ``full`` model, data and optimiser for 1000 steps, sized by the plan to train
    the six stress cases on one H200 in about half the GPU job's 240 minutes (docs/scale-out.md). A decade LR
    grid from 1e-3 up to one that diverges; the ramp crosses 1e-2 at mid-run; two batch doublings; the
    ladder's fp32, bf16, fp16 and fp8 rungs for 200 steps (the MX rungs, emulated on Hopper at the FP32 rate,
    train in the nightly ``full`` job only)."""
    return ExperimentConfig(
        name="gpu-pr", preset="gpu-pr",
        run=RunConfig(
            model=_full_model(),
            data=DataConfig(corpus="stdlib", batch_size=32),
            optim=OptimConfig(lr=1e-3, warmup_steps=100),
            precision=PrecisionConfig(dtype="bf16"),
            probes=ProbeConfig(every=250, spike_window=100, spike_k=6.0, eval_batches=32, probe_batch_size=8),
            checkpoint=CheckpointConfig(every=500),
            steps=1000,
            device="cuda",
        ),
        seeds=(0, 1, 2),
        replicates=GPU_REPLICATES,
        stress=StressConfig(sweep_lrs=(1e-3, 1e-2, 1e-1, 1.0), ramp=ExponentialRamp(1e-5, 10.0),
                            batch=BatchRamp(double_every=250, max_size=128), shock=Shock(at_step=500, factor=10.0),
                            precisions=("fp32", "bf16", "fp16", "fp8"), ladder_steps=200, threads=0),
    )


def _sink() -> ExperimentConfig:
    """CPU, under a minute per arm on a free core: the positive control of the first-token probe (F-Attn).

    The smoke model with 16 heads of width 4 (more heads than byte-level text needs, so some have nothing
    to do) trained in the optimiser-stress regime of reports/effects.md (peak LR 1e-2, no weight decay,
    beta2 0.999, no clipping), the heavy probes on 16 held-out sequences every 100 steps (the share
    against tokens trained), and three arms: the reference arm, the G1 elementwise gate and the paper's
    floored gate. Found by studies/sink_search.py on seeds 0-2; its seeds are the held-out ones of the
    sink claim (suites/test_claims.py), so ``stability run --preset sink`` is that comparison. Measured
    and what it does not reach: reports/sink.md."""
    return ExperimentConfig(
        name="sink", preset="sink",
        run=RunConfig(
            model=ModelConfig(d_model=64, n_layers=2, n_heads=16, n_kv_heads=16, context=64),
            data=DataConfig(batch_size=8, builtin_bytes=300_000),
            optim=OptimConfig(lr=1e-2, warmup_steps=10, weight_decay=0.0, betas=(0.9, 0.999), grad_clip=0.0),
            probes=ProbeConfig(every=100, probe_batch_size=16, spike_window=30, diverge_patience=15,
                               eval_batches=8),
            checkpoint=CheckpointConfig(every=0),
            steps=600,
        ),
        arms=tuple(NAMED_ARMS[name] for name in (REFERENCE_ARM, "gated", "gated_floored")),
        seeds=(300, 301, 302, 303, 304, 305),
        stress=StressConfig(threads=1),
    )


PRESETS = {"smoke": _smoke, "ci": _ci, "gpu-pr": _gpu_pr, "full": _full, "sink": _sink}


def preset(name: str) -> ExperimentConfig:
    """The named preset ("smoke", "ci", "gpu-pr", "full" or "sink")."""
    if name not in PRESETS:
        raise ConfigError(f"preset={name!r} is unknown: expected one of {tuple(PRESETS)}")
    return PRESETS[name]()

