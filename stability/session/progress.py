"""What a command shows while it trains: a progress bar per case and per run on a terminal, plain
lines in a log.

    progress = Progress(sys.stdout)
    progress.case_started("[standard]", steps=320, done=0)    # a case: the steps of all its runs
    progress.run_started("  [standard] gated-seed0", steps=160, first=0)
    progress.step(step, row)                                   # after every step (row: loss, lr, ...)
    progress.run_ended(160)                                    # the run stopped after 160 steps in all
    progress.say("a line")                                     # printed between the bars
    progress.close()

On a terminal (``stream.isatty()``) two tqdm bars: the case's (the steps of all its runs) and the
run's, each with its rate (steps/s) and ETA, the run's with its latest loss. Elsewhere (a CI log, a
pipe) a plain line every tenth of a run and at least every ``LINE_SECONDS``, with the same figures:

      [standard] gated-seed0: step 65/160  loss 4.8123  lr 3.00e-03  grad-norm 1.2  update-norm 0.0123
      21.4 steps/s  ETA 0:04 (case 0:12)

(one line in the log). Rates count the steps trained in this process (a resumed run's earlier steps
are done, not timed). No torch import.
"""

from __future__ import annotations

import os
import time

LINES_PER_RUN = 10    # plain lines per run
LINE_SECONDS = 30.0   # and at least one this often


