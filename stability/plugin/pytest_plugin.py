"""The pytest plugin of stability: what the stress suites need, in any repository.

Registered through the ``pytest11`` entry point, so pytest loads it wherever the package is installed
(``-p no:stability`` leaves it out). It reads the repository's settings (``--stability-config PATH``, else
``[tool.stability]`` in the rootdir's pyproject.toml, else its stability.toml: ``stability.plugin.settings``)
and gives the suites (``pytest --pyargs stability.suites -m stress``; ``pytest suites/`` in this
repository):

* options --preset smoke|ci|gpu-pr|full, --device cpu|cuda, --seeds 0,1,2, --tracking-uri URI, --ray
  auto|local:N|HOST:PORT, --replicates R, --replicate N, --run-slow; each is also --stability-NAME, the
  name nothing else takes (the short name is added only where no other plugin or conftest has it);
* the markers of ``MARKERS``; ``gpu`` tests are skipped without CUDA, ``slow`` ones unless --run-slow;
* one run directory per test session, reports/runs/<UTC time>-pytest-<id>/ ($STABILITY_RUN_DIR names
  another), which the pytest-xdist workers share; one GPU per xdist worker, pinned before torch is
  imported (``stability.plugin.gpus``);
* the fixtures preset (``scale``, its old name), device, seeds, tracking_uri, run_dir, replicate, stability_settings, stress_config,
  ray_runner, stress_record and model_invariant;
* the table's ``cases`` (the built-in cases and those the loaded extensions registered, each trained by
  ``test_stress_cases.py``): the tests of the other stress cases are deselected; when the table
  names a model other than the harness's own, so are the stress tests of the harness's own model and
  detectors (tests of no case);
* model invariants: ``model_invariant(record, name, arm, seed, held, value, bound, message)`` records a
  property of the model under test, never failing the test, as one line of
  ``<run dir>/invariants-<xdist worker>.jsonl`` (worker "main" without xdist) with the fields ``case`` (the
  case key as the records name it, ``<config name>/<case label>``: ``stability.record.case_key``), ``name``,
  ``arm``, ``seed`` (None: over the seeds), ``held`` (true / false), ``value`` and ``bound`` (numbers or null), ``message`` and
  ``test`` (the node id); ``stability.record.invariants`` reads them. The terminal summary lists those
  that did not hold;
* progress: each stress run ends with one line on stderr, past pytest's capture and from every xdist
  worker (its step, loss, rate and the ETA of its case; on a terminal without xdist, bars); each run's
  per-step file is gzipped when it ends (a rounding replicate's dropped); no replay bundles unless the
  table's ``set`` asks for them.

Each value comes from the command line, else the environment ($STABILITY_PRESET, $STABILITY_DEVICE,
$MLFLOW_TRACKING_URI, $STABILITY_RAY, $STABILITY_RUN_SLOW), else the table, else the preset. A bad table
is a usage error naming the key, before anything trains; so is a factory the suites cannot use: when
pytest runs the suites, the controlling process calls it once per arm on a tiny batch
(``stability.model.contract``: its type, its logits, its observer calls, its gate settings). In a
repository without settings, outside the suites, the plugin stays out of the way: it pins no GPU, skips
nothing and imports no torch.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from stability.config import ConfigError, extensions
from stability.plugin.settings import Settings, SettingsError, check, find_settings

MARKERS = {
    "stress": "paired stress runs through the public API (pytest --pyargs stability.suites -m stress)",
    "claim": "a paper claim asserted on held-out seeds (stability.suites.test_claims)",
    "kernel": "Triton kernel correctness (interpreter on the CPU, real kernels on a GPU)",
    "agreement": "the quick kernel check the CPU workflow job runs: forward and every gradient against float64",
    "quant": "post-training quantization evaluation",
    "gpu": "needs a CUDA GPU; skipped cleanly without one",
    "slow": "long runs (ci/full scale, searches); skipped unless --run-slow",
    "bench": "benchmarks (pytest-benchmark); speed is reported, never asserted",
    "case": "case(NAME): the stress case a test trains (the settings' cases select tests by it)",
}

# --stability-NAME (and --NAME where free): the keyword arguments of addoption
OPTIONS = {
    "preset": {"default": None, "choices": ("smoke", "ci", "gpu-pr", "full"),
               "help": "preset of the stress suites (default $STABILITY_PRESET, the table's preset, smoke)"},
    "device": {"default": None, "metavar": "cpu|cuda",
               "help": "cpu or cuda (default $STABILITY_DEVICE, the table's device, the preset's: cpu for smoke "
                       "and ci, cuda for gpu-pr and full); under pytest-xdist worker gwN sees only entry N of "
                       "CUDA_VISIBLE_DEVICES, as cuda:0"},
    "seeds": {"default": None, "metavar": "0,1,2",
              "help": "comma-separated seeds overriding the table's and the preset's"},
    "tracking-uri": {"default": None, "metavar": "URI",
                     "help": "MLflow tracking URI of the suites (default $MLFLOW_TRACKING_URI, the table's "
                             "tracking_uri, sqlite:///reports/mlflow-tests.db)"},
    "ray": {"default": None, "metavar": "auto|local:N|HOST:PORT",
            "help": "train the runs of the stress cases as Ray tasks (default $STABILITY_RAY); with -n, use a "
                    "running cluster (auto or HOST:PORT): local:N starts one Ray instance per worker"},
    "replicates": {"type": int, "default": 0, "metavar": "R",
                   "help": "also train R rounding replicates of every stress case into the run directory (what a "
                           "regression baseline is made of: stability baseline make)"},
    "replicate": {"type": int, "default": 0, "metavar": "N",
                  "help": "train every run as rounding replicate N (0: the unperturbed runs; stability.model.rounding)"},
    "cases": {"default": None, "metavar": "NAMES",
              "help": "comma-separated stress cases to run: the suites of the others, and the stress tests of no "
                      "case, are deselected (stability baseline make --cases: a baseline remade case by case)"},
    "run-slow": {"action": "store_true", "default": False,
                 "help": "also run tests marked slow (or $STABILITY_RUN_SLOW=1)"},
}

SETTINGS = pytest.StashKey[Settings | None]()
_ERROR = pytest.StashKey[SettingsError]()          # a bad settings file, reported at pytest_configure
_PINNING_ERROR = pytest.StashKey[Exception]()      # more xdist workers than GPUs, reported with --device cuda
RUN_DIR_KEY = "stability_run_dir"
# The suites keep no replay bundles of flagged steps (each a copy of the model, most of a job's artifact)
# unless the table's ``set`` asks for them; rounding replicates (noise measurements) never do.
NO_BUNDLES = {"run.checkpoint.replay_first": 0, "run.checkpoint.replay_worst": 0}
DEFAULT_TRACKING_URI = "sqlite:///reports/mlflow-tests.db"


# The spelling an option had before its rename, still read (a workflow an earlier `stability init` wrote says
# --scale; its environment, $STABILITY_SCALE)
OLD_NAMES = {"preset": "scale"}


def _dest(name: str) -> str:
    return "stability_" + name.replace("-", "_")


def option(config: pytest.Config, name: str):
    """The value of option NAME, whichever of its two spellings was given."""
    return config.getoption(_dest(name))


def suites_dir() -> Path:
    """Where the installed suites are (stability.suites; the folder suites/ of this repository)."""
    return Path(importlib.util.find_spec("stability.suites").origin).parent


# ----------------------------------------------------------------------------- options and settings

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("stability", "stability stress suites (settings: [tool.stability] in pyproject.toml)")
    group.addoption("--stability-config", metavar="PATH", default=None,
                    help="settings file (default: [tool.stability] in the rootdir's pyproject.toml, or its "
                         "stability.toml)")
    for name, spec in OPTIONS.items():
        old = [f"--stability-{OLD_NAMES[name]}"] if name in OLD_NAMES else []
        group.addoption(f"--stability-{name}", *old, dest=_dest(name), **spec)


def _taken(parser: pytest.Parser) -> set[str]:
    options = parser._anonymous.options + [o for group in parser._groups for o in group.options]
    return {name for o in options for name in o.names()}


def _load_settings(config: pytest.Config) -> Settings | None:
    """The repository's settings, read once per process (a SettingsError is kept for pytest_configure)."""
    if SETTINGS not in config.stash:
        try:
            found = find_settings(config.rootpath, config.known_args_namespace.stability_config)
        except SettingsError as error:
            config.stash[_ERROR] = error
            found = None
        config.stash[SETTINGS] = found
    return config.stash[SETTINGS]


