"""How fast a run's FLOPs go: a named GPU's peak from its vendor's sheet times a stated model FLOP utilisation,
or this machine's CPU, measured.

    rate = gpu_rate(GPUS["h200"], "bf16", mfu=0.35)       # FLOP/s a bf16 run is planned at
    rates = measure_cpu_rates(config, ("fp32", "bf16"))   # FLOP/s of this CPU, per training format

The GPU peaks are dense (no sparsity), from NVIDIA's datasheets: A100 SXM 312 TFLOP/s BF16 and 19.5 TFLOP/s
FP32; H100 SXM and H200 SXM 989 TFLOP/s BF16 (1,979 with sparsity) and 67 TFLOP/s FP32. A run's training
format (``stability.precision.FORMATS``) says from which compute capability its matmuls run on tensor cores
(``Format.tensor_cores``): there it is planned at the BF16 peak (bf16 and fp16; fp8 from 8.9 and mxfp8 from
10.0 too: their matmuls are a part of a step at this model width, so nothing faster is assumed); fp32 (the
harness leaves TF32 off) and a format the GPU has no hardware for (emulated by torchao in high precision) at
the FP32 peak.

The CPU has no sheet: its rate is measured, per training format, by training the config's reference arm for
``MEASURE_STEPS`` steps here (the trainer itself, its per-step probes included) with the config's CPU
threads, and dividing the counted FLOPs by the seconds the steps took.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from stability import config as cfg

MEASURE_STEPS = 20
DEFAULT_MFU = 0.35   # the model FLOP utilisation a GPU plan assumes until a GPU has measured one


@dataclass(frozen=True)
class Gpu:
    """A GPU the plan knows: its dense peaks (FLOP/s), memory (bytes), compute capability (major, minor) and
    where the numbers come from."""

    name: str
    bf16: float
    fp32: float
    memory: int
    capability: tuple[int, int]
    source: str


GPUS = {
    "a100": Gpu("NVIDIA A100 SXM 80GB", 312e12, 19.5e12, 80 * 10**9, (8, 0),
                "NVIDIA A100 Tensor Core GPU datasheet: 312 TFLOP/s BF16 dense, 19.5 TFLOP/s FP32, 80 GB"),
    "h100": Gpu("NVIDIA H100 SXM", 989e12, 67e12, 80 * 10**9, (9, 0),
                "NVIDIA H100 Tensor Core GPU datasheet: 1,979 TFLOP/s BF16 with sparsity (989 dense), "
                "67 TFLOP/s FP32, 80 GB"),
    "h200": Gpu("NVIDIA H200 SXM", 989e12, 67e12, 141 * 10**9, (9, 0),
                "NVIDIA H200 Tensor Core GPU datasheet: 1,979 TFLOP/s BF16 with sparsity (989 dense), "
                "67 TFLOP/s FP32, 141 GB"),
}

def gpu_rate(gpu: Gpu, dtype: str, mfu: float) -> float:
    """FLOP/s a run in training format ``dtype`` is planned at on ``gpu`` (see the module docstring)."""
    from stability.precision.formats import format_class

    cores = format_class(dtype).tensor_cores
    return (gpu.bf16 if cores is not None and gpu.capability >= cores else gpu.fp32) * mfu


def measure_cpu_rates(config: cfg.ExperimentConfig, dtypes, count) -> dict[str, float]:
    """This CPU's FLOP/s per training format of ``dtypes``: the config's reference arm trained for
    ``MEASURE_STEPS`` steps in each (no heavy probes), ``count(run)`` its FLOPs per trained token."""
    from stability.cases.case import cpu_threads
    from stability.config.schedules import Standard
    from stability.train.trainer import train

    rates = {}
    with cpu_threads(config.stress.threads):
        for dtype in dict.fromkeys(dtypes):
            run = config.arm_config(config.arm_names[0], config.seeds[0])
            run = dataclasses.replace(run, steps=MEASURE_STEPS, device="cpu",
                                      model=dataclasses.replace(run.model, backend="torch"),
                                      precision=dataclasses.replace(run.precision, dtype=dtype),
                                      probes=dataclasses.replace(run.probes, every=10 * MEASURE_STEPS))
            record = train(run, Standard(), arm=config.arm_names[0])
            timing = record["timing"]
            rates[dtype] = count(run) * timing["tokens"] / timing["train_seconds"]
    return rates
