"""The ```bash blocks of docs/arms-and-controls.md run as written, in order, in a fresh copy of the repository.

Each block is preceded by ``<!-- test: default -->`` (cheap: run here) or ``<!-- test: slow -->`` (long:
run with --run-slow). A block fails the test when its script exits non-zero under ``bash -eo pipefail``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _workflow import fresh_copy

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "arms-and-controls.md"
BLOCK = re.compile(r"<!-- test: (default|slow) -->\s*\n```bash\n(.*?)```", re.DOTALL)


def blocks(kind: str) -> list[str]:
    return [body for marker, body in BLOCK.findall(DOC.read_text()) if marker == kind]


def test_every_bash_block_carries_a_marker():
    assert DOC.read_text().count("```bash") == len(BLOCK.findall(DOC.read_text())) > 0


def _run_in_copy(tmp_path: Path, scripts: list[str]) -> None:
    copy = fresh_copy(tmp_path / "repo")
    env = {k: v for k, v in os.environ.items() if k not in ("STABILITY_RUN_DIR", "MLFLOW_TRACKING_URI")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"   # `stability`, `python`
    env["OMP_NUM_THREADS"] = "1"   # one intra-op thread: on a shared 2-core machine more threads only spin
    for index, script in enumerate(scripts):
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], check=False,
                              cwd=copy, env=env, capture_output=True, text=True, timeout=3 * 3600)
        assert done.returncode == 0, f"block {index}:\n{script}\n--- stdout\n{done.stdout[-3000:]}\n" \
                                     f"--- stderr\n{done.stderr[-3000:]}"


def test_default_blocks_run(tmp_path):
    _run_in_copy(tmp_path, blocks("default"))


@pytest.mark.slow
def test_slow_blocks_run(tmp_path):
    _run_in_copy(tmp_path, blocks("default") + blocks("slow"))
