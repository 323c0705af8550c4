"""Speed benchmarks: tables of times, side by side, never asserted.

Each ``bench_*.py`` runs as a script (``python benchmarks/bench_kernel.py``) or as a module from the
repository root (``python -m benchmarks.bench_stores``, which needs ``validation.servers``).
"""
