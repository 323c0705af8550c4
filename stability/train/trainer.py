"""Trains one arm (one model, one seed) with the probes attached and returns its run record.

    record = train(run, schedule, corpus, arm="gated", hooks=ArmHooks(on_step=...))

The record is a plain JSON-ready dict: the per-step ``series`` (loss, lr, grad norm, update
norm, spike and non-finite flags, loss scale, batch size), the non-finite ``events`` with the
first offending module, the heavy ``probes`` snapshots, the ``final`` figures (held-out
loss, perplexity, next-token accuracy, spike scores, M-Act, F-Attn, ...) and ``timing``.

An arm that diverges (non-finite loss, or loss above ``diverge_factor`` times its first
loss for ``diverge_patience`` consecutive steps) stops early with status "diverged":
that is a result, not an error. Ctrl-C stops the arm with status "killed" and the record
so far is returned; the caller decides whether to stop everything. The first Ctrl-C lets the
step in flight finish (so the state is consistent and can be checkpointed); a second one
interrupts at once.

The pieces: ``step.train_step`` trains one step and returns its row; ``monitor.Monitor`` decides
spikes and divergence; ``state.TrainState`` is what carries over between steps (and into a
checkpoint); ``reducer`` makes the figures global (one process, or every rank under torchrun);
``faults`` installs the deliberate faults; ``applied`` keeps what proves the run's stresses were applied (the
LR the optimiser stepped with, the format of every Linear call, the probes); ``evaluate.evaluate`` gives the
held-out figures. A caller
attaches callbacks, checkpoints and replay bundles through ``ArmHooks``; the trainer imports no
tracking and writes no file of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
import traceback
import types
from collections.abc import Callable

import torch

from stability.config import RunConfig
from stability.config.schedules import Standard
from stability.data import Corpus, eval_batches, load_corpus, probe_batch
from stability.model.build import build_model
from stability.model.rounding import StepRounding, perturb_rounding, run_identity
from stability.precision import PrecisionPolicy
from stability.record import (
    USABLE,
    add_figures,
    add_precision_stats,
    add_probes,
    describe_arm,
    final_figures,
    mark_completed,
    mark_diverged,
    mark_error,
    mark_killed,
    mark_running,
    new_arm_record,
    note_probe_modules_missed,
    note_wall_seconds,
    set_arm_timing,
    set_probe_steps_missed,
    start_applied,
)
from stability.train import applied, faults, probes
from stability.train.checkpoint import NO_BUNDLES, NO_CHECKPOINTS, Bundles, Checkpoints, arm_state, restore
from stability.train.evaluate import evaluate
from stability.train.monitor import Monitor
from stability.train.optimizer import make_optimizer
from stability.train.reducer import reducer_for
from stability.train.state import TrainState
from stability.train.step import Parts, train_step


@dataclasses.dataclass
class ArmHooks:
    """What a caller attaches to one arm's training; every field is optional (the defaults do nothing).

    on_start(record): before the first step trained in this call (a resumed record holds the steps so far).
    on_step(step, row): after every step, with that step's series values (the keys of ``SERIES_KEYS``).
    on_trained(model, corpus, record): after the final evaluation of an arm that completed or diverged, with
        the trained model (under torchrun an unsharded copy, on rank 0 only): the evaluations after
        training (quantization, length extrapolation) add to the record here.
    on_end(record): once, when the arm has stopped (any status), with its final figures.
    checkpoints: a ``stability.train.checkpoint.Checkpoints``: when and where to checkpoint, and the state to
        resume from. bundles: a ``stability.train.checkpoint.Bundles``: the budget of replay bundles.
    identity: which run this is (run key, run hash...), stored in checkpoints and bundles.
    replay_optimizer: put the optimiser state into replay bundles too.
    """

    on_start: Callable[[dict], None] = lambda record: None
    on_step: Callable[[int, dict], None] = lambda step, row: None
    on_trained: Callable[[torch.nn.Module, Corpus, dict], None] | None = None   # None: no evaluation after training
    on_end: Callable[[dict], None] = lambda record: None
    checkpoints: Checkpoints = NO_CHECKPOINTS
    bundles: Bundles = NO_BUNDLES
    identity: dict = dataclasses.field(default_factory=dict)
    replay_optimizer: bool = False


@contextlib.contextmanager
def stop_after_step():
    """While it is active, the first Ctrl-C (SIGINT) only sets ``.requested``: the loop stops after the step
    in flight. A second Ctrl-C raises KeyboardInterrupt at once. Outside the main thread: no change."""
    flag = types.SimpleNamespace(requested=False)
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(_signum, _frame):
        if flag.requested:
            raise KeyboardInterrupt
        flag.requested = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def train(run: RunConfig, schedule=None, corpus: Corpus | None = None, arm: str = "",
          hooks: ArmHooks | None = None) -> dict:
    """Train one arm and return its run record (see the module docstring).

    ``hooks``: callbacks, checkpoints and replay bundles (``ArmHooks``); with a checkpoint to resume from,
    training continues after its step with the record, model, optimiser, loss scaler and RNG states it holds.
    Under a process group (torchrun; ``stability.train.distributed``) the arm trains sharded with FSDP2 (or
    DDP), every figure global; checkpoints and replay bundles are single-process only and left out."""
    reducer = reducer_for(run)        # ConfigError when the run cannot train across the processes
    hooks = reducer.supported(hooks or ArmHooks())
    schedule = schedule or Standard()
    parts = build(run, faults.with_lr_spike(schedule, run), corpus, reducer, run_identity(run, schedule.name, arm))
    state = TrainState(record=new_record(parts, arm), monitor=Monitor(run.probes))
    fault_hooks = faults.install(parts.model, parts.forward, run, lambda: state.step, reducer.rank, reducer.size)
    resume = hooks.checkpoints.resume_state
    if resume is not None:
        restore(resume, parts.model, parts.optimizer, parts.policy, state)
        state.first_step = resume["step"] + 1
        mark_running(state.record)
        if "applied" not in state.record:   # a checkpoint written before the record kept it: from here on
            start_applied(state.record, parts.linears.describe())
    state.start_clock()
    record = state.record
    hooks.on_start(record)
    parts.model.train()
    try:
        with stop_after_step() as stop:
            for step in range(state.first_step, run.steps):
                state.between_steps = False
                row = train_step(parts, state, hooks, step, stop)
                stop_reason = state.monitor.verdict(row)
                hooks.on_step(step, row)
                if stop_reason is not None:
                    mark_diverged(record, step, stop_reason)
                    break
                if step % run.probes.every == 0:
                    take_probes(parts, state, step)
                if hooks.checkpoints.due(step) and step < run.steps - 1:
                    checkpoint(parts, state, hooks, step)
                state.between_steps = True
                if reducer.stop_requested(stop.requested):   # under torchrun: any rank's Ctrl-C
                    raise KeyboardInterrupt
            else:
                mark_completed(record)
    except KeyboardInterrupt:
        mark_killed(record)
        if hooks.checkpoints.enabled and state.between_steps and record["series"]["step"]:
            checkpoint(parts, state, hooks, record["series"]["step"][-1])   # resume continues after the last step
    except Exception as error:  # noqa: BLE001 -- recorded, never lost; the caller reports it
        mark_error(record, error, traceback.format_exc())
    finally:
        for handle in fault_hooks:
            handle.remove()
        parts.policy.unwatch()
        parts.linears.remove()
        parts.stepped_lr.remove()
    finish(parts, state, hooks)
    hooks.on_end(record)
    return record


def build(run: RunConfig, schedule, corpus: Corpus | None, reducer, identity: str = "") -> Parts:
    """What the arm trains with. The seed is set first: every rank (and every resumed call) builds the same
    values, then ``reducer.wrap`` shards them under torchrun. ``identity``: what a rounding replicate's draws
    are keyed on (``stability.model.rounding.run_identity``)."""
    device = torch.device(run.device)
    corpus = corpus or load_corpus(run.data, run.model.vocab_size, run.model.context)
    torch.manual_seed(run.seed)
    model = perturb_rounding(build_model(run.model, run.seed), identity, run.replicate).to(device)
    policy = PrecisionPolicy(run.precision, run.device)
    model = policy.prepare(model)
    policy.watch(model)  # counts overflow/underflow on the device (the own fp8 counts in its casts)
    linears = applied.LinearFormats(model, policy.format, run.precision)   # every Linear call of a training forward
    forward = reducer.wrap(model)
    optimizer = make_optimizer(model, run)
    groups = probes.layer_groups(model)
    grad_norms, update_norms = probes.GradNorms(groups), probes.UpdateNorms(groups)
    cfg_p = run.probes
    probe_x, _ = probe_batch(corpus, cfg_p.probe_batch_size, run.model.context, run.data.bos, device)
    held_out = eval_batches(corpus, cfg_p.eval_batches, run.data.batch_size, run.model.context, run.data.bos,
                            device)
    rounding = StepRounding(model, identity, run.replicate, probes.local)
    return Parts(run=run, schedule=schedule, corpus=corpus, device=device, model=model, forward=forward,
                 policy=policy, optimizer=optimizer, reducer=reducer, groups=groups, grad_norms=grad_norms,
                 update_norms=update_norms, probe_x=probe_x, held_out=held_out, rounding=rounding,
                 stepped_lr=applied.SteppedLR(optimizer), linears=linears,
                 probe_targets=applied.probe_targets(model))


def new_record(parts: Parts, arm: str) -> dict:
    """The arm record before its first step: what was built (parameters, layers, model, precision, processes)."""
    run, model = parts.run, parts.model
    record = new_arm_record(arm, run.variant, run.seed, parts.schedule.name)
    describe_arm(record, num_parameters=model.num_parameters(), gate_parameters=model.num_gate_parameters(),
                 layer_names=list(parts.groups), model=model.describe(),
                 precision={"dtype": run.precision.dtype, **parts.policy.describe()},
                 distributed=parts.reducer.describe())
    start_applied(record, parts.linears.describe())
    return record


def take_probes(parts: Parts, state: TrainState, step: int) -> None:
    """The heavy probes on the fixed probe batch, and the precision's overflow/underflow counts so far."""
    t0 = time.perf_counter()
    snapshot = probes.heavy_probes(parts.model, parts.probe_x)
    add_probes(state.record, snapshot, step)
    hooked = set(snapshot["hooked"])
    missed = [name for name in parts.probe_targets if name not in hooked]
    if missed:
        note_probe_modules_missed(state.record, step, missed)
    if parts.policy.format.counts_range:
        parts.reducer.precision_tally(parts.policy.tally)
        add_precision_stats(state.record, step, parts.policy.pop_stats())
    state.probe_seconds += time.perf_counter() - t0


