"""Train the runs of a case as Ray tasks: every GPU of a machine, or many machines.

    runner = RayRunner("local:2")            # a Ray instance on this machine with 2 CPUs
    record = run_case("lr_sweep", config, runner=runner)
    runner.close()

Each ``stability.cases.runs.Unit`` (one seed, arm and LR / precision rung of a case) becomes one Ray
task that trains that run alone and returns its arm record: ``num_gpus=1`` when the config trains
on CUDA (Ray sets ``CUDA_VISIBLE_DEVICES`` of the task to its GPU), ``num_cpus=1`` otherwise. The
case reads the records back in the order of its list, so the case record, its figures and its
order are those of a run in one process (the runs are independent: each builds its own model and
reads its batches from the seed). Pin ``stress.threads`` (the ``smoke`` and ``ci`` presets do) for
bit-identical figures on the CPU: a Ray worker otherwise trains with one intra-op thread.

Where Ray runs (``address``):

* ``local:N``: start a Ray instance here with N CPUs (and the GPUs Ray finds); stopped by ``close``.
* ``auto``: join the Ray cluster this machine is part of (``ray start --head`` / ``ray start
  --address=...`` ran before, or ``RAY_ADDRESS`` is set).
* ``HOST:PORT`` or ``ray://HOST:PORT``: join that cluster. Every node needs this package installed
  (``pip install -e ".[ray]"``) and reaches the corpus at the same path.

Fault tolerance. A task whose worker process dies (killed, out of memory, a lost node) is run
again by Ray, up to ``max_retries`` times. A unit's result is kept under its task's id (``task_id``), so a
task that ran twice still gives one arm record. Its attempts are Ray's own count (the attempt number Ray gives
the run that returned), so a worker lost at any moment is counted, also one lost before the task's
first instruction (while its arguments load); a small actor also counts the attempts that reached the
task's body (where Ray's number is not available). The case record's ``ray`` entry lists the units
(id, name, attempts) and how many tasks were retried.

Tracking. The tasks do not talk to MLflow: the driver writes the case record locally, then logs it
(``stability.cases.pipeline.keep``) - a retried task can therefore never leave a second MLflow run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

from stability import config as cfg
from stability.cases.runs import Unit, hash_run
from stability.record import name_run, note_attempts, set_ray, set_unit

_CORPORA: dict[str, object] = {}   # per worker process: corpus of a config, loaded once


class UnitLost(RuntimeError):
    """A unit's worker died more often than ``max_retries`` allows."""


def parse_address(spec: str) -> dict:
    """``ray.init`` keyword arguments of an ``--ray`` value (see the module docstring); ConfigError
    naming the value when it is none of the accepted forms."""
    spec = (spec or "").strip()
    if spec == "auto":
        return {"address": "auto"}
    if spec.startswith("local:"):
        count = spec.removeprefix("local:")
        if not count.isdigit() or int(count) < 1:
            raise cfg.ConfigError(f"--ray {spec!r} is invalid: expected local:N with N a whole number >= 1 "
                                  f"(the CPUs of the local Ray instance)")
        return {"num_cpus": int(count)}
    host, sep, port = spec.removeprefix("ray://").rpartition(":")
    if sep and host and port.isdigit():
        return {"address": spec}
    raise cfg.ConfigError(f"--ray {spec!r} is invalid: expected auto, local:N or a cluster address HOST:PORT "
                          f"(or ray://HOST:PORT)")


def train_alone(config: cfg.ExperimentConfig, unit: Unit) -> dict:
    """Train one unit in this process without a session (the body of a Ray task): its arm record."""
    import torch

    from stability.cases.experiment import after_training, load_inputs
    from stability.cases.stress import cpu_threads
    from stability.train.trainer import ArmHooks, train

    cfg.extensions.load(config.plugins)   # this worker's own imports: the driver's registries do not reach it
    run = unit.run
    if run.device.startswith("cuda") and torch.cuda.device_count() == 1:
        run = dataclasses.replace(run, device="cuda:0")   # the task's one GPU, whatever index the config names
    key = repr((config.run.data, config.run.model.vocab_size, config.run.model.context))
    if key not in _CORPORA:
        _CORPORA[key] = load_inputs(config)
    with cpu_threads(config.stress.threads):
        return train(run, unit.schedule, corpus=_CORPORA[key], arm=unit.arm,
                     hooks=ArmHooks(on_trained=after_training(run, config)))


def ray_attempt() -> int | None:
    """The running task's attempt as Ray counts it (1, then 2 for its first retry, ...); None when this Ray
    does not say (the number is kept by Ray's core worker; no public API gives it)."""
    import ray

    number = getattr(getattr(ray._private.worker.global_worker, "core_worker", None),
                     "get_current_task_attempt_number", None)
    return number() + 1 if number is not None else None