def clock(seconds: float | None) -> str:
    """Seconds as H:MM:SS (M:SS under an hour); "?" when unknown."""
    if seconds is None:
        return "?"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """Bars on a terminal, plain lines elsewhere (see the module docstring). ``bars``: force one or the other
    (default: whether ``stream`` is a terminal). ``lines_per_run``: plain lines per run (1: one, when the run
    ends). ``notes``: also print the notes of ``note`` (a run started, ended). ``prefix``: put before every
    line and bar label."""

    def __init__(self, stream, bars: bool | None = None, lines_per_run: int = LINES_PER_RUN, notes: bool = True,
                 prefix: str = ""):
        self.stream = stream
        isatty = getattr(stream, "isatty", None)
        self.bars = bool(isatty and isatty()) if bars is None else bars
        self.lines_per_run, self.notes, self.prefix = max(1, lines_per_run), notes, prefix
        self.last: tuple[int, dict] | None = None     # the run's latest step and row
        self.shown = -1                               # the step of the run's latest plain line
        self.case_bar = self.run_bar = None
        self.shape = {"dynamic_ncols": True} if _width(stream) else {"ncols": 100, "nrows": 24}   # a pty of no size
        self.case_total = self.case_done = 0          # steps of the case: in all, and done
        self.case_timed = 0                           # steps of the case trained here (for its rate)
        self.case_clock: float | None = None          # when the case's first step here began
        self.label, self.steps, self.first = "", 0, 0
        self.run_clock = self.last_line = 0.0

    # ---------------------------------------------------------------- the case

    def case_started(self, label: str, steps: int, done: int = 0) -> None:
        """A case starts: ``steps`` of all its runs, ``done`` of them already trained (a resumed case)."""
        self._close_bars()
        self.case_total, self.case_done, self.case_timed, self.case_clock = steps, done, 0, None
        if self.bars:
            from tqdm import tqdm

            self.case_bar = tqdm(total=steps, initial=done, desc=self.prefix + label, unit="step", file=self.stream,
                                 position=0, **self.shape)

    def skip(self, steps: int) -> None:
        """A run of the case that is done already (taken from disk, or trained elsewhere): its steps count."""
        self.case_done += steps
        if self.case_bar is not None:
            self.case_bar.update(steps)

    # ---------------------------------------------------------------- one run

    def run_started(self, label: str, steps: int, first: int = 0) -> None:
        """A run starts (or continues after step ``first`` - 1): ``steps`` in all."""
        self.label, self.steps, self.first = label, steps, first
        self.last, self.shown = None, -1
        self.case_done += first
        if self.case_bar is not None:
            self.case_bar.update(first)
        self.run_clock = self.last_line = time.monotonic()
        if self.case_clock is None:
            self.case_clock = self.run_clock
        if self.bars:
            from tqdm import tqdm

            self._close(self.run_bar)
            self.run_bar = tqdm(total=steps, initial=first, desc=self.prefix + label.strip(), unit="step",
                                file=self.stream, position=1, leave=False, **self.shape)

    def step(self, step: int, row: dict) -> None:
        """After step ``step`` (0-based) of the run; ``row``: its loss, lr, grad_norm, update_norm."""
        self.case_done += 1
        self.case_timed += 1
        if self.bars:
            self.run_bar.set_postfix_str(f"loss {row['loss']:.4f}", refresh=False)
            self.run_bar.update(1)
            if self.case_bar is not None:
                self.case_bar.update(1)
            return
        now = time.monotonic()
        self.last = (step, row)
        every = max(1, self.steps // self.lines_per_run)
        regular = self.lines_per_run > 1 and step % every == 0
        if regular or step == self.steps - 1 or now - self.last_line >= LINE_SECONDS:
            self.last_line, self.shown = now, step
            self.say(self.line(step, row, now))

    def line(self, step: int, row: dict, now: float) -> str:
        """The plain progress line after step ``step``."""
        trained = step + 1 - self.first
        rate = trained / (now - self.run_clock) if now > self.run_clock else None
        eta = (self.steps - step - 1) / rate if rate else None
        started = self.case_clock if self.case_clock is not None else now
        case_rate = self.case_timed / (now - started) if now > started else None
        case_eta = max(0, self.case_total - self.case_done) / case_rate if case_rate and self.case_total else None
        return (f"{self.prefix}{self.label.strip() if self.prefix else self.label}: step {step + 1}/{self.steps}  "
                f"loss {_number(row['loss'], '.4f')}  lr {row['lr']:.2e}  "
                f"grad-norm {_number(row['grad_norm'], '.3g')}  update-norm {_number(row['update_norm'], '.3g')}  "
                f"{f'{rate:.1f}' if rate else '?'} steps/s  ETA {clock(eta)}"
                + (f" (case {clock(case_eta)})" if self.case_total else ""))

    def run_ended(self, steps: int) -> None:
        """The run stopped after ``steps`` steps in all (fewer than planned when it diverged or was stopped):
        the steps it will never train leave the case's count; in a log, a run that stopped early gets its line."""
        if not self.bars and self.last is not None and self.shown != self.last[0]:
            self.shown = self.last[0]
            self.say(self.line(*self.last, time.monotonic()) + "  (stopped)")
        self.case_total -= max(0, self.steps - steps)
        if self.case_bar is not None:
            self.case_bar.total = self.case_total
            self.case_bar.refresh()
        self._close(self.run_bar)
        self.run_bar = None

    # ---------------------------------------------------------------- text

    def say(self, line: str) -> None:
        """A line of text (between the bars on a terminal)."""
        if self.bars and (self.case_bar is not None or self.run_bar is not None):
            from tqdm import tqdm

            tqdm.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def note(self, line: str) -> None:
        """A note on a run (it started, it ended): printed unless ``notes`` is off."""
        if self.notes:
            self.say(line)

    def close(self) -> None:
        self._close_bars()

    def _close_bars(self) -> None:
        self._close(self.run_bar)
        self._close(self.case_bar)
        self.run_bar = self.case_bar = None

    @staticmethod
    def _close(bar) -> None:
        if bar is not None:
            bar.close()


class Quiet(Progress):
    """The display of a session that shows no progress: no bars, no progress lines, no notes; only what must be
    said (where to watch the live runs) is printed, as a plain line."""

    def __init__(self, stream):
        super().__init__(stream, bars=False, notes=False)

    def case_started(self, label: str, steps: int, done: int = 0) -> None:
        pass

    def skip(self, steps: int) -> None:
        pass

    def run_started(self, label: str, steps: int, first: int = 0) -> None:
        pass

    def step(self, step: int, row: dict) -> None:
        pass

    def run_ended(self, steps: int) -> None:
        pass


def _number(value, spec: str) -> str:
    """A figure of a step's row ("nan" when a non-finite value was recorded as None)."""
    return "nan" if value is None else format(value, spec)


def _width(stream) -> int:
    """The columns of the terminal ``stream`` writes to (0 when unknown)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0
