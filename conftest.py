"""Shared pytest plumbing: markers, command-line options, fixtures, hypothesis profiles.

Options:  --scale smoke|ci|full   (default $STABILITY_SCALE or smoke)
          --device cpu|cuda       (default: the preset's device; under pytest-xdist worker gwN sees only
                                   entry N of the caller's CUDA_VISIBLE_DEVICES, as cuda:0)
          --seeds 0,1,2           (override the preset's seeds)
          --tracking-uri URI      (default $MLFLOW_TRACKING_URI or sqlite:///reports/mlflow-tests.db)
          --ray auto|local:N|ADDR (default $STABILITY_RAY or none: the stress cases' runs as Ray tasks)

Records: one run directory per test session, reports/runs/<UTC time>-pytest-<id>/ (created with its
first record; $STABILITY_RUN_DIR names another). pytest-xdist workers write into their controller's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# One GPU per pytest-xdist worker, from the caller's own CUDA_VISIBLE_DEVICES: set before torch is
# imported (stability.cases.gpus imports nothing heavy). An impossible assignment is reported at configure.
from stability.cases.gpus import GpuAssignmentError, pin_this_worker

try:
    _GPU_PINNING_ERROR = None
    pin_this_worker()
except GpuAssignmentError as _error:
    _GPU_PINNING_ERROR = _error

# Triton kernels on a machine without CUDA run in the interpreter; this must be set
# before any kernel is defined, so it is set here, before tests import anything.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # torch missing: the test run fails on its own, with a clearer message
    pass

from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=25, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=50)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

MARKERS = {
    "stress": "paired stress runs through the public API (pytest suites/ -m stress)",
    "claim": "a paper claim asserted on held-out seeds (suites/test_claims.py)",
    "kernel": "Triton kernel correctness (interpreter on the CPU, real kernels on a GPU)",
    "agreement": "the quick kernel check the CPU workflow job runs: forward and every gradient against float64",
    "quant": "post-training quantization evaluation",
    "gpu": "needs a CUDA GPU; skipped cleanly without one",
    "slow": "long runs (ci/full scale, searches); deselect with -m 'not slow'",
    "bench": "benchmarks (pytest-benchmark); speed is reported, never asserted",
}


def pytest_addoption(parser):
    group = parser.getgroup("stability")
    group.addoption("--scale", default=os.environ.get("STABILITY_SCALE", "smoke"),
                    choices=("smoke", "ci", "full"), help="scale preset of the stress suites")
    group.addoption("--device", default=os.environ.get("STABILITY_DEVICE"),
                    help="cpu or cuda (default: the preset's device: cpu for smoke/ci, cuda for full)")
    group.addoption("--seeds", default=None, help="comma-separated seeds overriding the preset's")
    group.addoption("--tracking-uri", default=None, help="MLflow tracking URI for the suites")
    group.addoption("--ray", default=os.environ.get("STABILITY_RAY"), metavar="auto|local:N|HOST:PORT",
                    help="train the runs of the stress cases as Ray tasks (docs/scale-out.md); with -n, use a "
                         "running cluster (auto or HOST:PORT): local:N starts one Ray instance per worker")
    group.addoption("--replicates", type=int, default=0, metavar="R",
                    help="also train R rounding replicates of every stress case into the run directory (what a "
                         "regression baseline is made of: stability baseline make)")
    group.addoption("--replicate", type=int, default=0, metavar="N",
                    help="train every run as rounding replicate N (0: the reference runs; stability.model.rounding)")
    group.addoption("--run-slow", action="store_true", default=os.environ.get("STABILITY_RUN_SLOW") == "1",
                    help="also run tests marked slow (long CPU runs, regime searches)")


RUN_DIR_KEY = "stability_run_dir"


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if _GPU_PINNING_ERROR is not None and (config.getoption("--device") or "").startswith("cuda"):
        raise pytest.UsageError(str(_GPU_PINNING_ERROR))
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None and RUN_DIR_KEY in worker_input:
        config._stability_run_dir = worker_input[RUN_DIR_KEY]
    else:
        from stability.record.rundir import ENV_VAR, new_run_dir

        config._stability_run_dir = os.environ.get(ENV_VAR) or str(new_run_dir(label="pytest"))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: every worker writes into the controller's run directory."""
    node.workerinput[RUN_DIR_KEY] = node.config._stability_run_dir