def checkpoint(parts: Parts, state: TrainState, hooks: ArmHooks, step: int) -> None:
    """Save the state after ``step`` through ``hooks.checkpoints``."""
    note_wall_seconds(state.record, state.wall_seconds())
    hooks.checkpoints.save(arm_state(step, parts.model, parts.optimizer, parts.policy, state, hooks.identity))


def finish(parts: Parts, state: TrainState, hooks: ArmHooks) -> None:
    """After the last step: of an arm that completed or diverged, the last probes, the held-out figures and
    ``hooks.on_trained``; of every arm, the trajectory figures and the timing."""
    run, record = parts.run, state.record
    eval_seconds = 0.0
    if record["status"] in USABLE and record["series"]["step"]:
        last = record["series"]["step"][-1]
        if not record["probes"] or record["probes"][-1]["step"] != last:
            take_probes(parts, state, last)
        t0 = time.perf_counter()
        add_figures(record, evaluate(parts.model, parts.held_out, parts.policy))
        if hooks.on_trained is not None:
            trained = parts.reducer.full_model(parts.model,
                                               lambda: parts.policy.prepare(build_model(run.model, run.seed)))
            if trained is not None:   # None on the ranks other than 0 (whose record is kept)
                hooks.on_trained(trained, parts.corpus, record)
        eval_seconds = time.perf_counter() - t0
    set_probe_steps_missed(record, applied.probe_steps_missed(record["series"]["step"],
                                                             [snapshot["step"] for snapshot in record["probes"]],
                                                             run.probes.every, record["status"] in USABLE))
    add_figures(record, final_figures(record, run.steps))
    set_arm_timing(record, wall_seconds=state.wall_seconds(), train_seconds=state.train_seconds,
                   probe_seconds=state.probe_seconds, eval_seconds=eval_seconds, tokens=state.tokens_seen,
                   started_at=state.started_at, ended_at=time.time(), resumed_at_step=state.first_step)
