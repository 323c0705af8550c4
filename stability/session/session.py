"""What a training command keeps while it trains, so that a long run can be watched, survive a crash
and be continued.

    session = Session(run_dir, label="run", tracker=LiveTracker(uri))   # tracker: None = no live tracking
    record = run_pair(config, session=session)                         # or run_case(kind, config, session=...)
    session.close()

For every run of a case (an arm at a seed; in sweeps and ladders also an LR or a precision) it keeps

    <run dir>/<record>.json                         the case record: written when the case starts and after
                                                    every run (its "runs" list: status, final figures, files)
    <run dir>/<record>.mlflow                       the ids of its live MLflow runs, written by the sending
                                                    process before it sends anything to a run (track.ids)
    <run dir>/steps/<case id>/<run key>.jsonl       one line per step, flushed as training goes (steplog;
                                                    once the run ends: kept, gzipped or dropped, as
                                                    ``finished_steps`` says)
    <checkpoint dir>/<case id>/<run key>.pt         the arm's checkpoint, every ``checkpoint.every`` steps and
                                                    at a stop; deleted once the run has finished
    <run dir>/replay/<case id>/<run key>-step<N>.pt replay bundles of flagged steps, within the budget

shows progress (``stability.session.progress``: bars on a terminal, a line every tenth of a run in a log),
sends the steps to the live MLflow runs and says where to watch them (the runs-table link) as soon as
they exist. The checkpoint directory defaults to ``<run dir>/checkpoints``.

Resuming: ``Resume.load(path)`` reads an interrupted run directory (or one of its records) and checks
it; a ``Session(..., resume=...)`` then gives every case the id of its interrupted record and the MLflow
runs it is known to have (its tracking entry and ids file: continued, live or not, never made again),
takes the runs that had finished from their per-step files, and continues the unfinished ones from their
checkpoints.
Bad input (missing or corrupt target or checkpoint, another config, a directory in use, a checkpoint
directory that cannot be written) is a RecordError before anything is written.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import sys
from pathlib import Path

from stability import config as cfg
from stability.record import (
    UNFINISHED,
    RecordError,
    Status,
    case_key,
    case_name,
    config_diff,
    name_run,
    note_resumed,
    note_run,
    read_record,
    record_filename,
    resume_config,
    set_checkpoint_dir,
    set_replay_bundles,
    set_tracking,
    write_record,
)
from stability.record.rundir import MANIFEST, ensure_run_dir, is_session, read_manifest, sessions
from stability.session.progress import Progress, Quiet
from stability.session.steplog import StepLog, compressed, read_steplog
from stability.track.live import NoLiveTracking
from stability.train.checkpoint import NO_BUNDLES, Bundles, Checkpoints, load_state
from stability.train.trainer import ArmHooks

LOCK = ".lock"
FINISHED_STEPS = ("keep", "gzip", "drop")   # what becomes of a run's per-step file when the run has ended


# ----------------------------------------------------------------------------- resuming

@dataclasses.dataclass
class Resume:
    """An interrupted run directory and its records, checked (see the module docstring)."""

    run_dir: Path
    records: list[dict]
    label: str
    checkpoint_dir: Path

    @classmethod
    def load(cls, target: str | Path, checkpoint_dir: str | Path | None = None) -> Resume:
        """Read ``target`` (a run directory or a record in one); RecordError when it cannot be resumed."""
        path = Path(target)
        if not path.exists():
            raise RecordError(f"resume target {str(path)!r} does not exist: expected a record file or a run "
                              f"directory written by `stability run` or `stability stress`")
        run_dir = path if path.is_dir() else path.parent
        if not is_session(run_dir):
            raise RecordError(f"resume target {str(path)!r} is not in a run directory (no {MANIFEST} in "
                              f"{str(run_dir)!r}): expected a directory made by `stability run` or `stability stress`")
        label = (read_manifest(run_dir) or {}).get("label", "run")
        files = [path] if path.is_file() else sorted(p for p in run_dir.glob("*.json") if p.name != MANIFEST)
        if not files:
            raise RecordError(f"resume target {str(run_dir)!r} holds no record: nothing was measured there, "
                              f"start a new run instead")
        records = [read_record(p) for p in files]
        holder = locked_by(run_dir)
        if holder:
            raise RecordError(f"run directory {str(run_dir)!r} is in use by another process ({holder}): "
                              f"expected an interrupted run")
        saved = next((r.get("checkpoint_dir") for r in records if r.get("checkpoint_dir")), None)
        directory = Path(checkpoint_dir) if checkpoint_dir else run_dir / (saved or "checkpoints")  # relative: inside
        return cls(run_dir, records, label, directory)

    @property
    def config(self) -> cfg.ExperimentConfig:
        """The experiment config the interrupted run was started with; RecordError naming the record when this
        code cannot read it (a record is data: its config is checked as a command line's would be)."""
        from stability.config.overrides import check_types

        record = self.records[0]
        try:
            config = cfg.from_dict(cfg.ExperimentConfig, record["config"])
            check_types(config)
            return config
        except (TypeError, ValueError, KeyError, AttributeError) as error:   # ConfigError is a ValueError
            message = " ".join(str(error).split())
            raise RecordError(f"resume target {record['_path']!r} holds a config this code cannot read: "
                              f"{message[:300]}") from None

    def unfinished(self) -> list[dict]:
        return [r for r in self.records if r.get("status") in UNFINISHED]

    def check_config(self, config: cfg.ExperimentConfig) -> None:
        """RecordError unless ``config`` is the one the records were made with (``resume_config``: how a run is
        kept, its checkpoint settings, aside)."""
        wanted = resume_config(cfg.to_dict(config))
        for record in self.records:
            have = resume_config(record["config"])
            if have != wanted:
                raise RecordError(f"resume target {record['_path']!r} belongs to another config "
                                  f"({config_diff(have, wanted, names=('run', 'command'))}): expected the "
                                  f"command's config, or --resume without --preset/--set/--config")

    def check_checkpoints(self) -> int:
        """Load every checkpoint an unfinished record will resume from; RecordError when one is corrupt or
        of another run. Returns how many there are."""
        count = 0
        for record in self.unfinished():
            for path in sorted((self.checkpoint_dir / record["id"]).glob("*.pt")):
                state = load_state(path)
                if state.get("run_key") != path.stem:
                    raise RecordError(f"checkpoint {str(path)!r} belongs to run {state.get('run_key')!r}, not "
                                      f"{path.stem!r}: expected the file this run wrote")
                count += 1
        return count

    def record_for(self, case_record: dict) -> dict | None:
        """The interrupted record of the same case (its stress case and case key), if any."""
        key = (case_name(case_record), case_key(case_record))
        return next((r for r in self.records if (case_name(r), case_key(r)) == key), None)


def locked_by(run_dir: Path) -> str | None:
    """"pid N" when a live process holds the run directory's lock, else None."""
    lock = Path(run_dir) / LOCK
    if not lock.is_file():
        return None
    with open(lock, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            return f"pid {handle.read().strip() or '?'}"
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return None


def find_interrupted(root: str | Path, label: str, config: cfg.ExperimentConfig) -> Path | None:
    """The newest run directory under ``root`` made by the same command (``label``) with the same config whose
    records are unfinished and that no process holds: what running the same command again continues."""
    wanted = resume_config(cfg.to_dict(config))
    for run_dir in reversed(sessions(root)):
        try:
            resume = Resume.load(run_dir)
        except RecordError:
            continue
        if resume.label == label and resume.unfinished() and all(
                resume_config(r["config"]) == wanted for r in resume.records):
            return run_dir
    return None


# ----------------------------------------------------------------------------- the session

class Session:
    """What one command keeps while it trains (see the module docstring).

    run_dir: the run directory. label: the command ("run", "stress"; the run directory's manifest).
    tracker: a ``stability.track.live.LiveTracker``, or None (no live tracking: a ``NoLiveTracking`` stands in).
    checkpoint_dir: default ``<run dir>/checkpoints``. progress: show progress (bars or lines) and what each run
    did. display: the ``Progress`` to show it with (default: one on ``stream`` when ``progress``, else a
    ``Quiet`` one). resume: a checked ``Resume``. lock: hold the run directory's
    lock (so a resume can tell a live run from an interrupted one; off when several processes share a
    directory). finished_steps: what becomes of a run's per-step file once the run has ended: "keep" it, "gzip"
    it (``<run key>.jsonl.gz``), or "drop" it (its figures are in the record; a run stopped before its end keeps
    its file either way)."""

    def __init__(self, run_dir: str | Path, label: str = "run", tracker=None, checkpoint_dir: str | Path | None = None,
                 progress: bool = False, resume: Resume | None = None, lock: bool = False, stream=None,
                 display: Progress | None = None, finished_steps: str = "keep"):
        self.run_dir = Path(run_dir)
        self.label = label
        self.live = tracker is not None       # tracked live: the record names the live runs while it trains
        self.tracker = tracker if tracker is not None else NoLiveTracking()
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else self.run_dir / "checkpoints"
        self.progress = progress
        self.resume = resume
        self.lock = lock
        if finished_steps not in FINISHED_STEPS:
            raise ValueError(f"finished_steps={finished_steps!r}: expected one of {FINISHED_STEPS}")
        self.finished_steps = finished_steps
        self.stream = stream or sys.stdout
        self.record_paths: dict[str, Path] = {}
        self.current: dict | None = None     # the case record in flight
        self._cases: dict[int, dict] = {}     # id(case record) -> its bookkeeping
        self._lock_handle = None
        self.display = display or (Progress(self.stream) if progress else Quiet(self.stream))
        self._watched: set[str] = set()       # cases whose live runs were looked for, and found
        self._shown_experiments: set[str] = set()   # experiments whose runs-table link was printed
        self._written_children: set[tuple] = set()  # (case id, child run) whose live id the record holds

    # ---------------------------------------------------------------- what train_arm calls

    def arm_hooks(self, case_record: dict, unit):
        """The hooks of one run (a ``stability.cases.runs.Unit``: it names the run and keys its files), or its
        finished arm record when a resumed case already has it."""
        case = self._case(case_record)
        run, arm, name, key = unit.run, unit.arm, unit.run_name, unit.key
        label = f"  [{unit.case}] {name}"
        steps_file = self.run_dir / "steps" / case_record["id"] / f"{key}.jsonl"
        checkpoint_file = self.checkpoint_dir / case_record["id"] / f"{key}.pt"
        resume_state, resume_after = None, None
        if case["resumed"]:
            kept = next((f for f in (compressed(steps_file), steps_file) if f.is_file()), None)
            finished = read_steplog(kept)["end"] if kept is not None else None
            if finished is not None:
                self._say(f"{label}: finished before the interruption "
                          f"({finished.get('status')}, {len(finished['series']['step'])} steps), taken from "
                          f"{kept.name}")
                self._done_elsewhere(case, finished)
                return finished
            if checkpoint_file.is_file():
                resume_state = load_state(checkpoint_file, map_location=run.device)
                resume_after = resume_state["step"]
        identity = unit.identity(case_record["id"])
        steplog = StepLog(steps_file, {k: v for k, v in identity.items() if k != "config"}, resume_after)
        checkpoints = Checkpoints(checkpoint_file, run.checkpoint.every, resume_state,
                                  on_saved=lambda _step: steplog.sync())
        tracker, display = self.tracker, self.display
        case["shown"].add(key)

        def on_start(record):
            name_run(record, name, key)
            first = len(record["series"]["step"])
            self._say(f"{label}: {'resuming after step ' + str(first - 1) + ', ' if first else ''}"
                      f"{run.steps} steps")
            display.run_started(label, run.steps, first)
            tracker.arm_started(case_record, record, first)

        def on_step(step, row):
            steplog.append(row)
            tracker.step(case_record, {"arm": arm, "seed": unit.seed, "run_name": name}, row)
            self._watch(case_record, name)
            display.step(step, row)

        def on_end(record):
            display.run_ended(len(record["series"]["step"]))
            if record["status"] == Status.KILLED:
                steplog.close()          # no end line: the run is continued from its checkpoint
                self._say(f"{label}: stopped after step {len(record['series']['step']) - 1} "
                          f"(checkpoint {checkpoint_file})")
            else:
                steplog.end(record, compress=self.finished_steps == "gzip")
                if self.finished_steps == "drop":
                    steplog.path.unlink(missing_ok=True)
                checkpoints.remove()
                self._say(f"{label}: {record['status']} after {len(record['series']['step'])} steps"
                          + (f" - {record['stop_reason']}" if record.get("stop_reason") else ""))
            tracker.arm_ended(case_record, record)
            self._watch(case_record)

        return ArmHooks(on_start=on_start, on_step=on_step, on_end=on_end, checkpoints=checkpoints,
                        bundles=case["bundles"], identity=identity, replay_optimizer=run.checkpoint.replay_optimizer)

    def arm_done(self, case_record: dict, arm_record: dict | None) -> None:
        """Note a finished (or stopped) run in the case record and write the record."""
        case = self._case(case_record)
        if arm_record is not None and arm_record.get("run_key") not in case["shown"]:
            self._done_elsewhere(case, arm_record)       # trained by a runner (Ray): no steps seen here
        if arm_record is not None:
            steps_file = Path("steps") / case_record["id"] / f"{arm_record.get('run_key')}.jsonl"
            if compressed(self.run_dir / steps_file).is_file():
                steps_file = compressed(steps_file)
            kept = (self.run_dir / steps_file).is_file() or self.finished_steps != "drop"
            note_run(case_record, arm_record, str(steps_file) if kept else "")
        if case["bundles"].enabled:
            set_replay_bundles(case_record, case["bundles"].index())
        self.write(case_record)

    def write(self, case_record: dict) -> Path:
        """Write the case record into the run directory (with the live run ids, so a resume reuses them; the
        ids it holds stay until the tracker reports newer ones)."""
        ensure_run_dir(self.run_dir, self.label)
        self._hold_lock()
        if self.live and case_record.get("status") in UNFINISHED:
            live = self.tracker.runs_of(case_record)
            held = case_record.get("tracking") or {}
            if live:
                set_tracking(case_record, {"status": "live", **live})
            elif self.tracker.failed or not held.get("parent_run_id"):
                set_tracking(case_record, {**(held if held.get("uri") == self.tracker.uri else {}),
                                           **self.tracker.status()})
        path = write_record(case_record, self.run_dir)
        self.record_paths[case_record["id"]] = path
        self.tracker.record_file = path
        return path

    def live_runs(self, case_record: dict) -> dict | None:
        """The live MLflow runs of a case (after sending everything queued), for ``log_to_mlflow(live=...)``."""
        if not self.tracker.flush():
            return None
        self._watch(case_record)
        return self.tracker.runs_of(case_record)

    def case_units(self, case_record: dict, units: list) -> None:
        """The runs (``stability.cases.runs.Unit``) a case is about to train: the size of its progress bar."""
        case = self._case(case_record)
        if not case["units"] and units:
            self.display.case_started(f"[{units[0].case}]", sum(unit.run.steps for unit in units))
        case["units"] = len(units)

    def close(self) -> None:
        """End the progress display and the live tracking (sending what is queued); a stopped case whose record
        does not name its live runs yet (a second Ctrl-C came before the tracker reported them) is written
        once more, with their ids."""
        self.display.close()
        self.tracker.close()
        for case in self._cases.values():
            record = case["record"]
            if record.get("status") in UNFINISHED and not (record.get("tracking") or {}).get("parent_run_id") \
                    and self.tracker.runs_of(record):
                self.write(record)
        if self._lock_handle is not None:
            self._lock_handle.close()
            self._lock_handle = None

    # ---------------------------------------------------------------- bookkeeping

    def _case(self, case_record: dict) -> dict:
        case = self._cases.get(id(case_record))
        if case is not None and case["record"] is case_record:
            return case
        old = self.resume.record_for(case_record) if self.resume is not None else None
        resumed = old is not None and old.get("status") in UNFINISHED
        if resumed:   # the same file, the same per-step files and checkpoints
            note_resumed(case_record, old)
        inside = self.checkpoint_dir.resolve().is_relative_to(self.run_dir.resolve())
        set_checkpoint_dir(case_record, str(self.checkpoint_dir.resolve().relative_to(self.run_dir.resolve())
                                            if inside else self.checkpoint_dir.resolve()))
        bundles = NO_BUNDLES
        run_cfg = (case_record.get("config") or {}).get("run") or {}
        budget = run_cfg.get("checkpoint") or {}
        if budget.get("replay_first", 0) or budget.get("replay_worst", 0):
            bundles = Bundles(self.run_dir / "replay" / case_record["id"], budget.get("replay_first", 0),
                              budget.get("replay_worst", 0))
            if resumed:
                bundles.adopt(old.get("replay_bundles") or [])
        case = {"record": case_record, "resumed": resumed, "bundles": bundles, "units": 0, "shown": set()}
        self._cases[id(case_record)] = case
        self.current = case_record
        known = None
        if resumed:   # the MLflow runs of the interrupted case ({}: none named; the store's tags may know them)
            from stability.track.ids import known_runs

            known = known_runs(old)
            if known:
                set_tracking(case_record, {**{k: v for k, v in known.items() if k != "error"}, "status": "live"}
                             if self.live else known)
        if self.live:
            from stability.track.ids import ids_file

            self.tracker.case_started(case_record, known, ids_file(self.run_dir / record_filename(case_record)))
        self.write(case_record)          # on disk before the first step
        return case

    def _hold_lock(self) -> None:
        if not self.lock or self._lock_handle is not None:
            return
        handle = open(self.run_dir / LOCK, "a+")  # noqa: SIM115  (held for the session's life)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RecordError(f"run directory {str(self.run_dir)!r} is in use by another process") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._lock_handle = handle

    def _done_elsewhere(self, case: dict, arm_record: dict) -> None:
        """A run of the case not trained through this session's hooks: its steps count as done."""
        case["shown"].add(arm_record.get("run_key"))
        self.display.skip(len(arm_record["series"]["step"]))

    def _watch(self, case_record: dict, child: str | None = None) -> None:
        """Once the tracker has made a case's live runs: print where to watch them (once per experiment, also
        with ``progress`` off); once it has made the child run ``child`` (the run training now), write the
        case record with its id, so that a resume after kill -9 continues that run."""
        if child is not None and (case_record["id"], child) not in self._written_children:
            where = self.tracker.experiment_of(case_record)
            if where is not None and child in where["child_run_ids"]:
                self._written_children.add((case_record["id"], child))
                self.write(case_record)
        if case_record["id"] in self._watched:
            return
        where = self.tracker.experiment_of(case_record)
        if where is None:
            return
        self._watched.add(case_record["id"])
        if where["experiment_id"] in self._shown_experiments:
            return
        self._shown_experiments.add(where["experiment_id"])
        from stability.track.runs import where_to_look

        line = (f"mlflow: live in experiment {where['experiment']!r} at {where['uri']}; "
                f"{where_to_look(where['uri'], where['experiment_id'])}")
        self.display.say(line)

    def _say(self, line: str) -> None:
        self.display.note(line)
