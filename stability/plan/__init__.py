"""The plan of a preset before it runs: its runs, FLOPs, peak memory and time, per stress case, for the job
and for its baseline (``stability plan``).

    count.py    the FLOPs and peak memory of one run's model, counted on the meta device (no GPU, no weights)
    rates.py    the rate a run's FLOPs go at: a GPU's vendor peak times a stated utilisation, or this CPU, measured
    plan.py     per case (its runs, as it declares them), the job and the baseline; as JSON and as text
"""

from stability.plan.count import ModelCost, formula_flops_per_token, model_cost
from stability.plan.plan import CasePlan, Plan, RunPlan, describe, make_plan
from stability.plan.rates import DEFAULT_MFU, GPUS, Gpu, gpu_rate, measure_cpu_rates

__all__ = ["DEFAULT_MFU", "GPUS", "CasePlan", "Gpu", "ModelCost", "Plan", "RunPlan", "describe",
           "formula_flops_per_token", "gpu_rate", "make_plan", "measure_cpu_rates", "model_cost"]
