"""An empty, migrated MLflow SQLite store to copy from (creating and migrating one takes seconds). The stop
of an ``mlflow server``/``mlflow ui`` process: ``validation.servers.stop_server``."""

from __future__ import annotations

import os
from pathlib import Path


def migrated_template(pytest_config, tmp_path_factory) -> Path:
    """The template store, kept in pytest's cache per MLflow version (under tmp when the cache is off)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    cache = getattr(pytest_config, "cache", None)
    folder = cache.mkdir("stability-mlflow-template") if cache is not None else tmp_path_factory.mktemp("template")
    path = Path(folder) / f"mlflow-{mlflow.__version__}.db"
    if not path.is_file():
        fresh = path.with_suffix(f".{os.getpid()}.tmp")
        MlflowClient(tracking_uri=f"sqlite:///{fresh}").search_experiments()   # creates and migrates the schema
        os.replace(fresh, path)
    return path