def pytest_collection_modifyitems(config, items):
    has_cuda = False
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        pass
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none available)")
    skip_slow = pytest.mark.skip(reason="slow: run with --run-slow (or STABILITY_RUN_SLOW=1)")
    run_slow = config.getoption("--run-slow")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)


@pytest.fixture(scope="session")
def scale(pytestconfig) -> str:
    return pytestconfig.getoption("--scale")


@pytest.fixture(scope="session")
def device(pytestconfig) -> str | None:
    """The device of this test process; under xdist each worker sees only its own GPU (as cuda:0)."""
    wanted = pytestconfig.getoption("--device")
    if wanted is None:
        from stability.config import preset

        wanted = preset(pytestconfig.getoption("--scale")).run.device
    if wanted.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            pytest.skip("--device cuda asked for, but no CUDA GPU is available")
    return wanted


@pytest.fixture(scope="session")
def seeds(pytestconfig):
    text = pytestconfig.getoption("--seeds")
    return tuple(int(s) for s in text.split(",")) if text else None


@pytest.fixture(scope="session")
def tracking_uri(pytestconfig, tmp_path_factory) -> str:
    uri = pytestconfig.getoption("--tracking-uri") or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    os.makedirs("reports", exist_ok=True)
    return "sqlite:///reports/mlflow-tests.db"


@pytest.fixture(scope="session")
def run_dir(pytestconfig) -> Path:
    """This test session's run directory (created when the first record is written)."""
    return Path(pytestconfig._stability_run_dir)


@pytest.fixture(scope="session")
def replicate(pytestconfig) -> int:
    return pytestconfig.getoption("--replicate")


@pytest.fixture(scope="session")
def stress_config(scale, device, seeds, replicate):
    """Factory: the scale preset with overrides (``model__d_model=96`` or {"model.d_model": 96}),
    on this process's device and seeds."""
    from stability.config import resolve

    def make(overrides: dict | None = None, **keyword_overrides):
        values = {**(overrides or {}), **{k.replace("__", "."): v for k, v in keyword_overrides.items()}}
        if device is not None:
            values["run.device"] = device
        if seeds is not None:
            values["seeds"] = seeds
        if replicate:
            values.setdefault("run.replicate", replicate)
        return resolve(scale, values)

    return make


@pytest.fixture(scope="session")
def ray_runner(pytestconfig):
    """The Ray runner of ``--ray`` (None without it): the stress cases' runs become Ray tasks."""
    spec = pytestconfig.getoption("--ray")
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
    the scale preset once per session: JSON record first (this session's run directory), then one
    MLflow parent run (with plots unless STABILITY_PLOTS=0). Later calls with the same case and
    overrides return the same record (``.records`` holds all). With ``--replicates R`` the case's R
    rounding replicates are trained and recorded too (not tracked); the tests see the reference."""
    from stability.cases.pipeline import run_recorded

    cache: dict = {}
    plots = os.environ.get("STABILITY_PLOTS", "1") != "0"
    replicates = pytestconfig.getoption("--replicates")

    def get(kind: str, overrides: dict | None = None) -> dict:
        config = stress_config(overrides)
        if (kind, config) not in cache:
            cache[(kind, config)] = run_recorded(kind, config, run_dir, tracking_uri=tracking_uri, plots=plots,
                                                 runner=ray_runner)
            for draw in range(1, replicates + 1):
                run_recorded(kind, stress_config({**(overrides or {}), "run.replicate": draw}), run_dir,
                             track=False, plots=False, runner=ray_runner)
        return cache[(kind, config)]

    get.records = cache
    return get
