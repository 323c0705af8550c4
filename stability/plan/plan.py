"""The plan of a preset before it runs: per stress case its runs, steps, tokens, FLOPs, peak memory of one run
and expected time; the job's and the baseline's totals.

    plan = make_plan(config, cases=("standard", "lr_sweep"), gpu=GPUS["h200"], mfu=0.35, gpus=1)
    plan.to_json()   # {"cases": {name: {runs, steps, tokens, flops, seconds, ...}}, "job": {...}, "baseline": {...}}

Each case is asked for its runs (``StressCase.units``: one ``Unit`` per arm, seed and rung, with its run
config and schedule), and each run costs

    tokens   the batch of each step (its schedule's ``batch_size_at``, so the batch ramp's growth counts)
             times the context, over the run's steps
    FLOPs    tokens x the counted FLOPs per token of a training step (``stability.plan.count``), plus a
             forward per token of the heavy probes (``probe_batch_size`` sequences every ``probes.every``
             steps and at the end) and of the held-out evaluation (``eval_batches`` batches at the end)
    seconds  FLOPs / the rate of its training format (``stability.plan.rates``)

Every run is planned at its whole length: a run that diverges stops early (the range test's runs do, and the
sweep's largest LRs), so the plan is an upper bound there. Left out: the post-training quantization of the
standard case's runs (forward passes over the held-out batches, a few per cent of a run at ``full``), a
case's setup (the corpus, the models' checks) and the suites' short tests besides the cases (the
injected faults and the configs' property tests train a few steps each).

The job is what the stress suites train once: every case, and a second time each case that the suites
train again where a baseline is committed (``StressCase.rerun``). On ``gpus`` GPUs (pytest-xdist, one GPU
per worker: docs/scale-out.md) the cases go to the workers whole, a case to one worker, as workers free up:
the job's wall time is at most (the sum - the longest case) / gpus + the longest case. The baseline (``stability baseline make``)
trains every case once for the reference runs and once per rounding replicate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stability import config as cfg
from stability.plan.count import model_cost
from stability.plan.rates import Gpu, gpu_rate, measure_cpu_rates


@dataclass(frozen=True)
class RunPlan:
    """One run: its name, training format, steps, tokens trained, FLOPs, seconds and peak memory (bytes)."""

    name: str
    dtype: str
    steps: int
    tokens: int
    flops: float
    seconds: float
    memory_bytes: int
    parameters: int


@dataclass(frozen=True)
class CasePlan:
    """One case's runs, and whether the suites train it twice (``StressCase.rerun``)."""

    name: str
    runs: tuple[RunPlan, ...]
    rerun: bool

    def totals(self) -> dict:
        runs = self.runs
        return {"runs": len(runs), "steps": sum(r.steps for r in runs), "run_steps": max(r.steps for r in runs),
                "tokens": sum(r.tokens for r in runs), "flops": sum(r.flops for r in runs),
                "seconds": sum(r.seconds for r in runs), "memory_bytes": max(r.memory_bytes for r in runs),
                "parameters": max(r.parameters for r in runs), "rerun": self.rerun}


@dataclass(frozen=True)
class Plan:
    """The plan: the preset, where it is planned (a GPU's name or "this CPU"), the rates per training format
    (FLOP/s), the model FLOP utilisation (None on the CPU: measured), the cases, the GPUs, the replicates."""

    preset: str
    device: str
    source: str
    mfu: float | None
    rates: dict[str, float]
    cases: tuple[CasePlan, ...]
    gpus: int | None
    replicates: int
    job_limit_seconds: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def job(self) -> dict:
        """The stress suites once (a case with ``rerun`` twice): FLOPs, seconds on one device (GPU-seconds), and the
        wall time on ``gpus`` workers (``wall``)."""
        per_case = [c.totals() for c in self.cases]
        times = [t["seconds"] * (2 if t["rerun"] else 1) for t in per_case]
        return {"flops": sum(t["flops"] * (2 if t["rerun"] else 1) for t in per_case), "seconds": sum(times),
                "gpus": self.gpus, "wall_seconds": self.wall(times), "limit_seconds": self.job_limit_seconds}

    def baseline(self) -> dict:
        """``stability baseline make``: every case for the reference runs and for each rounding replicate (a case
        and its replicates on one worker)."""
        copies = 1 + self.replicates
        per_case = [c.totals() for c in self.cases]
        times = [copies * t["seconds"] for t in per_case]
        return {"flops": copies * sum(t["flops"] for t in per_case), "seconds": sum(times), "gpus": self.gpus,
                "wall_seconds": self.wall(times), "replicates": self.replicates}

    def wall(self, times: list[float]) -> float:
        """The wall time of cases taking ``times`` seconds on ``gpus`` workers, a case to one worker whole, in any
        order the workers take them: at most (the sum - the longest) / gpus + the longest."""
        return (sum(times) - max(times)) / max(1, self.gpus or 1) + max(times)

    def to_json(self) -> dict:
        return {"preset": self.preset, "device": self.device, "source": self.source, "mfu": self.mfu,
                "rates": self.rates, "cases": {c.name: c.totals() for c in self.cases}, "job": self.job(),
                "baseline": self.baseline(), "notes": list(self.notes)}


def run_tokens(unit) -> int:
    """Tokens one run trains: the batch its schedule gives each step, times the context."""
    run = unit.run
    return sum(unit.schedule.batch_size_at(step, run) for step in range(run.steps)) * run.model.context


