"""A simulated GPU runner, loaded by every Python process that has this folder on ``PYTHONPATH`` (as
``sitecustomize``) and ``STABILITY_SIMULATED_GPUS`` set to a folder: torch, once imported, says CUDA is
available with one device per entry of ``CUDA_VISIBLE_DEVICES``, each an H100 to the device queries (name,
capability, properties), and the first CUDA computation (CUDA's lazy initialisation: the first tensor on a
GPU, a synchronize, a memory query) writes
``<folder>/<pid>-<unique>.json`` (the process's command line, its visible devices and what touched CUDA) and raises.

So a GPU job's commands run on a CPU up to the point where a real GPU would start computing: their options,
pytest-xdist's workers and the pinning of one GPU per worker, the settings and every check made before
training are exercised as on the runner. ``validation.gpu_job`` runs a workflow's GPU jobs this way.
torch is not imported here: it is patched when the process imports it, so that a process that sets
``CUDA_VISIBLE_DEVICES`` before importing torch (a pinned xdist worker) is simulated with its own list.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import traceback
import uuid
from types import SimpleNamespace

MARKERS = os.environ.get("STABILITY_SIMULATED_GPUS")


class SimulatedGpuReached(RuntimeError):
    """Raised by the first CUDA computation of a process on a simulated GPU."""


def visible() -> list[str]:
    """This process's GPUs: the entries of its CUDA_VISIBLE_DEVICES (none when it is unset)."""
    return [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]


_written: list[str] = []   # this process's marker, once written


def reached(what: str) -> None:
    """Write this process's marker (once: a new file, never one an earlier process of the same pid left) and
    stop the computation."""
    if not _written:
        path = os.path.join(MARKERS, f"{os.getpid()}-{uuid.uuid4().hex}.json")
        stack = [f"{frame.filename}:{frame.lineno} {frame.name}" for frame in traceback.extract_stack()[-12:-1]]
        with open(path + ".tmp", "w") as out:
            json.dump({"pid": os.getpid(), "argv": sys.argv, "visible": visible(), "what": what, "stack": stack},
                      out)
        os.replace(path + ".tmp", path)
        _written.append(path)
    raise SimulatedGpuReached(f"simulated GPU: the first CUDA computation ({what}) is reached; nothing runs on a "
                              f"simulated GPU")


# what a device query answers: one H100 (SXM), the GPU the jobs are sized for
NAME, CAPABILITY, MEMORY, SMS = "NVIDIA H100 80GB HBM3 (simulated)", (9, 0), 80 * 2**30, 132


def properties(device=None):
    """torch.cuda.get_device_properties of the simulated GPU (the fields the harness reads)."""
    return SimpleNamespace(name=NAME, major=CAPABILITY[0], minor=CAPABILITY[1], total_memory=MEMORY,
                           multi_processor_count=SMS)


def patch(torch) -> None:
    """CUDA available with len(visible()) devices of the simulated kind, which device queries describe;
    CUDA's lazy initialisation (every computation's first step) is the first computation."""
    cuda = torch.cuda
    cuda.is_available = lambda: len(visible()) > 0
    cuda.device_count = lambda: len(visible())
    cuda.is_initialized = lambda: False
    cuda.get_device_properties = properties
    cuda.get_device_name = lambda device=None: NAME
    cuda.get_device_capability = lambda device=None: CAPABILITY
    cuda.is_bf16_supported = lambda including_emulation=True: True
    cuda.current_device = lambda: 0

    def lazy_init():
        reached("torch.cuda._lazy_init")

    cuda._lazy_init = lazy_init


class _PatchTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``torch`` is imported, the loader found by the other finders runs, then
    ``patch`` runs on the loaded module."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


if MARKERS:
    sys.meta_path.insert(0, _PatchTorch())
