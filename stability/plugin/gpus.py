"""One GPU per pytest-xdist worker, chosen before torch is imported.

    devices = worker_devices("gw1", visible="2,3,5", count=None, share=False)   # -> "3"

The caller's ``CUDA_VISIBLE_DEVICES`` (when set) is the list of GPUs this run may use; worker
``gwN`` gets entry N of it, as its own ``CUDA_VISIBLE_DEVICES``, so inside the worker the GPU is
``cuda:0`` and a GPU the caller excluded is never touched. Without the variable, the GPUs are
``0 .. count-1`` (``gpu_count`` reads the driver's list, no torch import). More workers than GPUs is
an error unless ``share`` is set (then workers take GPUs round robin). Under ``-n auto`` with the device
cuda, the plugin starts one worker per GPU (``pytest_xdist_auto_num_workers``), so the count fits.
"""

from __future__ import annotations

import os
from pathlib import Path


class GpuAssignmentError(RuntimeError):
    """More workers than GPUs without sharing, or a malformed worker name."""


def gpu_count() -> int:
    """GPUs the NVIDIA driver lists (0 without a driver); torch is not imported."""
    listing = Path("/proc/driver/nvidia/gpus")
    return len(list(listing.iterdir())) if listing.is_dir() else 0


def worker_index(worker: str) -> int:
    if not (worker.startswith("gw") and worker[2:].isdigit()):
        raise GpuAssignmentError(f"PYTEST_XDIST_WORKER={worker!r} is not a worker name like 'gw0'")
    return int(worker[2:])


def visible_gpus(visible: str | None, count: int | None = None) -> list[str]:
    """The GPUs a run may use: the entries of ``visible`` (the caller's CUDA_VISIBLE_DEVICES), else ``0 ..
    count-1`` (``count`` None: the driver's list)."""
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    return [str(i) for i in range(gpu_count() if count is None else count)]


def worker_devices(worker: str, visible: str | None, count: int | None = None, share: bool = False,
                   workers: int | None = None) -> str | None:
    """The CUDA_VISIBLE_DEVICES of ``worker`` (None: no GPU to give; leave the variable alone)."""
    devices = visible_gpus(visible, count)
    if not devices:
        return None
    index = worker_index(worker)
    total = workers if workers is not None else index + 1
    if max(index + 1, total) > len(devices) and not share:
        raise GpuAssignmentError(
            f"{total} pytest-xdist workers but {len(devices)} GPU(s) ({','.join(devices)}): run with "
            f"-n {len(devices)} or fewer, or set STABILITY_GPU_SHARING=1 to let workers share GPUs")
    return devices[index % len(devices)]


def pin_this_worker(environ=os.environ) -> str | None:
    """Set this process's CUDA_VISIBLE_DEVICES from PYTEST_XDIST_WORKER (before torch is imported).
    Returns the device list set, or None outside a worker / without GPUs."""
    worker = environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return None
    workers = environ.get("PYTEST_XDIST_WORKER_COUNT")
    chosen = worker_devices(worker, environ.get("CUDA_VISIBLE_DEVICES"),
                            share=environ.get("STABILITY_GPU_SHARING") == "1",
                            workers=int(workers) if workers and workers.isdigit() else None)
    if chosen is not None:
        environ["CUDA_VISIBLE_DEVICES"] = chosen
    return chosen
