"""The fused kernel compiled for its GPU targets on a machine without a GPU: every kernel, config, dtype, gate
mode and head dim, for sm_80, sm_90 and sm_100, with the triton installed (the table holds one section per
version: 3.6.0 and 3.9.0, each made in a venv with that version; the lists must be clean under each).

    python -m validation.compile_kernels --jobs 4              # every config of the kernel's lists
    python -m validation.compile_kernels --small               # one config per kernel and target
    python -m validation.compile_kernels --check               # ... and each compile as committed for this triton
    python -m validation.compile_kernels --write --jobs 4      # the lists and TRIED; rewrite the tables

The kernels (``stability.kernels``: the forward ``fwd``, the backward's ``preprocess``, ``dkdv`` and ``dq``)
are compiled (``validation/kernel_compile.py``: how, and what ok / spills / shared / registers / error mean)
for every config the autotuner may pick on each target (``GPU_CONFIGS[target]`` of
``kernels/gated_attention.py``), every dtype (bf16, fp16, fp32), gate mode (none, elementwise, headwise: the
forward and the preprocess) and head dim (64, 128, 256) of the config's tier, causal, as a training step
launches them (the forward stores the ungated output O when gated). ``--small`` compiles the last config of
each fast list (the smallest, which every list keeps) for bf16, D=64, elementwise gate: one per kernel and
target. ``--write`` also compiles the ``TRIED`` candidates the lists were chosen from and rewrites this triton
version's section of reports/kernel-compile.md (the other versions' sections are kept as they are) and the
summary of docs/kernel.md (every version's). Each compile's row also names the tensor-core instruction its PTX
uses (``wgmma``, ``mma.sync``, ``tcgen05.mma`` or ``none``), which ``--check`` compares too.

Exit 0 when every listed config is ok on its target and each list keeps at least two (the preprocess: its
launch); with ``--check``, also when every compile equals the committed one of this triton version (a version
with no committed section is checked for its verdicts only, and says so); 1 otherwise, naming each
config; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

from validation import kernel_table
from validation.kernel_compile import Spec, compile_all

KERNELS = ("fwd", "preprocess", "dkdv", "dq")
TARGETS = (80, 90, 100)
DTYPES = ("bf16", "fp16", "fp32")
HEAD_DIMS = (64, 128, 256)
GATE_MODES = (0, 1, 2)
PREPROCESS_WARPS, PREPROCESS_STAGES = 4, 3   # the preprocess launch: triton's default warps and stages

# The candidates the lists were chosen from, kept in the table as the evidence of what spilled: ``--write`` compiles
# them on every target with the lists. First the lists as they stood before the kernel was first compiled for a GPU
# (one list for every target); then (after the "+") the configs left out of some target's list when triton 3.6.0
# was compiled (they spill under it, or under 3.9.0 since dK/dV runs one loop) and the dK/dV candidates with 64 or
# more keys per block tried for wgmma on sm_90 (those at or near the register file's edge, 242 or more registers,
# left out).
TRIED = {
    ("fwd", "fast"): [(128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (64, 64, 4, 3), (32, 32, 4, 1)],
    ("fwd", "big"): [(64, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 1)] + [(32, 16, 4, 2)],
    ("dkdv", "fast"): [(32, 128, 4, 3), (64, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3), (32, 32, 4, 1)]
    + [(16, 32, 4, 1), (64, 64, 8, 2), (64, 64, 4, 2), (32, 128, 8, 2), (32, 64, 4, 2), (16, 64, 4, 2)],
    ("dkdv", "big"): [(32, 64, 4, 2), (32, 32, 4, 1)]
    + [(16, 32, 8, 2), (16, 32, 8, 1), (16, 16, 8, 2), (16, 16, 8, 1)],
    ("dq", "fast"): [(128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 8, 2), (64, 32, 4, 3), (32, 32, 4, 1)],
    ("dq", "big"): [(64, 32, 4, 2), (32, 32, 4, 1)],
}


def kernel_module():
    """``stability.kernels.gated_attention`` (its lists and launch rules are plain data and functions: read
    wherever the module was imported, interpreted or not)."""
    import importlib

    return importlib.import_module("stability.kernels.gated_attention")


def preprocess_config(head_dim: int) -> tuple[int, int, int, int]:
    """The preprocess launch on the GPU for a head dim: its rows (``preprocess_rows``), 4 warps, 3 stages."""
    block_d = max(16, 1 << (head_dim - 1).bit_length())
    return (kernel_module().preprocess_rows(block_d), 0, PREPROCESS_WARPS, PREPROCESS_STAGES)


def kernel_lists() -> dict:
    """The kernel's per-target lists, ``GPU_CONFIGS``."""
    return kernel_module().GPU_CONFIGS


