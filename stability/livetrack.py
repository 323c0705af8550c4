"""Live tracking: per-step metrics reach MLflow while an arm trains, without ever holding a step up.

    tracker = LiveTracker(uri)
    tracker.case_started(record)                        # the parent run, started now
    tracker.arm_started(record, arm_record, first_step) # a child run per arm (named by arm, seed, LR)
    tracker.step(record, arm_record, row)               # queued; returns at once
    tracker.arm_ended(record, arm_record)               # final figures, status and end time of the child
    tracker.runs_of(record)                             # the run ids, for ``log_to_mlflow(live=...)``
    tracker.close()

The training thread only puts small tuples into a bounded queue (``put_nowait``); one background
thread takes them out, groups the metrics of about ``flush_seconds`` of training per run and sends
them with ``log_batch`` (SQLite stores under the same file lock as ``log_to_mlflow``). When the
store fails, or does not answer for ``patience_seconds``, or the queue fills up, the tracker gives
up for the rest of the process with ONE message: the run goes on "not tracked", the JSON record and
the per-step files hold everything, and ``stability upload`` sends the record later.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import threading
import time

from stability import tracking

STOP = object()


class LiveTracker:
    """Sends runs and per-step metrics to the MLflow store at ``uri`` from a background thread (see above).

    ``experiment``: the experiment name (default ``stability-<preset>``). ``record_file``: named in the
    failure message (the session sets it when it writes the record). Methods never raise and never block
    the caller except ``flush``/``close``, which wait at most their timeout."""

    def __init__(self, uri: str | None = None, experiment: str | None = None, flush_seconds: float = 2.0,
                 max_queue: int = 20_000, patience_seconds: float = 30.0):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")   # fail in seconds, not MLflow's minutes
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self.uri = tracking.resolve_tracking_uri(uri)
        self.experiment = experiment
        self.flush_seconds = flush_seconds
        self.patience_seconds = patience_seconds
        self.failed: str | None = None
        self.record_file = None
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._busy_since: float | None = None     # when the store call in flight started
        self._runs: dict[str, dict] = {}          # record id -> {"experiment_id", "parent_run_id", ...}
        self._thread = threading.Thread(target=self._work, name="stability-live-tracking", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the training thread's side

    def case_started(self, record: dict, resumed: dict | None = None) -> None:
        """Start the parent run of ``record`` now (or continue ``resumed``: the ids a killed run left)."""
        self._put(("case", record["id"], {k: v for k, v in record.items() if k not in ("arms", "runs")},
                   _now_ms(), resumed))

    def arm_started(self, record: dict, arm: dict, first_step: int = 0) -> None:
        """Start (or, for an arm resumed after ``first_step`` > 0, continue) the arm's child run, at the arm's
        start time."""
        start, _ = tracking.arm_times(arm)
        self._put(("arm", record["id"], {k: v for k, v in arm.items() if k not in ("series", "probes")},
                   start or _now_ms(), first_step))

    def step(self, record: dict, arm: dict, row: dict) -> None:
        """Queue the step's metrics (``tracking.STEP_METRICS``); also notices a store that stopped answering."""
        if self.failed:
            return
        busy = self._busy_since
        if busy is not None and time.monotonic() - busy > self.patience_seconds:
            self._fail(f"the tracking store did not answer for {self.patience_seconds:.0f} s")
            return
        metrics = {k: float(row[k]) for k in tracking.STEP_METRICS
                   if isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)
                   and math.isfinite(row[k])}
        self._put(("metrics", record["id"], tracking.child_name(arm), int(row["step"]), metrics, _now_ms()))

    def arm_ended(self, record: dict, arm: dict) -> None:
        self._put(("arm_end", record["id"], {k: v for k, v in arm.items() if k not in ("series", "probes")}))

    def runs_of(self, record: dict) -> dict | None:
        """The live runs of ``record`` for ``log_to_mlflow(live=...)``, or None (none, or tracking failed)."""
        runs = self._runs.get(record.get("id"))
        if self.failed or not runs or not runs.get("parent_run_id"):
            return None
        return {"uri": self.uri, **{k: (dict(v) if isinstance(v, dict) else sorted(v) if isinstance(v, set) else v)
                                    for k, v in runs.items() if k != "record"}}

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
        timeout = self.patience_seconds if timeout is None else timeout
        done = threading.Event()
        self._put(("flush", done))
        if not done.wait(timeout) and not self.failed:
            self._fail(f"the tracking store took more than {timeout:.0f} s to take the queued metrics")
        return not self.failed

    def close(self, timeout: float | None = None) -> None:
        self.flush(timeout)
        timeout = self.patience_seconds if timeout is None else timeout
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(STOP)
        self._thread.join(timeout=1.0 if self.failed else timeout)

    def _put(self, item) -> None:
        if self.failed:
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._fail(f"the tracking store fell behind ({self._queue.maxsize} updates queued)")

    def _fail(self, message: str) -> None:
        if self.failed:
            return
        self.failed = message
        tracking._FAILED[self.uri] = (time.monotonic(), message)
        tracking.report_failure({"status": "not tracked", "uri": self.uri, "error": message}, self.record_file)

    # ------------------------------------------------------------------ the background thread

    def _work(self) -> None:
        pending: dict[str, list] = {}        # child run id -> [Metric, ...]
        last_flush = time.monotonic()
        client = None
        while True:
            try:
                item = self._queue.get(timeout=self.flush_seconds)
            except queue.Empty:
                item = None
            if item is STOP:
                return
            if self.failed:
                if item is not None and item[0] == "flush":
                    item[1].set()
                pending.clear()
                continue
            try:
                if client is None:
                    tracking.check_reachable(self.uri)
                    from mlflow.tracking import MlflowClient

                    client = MlflowClient(tracking_uri=self.uri)
                if item is not None and item[0] == "metrics":
                    self._add_metrics(item, pending)
                elif item is not None:
                    self._send(client, pending)
                    last_flush = time.monotonic()
                    self._handle(client, item)
                if pending and (time.monotonic() - last_flush >= self.flush_seconds
                                or sum(map(len, pending.values())) >= 1000):
                    self._send(client, pending)
                    last_flush = time.monotonic()
            except Exception as error:  # noqa: BLE001  (any store failure: stop tracking, keep training)
                self._busy_since = None
                self._fail(tracking._one_line(error))
                if item is not None and item[0] == "flush":
                    item[1].set()

    def _add_metrics(self, item, pending) -> None:
        from mlflow.entities import Metric

        _, record_id, child, step, metrics, stamp = item
        runs = self._runs.get(record_id) or {}
        run_id = (runs.get("child_run_ids") or {}).get(child)
        if run_id is None:
            return
        pending.setdefault(run_id, []).extend(Metric(k, v, stamp, step) for k, v in metrics.items())

    def _store(self, fn, *args, **kwargs):
        """One call to the store, timed so the training thread can tell a store that stopped answering."""
        self._busy_since = time.monotonic()
        try:
            with tracking.store_lock(self.uri):
                return tracking._retry(fn, *args, **kwargs)
        finally:
            self._busy_since = None

    def _send(self, client, pending) -> None:
        for run_id, metrics in list(pending.items()):
            for start in range(0, len(metrics), 1000):
                self._store(client.log_batch, run_id, metrics=metrics[start:start + 1000])
        pending.clear()

    def _handle(self, client, item) -> None:
        kind = item[0]
        if kind == "flush":
            item[1].set()
        elif kind == "case":
            _, record_id, record, stamp, resumed = item
            self._start_case(client, record_id, record, stamp, resumed)
        elif kind == "arm":
            _, record_id, arm, stamp, first_step = item
            self._start_arm(client, record_id, arm, stamp, first_step)
        elif kind == "arm_end":
            _, record_id, arm = item
            runs = self._runs.get(record_id) or {}
            run_id = (runs.get("child_run_ids") or {}).get(tracking.child_name(arm))
            if run_id is not None:
                from mlflow.entities import Metric, RunTag

                now = _now_ms()
                final = [Metric(k, v, now, 0) for k, v in tracking._finite_metrics(arm.get("final") or {},
                                                                                   "final.").items()]
                self._store(client.log_batch, run_id, metrics=final[:1000],
                            tags=[RunTag("status", str(arm.get("status"))),
                                  RunTag("stability.status", str(arm.get("status")))])
                _, end = tracking.arm_times(arm)
                self._store(client.set_terminated, run_id, status=tracking.arm_status(arm), end_time=end)

    def _start_case(self, client, record_id, record, stamp, resumed) -> None:
        from mlflow.entities import Param

        if resumed and resumed.get("uri") == self.uri and resumed.get("parent_run_id"):
            self._store(client.update_run, resumed["parent_run_id"], status="RUNNING")
            self._runs[record_id] = {"record": record, "experiment_id": resumed["experiment_id"],
                                     "experiment": resumed.get("experiment"),
                                     "parent_run_id": resumed["parent_run_id"], "params_logged": True,
                                     "child_run_ids": dict(resumed.get("child_run_ids") or {}),
                                     "complete_children": set(), "resumed_children": set()}
            return
        name = tracking.experiment_name(record, self.experiment)
        experiment_id = self._store(tracking.ensure_experiment, client, self.uri, name)
        parent = self._store(client.create_run, experiment_id, start_time=stamp, run_name=tracking.run_name(record),
                             tags=tracking.parent_tags({**record, "status": "running"}))
        params = [Param(k, v) for k, v in tracking.params_of(record["config"]).items()]
        for start in range(0, len(params), 100):
            self._store(client.log_batch, parent.info.run_id, params=params[start:start + 100])
        self._runs[record_id] = {"record": record, "experiment_id": experiment_id, "experiment": name,
                                 "parent_run_id": parent.info.run_id, "params_logged": True, "child_run_ids": {},
                                 "complete_children": set(), "resumed_children": set()}

    def _start_arm(self, client, record_id, arm, stamp, first_step) -> None:
        from mlflow.entities import Param

        runs = self._runs.get(record_id)
        if runs is None:
            return
        key = tracking.child_name(arm)
        if key in runs["child_run_ids"]:          # an arm resumed after an interruption: the same child run
            self._store(client.update_run, runs["child_run_ids"][key], status="RUNNING")
            runs["resumed_children"].add(key)
            return
        child = self._store(client.create_run, runs["experiment_id"], start_time=stamp, run_name=key,
                            tags=tracking.child_tags(runs["record"], {**arm, "status": "running"},
                                                     runs["parent_run_id"]))
        self._store(client.log_batch, child.info.run_id,
                    params=[Param("arm", str(arm["arm"])), Param("variant", str(arm.get("variant"))),
                            Param("seed", str(arm["seed"]))])
        runs["child_run_ids"][key] = child.info.run_id
        if not first_step:
            runs["complete_children"].add(key)   # every step of it goes through this tracker


def _now_ms() -> int:
    return int(time.time() * 1000)
