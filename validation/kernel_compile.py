"""One kernel config compiled for one GPU target on a machine without a GPU, and what the compile uses.

    usage = compile_one(Spec("fwd", 90, "fast", (128, 64, 8, 3), "bf16", 128, gate=1))
    usage.registers, usage.stack, usage.shared, usage.verdict, usage.instruction
    usages = compile_all(specs, jobs=4, timeout=300)    # in worker processes, each compile time-limited

``triton.compile`` builds the kernel of ``stability.kernels`` for ``GPUTarget("cuda", target, 32)`` with the
arguments of a training launch (a (B=2, H=16, Hkv=4, S=4096) batch: q, k, v, the gate, Y and O in (B, S, H, D)
memory, dO, dQ, dK, dV in (B, H, S, D)), specialised the way triton specialises a launch: 16-byte aligned
pointers and integers divisible by 16 are marked so, an integer equal to 1 becomes the constant 1. The cubin
is read with the ``cuobjdump`` that ships with triton (``--dump-resource-usage``: registers per thread, stack
frame bytes, static shared memory) and triton's metadata (the dynamic shared memory the launch asks for); its
PTX names the tensor-core instruction the matmuls compiled to (``instruction``: ``wgmma m64n64k16`` on Hopper,
``mma.sync m16n8k16`` (Ampere's, also on Hopper and Blackwell when triton does not pick the newer one),
``tcgen05.mma kind::f16`` on Blackwell, ``none`` for a kernel without one: fp32 tiles (exact fp32 dots are FMAs)
and the preprocess). A compile is

    ok          no stack frame (a Triton kernel keeps nothing on the stack but spilled registers), its shared
                memory within the target's limit and its registers within the register file
    spills      a stack frame: registers spilled to local memory, slow
    shared      more shared memory than a block may have on the target (the launch fails: OutOfResources)
    registers   registers x threads over the 64K registers of the register file (the launch fails)
    error       triton or ptxas could not compile it (the message says why), not within the time limit, or
                compiled to a kernel that traps and stores nothing (seen for dkdv (32, 64, 4, 2), bf16 and fp16
                D=256, on sm_100 with triton 3.9.0; why triton emits it there is not established)

These are the compiler's figures, read on a machine without a GPU; no GPU has run these cubins.

Limits (NVIDIA CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": maximum shared
memory per thread block 163 KB on 8.0, 227 KB on 9.0 and 10.0; 64K 32-bit registers per block).

The kernels must be compiled, not interpreted: ``TRITON_INTERPRET`` must be 0 before triton is imported
(without CUDA, importing ``stability.kernels`` turns the interpreter on otherwise). ``compile_all`` runs the
compiles in worker processes of its own (``python -m validation.kernel_compile``), which set it.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024, 100: 227 * 1024}   # bytes per block, opt-in maximum
REGISTER_FILE = 64 * 1024                                          # 32-bit registers per block
VERDICTS = ("ok", "spills", "shared", "registers", "error")         # from good to worst
GATES = {0: "none", 1: "elementwise", 2: "headwise"}
BATCH, HEADS, KV_HEADS, SEQ = 2, 16, 4, 4096


@dataclass(frozen=True)
class Spec:
    """One compile: a kernel ("fwd", "preprocess", "dkdv", "dq") with one config for one target (compute
    capability 80, 90, 100), dtype ("bf16", "fp16", "fp32"), head dim and gate mode (``GATES``; 0 for the
    kernels that take no gate). config: (BLOCK_M, BLOCK_N, num_warps, num_stages), BLOCK_N 0 for the preprocess."""

    kernel: str
    target: int
    tier: str
    config: tuple[int, int, int, int]
    dtype: str
    head_dim: int
    gate: int = 0

    def describe(self) -> str:
        m, n, w, s = self.config
        blocks = f"({m}, {n}, {w}, {s})" if n else f"{m} rows, {w} warps"
        return f"{self.kernel} sm_{self.target} {blocks} {self.dtype} D={self.head_dim} gate {GATES[self.gate]}"


@dataclass(frozen=True)
class Usage:
    """What one compile uses: registers per thread, stack frame bytes, shared memory bytes (dynamic and static),
    its verdict (``VERDICTS``) and, for an error, the message; seconds the compile took; the tensor-core
    instructions of its PTX (``instruction``; "" where there is no PTX: an error)."""

    spec: Spec
    registers: int = 0
    stack: int = 0
    shared: int = 0
    verdict: str = "ok"
    message: str = ""
    seconds: float = 0.0
    instruction: str = ""

    def describe(self) -> str:
        if self.verdict == "error":
            return f"{self.spec.describe()}: error: {self.message}"
        return (f"{self.spec.describe()}: {self.registers} registers, {self.stack} B stack, "
                f"{self.shared / 1024:.0f} KB shared, {self.instruction or '?'}: {self.verdict}")


def judge(spec: Spec, registers: int, stack: int, shared: int) -> str:
    """The verdict of a compile that succeeded (see the module docstring)."""
    if shared > SHARED_LIMIT[spec.target]:
        return "shared"
    if registers * 32 * spec.config[2] > REGISTER_FILE:
        return "registers"
    if stack > 0:
        return "spills"
    return "ok"


# ----------------------------------------------------------------------------- the launch's arguments

def specialise(value, pointer: str | None = None) -> tuple[str, list, int | None]:
    """(signature type, attributes, constant) of one launch argument, as triton specialises a launch."""
    if pointer is not None:
        return f"*{pointer}", [["tt.divisibility", 16]], None
    if isinstance(value, float):
        return "fp32", [], None
    if value == 1:
        return "constexpr", [], 1
    kind = "i32" if -2**31 <= value < 2**31 else "i64"
    return kind, ([["tt.divisibility", 16]] if value % 16 == 0 else []), None


def strides(shape: tuple[int, ...], order: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Strides of a (B, H, S, D) tensor whose memory holds its dims in ``order`` (default: as is)."""
    order = order or tuple(range(len(shape)))
    out, step = [0] * len(shape), 1
    for dim in reversed(order):
        out[dim] = step
        step *= shape[dim]
    return tuple(out)


