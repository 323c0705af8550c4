"""Live tracking: per-step metrics reach MLflow while an arm trains, without ever holding a step up.

    tracker = LiveTracker(uri)
    tracker.case_started(record, None, ids_path)        # the parent run, started now; its id into ids_path
    tracker.arm_started(record, arm_record, first_step) # a child run per arm (named by arm, seed, LR)
    tracker.step(record, arm_record, row)               # queued; returns at once
    tracker.arm_ended(record, arm_record)               # final figures, status and end time of the child
    tracker.runs_of(record)                             # the run ids, for ``log_to_mlflow(live=...)``
    tracker.close()

The training process collects each step's metrics in a list and, every ``BATCH_SECONDS``, puts the
list into a bounded queue (``put_nowait``): one hand-over per half second, not per step. A separate
process (``multiprocessing`` "spawn", so MLflow's Python never competes with the training loop for
the interpreter lock) takes them out, groups the metrics of about ``flush_seconds`` of training
per run and sends them with ``log_batch`` (SQLite stores under the same file lock as
``log_to_mlflow``), and reports the run ids back. When the store fails, does not answer for
``patience_seconds``, or the queue fills up, the tracker gives up for the rest of the process with
ONE message and stops the sending process: the run goes on "not tracked", the JSON record and the
per-step files hold everything, and ``stability upload`` sends the record later.

The sending process writes the id of every run it makes into the case's ids file
(``stability.track.ids``) before it sends anything to that run, so a command stopped at any moment
(two Ctrl-C, kill -9) leaves every run that holds something named on disk. A resumed case continues
those runs (``stability.track.runs.reopen``: the ids kept, else the runs tagged with the record's id;
runs a dead process left RUNNING are ended as KILLED): a resumed arm's child run is asked which step
of each series it holds, and the steps trained again after an older checkpoint are not sent a second
time, so every step is in the series once however often a run was stopped.

The sending process ends with the training process: it ignores Ctrl-C (a terminal sends it to both;
the training process decides when to stop and sends what is queued), and a thread in it waits on the
pipe from its parent, which closes when the parent is gone, kill -9 included (and checks the parent
pid, in case a child of the parent holds that pipe open too).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import multiprocessing
import os
import queue
import signal
import threading
import time

from stability.record import Status
from stability.track import runs as tracking
from stability.track.ids import write_ids

POLL_SECONDS = 0.5   # how often the training side looks at what the sender reported
BATCH_SECONDS = 0.5  # how often the training side hands the steps collected so far to the sender
PARENT_CHECK_SECONDS = 1.0   # the longest the sender outlives its parent when the pipe does not tell


class LiveTracker:
    """Sends runs and per-step metrics to the MLflow store at ``uri`` from a separate process (see above).

    ``experiment``: the experiment name (default ``stability-<preset>``). ``record_file``: named in the
    failure message (the session sets it when it writes the record). Methods never raise and never block
    the caller, except ``flush``/``close``, which wait at most their timeout."""

    def __init__(self, uri: str | None = None, experiment: str | None = None, flush_seconds: float = 2.0,
                 max_queue: int = 20_000, patience_seconds: float = 120.0):
        self.uri = tracking.resolve_tracking_uri(uri)
        self.experiment = experiment
        self.patience_seconds = patience_seconds
        self.failed: str | None = None
        self.record_file = None
        self._runs: dict[str, dict] = {}          # record id -> {"experiment_id", "parent_run_id", ...}
        self._tokens = itertools.count()
        self._max_queue = max_queue
        self._flushed = -1
        self._polled = 0.0
        self._steps: list[tuple] = []     # (record id, child run name, step, metrics, time) not handed over yet
        self._handed = 0.0
        context = multiprocessing.get_context("spawn")
        self._queue = context.Queue(maxsize=max_queue)
        self._events = context.Queue()
        self._busy = context.Value("d", 0.0, lock=False)   # monotonic time the store call in flight started
        self._process = context.Process(target=serve, name="stability-live-tracking", daemon=True,
                                        args=(self.uri, experiment, flush_seconds, self._queue, self._events,
                                              self._busy))
        self._process.start()

    # ------------------------------------------------------------------ the training side

    def case_started(self, record: dict, resumed: dict | None = None, ids_path=None) -> None:
        """Start the parent run of ``record`` now, or, for a resumed case (``resumed`` not None), continue the
        runs of the interrupted one: those ``resumed`` names (``stability.track.ids.known_runs``), else those
        the store holds with the record's id. ``ids_path``: the ids file the sending process writes each
        run's id into before it sends anything to the run (``stability.track.ids``)."""
        self._put(("case", record["id"], {k: v for k, v in record.items() if k not in ("arms", "runs")},
                   _now_ms(), resumed, str(ids_path) if ids_path else None))

    def arm_started(self, record: dict, arm: dict, first_step: int = 0) -> None:
        """Start (or, for an arm resumed after ``first_step`` > 0, continue) the arm's child run, at the arm's
        start time."""
        start, _ = tracking.arm_times(arm)
        self._put(("arm", record["id"], _light(arm), start or _now_ms(), first_step))

    def step(self, record: dict, arm: dict, row: dict) -> None:
        """Queue the step's metrics (``tracking.STEP_METRICS``); also notices a sender that stopped answering."""
        if self.failed:
            return
        now = time.monotonic()
        if now - self._polled > POLL_SECONDS:
            self._polled = now
            self._poll()
            busy = self._busy.value
            if busy and now - busy > self.patience_seconds:
                self._fail(f"the tracking store did not answer for {self.patience_seconds:.0f} s")
            if self.failed:
                return
        metrics = {k: float(row[k]) for k in tracking.STEP_METRICS
                   if isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)
                   and math.isfinite(row[k])}
        self._steps.append((record["id"], tracking.child_name(arm), int(row["step"]), metrics, _now_ms()))
        if now - self._handed > BATCH_SECONDS:
            self._hand_over()

    def _hand_over(self) -> None:
        """Put the steps collected so far into the queue as one item."""
        self._handed = time.monotonic()
        if self._steps:
            steps, self._steps = self._steps, []
            self._put(("metrics", steps))

    def arm_ended(self, record: dict, arm: dict) -> None:
        """End the arm's child run: its final figures (at the arm's last step), status and end time."""
        self._put(("arm_end", record["id"], _light(arm), tracking.final_step(arm)))

    def runs_of(self, record: dict) -> dict | None:
        """The live runs of ``record`` for ``log_to_mlflow(live=...)``, or None (none, or tracking failed)."""
        self._poll()
        runs = self._runs.get(record.get("id"))
        if self.failed or not runs or not runs.get("parent_run_id"):
            return None
        return {"uri": self.uri, **runs}

    def experiment_of(self, record: dict) -> dict | None:
        """{"uri", "experiment", "experiment_id", "child_run_ids"} of ``record``'s live runs once the sending
        process has made them (what it reported so far: no waiting, no polling), else None."""
        runs = self._runs.get(record.get("id"))
        if self.failed or not runs or not runs.get("experiment_id"):
            return None
        return {"uri": self.uri, "experiment": runs.get("experiment"), "experiment_id": runs["experiment_id"],
                "child_run_ids": runs.get("child_run_ids") or {}}

    def status(self) -> dict:
        """{"status": "live", "uri"} or {"status": "not tracked", "uri", "error"}."""
        if self.failed:
            return {"status": "not tracked", "uri": self.uri, "error": self.failed}
        return {"status": "live", "uri": self.uri}

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far is sent (at most ``timeout`` s, default the patience); False
        when it was not."""
        if self.failed:
            return False
        token = next(self._tokens)
        self._put(("flush", token))
        deadline = time.monotonic() + (self.patience_seconds if timeout is None else timeout)
        while not self.failed and self._flushed < token:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(f"the tracking store took more than {self.patience_seconds if timeout is None else timeout:.0f}"
                           f" s to take the queued metrics")
                break
            try:
                self._take(self._events.get(timeout=min(left, 0.5)))
            except queue.Empty:
                if not self._process.is_alive():
                    self._poll()
                    self._fail(self.failed or "the tracking process ended unexpectedly")
        return not self.failed

    def close(self, timeout: float | None = None) -> None:
        """Send what is queued (at most ``timeout`` s), then stop the sending process."""
        self.flush(timeout)
        with contextlib.suppress(Exception):
            self._queue.put_nowait(("stop",))
        self._process.join(timeout=5.0)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=5.0)
        for channel in (self._queue, self._events):
            channel.close()
            channel.cancel_join_thread()

    def _put(self, item) -> None:
        if self.failed:
            return
        if item[0] != "metrics" and self._steps:
            self._hand_over()      # keep the order: the steps before what follows them
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._fail(f"the tracking store fell behind ({self._max_queue} updates queued)")

    def _poll(self) -> None:
        """Take in what the sending process reported so far (run ids, flushes, a failure)."""
        while True:
            try:
                self._take(self._events.get_nowait())
            except (queue.Empty, OSError, ValueError):
                return

    def _take(self, event) -> None:
        kind = event[0]
        if kind == "runs":
            self._runs[event[1]] = event[2]
        elif kind == "flushed":
            self._flushed = max(self._flushed, event[1])
        elif kind == "failed":
            self._fail(event[1])

    def _fail(self, message: str) -> None:
        if self.failed:
            return
        self.failed = message
        tracking._FAILED[self.uri] = (time.monotonic(), message)
        tracking.report_failure({"status": "not tracked", "uri": self.uri, "error": message}, self.record_file)
        if self._process.is_alive():
            self._process.terminate()   # a call stuck on a silent server goes with it


class NoLiveTracking:
    """The tracker of a session that does not track live (``LiveTracker``'s calls, each doing nothing): no run
    is ever live, nothing ever fails."""

    uri = None
    failed = None

    def __init__(self):
        self.record_file = None

    def case_started(self, record: dict, resumed: dict | None = None, ids_path=None) -> None:
        pass

    def arm_started(self, record: dict, arm: dict, first_step: int = 0) -> None:
        pass

    def step(self, record: dict, arm: dict, row: dict) -> None:
        pass

    def arm_ended(self, record: dict, arm: dict) -> None:
        pass

    def runs_of(self, record: dict) -> None:
        return None

    def experiment_of(self, record: dict) -> None:
        return None

    def flush(self, timeout: float | None = None) -> bool:
        return False

    def close(self, timeout: float | None = None) -> None:
        pass


def _light(arm: dict) -> dict:
    """An arm record without its bulk (series, probes): what the sending process needs of it."""
    return {k: v for k, v in arm.items() if k not in ("series", "probes", "events", "quant", "precision_stats")}


def _now_ms() -> int:
    return int(time.time() * 1000)


# ----------------------------------------------------------------------------- the sending process

def serve(uri: str, experiment: str | None, flush_seconds: float, inbox, events, busy) -> None:
    """The sending process: take items from ``inbox`` until ("stop",), send them, report to ``events``; end
    with the parent (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent()
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")   # fail in seconds, not MLflow's minutes
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    sender = _Sender(uri, experiment, events, busy)
    pending: dict[str, list] = {}        # child run id -> [Metric, ...]
    last_flush = time.monotonic()
    while True:
        try:
            item = inbox.get(timeout=flush_seconds)
        except queue.Empty:
            item = None
        try:
            if item is not None and item[0] == "stop":
                sender.send(pending)
                return
            if item is not None and item[0] == "metrics":
                sender.add_metrics(item, pending)
            elif item is not None:
                sender.send(pending)
                last_flush = time.monotonic()
                sender.handle(item)
            if pending and (time.monotonic() - last_flush >= flush_seconds
                            or sum(map(len, pending.values())) >= 1000):
                sender.send(pending)
                last_flush = time.monotonic()
        except Exception as error:  # noqa: BLE001  (any store failure: report it once and stop)
            events.put(("failed", tracking._one_line(error)))
            return


def exit_with_parent(check_seconds: float = PARENT_CHECK_SECONDS) -> None:
    """End this process (``os._exit``, whatever it is doing) as soon as the process that started it is gone:
    a thread waits on the pipe from the parent (it reads end-of-file when the parent dies) and every
    ``check_seconds`` compares the parent pid with the one at start (the process is handed to another
    parent when its own dies)."""
    parent, first = multiprocessing.parent_process(), os.getppid()

    def watch():
        while True:
            if parent is not None:
                parent.join(timeout=check_seconds)   # returns at once when the pipe from the parent closes
            else:
                time.sleep(check_seconds)
            if (parent is not None and not parent.is_alive()) or os.getppid() != first:
                os._exit(0)
    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class _Sender:
    """The MLflow side of the sending process: run ids per record, and the store calls."""

    def __init__(self, uri, experiment, events, busy):
        self.uri, self.experiment, self.events, self.busy = uri, experiment, events, busy
        self.client = None
        self.runs: dict[str, dict] = {}

    def store(self, fn, *args, **kwargs):
        """One call to the store, timed so the training side can tell a store that stopped answering."""
        self.busy.value = time.monotonic()
        try:
            with tracking.store_lock(self.uri):
                return tracking._retry(fn, *args, **kwargs)
        finally:
            self.busy.value = 0.0

    def connect(self):
        if self.client is None:
            self.busy.value = time.monotonic()
            tracking.check_reachable(self.uri)
            self.busy.value = 0.0     # a store another process is creating is waited for (open_client)
            self.client = tracking.open_client(self.uri)
        return self.client

    def add_metrics(self, item, pending) -> None:
        from mlflow.entities import Metric

        for record_id, child, step, metrics, stamp in item[1]:
            runs = self.runs.get(record_id) or {}
            run_id = runs.get("child_run_ids", {}).get(child)
            if run_id is not None:
                held = runs["held"].get(child, {})    # a resumed run: the steps the store has
                pending.setdefault(run_id, []).extend(Metric(k, v, stamp, step) for k, v in metrics.items()
                                                      if (k, step) not in held)

    def send(self, pending) -> None:
        client = self.connect() if pending else None
        for run_id, metrics in list(pending.items()):
            for start in range(0, len(metrics), 1000):
                self.store(client.log_batch, run_id, metrics=metrics[start:start + 1000])
        pending.clear()

    def report(self, record_id: str) -> None:
        runs = self.runs[record_id]
        self.events.put(("runs", record_id, {k: (sorted(v) if isinstance(v, set) else
                                                 dict(v) if isinstance(v, dict) else v)
                                             for k, v in runs.items() if k not in ("record", "held", "ids_path")}))

    def save_ids(self, record_id: str) -> None:
        """Write the ids of the record's runs into its ids file (before anything is sent to a new run)."""
        runs = self.runs[record_id]
        if runs.get("ids_path"):
            write_ids(runs["ids_path"], {"uri": self.uri, **runs})

    def handle(self, item) -> None:
        kind = item[0]
        if kind == "flush":
            self.events.put(("flushed", item[1]))
        elif kind == "case":
            _, record_id, record, stamp, resumed, ids_path = item
            self.start_case(record_id, record, stamp, resumed, ids_path)
        elif kind == "arm":
            _, record_id, arm, stamp, first_step = item
            self.start_arm(record_id, arm, stamp, first_step)
        elif kind == "arm_end":
            self.end_arm(item[1], item[2], item[3])

    def start_case(self, record_id, record, stamp, resumed, ids_path) -> None:
        from mlflow.entities import Param

        client = self.connect()
        known = resumed if resumed and resumed.get("uri") == self.uri else {}
        name = known.get("experiment") or tracking.experiment_name(record, self.experiment)
        experiment_id = known.get("experiment_id") or self.store(tracking.ensure_experiment, client, self.uri, name)
        ids = self.store(tracking.reopen, client, experiment_id, record, known) if resumed is not None else {}
        runs = self.runs[record_id] = {"record": record, "experiment_id": experiment_id, "experiment": name,
                                       "parent_run_id": ids.get("parent_run_id"), "params_logged": True,
                                       "child_run_ids": dict(ids.get("child_run_ids") or {}),
                                       "complete_children": set(), "held": {}, "ids_path": ids_path}
        if runs["parent_run_id"]:
            self.store(client.update_run, runs["parent_run_id"], status="RUNNING")
            held = self.store(client.get_run, runs["parent_run_id"]).data.params
        else:
            parent = self.store(client.create_run, experiment_id, start_time=stamp, run_name=tracking.run_name(record),
                                tags=tracking.parent_tags({**record, "status": Status.RUNNING}))
            runs["parent_run_id"], held = parent.info.run_id, {}
        self.save_ids(record_id)
        params = [Param(k, v) for k, v in tracking.params_of(record["config"]).items() if k not in held]
        for start in range(0, len(params), 100):
            self.store(client.log_batch, runs["parent_run_id"], params=params[start:start + 100])
        self.report(record_id)

    def start_arm(self, record_id, arm, stamp, first_step) -> None:
        from mlflow.entities import Param

        runs = self.runs.get(record_id)
        if runs is None:
            return
        client = self.connect()
        key = tracking.child_name(arm)
        if key in runs["child_run_ids"]:          # an arm resumed after an interruption: the same child run
            run_id = runs["child_run_ids"][key]
            self.store(client.update_run, run_id, status="RUNNING")
            runs["held"][key] = self.store(tracking.held_points, client, run_id)   # not sent again
            held = self.store(client.get_run, run_id).data.params
        else:
            child = self.store(client.create_run, runs["experiment_id"], start_time=stamp, run_name=key,
                               tags=tracking.child_tags(runs["record"], {**arm, "status": Status.RUNNING},
                                                        runs["parent_run_id"]))
            run_id = runs["child_run_ids"][key] = child.info.run_id
            self.save_ids(record_id)
            held = {}
            if not first_step:
                runs["complete_children"].add(key)   # every step of it goes through this tracker
        params = tracking.child_params(runs["record"], arm)
        self.store(client.log_batch, run_id, params=[Param(k, v) for k, v in params.items() if k not in held])
        self.report(record_id)

    def end_arm(self, record_id, arm, step) -> None:
        from mlflow.entities import Metric, RunTag

        runs = self.runs.get(record_id) or {}
        key = tracking.child_name(arm)
        run_id = (runs.get("child_run_ids") or {}).get(key)
        if run_id is None:
            return
        client = self.connect()
        now = _now_ms()
        final = tracking.new_points([Metric(k, v, now, step) for k, v in tracking._finite_metrics(
            arm.get("final") or {}, "final.").items()], runs["held"].get(key, {}))
        self.store(client.log_batch, run_id, metrics=final[:1000],
                   tags=[RunTag("status", str(arm.get("status")))])
        _, end = tracking.arm_times(arm)
        self.store(client.set_terminated, run_id, status=tracking.arm_status(arm), end_time=end)
