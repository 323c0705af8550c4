"""Saved training state: checkpoints of an arm (to resume it) and replay bundles of one flagged step.

    state = arm_state(...)                  what carries over from one step to the next (see below)
    Checkpoints(path, every).save(state)    every N steps and when the arm is stopped; one file, replaced
    state = load_state(path, run_key)       RecordError (exit 2) when missing, corrupt or of another run
    restore(state, model, optimizer, policy, train_state)

    bundle = step_bundle(...)               the state *before* a flagged step, its batch and what it measured
    Bundles(directory, first, worst)        keeps the first K and the worst K flagged steps of a case

A checkpoint holds the model and optimiser state dicts, the precision policy's state (loss scale,
fp8 amax histories), the torch RNG states, the data position (the last step trained: batch k
depends only on the seed and k, so the position is the step) and the trainer's own state
(``stability.train.state.TrainState``): the arm record so far (series, events, probes), the spike
detectors' histories, the initial loss and the counters. So a
resumed arm continues bit for bit on the CPU. Files are written to a temporary name and renamed:
a process killed while writing leaves the previous checkpoint. Loading uses ``weights_only``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import torch

from stability.record import RecordError

FORMAT = 1


def code_version() -> str:
    """A short hash of the stability package's source files: two runs with the same value ran the same code."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def rng_states(device: torch.device) -> dict:
    states = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def set_rng_states(states: dict, device: torch.device) -> None:
    torch.set_rng_state(states["torch"])
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)


def arm_state(step: int, model, optimizer, policy, train_state, identity: dict) -> dict:
    """The state after ``step`` (the last step trained): see the module docstring. ``train_state`` is the
    trainer's own (``TrainState``: record, detector histories, counters), kept as its ``state_dict()``
    under "loop"; ``identity`` says which run it belongs to."""
    return {"format": FORMAT, "kind": "checkpoint", **identity, "step": step, "model": model.state_dict(),
            "optimizer": optimizer.state_dict(), "precision": policy.state_dict(),
            "rng": rng_states(next(model.parameters()).device), "loop": train_state.state_dict()}


def restore(state: dict, model, optimizer, policy, train_state) -> None:
    """Load ``state`` into the model, optimiser and policy (and the RNGs), and its "loop" into ``train_state``."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    policy.load_state_dict(state["precision"])
    set_rng_states(state["rng"], next(model.parameters()).device)
    train_state.load_state_dict(state["loop"])


def save_state(path: Path, state: dict) -> Path:
    """torch.save to a temporary file, then rename (atomic on one file system)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_state(path: str | Path, kind: str = "checkpoint", map_location="cpu") -> dict:
    """Read a checkpoint or bundle; RecordError naming the file when it is missing or not one."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"{kind} {str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # noqa: BLE001  (pickle, zip and torch errors alike: the file is unusable)
        cause = load_error_cause(error)
        if "GLOBAL" in cause:   # a pickled callable or class: loading it would import and run code
            raise RecordError(f"{kind} {str(path)!r} is refused: it holds Python objects whose loading would "
                              f"import or run code ({cause}); only tensors and plain values are loaded") from None
        raise RecordError(f"{kind} {str(path)!r} is corrupt or not a {kind} ({cause})") from None
    plain = isinstance(state, dict) and isinstance(state.get("kind"), str) and type(state.get("format")) is int
    if not plain or state["kind"] != kind or state["format"] != FORMAT:
        found = state.get("kind") if isinstance(state, dict) else None
        found = found[:60] if isinstance(found, str) else type(found if isinstance(state, dict) else state).__name__
        raise RecordError(f"{kind} {str(path)!r} is not a stability {kind} of format {FORMAT} (kind {found!r})")
    return state


def untrusted_factory(source: str, factory: str) -> str:
    """Why a ``model.factory`` named inside a file (a bundle, an interrupted run's record) is not imported."""
    return (f"{source} names model.factory={factory!r}, and building the model would import that module (run "
            f"its code); a file is data and names no code to run: pass --trust-factory if you trust the module, "
            f"or name the same factory in the command's own configuration (--set model.factory={factory})")


def load_error_cause(error: BaseException) -> str:
    """The cause in a failed ``torch.load``'s message, in one line. Torch wraps it in paragraphs of advice
    ("Weights only load failed. ... Re-running `torch.load` with `weights_only` set to `False` ...", how to
    allowlist a global) and a link; those are left out."""
    advice = ("Weights only load failed", "Please file an issue", "Check the documentation", "(1)", "(2)")
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    cause = ""
    for index, line in enumerate(lines):
        if "WeightsUnpickler error:" in line:
            cause = line.split("WeightsUnpickler error:", 1)[1].strip() or " ".join(lines[index + 1:index + 2])
            break
    cause = cause or next((line for line in lines if "GLOBAL" in line), "") or \
        next((line for line in lines if not line.startswith(advice)), lines[0] if lines else "")
    cause = cause.split(". ", 1)[0].rstrip(".")   # its first sentence (then: how to allowlist a global, ...)
    return f"{type(error).__name__}: {cause[:300]}"


def check_writable(directory: str | Path, what: str = "checkpoint directory") -> Path:
    """Create ``directory`` and prove a file can be written there; RecordError (exit 2) otherwise."""
    directory = Path(directory)
    probe = directory / f".write-test-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise RecordError(f"{what} {str(directory)!r} is not writable ({error.strerror or error}): expected a "
                          f"directory this user can write (--checkpoint-dir)") from None
    return directory