def launch(spec: Spec) -> tuple[dict, dict, dict]:
    """(pointer dtypes, integer and float arguments, constexprs) by argument name, of one training launch."""
    dtype, head_dim = spec.dtype, spec.head_dim
    bshd = (0, 2, 1, 3)     # (B, S, H, D) memory seen as (B, H, S, D): q, k, v, the gate, Y and O
    q = strides((BATCH, HEADS, SEQ, head_dim), bshd)
    kv = strides((BATCH, KV_HEADS, SEQ, head_dim), bshd)
    width = head_dim if spec.gate != 2 else 1
    gate = strides((BATCH, HEADS, SEQ, width), bshd) if spec.gate else (0, 0, 0, 0)
    dense = strides((BATCH, HEADS, SEQ, head_dim))
    dense_kv = strides((BATCH, KV_HEADS, SEQ, head_dim))

    def named(prefix, values):
        return dict(zip((f"{prefix}_b", f"{prefix}_h", f"{prefix}_s", f"{prefix}_d"), values))

    m, n, _, _ = spec.config
    constants = {"HEAD_DIM": head_dim, "BLOCK_D": max(16, 1 << (head_dim - 1).bit_length()), "BLOCK_M": m}
    dots = {"BLOCK_N": n, "CAUSAL": True, "UPCAST": False, "DOT_PRECISION": "ieee" if dtype == "fp32" else "tf32"}
    sizes = {"n_heads": HEADS, "n_kv_heads": KV_HEADS, "group": HEADS // KV_HEADS, "seq_len": SEQ, "qk_scale": 0.18,
             "sm_scale": 0.125, "seq_bucket": SEQ}
    if spec.kernel == "fwd":
        pointers = {name: dtype for name in ("Q", "K", "V", "G", "Y", "O")} | {"LSE": "fp32"}
        values = {**named("sq", q), **named("sk", kv), **named("sv", kv), **named("sg", gate), **named("sy", q)}
        constants |= dots | {"GATE": spec.gate, "STORE_O": spec.gate != 0}
    elif spec.kernel == "preprocess":
        pointers = {"DY": dtype, "O": dtype, "G": dtype, "DO": dtype, "DG": dtype if spec.gate else "fp32",
                    "DELTA": "fp32"}
        dgate = strides((BATCH, HEADS, SEQ, width)) if spec.gate else (0, 0, 0, 0)
        values = {**named("sdy", q), **named("so", q), **named("sg", gate), **named("sdo", dense), **named("sdg", dgate)}
        constants |= {"GATE": spec.gate}
    elif spec.kernel == "dkdv":
        pointers = {name: dtype for name in ("Q", "K", "V", "DO", "DK", "DV")} | {"LSE": "fp32", "DELTA": "fp32"}
        values = {**named("sq", q), **named("sk", kv), **named("sv", kv), **named("sdo", dense),
                  **named("sdk", dense_kv), **named("sdv", dense_kv)}
        constants |= dots
    else:
        pointers = {name: dtype for name in ("Q", "K", "V", "DO", "DQ")} | {"LSE": "fp32", "DELTA": "fp32"}
        values = {**named("sq", q), **named("sk", kv), **named("sv", kv), **named("sdo", dense), **named("sdq", dense)}
        constants |= dots
    return pointers, values | sizes, constants


