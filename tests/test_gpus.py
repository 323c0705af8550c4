"""One GPU per pytest-xdist worker (stability.plugin.gpus) and the kernel's launch under its tensors' device."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from stability.plugin.gpus import GpuAssignmentError, pin_this_worker, worker_devices


def test_workers_index_into_the_callers_visible_devices():
    assert [worker_devices(f"gw{i}", "2,3,5", workers=3) for i in range(3)] == ["2", "3", "5"]
    assert worker_devices("gw1", None, count=4, workers=4) == "1"


def test_a_gpu_the_caller_excluded_is_never_used():
    chosen = {worker_devices(f"gw{i}", "4,6", workers=2) for i in range(2)}
    assert chosen == {"4", "6"}


def test_more_workers_than_gpus_is_an_error_unless_sharing_is_asked():
    with pytest.raises(GpuAssignmentError, match="3 pytest-xdist workers but 2 GPU"):
        worker_devices("gw0", "0,1", workers=3)
    assert [worker_devices(f"gw{i}", "0,1", workers=3, share=True) for i in range(3)] == ["0", "1", "0"]


def test_no_gpu_leaves_the_variable_alone():
    environ = {"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2", "CUDA_VISIBLE_DEVICES": ""}
    assert pin_this_worker(environ) is None and environ["CUDA_VISIBLE_DEVICES"] == ""
    assert pin_this_worker({}) is None


def test_pinning_sets_the_worker_s_own_device_list():
    environ = {"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2", "CUDA_VISIBLE_DEVICES": "3,7"}
    assert pin_this_worker(environ) == "7" and environ["CUDA_VISIBLE_DEVICES"] == "7"


def test_the_kernel_guard_picks_the_tensor_s_gpu():
    from stability.kernels.gated_attention import device_guard

    guard = device_guard(SimpleNamespace(is_cuda=True, device=torch.device("cuda:1")))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    assert isinstance(device_guard(torch.zeros(1)), contextlib.nullcontext)


@pytest.mark.kernel
def test_forward_and_backward_launch_under_the_guard_of_q_s_device(monkeypatch):
    import importlib

    module = importlib.import_module("stability.kernels.gated_attention")   # the module, not the function

    entered = []
    real = module.device_guard

    def spy(tensor):
        entered.append(tensor.device)
        return real(tensor)
    monkeypatch.setattr(module, "device_guard", spy)
    q, k, v = (torch.randn(1, 2, 8, 16, requires_grad=True) for _ in range(3))
    gate = torch.randn(1, 2, 8, 16, requires_grad=True)
    module.gated_attention(q, k, v, gate).sum().backward()
    assert entered == [q.device, q.device] and q.grad is not None
