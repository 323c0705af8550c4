"""The merge gate's own evidence: does it catch harmful changes, and pass harmless ones?

Run each script as a module from the repository root (``python -m validation.regression_zoo --help``):

    zoo.py              the regression zoo: harmful and harmless source patches
    workflow.py         runs a GitHub Actions job's steps here, as the runner would
    regression_zoo.py   the CPU job on every zoo entry: what the gate caught (reports/zoo-*.md)
    null_jobs.py        the CPU job on unchanged code under fresh rounding replicates: false alarms (reports/null-*.md)
    power_curve.py      the smallest graded regression the job catches every time (reports/power-*.md)
    replicate_spread.py do rounding replicates move the figures as harmless changes do (reports/replicates-*.md)
    pooled_rows.py      would a test pooling the rows see what Holm misses (a permutation test)
    seed_spread_rule.py the gate's earlier, retired rule, kept to compare against
    gpu_check.py        kernels, fp8 matmuls and a full step against the plan on one CUDA GPU, in one go
    compile_kernels.py  the fused kernel compiled for sm_80 / sm_90 / sm_100 on the CPU (kernel_compile.py: one
                        compile and what it uses; kernel_table.py: the tables of docs/kernel.md and reports/)
    servers.py          a throwaway PostgreSQL cluster and MLflow server (tests, benchmarks/bench_stores.py)

The tests import these modules too; nothing in ``stability`` imports them.
"""