def probe_count(run: cfg.RunConfig) -> int:
    """Heavy-probe snapshots of a whole run: every ``probes.every`` steps from step 0, and one after the last."""
    every = run.probes.every
    taken = len(range(0, run.steps, every))
    return taken + (1 if (run.steps - 1) % every else 0)


def plan_run(unit, rate: float) -> RunPlan:
    """The cost of one run (a ``Unit``) at ``rate`` FLOP/s."""
    run = unit.run
    batch = max(unit.schedule.batch_size_at(step, run) for step in range(run.steps))
    cost = model_cost(run.model, run.optim.optimizer, run.precision.dtype, batch)
    tokens = run_tokens(unit)
    forward_tokens = (probe_count(run) * run.probes.probe_batch_size
                      + run.probes.eval_batches * run.data.batch_size) * run.model.context
    flops = tokens * cost.train_flops_per_token + forward_tokens * cost.forward_flops_per_token
    return RunPlan(f"{unit.case}/{unit.run_name}", run.precision.dtype, run.steps, tokens, flops, flops / rate, cost.memory_bytes,
                   cost.parameters)


def train_flops_per_token(run: cfg.RunConfig) -> float:
    return model_cost(run.model, run.optim.optimizer, run.precision.dtype, run.data.batch_size).train_flops_per_token


def make_plan(config: cfg.ExperimentConfig, cases, gpu: Gpu | None, mfu: float, gpus: int = 1,
              job_limit_seconds: float | None = None, rates: dict[str, float] | None = None) -> Plan:
    """The plan of ``config`` for the stress cases named (``stability.cases.stress.CASES``): on ``gpu`` at
    ``mfu`` (``gpus`` of them), or, with ``gpu`` None, on this CPU at its measured rates (``rates`` given: those)."""
    from stability.cases.stress import CASES, check_cases

    units = {name: CASES[name].units(config) for name in check_cases(cases)}
    dtypes = list(dict.fromkeys(u.run.precision.dtype for runs in units.values() for u in runs))
    if gpu is not None:
        rates = {dtype: gpu_rate(gpu, dtype, mfu) for dtype in dtypes}
        device, source = gpu.name, gpu.source
    else:
        rates = rates or measure_cpu_rates(config, dtypes, train_flops_per_token)
        device = "this CPU"
        source = (f"measured here: the reference arm trained {', '.join(dtypes)} for a few steps each with "
                  f"{config.stress.threads or 'torch''s default'} CPU thread(s)")
    plans = tuple(CasePlan(name, tuple(plan_run(unit, rates[unit.run.precision.dtype]) for unit in runs),
                           CASES[name].rerun) for name, runs in units.items())
    return Plan(config.preset, device, source, mfu if gpu is not None else None, rates, plans,
                gpus if gpu is not None else None, config.replicates, job_limit_seconds)


# ----------------------------------------------------------------------------- as text

def human(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def describe(plan: Plan) -> str:
    """The plan as the command prints it: the assumptions, one line per case, the job and the baseline."""
    lines = []
    if plan.mfu is not None:
        peaks = ", ".join(f"{dtype} {rate / 1e12:.0f}" for dtype, rate in plan.rates.items())
        lines.append(f"plan: preset {plan.preset} on {plan.device} at {100 * plan.mfu:.0f}% model FLOP utilisation "
                     f"(planned TFLOP/s: {peaks}; peaks from the {plan.source})")
    else:
        rates = ", ".join(f"{dtype} {rate / 1e9:.2f}" for dtype, rate in plan.rates.items())
        lines.append(f"plan: preset {plan.preset} on {plan.device}, at its measured GFLOP/s: {rates} ({plan.source})")
    lines += ["", (f"{'case':18s} {'runs':>5s} {'steps/run':>9s} {'tokens':>10s} {'FLOPs':>10s} {'memory/run':>10s} "
              f"{'time':>8s}")]
    for case in plan.cases:
        t = case.totals()
        lines.append(f"{case.name:18s} {t['runs']:5d} {t['run_steps']:9d} {t['tokens']:10.3g} {t['flops']:10.3g} "
                     f"{t['memory_bytes'] / 1e9:8.2f} GB {human(t['seconds']):>8s}"
                     + ("   (trained twice in the job)" if t["rerun"] else ""))
    job, baseline = plan.job(), plan.baseline()
    unit = "GPU" if plan.gpus is not None else "CPU"
    lines += ["", f"job (the stress suites): {job['flops']:.3g} FLOPs, {job['seconds'] / 3600:.2f} {unit}-hours"
              + (f"; on {plan.gpus} GPU(s), at most {human(job['wall_seconds'])} wall" if plan.gpus else "")
              + (f" (limit {human(job['limit_seconds'])}: {'fits' if job['wall_seconds'] <= job['limit_seconds'] else 'DOES NOT FIT'})"
                 if job["limit_seconds"] else ""),
              (f"baseline (reference + {baseline['replicates']} rounding replicates): {baseline['flops']:.3g} FLOPs, "
               f"{baseline['seconds'] / 3600:.2f} {unit}-hours"
               + (f"; on {plan.gpus} GPU(s), at most {human(baseline['wall_seconds'])} wall" if plan.gpus else ""))]
    lines += [f"note: {note}" for note in plan.notes]
    return "\n".join(lines)