def specs(kernels=KERNELS, targets=TARGETS, small: bool = False, tried: bool = False) -> list[Spec]:
    """The compiles to make (see the module docstring)."""
    lists = kernel_lists()
    out = []
    for target in targets:
        for kernel in kernels:
            for dtype in DTYPES:
                for head_dim in HEAD_DIMS:
                    tier = kernel_table.tier_of(dtype, head_dim)
                    if small and (dtype, head_dim) != ("bf16", 64):
                        continue
                    if kernel == "preprocess":
                        configs = [preprocess_config(head_dim)]
                    elif small:
                        configs = [lists[target][kernel, "fast"][-1]]
                    else:
                        configs = list(dict.fromkeys(lists[target][kernel, tier] + (TRIED[kernel, tier] if tried else [])))
                    gates = ((1,) if small else GATE_MODES) if kernel in ("fwd", "preprocess") else (0,)
                    out += [Spec(kernel, target, tier, config, dtype, head_dim, gate) for config in configs
                            for gate in gates]
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="one config per kernel and target (bf16, D=64, gated)")
    p.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated, of {', '.join(KERNELS)}")
    p.add_argument("--targets", default=",".join(map(str, TARGETS)),
                   help=f"compute capabilities, of {', '.join(map(str, TARGETS))}")
    p.add_argument("--jobs", type=int, default=1, help="compiles at once, each in a process of its own (default 1)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one compile may take (default 120)")
    p.add_argument("--check", action="store_true",
                   help="also require each compile to equal the committed one of this triton version")
    p.add_argument("--write", action="store_true",
                   help="compile the lists and TRIED for every kernel and target; rewrite this triton version's "
                        "section of reports/kernel-compile.md and the summary of docs/kernel.md")
    args = p.parse_args(argv)
    args.kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    wrong = [k for k in args.kernels if k not in KERNELS]
    if wrong or not args.kernels:
        p.error(f"--kernels {','.join(wrong) or '(empty)'} is invalid: expected some of {', '.join(KERNELS)}")
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not targets or any(not re.fullmatch(r"\d+", t) or int(t) not in TARGETS for t in targets):
        p.error(f"--targets {args.targets!r} is invalid: expected some of {', '.join(map(str, TARGETS))}")
    args.targets = [int(t) for t in targets]
    if args.jobs < 1 or not args.timeout > 0:
        p.error(f"--jobs {args.jobs} / --timeout {args.timeout} is invalid: expected a positive number")
    if args.write and (args.small or len(args.kernels) < len(KERNELS) or len(args.targets) < len(TARGETS)):
        p.error("--write rewrites the whole table: expected no --small, --kernels or --targets with it")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "0"
    import triton

    version = triton.__version__
    todo = specs(args.kernels, args.targets, args.small, tried=args.write)
    started = time.perf_counter()
    print(f"compile_kernels: {len(todo)} compiles with triton {version}, {args.jobs} at once", flush=True)
    usages = compile_all(todo, args.jobs, args.timeout, progress=lambda text: print(text, flush=True))
    header = (f"Compiled {time.strftime('%Y-%m-%d')} with triton {version} (its ptxas and cuobjdump), no GPU: "
              f"{len(usages)} compiles in {time.perf_counter() - started:.0f} s.")
    lists = kernel_lists()
    found = kernel_table.problems(usages, lists)
    sections = kernel_table.read_report()
    if args.check:
        if version in sections:
            found += kernel_table.differences(usages, sections[version])
        else:
            print(f"\nno committed compiles for triton {version} (reports/kernel-compile.md has "
                  f"{', '.join(sections) or 'none'}): the verdicts are checked, not the numbers")
    print("\n" + kernel_table.summary_table({version: usages}, lists))
    if args.write:
        headers = kernel_table.headers_of(kernel_table.REPORT.read_text()) if kernel_table.REPORT.is_file() else {}
        sections[version], headers[version] = usages, header
        kernel_table.write_report(sections, headers)
        kernel_table.write_summary(sections, lists)
        print(f"\nwritten: reports/kernel-compile.md (triton {version}), docs/kernel.md (its summary)")
    if found:
        print("\nNOT OK:\n  " + "\n  ".join(found))
        return 1
    print(f"\nok: every listed config compiles clean on its target{' and as committed' if args.check else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
