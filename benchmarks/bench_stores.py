"""What one logged training step costs on each MLflow store: SQLite, a server on SQLite, a server on PostgreSQL.

    python -m benchmarks.bench_stores [--steps 300] [--repeats 3]      # from the repository root

For each store a fresh run gets ``--steps`` steps of the metrics the live tracker sends per step
(loss, LR, grad norm, update norm, loss scale, batch size, tokens, step time: 8 values), two ways:
one ``log_batch`` call per step (the slowest a writer can go) and 100 steps per call (how the live
tracker sends a backlog). The stores take turns (ABCCBA order, ``--repeats`` times) in one process;
the table shows the median milliseconds per step and the ratios to SQLite. The servers are started
here on 127.0.0.1 (validation/servers.py: a throwaway PostgreSQL cluster); without PostgreSQL its column
says why. Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

METRICS = ("loss", "lr", "grad_norm", "update_norm", "loss_scale", "batch_size", "tokens", "step_seconds")


def log_steps(uri: str, steps: int, per_call: int) -> float:
    """Milliseconds per step to log ``steps`` steps into a fresh run of ``uri``, ``per_call`` steps a call."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name("bench-stores")
    experiment = found.experiment_id if found else client.create_experiment("bench-stores")
    run = client.create_run(experiment).info.run_id
    now = int(time.time() * 1000)
    started = time.perf_counter()
    for first in range(0, steps, per_call):
        batch = [Metric(name, float(step) + 0.5, now, step) for step in range(first, min(steps, first + per_call))
                 for name in METRICS]
        client.log_batch(run, metrics=batch)
    elapsed = time.perf_counter() - started
    client.set_terminated(run)
    return 1000 * elapsed / steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from validation.servers import Unavailable, mlflow_server, postgres_cluster

    folder = Path(tempfile.mkdtemp(prefix="bench-stores-"))
    stores, notes = {}, {}
    with contextlib.ExitStack() as stack:
        stores["sqlite"] = f"sqlite:///{folder / 'direct.db'}"
        stores["server on sqlite"] = stack.enter_context(mlflow_server(f"sqlite:///{folder / 'server.db'}",
                                                                       folder / "artifacts-sqlite"))
        try:
            url = stack.enter_context(postgres_cluster())
            stores["server on postgresql"] = stack.enter_context(mlflow_server(url, folder / "artifacts-pg"))
        except Unavailable as error:
            notes["server on postgresql"] = str(error)
        for uri in stores.values():
            log_steps(uri, 10, 1)          # schema, connection pools, first run: not timed
        order = list(stores)
        times = {(name, per_call): [] for name in stores for per_call in (1, 100)}
        for _ in range(args.repeats):
            for name in order + order[::-1]:
                for per_call in (1, 100):
                    times[name, per_call].append(log_steps(stores[name], args.steps, per_call))
    print(f"\n{args.steps} steps x {len(METRICS)} metrics, {args.repeats} ABCCBA repeats, median ms per step")
    print("\n| store | 1 step per call | ratio to sqlite | 100 steps per call | ratio to sqlite |")
    print("|---|---:|---:|---:|---:|")
    base = {per_call: statistics.median(times["sqlite", per_call]) for per_call in (1, 100)}
    for name in stores:
        one, hundred = (statistics.median(times[name, per_call]) for per_call in (1, 100))
        print(f"| {name} | {one:.2f} | {one / base[1]:.2f}x | {hundred:.3f} | {hundred / base[100]:.2f}x |")
    for name, why in notes.items():
        print(f"| {name} | not measured: {why} | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