# ----------------------------------------------------------------------------- one compile

def kernels_module():
    """``stability.kernels.gated_attention``, compiled (not interpreted): RuntimeError where triton was imported
    under the interpreter (a test process), since an interpreted kernel cannot be compiled."""
    os.environ["TRITON_INTERPRET"] = "0"
    import importlib

    module = importlib.import_module("stability.kernels.gated_attention")
    if module.INTERPRETED:
        raise RuntimeError("the kernels were imported under the Triton interpreter (TRITON_INTERPRET=1) and cannot "
                           "be compiled: compile in a fresh process (compile_all, python -m validation.compile_kernels)")
    return module


def resource_usage(cubin: bytes) -> tuple[int, int, int]:
    """(registers, stack bytes, static shared bytes) of the function in ``cubin``, read by triton's cuobjdump."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        out = subprocess.run([str(tool), "--dump-resource-usage", file.name], capture_output=True, text=True,
                             check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", out)
    if not found:
        raise RuntimeError(f"cuobjdump printed no resource usage: {out[-500:]}")
    return int(found.group(1)), int(found.group(2)), int(found.group(3))


def traps(ptx: str) -> bool:
    """Whether the PTX is a kernel that traps and stores nothing: a compile that succeeded but cannot run as a
    kernel (read from the PTX alone: a ``trap`` and no global store), counted as a failed compile."""
    return re.search(r"\btrap;", ptx) is not None and not re.search(r"\bst\.global|cp\.async\.bulk", ptx)


MMA = (  # (pattern, name) of each tensor-core instruction, its shape (m, n, k) where the PTX spells it
    (re.compile(r"\bwgmma\.mma_async\.(?:sp\.)?sync\.aligned\.(m\d+n\d+k\d+)"), "wgmma"),
    (re.compile(r"(?<![\w.])mma\.(?:sp\.)?sync\.aligned\.(m\d+n\d+k\d+)"), "mma.sync"),
    (re.compile(r"\btcgen05\.mma\.(?:cta_group::\d\.)?(kind::\w+)"), "tcgen05.mma"),
)


def instruction(ptx: str) -> str:
    """The tensor-core instructions of a PTX, each kind and shape once, sorted, joined by " + " (``wgmma
    m64n16k16 + wgmma m64n64k16``; ``tcgen05.mma kind::f16``: its shape is in a runtime descriptor, not in the
    text); ``none`` for a kernel without one (its dots are FMAs, or it has none)."""
    found = {(name, match) for pattern, name in MMA for match in pattern.findall(ptx)}
    return " + ".join(f"{name} {shape}" for name, shape in sorted(found, key=instruction_key)) or "none"


def instruction_key(token: tuple[str, str]) -> tuple:
    """Sort key of (kind, shape): by kind, then the shape's numbers (m64n16k16 before m64n128k16)."""
    return (token[0], [int(n) for n in re.findall(r"\d+", token[1])], token[1])