def task_id(unit: Unit) -> str:
    """The id of the task that trains ``unit``: 16 hex digits of its case, arm, seed, rung and whole run config,
    the same in every process and on every machine (a retried task keeps it)."""
    text = json.dumps({"case": unit.case, "arm": unit.arm, "seed": unit.seed,
                       "rung": unit.rung.name if unit.rung else "", "run": hash_run(unit.run, unit.schedule.name)},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def task_name(unit: Unit) -> str:
    """The name of the task that trains ``unit`` ("lr_sweep/gated/seed0/lr=0.01"), in the record and messages."""
    return f"{unit.case}/{unit.arm}/seed{unit.seed}" + (f"/{unit.rung.name}" if unit.rung else "")


def _task(config, unit: Unit, attempts, before_unit) -> tuple[str, dict]:
    """One Ray task: its attempt (Ray's count first; tests: ``before_unit(unit_id, attempt)``), train, return
    (id, record)."""
    import ray

    attempt, id_ = ray_attempt(), task_id(unit)
    if before_unit is not None:
        before_unit(id_, attempt)
    counted = ray.get(attempts.start.remote(id_))
    attempt = max(attempt or 0, counted)
    arm_record = train_alone(config, unit)
    set_unit(arm_record, id_, task_name(unit), attempt, os.getpid())
    return id_, arm_record


class _Attempts:
    """An actor counting the attempts of each unit (a retried task is a second attempt)."""

    def __init__(self):
        self.counts: dict[str, int] = {}

    def start(self, unit_id: str) -> int:
        self.counts[unit_id] = self.counts.get(unit_id, 0) + 1
        return self.counts[unit_id]

    def all(self) -> dict[str, int]:
        return dict(self.counts)


class RayRunner:
    """Trains the units of a case as Ray tasks (see the module docstring).

    address: ``local:N``, ``auto`` or a cluster address. max_retries: reruns of a task whose worker
    died. before_unit: called as ``before_unit(unit_id, attempt)`` first thing in every task (a
    picklable callable; tests inject faults with it)."""

    def __init__(self, address: str, max_retries: int = 3, before_unit=None):
        if not isinstance(max_retries, int) or max_retries < 0:
            raise cfg.ConfigError(f"max_retries={max_retries!r} is invalid: expected a whole number >= 0")
        self.address = address
        self.init_args = parse_address(address)
        self.max_retries = max_retries
        self.before_unit = before_unit
        self.started = False     # whether this runner started Ray (and so stops it)

    def connect(self):
        """Start or join Ray (once); ConfigError when Ray is missing or the cluster cannot be reached."""
        try:
            import ray
        except ImportError:
            raise cfg.ConfigError("--ray needs Ray: pip install -e \".[ray]\"") from None
        if ray.is_initialized():
            return ray
        try:
            ray.init(**self.init_args, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise cfg.ConfigError(f"--ray {self.address!r} is invalid here: cannot start or reach Ray: {error}") from None
        self.started = True
        return ray

    def train(self, case_record: dict, config: cfg.ExperimentConfig, units: list[Unit]):
        """Send every unit as a task, then yield the arm records in the order of ``units``. The case
        record gains ``ray``: address, resources per task, per unit its id, name and attempts, retries."""
        ray = self.connect()
        resources = {"num_gpus": 1} if config.run.device.startswith("cuda") else {"num_cpus": 1}
        task = ray.remote(max_retries=self.max_retries, retry_exceptions=False, **resources)(_task)
        attempts = ray.remote(num_cpus=0)(_Attempts).remote()
        config_ref = ray.put(config)
        ids = [task_id(unit) for unit in units]
        pending = {id_: task.remote(config_ref, unit, attempts, self.before_unit) for id_, unit in zip(ids, units)}
        set_ray(case_record, self.address, resources, self.max_retries, [(id_, task_name(unit))
                                                                          for id_, unit in zip(ids, units)])
        results: dict[str, dict] = {}
        attempts_of: dict[str, int] = {}   # unit id -> attempts, Ray's own count (the actor's as a fallback)
        for index, (id_, unit) in enumerate(zip(ids, units)):
            try:
                unit_id, arm_record = ray.get(pending[id_])
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as error:
                raise UnitLost(f"unit {task_name(unit)} ({id_}): its worker died {self.max_retries + 1} times "
                               f"(max_retries={self.max_retries}): {error}") from None
            name_run(arm_record, unit.run_name, unit.key)   # as a session names a run trained here
            results[unit_id] = arm_record       # keyed by id: a unit that ran twice is kept once
            counts = ray.get(attempts.all.remote())
            attempts_of[id_] = max(arm_record["unit"]["attempt"], counts.get(id_, 1))
            note_attempts(case_record, index, attempts_of[id_], sum(n - 1 for n in attempts_of.values()))
            yield results[id_]

    def close(self) -> None:
        """Stop Ray when this runner started it."""
        if self.started:
            import ray

            ray.shutdown()
            self.started = False