class Checkpoints:
    """When and where one arm's checkpoints go: ``due(step)`` every ``every`` steps (0: never, only at a
    stop), ``save(state)`` replaces the arm's one checkpoint file. ``resume_state``: the checkpoint this
    arm continues from, or None. ``on_saved(step)`` runs after each save (the per-step file syncs there).
    A failing write is reported once and training goes on (the run only loses its resume point).
    ``NO_CHECKPOINTS``: an arm that keeps none (``enabled`` False)."""

    enabled = True

    def __init__(self, path: str | Path, every: int, resume_state: dict | None = None, on_saved=None):
        self.path = Path(path)
        self.every = every
        self.resume_state = resume_state
        self.on_saved = on_saved
        self.failed: str | None = None

    def due(self, step: int) -> bool:
        return self.every > 0 and (step + 1) % self.every == 0

    def save(self, state: dict) -> None:
        try:
            save_state(self.path, state)
        except OSError as error:
            if self.failed is None:
                print(f"checkpoint: cannot write {self.path} ({error.strerror or error}); training goes on "
                      f"without a resume point", file=sys.stderr, flush=True)
            self.failed = str(error)
            return
        if self.on_saved is not None:
            self.on_saved(state["step"])

    def remove(self) -> None:
        """Delete the checkpoint (its arm finished: the record holds the result), and its folder once empty."""
        self.path.unlink(missing_ok=True)
        for folder in (self.path.parent, self.path.parent.parent):
            try:
                folder.rmdir()
            except OSError:
                break


class NoCheckpoints(Checkpoints):
    """An arm that keeps no checkpoint and resumes from none."""

    enabled = False

    def __init__(self):
        super().__init__(Path(), 0)

    def save(self, state: dict) -> None:
        raise RuntimeError("an arm without checkpoints was asked to save one")

    def remove(self) -> None:
        pass


NO_CHECKPOINTS = NoCheckpoints()


# ----------------------------------------------------------------------------- replay bundles

def step_bundle(step: int, model, optimizer, policy_state: dict, x, y, identity: dict, measured: dict,
                with_optimizer: bool) -> dict:
    """What re-running ``step`` needs: the weights (and optionally the optimiser state) before its update,
    the precision state at its start, its batch, the thread count, and what training measured."""
    def cpu(tree):
        return {k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v for k, v in tree.items()}

    return {"format": FORMAT, "kind": "bundle", **identity, "step": step, "code": code_version(),
            "model": cpu(model.state_dict()), "optimizer": optimizer.state_dict() if with_optimizer else None,
            "precision": policy_state, "x": x.detach().cpu(), "y": y.detach().cpu(),
            "threads": torch.get_num_threads(), "measured": measured}


class Bundles:
    """The replay bundles of one case, within a budget: the first ``first`` flagged steps are kept, and of
    the rest the ``worst`` most severe (non-finite counts as infinitely severe); a bundle pushed out by a
    worse one is deleted. ``index`` lists the bundles on disk: step, run, reasons, severity, path.
    ``NO_BUNDLES``: an arm that keeps none (``enabled`` False: the step does not even copy the precision state)."""

    enabled = True

    def __init__(self, directory: str | Path, first: int, worst: int):
        self.directory = Path(directory)
        self.first, self.worst = first, worst
        self.kept_first: list[dict] = []
        self.kept_worst: list[dict] = []

    def wants(self, severity: float) -> bool:
        if len(self.kept_first) < self.first:
            return True
        if len(self.kept_worst) < self.worst:
            return True
        return self.worst > 0 and severity > min(b["severity"] for b in self.kept_worst)

    def save(self, bundle: dict) -> Path | None:
        """Write ``bundle`` if the budget takes it; returns its path (None when it did not fit)."""
        severity = bundle["measured"]["severity"]
        for entry in self.kept_first + self.kept_worst:   # the same step trained again after a resume
            if entry["run_key"] == bundle["run_key"] and entry["step"] == bundle["step"]:
                return Path(entry["path"])
        if not self.wants(severity):
            return None
        path = self.directory / f"{bundle['run_key']}-step{bundle['step']}.pt"
        save_state(path, bundle)
        entry = {"run_key": bundle["run_key"], "step": bundle["step"], "reasons": bundle["measured"]["reasons"],
                 "severity": severity, "path": str(path), "kept_as": "first"}
        if len(self.kept_first) < self.first:
            self.kept_first.append(entry)
        elif len(self.kept_worst) < self.worst:
            self.kept_worst.append({**entry, "kept_as": "worst"})
        else:
            weakest = min(self.kept_worst, key=lambda b: b["severity"])
            self.kept_worst.remove(weakest)
            Path(weakest["path"]).unlink(missing_ok=True)
            self.kept_worst.append({**entry, "kept_as": "worst"})
        return path

    def adopt(self, index: list[dict]) -> None:
        """Continue the budget of a resumed case from its record's bundle index (files still on disk)."""
        entries = [{**e, "severity": float("inf") if e.get("severity") is None else e["severity"]}
                   for e in index if Path(e["path"]).is_file()]   # JSON keeps a non-finite severity as null
        self.kept_first = [e for e in entries if e.get("kept_as") == "first"][:self.first]
        self.kept_worst = [e for e in entries if e.get("kept_as") == "worst"][:self.worst]

    def index(self) -> list[dict]:
        return sorted(self.kept_first + self.kept_worst, key=lambda b: (b["run_key"], b["step"]))


class NoBundles(Bundles):
    """An arm that keeps no replay bundle."""

    enabled = False

    def __init__(self):
        super().__init__(Path(), 0, 0)

    def save(self, bundle: dict) -> Path | None:
        raise RuntimeError("an arm without replay bundles was asked to keep one")


NO_BUNDLES = NoBundles()