def compile_one(spec: Spec) -> Usage:
    """Compile ``spec`` with triton and read what it uses; a failed compile is a Usage with verdict "error"."""
    import warnings

    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
    module = kernels_module()
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = {"fwd": module._attn_fwd, "preprocess": module._bwd_preprocess, "dkdv": module._attn_bwd_dkdv,
              "dq": module._attn_bwd_dq}[spec.kernel]
    pointers, values, constants = launch(spec)
    signature, constexprs, attrs = {}, dict(constants), {}
    for index, name in enumerate(kernel.arg_names):
        if name in constants:
            signature[name] = "constexpr"
            continue
        kind, attr, constant = specialise(values.get(name), pointers.get(name))
        signature[name] = kind
        if attr:
            attrs[(index,)] = attr
        if constant is not None:
            constexprs[name] = constant
    started = time.perf_counter()
    try:
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                                  target=GPUTarget("cuda", spec.target, 32),
                                  options={"num_warps": spec.config[2], "num_stages": spec.config[3]})
        registers, stack, static = resource_usage(compiled.asm["cubin"])
        mma = instruction(compiled.asm["ptx"])
        if traps(compiled.asm["ptx"]):
            return Usage(spec, registers, stack, compiled.metadata.shared + static, "error",
                         "compiled to a kernel that traps and stores nothing", time.perf_counter() - started, mma)
    except Exception as error:  # noqa: BLE001 (a compile that fails is a row of the table, with its message)
        return Usage(spec, verdict="error", message=" ".join(str(error).split())[:300],
                     seconds=time.perf_counter() - started)
    shared = compiled.metadata.shared + static
    return Usage(spec, registers, stack, shared, judge(spec, registers, stack, shared),
                 seconds=time.perf_counter() - started, instruction=mma)


# ----------------------------------------------------------------------------- many, in worker processes

class Worker:
    """A process compiling the specs it is sent, one JSON line each (``python -m validation.kernel_compile``),
    in a process group of its own, so that stopping it stops its ptxas too."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, "-m", "validation.kernel_compile"], cwd=ROOT,
                                        env={**os.environ, "TRITON_INTERPRET": "0"}, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        start_new_session=True)

    def compile(self, spec: Spec, timeout: float) -> Usage | None:
        """The usage of ``spec``; None when the worker gave none within ``timeout`` seconds (or died)."""
        self.process.stdin.write(json.dumps(asdict(spec)) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        answer = self.process.stdout.readline() if ready else ""
        if not answer:
            return None
        data = json.loads(answer)
        return Usage(spec, **{k: data[k] for k in ("registers", "stack", "shared", "verdict", "message", "seconds",
                                                   "instruction")})

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def compile_all(specs: list[Spec], jobs: int = 1, timeout: float = 300.0, progress=print) -> list[Usage]:
    """Every spec compiled by ``jobs`` worker processes, in the order given. A compile gets ``timeout`` seconds:
    past them its worker is stopped with its ptxas (a badly spilling config can keep ptxas busy for many
    minutes) and the compile is an error, "over N s"; a new worker takes the next spec."""
    results: list[Usage | None] = [None] * len(specs)
    todo = list(enumerate(specs))
    lock = threading.Lock()
    finished = [0]

    def work():
        worker = None
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    index, spec = todo.pop(0)
                worker = worker or Worker()
                usage = worker.compile(spec, timeout)
                if usage is None:
                    worker.stop()
                    worker = None
                    usage = Usage(spec, verdict="error", message=f"no result within {timeout:.0f} s (stopped)",
                                  seconds=timeout)
                with lock:
                    results[index] = usage
                    finished[0] += 1
                    progress(f"[{finished[0]}/{len(specs)}] {usage.describe()} ({usage.seconds:.1f} s)")
        finally:
            if worker is not None:
                worker.stop()

    threads = [threading.Thread(target=work) for _ in range(max(1, min(jobs, len(specs))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [usage for usage in results if usage is not None]


def serve() -> int:
    """A worker's loop: a spec (JSON) per line on stdin, its usage (JSON) per line on the stdout it was given;
    anything else printed (triton prints a failing ptxas's input) goes to stderr."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    kernels_module()
    for text in sys.stdin:
        data = json.loads(text)
        usage = compile_one(Spec(**{**data, "config": tuple(data["config"])}))
        answers.write(json.dumps({k: v for k, v in asdict(usage).items() if k != "spec"}) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
