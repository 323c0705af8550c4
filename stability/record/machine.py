"""The machine a record was made on: what can change the rounding of its figures or the kernels it ran.

    machine = describe("cpu")     # {"cpu", "isa", "cpu_capability", "torch": {...}, "gpu"} (imports torch)
    machine_key(machine)          # "Intel(R) Xeon(R) Processor | AVX512 | torch 2.13.0 mkl" (no torch)
    machines_of(records)          # the keys of the machines a job's records name, and how many name none

The same code and seed give the same figures on one machine; on another CPU (other SIMD width, FMA or not),
another BLAS or another torch the last bits move, and what a false-alarm rate was measured on is that
machine. ``env_info`` (``stability.record.build``) keeps ``describe()`` in every record's ``env.machine``;
the null jobs and the regression zoo keep it with each job (``validation/regression_zoo.py``), and
``stability check`` states whether the job's machine is among those its rate was measured on. Metadata
only: describing the machine changes nothing the runs compute.

Only ``describe`` imports torch (inside the function): reading a machine, its key, is JSON only.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Iterable

# /proc/cpuinfo flags that change float rounding (FMA, a SIMD width's reduction order) or which kernels torch
# and its BLAS pick (bf16/fp16 dot products, AMX tiles); x86 ("flags") and Arm ("Features") names
ISA_FLAGS = frozenset({
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512dq", "avx512cd", "avx512bw",
    "avx512vl", "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_bf16", "amx_fp16", "amx_int8", "amx_tile",
    "asimd", "asimdhp", "asimddp", "fphp", "bf16", "i8mm", "sve", "sve2", "sme"})


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def _field(text: str, *names: str) -> str | None:
    """The value of the first line of /proc/cpuinfo named one of ``names`` (first processor), None if none."""
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in names:
            return value.strip()
    return None


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (/proc/cpuinfo "model name"; elsewhere ``platform.processor()``, else the
    architecture)."""
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    return _field(text, "model name") or platform.processor() or platform.machine() or "unknown"


def isa_flags(cpuinfo: str | None = None) -> list[str] | None:
    """The flags of ``ISA_FLAGS`` the CPU has, sorted; None where /proc/cpuinfo names no flags (not Linux)."""
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    flags = _field(text, "flags", "Features")
    if flags is None:
        return None
    return sorted(set(flags.split()) & ISA_FLAGS)


def torch_build(config: str) -> dict:
    """BLAS, LAPACK and oneDNN of a torch build, from ``torch.__config__.show()``'s text: "mkl", "open" ...
    (``BLAS_INFO`` / ``LAPACK_INFO``), the oneDNN version ("3.12.0"); None where the text names none."""
    def setting(name: str) -> str | None:
        found = re.search(rf"\b{name}=([^,\s]+)", config)
        return found.group(1) if found else None
    onednn = re.search(r"(?:oneDNN|MKL-DNN)\s+v?(\d+(?:\.\d+)*)", config)
    return {"blas": setting("BLAS_INFO"), "lapack": setting("LAPACK_INFO"),
            "onednn": onednn.group(1) if onednn else None}


def describe(device: str = "cpu") -> dict:
    """This machine: {"cpu": model name, "isa": ``isa_flags()``, "cpu_capability": the SIMD level torch's CPU
    kernels dispatch to ("AVX2", "AVX512" ...), "torch": {"version", "cuda", "blas", "lapack", "onednn",
    "mkldnn_available"}, "gpu": the name of ``device`` when it is a CUDA device, else None}. Imports torch."""
    import torch

    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        capability = None
    try:
        build = torch_build(torch.__config__.show())
    except (AttributeError, RuntimeError):
        build = torch_build("")
    gpu = None
    if device.startswith("cuda") and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(torch.device(device))
    text = _cpuinfo()
    return {"cpu": cpu_model(text), "isa": isa_flags(text), "cpu_capability": capability,
            "torch": {"version": str(torch.__version__), "cuda": torch.version.cuda, **build,
                      "mkldnn_available": bool(torch.backends.mkldnn.is_available())},
            "gpu": gpu}


def machine_key(machine: dict) -> str:
    """A short label of ``machine`` (``describe``'s dict, as a record keeps it) that groups jobs: "<cpu> |
    <cpu capability> | torch <version> <blas>", and " | <gpu>" when it has one. The same machine gives the
    same key (the flags and library versions beyond these stay in the record)."""
    torch = machine.get("torch") if isinstance(machine.get("torch"), dict) else {}
    key = (f"{machine.get('cpu') or '?'} | {machine.get('cpu_capability') or '?'} | "
           f"torch {torch.get('version') or '?'} {torch.get('blas') or '?'}")
    return key + (f" | {machine['gpu']}" if machine.get("gpu") else "")


def record_machine(record: dict) -> dict | None:
    """The machine a record names (``env.machine``); None for a record written before records named it."""
    env = record.get("env") if isinstance(record, dict) else None
    machine = env.get("machine") if isinstance(env, dict) else None
    return machine if isinstance(machine, dict) else None


def machines_of(records: Iterable[dict]) -> tuple[dict[str, int], int]:
    """({machine key: records naming it}, how many records name no machine) of a job's records."""
    keys: dict[str, int] = {}
    unrecorded = 0
    for record in records:
        machine = record_machine(record)
        if machine is None:
            unrecorded += 1
        else:
            key = machine_key(machine)
            keys[key] = keys.get(key, 0) + 1
    return dict(sorted(keys.items())), unrecorded