def _runs_the_suites(args: list[str]) -> bool:
    """Whether the command line names the installed suites (stability.suites or a path inside them)."""
    if any(str(a).startswith("stability.suites") for a in args):
        return True
    where = suites_dir()
    return any(Path(str(a).split("::")[0]).resolve().is_relative_to(where) for a in args
               if not str(a).startswith("-") and Path(str(a).split("::")[0]).exists())


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]):
    """Before the conftests (which may import torch): pin this xdist worker's GPU where the plugin is in
    use. After them: the short option names that no one else took."""
    if _load_settings(early_config) is not None or _runs_the_suites(args):
        from stability.plugin.gpus import GpuAssignmentError, pin_this_worker

        try:
            pin_this_worker()
        except GpuAssignmentError as error:
            early_config.stash[_PINNING_ERROR] = error
    result = yield
    taken, group = _taken(parser), parser.getgroup("stability")
    for name, spec in OPTIONS.items():
        free = [f"--{short}" for short in (name, OLD_NAMES.get(name)) if short and f"--{short}" not in taken]
        if free:
            group.addoption(*free, dest=_dest(name), **{**spec, "help": f"same as --stability-{name}"})
    return result


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    settings = _load_settings(config)
    if _ERROR in config.stash:
        raise pytest.UsageError(str(config.stash[_ERROR]))
    try:
        import stability.cases.stress  # noqa: F401  (the registered cases declare their own settings first)

        extensions.load()   # the installed extensions; the table's plugins load when its config is built
    except ConfigError as error:
        raise pytest.UsageError(str(error)) from None
    if settings is not None and not config.getoption("help"):
        try:
            built = check(settings, preset_option(config))
            if settings.factory and getattr(config, "workerinput", None) is None:
                _check_factory(settings)
                if _runs_the_suites(list(config.invocation_params.args)):
                    _check_contract(settings, built)
        except SettingsError as error:
            raise pytest.UsageError(str(error)) from None
    if _PINNING_ERROR in config.stash and (device_option(config) or "").startswith("cuda"):
        raise pytest.UsageError(str(config.stash[_PINNING_ERROR]))
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None and RUN_DIR_KEY in worker_input:
        config._stability_run_dir = worker_input[RUN_DIR_KEY]
    else:
        from stability.record.rundir import ENV_VAR, new_run_dir

        config._stability_run_dir = os.environ.get(ENV_VAR) or str(new_run_dir(label="pytest"))


