"""A throwaway PostgreSQL cluster and an ``mlflow server`` on it, both on the loopback interface.

    with postgres_cluster(folder) as url:            # postgresql://stability@127.0.0.1:PORT/mlflow
        with mlflow_server(url, folder / "artifacts") as tracking_uri:    # http://127.0.0.1:PORT
            ...

The cluster lives in a fresh folder (``initdb``, then ``pg_ctl start``; fsync off: it is thrown away)
and is stopped and deleted afterwards. PostgreSQL refuses to run as root, so under root it runs as the
user ``nobody`` (through ``setpriv``). ``Unavailable`` says why a server could not be started: the
binaries are missing (Debian: ``apt-get install postgresql``), no unprivileged user, a start failed.
``stop_server`` ends a server process started in its own session (also ``mlflow ui`` in the tests).
Used by the tests and by ``benchmarks/bench_stores.py``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def stop_server(process: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM to the server's process group (it was started in its own session, so its workers go too);
    SIGKILL when it has not ended within ``timeout`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class Unavailable(RuntimeError):
    """A server could not be started here (the reason is the message)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def binaries() -> Path:
    """The folder holding initdb and pg_ctl: on the PATH, or Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(folder) / "initdb").is_file() and (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    raise Unavailable("PostgreSQL is not installed (no initdb / pg_ctl on the PATH or in /usr/lib/postgresql/*/bin; "
                      "Debian: apt-get install postgresql)")


def as_postgres_user() -> tuple[list[str], int | None]:
    """(command prefix, uid): nothing as an ordinary user; ``setpriv`` to ``nobody`` as root."""
    if os.geteuid() != 0:
        return [], None
    setpriv = shutil.which("setpriv")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        nobody = None
    if setpriv is None or nobody is None:
        raise Unavailable("PostgreSQL refuses to run as root, and there is no setpriv or no user 'nobody' to run it as")
    return [setpriv, f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"], nobody.pw_uid


def _run(command: list[str], what: str, timeout: float = 120) -> None:
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise Unavailable(f"{what} failed (exit {out.returncode}): {(out.stderr or out.stdout).strip()[-800:]}")


@contextlib.contextmanager
def postgres_cluster(database: str = "mlflow"):
    """Yield the URL of a new PostgreSQL cluster's ``database``; stop and delete the cluster afterwards."""
    folder = binaries()
    prefix, uid = as_postgres_user()
    root = Path(tempfile.mkdtemp(prefix="stability-pg-"))   # not under pytest's tmp: root-only folders above it
    data, port = root / "data", free_port()
    try:
        if uid is not None:
            os.chown(root, uid, -1)
        _run([*prefix, str(folder / "initdb"), "-D", str(data), "-U", "stability", "--auth=trust", "-E", "UTF8",
              "--no-sync"], "initdb")
        _run([*prefix, str(folder / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60",
              "-o", f"-h 127.0.0.1 -p {port} -k {root} -F", "start"], "pg_ctl start")
        url = f"postgresql://stability@127.0.0.1:{port}"
        _create_database(url, database)
        yield f"{url}/{database}"
    finally:
        if (data / "postmaster.pid").is_file():
            subprocess.run([*prefix, str(folder / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                           capture_output=True, timeout=60, check=False)
        shutil.rmtree(root, ignore_errors=True)


def _create_database(url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(f"{url}/postgres", autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')


@contextlib.contextmanager
def mlflow_server(backend_uri: str, artifact_root: Path, timeout: float = 180):
    """Yield the http URI of an ``mlflow server`` on ``backend_uri`` (127.0.0.1, a free port, one worker)."""
    port = free_port()
    artifact_root.mkdir(parents=True, exist_ok=True)
    log = open(artifact_root.parent / f"mlflow-server-{port}.log", "w")  # noqa: SIM115 (closed below)
    mlflow = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen([str(mlflow), "server", "--backend-store-uri", backend_uri, "--default-artifact-root",
                               str(artifact_root), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                log.flush()
                text = Path(log.name).read_text()[-1500:]
                raise Unavailable(f"mlflow server on {backend_uri} did not start "
                                  f"({'exit ' + str(server.returncode) if server.poll() is not None else 'timeout'}): "
                                  f"{text}")
            time.sleep(0.5)
        yield uri
    finally:
        stop_server(server, timeout=30)   # the server and the workers it started (its own session)
        log.close()