def _check_factory(settings: Settings) -> None:
    """The factory's module can be found in this environment (found, not imported: no torch here)."""
    module = settings.factory.partition(":")[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise SettingsError(f"{settings.source}: model.factory = {settings.factory!r} is invalid: module {module!r} "
                            f"cannot be found: expected a module of a package installed in this environment "
                            f"(pip install -e . in your repository)")


def _check_contract(settings: Settings, built) -> None:
    """The factory called once per arm on a (2, 8) batch, as the suites need it (``stability.model.contract``:
    a module, logits, the observer calls, the gate settings honoured): a SettingsError naming the problem."""
    from stability.cases.experiment import check_arm_models
    from stability.config import ConfigError

    try:
        check_arm_models(built, suites=True)
    except ConfigError as error:
        raise SettingsError(f"{settings.source}: {error}") from None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist: every worker writes into the controller's run directory."""
    node.workerinput[RUN_DIR_KEY] = node.config._stability_run_dir


def device_option(config: pytest.Config) -> str | None:
    return option(config, "device") or os.environ.get("STABILITY_DEVICE") or None


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` on GPUs: one pytest-xdist worker per GPU this run may use (``CUDA_VISIBLE_DEVICES``, else the
    driver's list) when the device is cuda (--device, $STABILITY_DEVICE or the table's ``device``), since each
    worker trains on a GPU of its own (``stability.plugin.gpus``). Elsewhere, and where
    $PYTEST_XDIST_AUTO_NUM_WORKERS or $STABILITY_GPU_SHARING=1 is set, pytest-xdist's own count (the CPU cores)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or os.environ.get("STABILITY_GPU_SHARING") == "1":
        return None
    settings = _load_settings(config)
    wanted = device_option(config) or (settings.device if settings is not None else None) or ""
    if not wanted.startswith("cuda"):
        return None
    from stability.plugin.gpus import visible_gpus

    return len(visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))) or None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under ``--dist loadfile``, the stress suite's cases spread over the workers like files
    (``stability.plugin.scheduling``); any other distribution is pytest-xdist's own."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from stability.plugin.scheduling import CaseScheduling

    return CaseScheduling(config, log)


# ----------------------------------------------------------------------------- collection

def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip gpu tests without CUDA and slow ones without --run-slow (every test where the repository has
    settings, else the suites' own); deselect the suites of stress cases the table leaves out."""
    settings = config.stash.get(SETTINGS, None)
    where = suites_dir()
    ours = [item for item in items if settings is not None or item.path.is_relative_to(where)]
    run_slow = option(config, "run_slow") or os.environ.get("STABILITY_RUN_SLOW") == "1"
    has_cuda = any("gpu" in item.keywords for item in ours) and _has_cuda()
    for item in ours:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (none available)"))
        if "slow" in item.keywords and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: run with --run-slow (or STABILITY_RUN_SLOW=1)"))
    chosen = [name for name in (option(config, "cases") or "").split(",") if name.strip()] or None
    if settings is None and chosen is None:
        return
    known = known_cases(where)
    for where_named, names in (("--stability-cases", chosen),
                               (settings.source if settings else "", settings.cases if settings else None)):
        unknown = [name for name in names or () if name not in known]
        if unknown:
            raise pytest.UsageError(f"{where_named}: cases={list(names)!r} is invalid: unknown stress case(s) "
                                    f"{unknown}: expected names from {known}")
    kept, left = [], []
    for item in items:
        out = settings is not None and _left_out(item, settings, where) or _not_chosen(item, chosen, where)
        (left if out else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


def known_cases(where: Path) -> tuple[str, ...]:
    """The stress cases the settings and ``--stability-cases`` may name: the built-in cases and those the loaded
    extensions registered (``stability.cases.stress.CASES``, which imports no torch: a case's training
    imports it when the case runs); the suite ``test_stress_cases.py`` trains each."""
    from stability.cases.stress import CASES

    return tuple(CASES)


def case_of(item: pytest.Item) -> str | None:
    """The stress case a test trains (its ``case`` marker); None for a test of no case."""
    marker = item.get_closest_marker("case")
    return marker.args[0] if marker is not None else None


def _left_out(item: pytest.Item, settings: Settings, where: Path) -> bool:
    """A stress test of the suites that the settings leave out: another case's, or (with a model other than
    the harness's own) one of the harness's own model and detectors (a test of no case)."""
    if "stress" not in item.keywords or not item.path.is_relative_to(where):
        return False
    case = case_of(item)
    if case is None:
        return not settings.own_model
    return settings.cases is not None and case not in settings.cases


def _not_chosen(item: pytest.Item, chosen: list[str] | None, where: Path) -> bool:
    """A stress test of the suites outside the cases ``--stability-cases`` names (a test of no case too)."""
    if chosen is None or "stress" not in item.keywords or not item.path.is_relative_to(where):
        return False
    return case_of(item) not in chosen


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def stability_settings(pytestconfig) -> Settings | None:
    """The repository's settings (None: it has none; the suites then train the presets as they are)."""
    return pytestconfig.stash.get(SETTINGS, None)


def preset_option(config: pytest.Config) -> str | None:
    """The preset the command line or the environment names: --preset, $STABILITY_PRESET ($STABILITY_SCALE,
    its old name); None when neither does."""
    return option(config, "preset") or os.environ.get("STABILITY_PRESET") or os.environ.get("STABILITY_SCALE")


@pytest.fixture(scope="session", name="preset")
def preset_fixture(pytestconfig, stability_settings) -> str:
    """The preset the suites train at: --preset, $STABILITY_PRESET, the table's preset, smoke."""
    return preset_option(pytestconfig) or (stability_settings and stability_settings.preset) or "smoke"


@pytest.fixture(scope="session")
def scale(preset) -> str:
    """The old name of the ``preset`` fixture (suites written before its rename)."""
    return preset


@pytest.fixture(scope="session")
def device(pytestconfig, preset, stability_settings) -> str:
    """The device of this test process; under xdist each worker sees only its own GPU (as cuda:0)."""
    wanted = device_option(pytestconfig) or (stability_settings and stability_settings.device)
    if not wanted:
        from stability.config import preset as preset_config

        wanted = preset_config(preset).run.device
    if wanted.startswith("cuda") and not _has_cuda():
        pytest.skip(f"device {wanted!r} asked for, but no CUDA GPU is available")
    return wanted


@pytest.fixture(scope="session")
def seeds(pytestconfig, stability_settings) -> tuple[int, ...] | None:
    """--seeds, else the table's seeds, else None (the preset's)."""
    text = option(pytestconfig, "seeds")
    if text:
        return tuple(int(s) for s in text.split(","))
    return stability_settings.seeds if stability_settings is not None else None


@pytest.fixture(scope="session")
def tracking_uri(pytestconfig, stability_settings) -> str:
    uri = (option(pytestconfig, "tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
           or (stability_settings and stability_settings.tracking_uri))
    if uri:
        return uri
    os.makedirs("reports", exist_ok=True)
    return DEFAULT_TRACKING_URI


@pytest.fixture(scope="session")
def run_dir(pytestconfig) -> Path:
    """This test session's run directory (created when the first record is written)."""
    return Path(pytestconfig._stability_run_dir)


@pytest.fixture(scope="session")
def replicate(pytestconfig) -> int:
    return option(pytestconfig, "replicate")


@pytest.fixture(scope="session")
def stress_config(preset, device, seeds, replicate, stability_settings):
    """Factory: the preset with the table's overrides (arms, model, set), then the test's own
    (``model__d_model=96`` or {"model.d_model": 96}), on this process's device and seeds; no replay bundles
    unless the table or the test sets ``checkpoint.replay_first`` / ``replay_worst``."""
    from stability.config import resolve

    table = stability_settings.overrides() if stability_settings is not None else {}

    def make(overrides: dict | None = None, **keyword_overrides):
        values = {**NO_BUNDLES, **table, **(overrides or {}),
                  **{k.replace("__", "."): v for k, v in keyword_overrides.items()}}
        if device is not None:
            values["run.device"] = device
        if seeds is not None:
            values["seeds"] = seeds
        if replicate:
            values.setdefault("run.replicate", replicate)
        return resolve(preset, values)

    return make


@pytest.fixture(scope="session")
def ray_runner(pytestconfig):
    """The Ray runner of ``--ray`` (None without it): the stress cases' runs become Ray tasks."""
    spec = option(pytestconfig, "ray") or os.environ.get("STABILITY_RAY")
    if not spec:
        yield None
        return
    from stability.cases.ray_runner import RayRunner

    runner = RayRunner(spec)
    runner.connect()
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def stress_record(stress_config, tracking_uri, run_dir, ray_runner, pytestconfig):
    """Factory: ``stress_record("lr_sweep")`` runs that stress case (``stability.cases.stress.CASES``) on
    the preset once per session: JSON record first (this session's run directory), then one
    MLflow parent run (with plots unless STABILITY_PLOTS=0). Later calls with the same case and
    overrides return the same record (``.records`` holds all). With ``--replicates R`` the case's R
    rounding replicates are trained and recorded too (not tracked, no replay bundles, no per-step files once
    a run has ended: their figures are in their records); the tests see the reference. Each unperturbed run's
    per-step file is gzipped when it ends; the progress goes to stderr (``progress_display``)."""
    from stability.cases.pipeline import run_recorded
    from stability.session.session import Session

    cache: dict = {}
    plots = os.environ.get("STABILITY_PLOTS", "1") != "0"
    replicates = option(pytestconfig, "replicates")

    def run(case: str, config, replicate: int, **keep) -> dict:
        session = Session(run_dir, label="cases", display=progress_display(pytestconfig, replicate, replicates),
                          finished_steps="gzip" if replicate == 0 else "drop")
        try:
            return run_recorded(case, config, run_dir, runner=ray_runner, session=session, **keep)
        finally:
            session.close()

    def get(case: str, overrides: dict | None = None) -> dict:
        config = stress_config(overrides)
        if (case, config) not in cache:
            cache[(case, config)] = run(case, config, 0, tracking_uri=tracking_uri, plots=plots)
            for replicate in range(1, replicates + 1):
                run(case, stress_config({**(overrides or {}), "run.replicate": replicate, **NO_BUNDLES}), replicate,
                    track=False, plots=False)
        return cache[(case, config)]

    get.records = cache
    return get


# ----------------------------------------------------------------------------- progress

class _Uncaptured:
    """A text stream onto this process's real stderr, past pytest's output capture (the progress of the
    stress runs reaches the terminal or the CI log while a test trains; under pytest-xdist each worker's
    stderr is the controller's)."""

    def __init__(self, config: pytest.Config):
        self.capture = config.pluginmanager.getplugin("capturemanager")

    def write(self, text: str) -> int:
        if self.capture is None:
            return sys.stderr.write(text)
        with self.capture.global_and_fixture_disabled():
            count = sys.stderr.write(text)
            sys.stderr.flush()
        return count

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.__stderr__ is not None and sys.__stderr__.isatty()

    def fileno(self) -> int:
        return sys.__stderr__.fileno()


def progress_display(config: pytest.Config, replicate: int, replicates: int):
    """What the stress runs of a test show (``stability.session.progress``): on a terminal, without
    pytest-xdist, the case's and the run's bars; elsewhere (a CI log, xdist workers) one line per run when it
    ends (and one every half minute of a long run) with its step, loss, rate and the ETA of the case.
    ``replicate``: the rounding replicate (0: the unperturbed runs), named in each line when there are replicates."""
    from stability.session.progress import Progress

    stream = _Uncaptured(config)
    bars = stream.isatty() and not os.environ.get("PYTEST_XDIST_WORKER")
    prefix = "" if not replicates else ("reference " if replicate == 0 else f"replicate {replicate}/{replicates} ")
    return Progress(stream, bars=bars, lines_per_run=1, notes=False, prefix=prefix)


# ----------------------------------------------------------------------------- model invariants

@pytest.fixture
def model_invariant(request, run_dir):
    """Callable: ``model_invariant(record, name, arm, seed, held, value=None, bound=None, message="")`` records an
    invariant of the model (a property of the model under test, which may fail on a user's model: the loss falls,
    a low-precision rung stays within its loss gap of fp32, ...) and returns ``held``. It never fails the test:
    the line goes to ``<run dir>/invariants-<xdist worker>.jsonl`` (``stability.record.invariants``, which names
    its fields: case key ``<config name>/<case label>`` (``stability.record.case_key``) from ``record``, invariant
    name, arm, seed (None: over the seeds), held, value, bound, message) and the terminal summary lists those that did not hold;
    ``stability check`` judges them against the committed baseline. Properties of the harness (a record written,
    the schedule followed, both arms on the same batches) stay assertions."""
    from stability.record import case_key
    from stability.record.invariants import append_invariant, invariant_line, invariants_file

    path = invariants_file(run_dir, os.environ.get("PYTEST_XDIST_WORKER", "main"))

    def record_invariant(record, name: str, arm: str | None, seed: int | None, held: bool, value=None, bound=None,
                         message: str = "") -> bool:
        case = record if isinstance(record, str) else case_key(record)
        append_invariant(path, invariant_line(case, name, arm, seed, held, value, bound, message, request.node.nodeid))
        return bool(held)

    return record_invariant


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """The model invariants that did not hold in this session (read from the run directory, so those of every
    pytest-xdist worker), listed, not failed."""
    if getattr(config, "workerinput", None) is not None or not hasattr(config, "_stability_run_dir"):
        return
    from stability.record.invariants import describe, failed, read_invariants
    from stability.record.schema import RecordError

    try:
        lines = read_invariants(config._stability_run_dir)
    except RecordError as error:
        terminalreporter.write_line(f"model invariants unreadable: {error}")
        return
    broken = failed(lines)
    if not broken:
        return
    terminalreporter.section(f"model invariants that did not hold: {len(broken)} of {len(lines)} (recorded, not "
                             f"failed; stability check judges them against the baseline)", yellow=True)
    for line in broken:
        terminalreporter.write_line(describe(line))
