"""The compile tables of the fused kernel: every compile per triton version (reports/kernel-compile.md), the
summary per config and target (docs/kernel.md), and what they say of the kernel's config lists.

    sections = read_report()                     # {"3.6.0": [Usage, ...], "3.9.0": [...]}
    problems(usages, lists)                      # listed configs that are not ok; lists with fewer than 2 ok
    differences(usages, sections)                # compiles that differ from the committed ones of their version
    summary_table(sections, lists)               # the table of docs/kernel.md

reports/kernel-compile.md holds one section per triton version ("## triton 3.6.0"), one row per compile; the
summary in docs/kernel.md (between its markers) has one row per kernel, tier, target and config: whether the
kernel's list for that target holds it and, per triton version, the worst of its compiles (most registers,
stack and shared memory over its dtypes, head dims and gate modes, and its worst verdict) and the tensor-core
instructions its compiles use.
"""

from __future__ import annotations

import re
from pathlib import Path

from validation.kernel_compile import GATES, VERDICTS, Spec, Usage, instruction_key

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "reports" / "kernel-compile.md"
DOCS = ROOT / "docs" / "kernel.md"
BEGIN, END = "<!-- compile table: begin -->", "<!-- compile table: end -->"
KERNELS = ("fwd", "preprocess", "dkdv", "dq")
MIN_LISTED = {"fwd": 2, "dkdv": 2, "dq": 2, "preprocess": 1}   # ok configs each list keeps (preprocess: its launch)
ROW = re.compile(r"^\| (\w+) \| sm_(\d+) \| \(([\d, ]+)\) \| (\w+) \| (\d+) \| (\w+) \| (\d+) \| (\d+) \| (\d+) \| "
                 r"([^|]+?) \| (\w+)(?:: (.*))? \|$")


def tier_of(dtype: str, head_dim: int) -> str:
    """The kernel's tier (``stability.kernels.gated_attention.tier``): "big" for D > 128 or fp32, else "fast"."""
    return "big" if head_dim > 128 or dtype == "fp32" else "fast"


def listed(spec: Spec, lists) -> bool:
    """Whether the kernel's list for the spec's target and tier holds its config (the preprocess: always)."""
    return spec.kernel == "preprocess" or spec.config in lists.get(spec.target, {}).get((spec.kernel, spec.tier), [])


# ----------------------------------------------------------------------------- every compile, per version

def report_section(version: str, usages: list[Usage], header: str) -> str:
    order = {k: i for i, k in enumerate(KERNELS)}
    lines = [f"## triton {version}", "", header, "",
             "| kernel | target | config | dtype | D | gate | registers | stack B | shared B | instruction | verdict |",
             "|---|---|---|---|---:|---|---:|---:|---:|---|---|"]
    for u in sorted(usages, key=lambda u: (order[u.spec.kernel], u.spec.target, u.spec.config, u.spec.dtype,
                                           u.spec.head_dim, u.spec.gate)):
        s = u.spec
        verdict = u.verdict + (f": {u.message[:160].replace('|', '/')}" if u.message else "")
        lines.append(f"| {s.kernel} | sm_{s.target} | ({', '.join(map(str, s.config))}) | {s.dtype} | {s.head_dim} | "
                     f"{GATES[s.gate]} | {u.registers} | {u.stack} | {u.shared} | {u.instruction or '-'} | {verdict} |")
    return "\n".join(lines)


def read_report(text: str | None = None) -> dict[str, list[Usage]]:
    """{triton version: its compiles} of reports/kernel-compile.md (or ``text``)."""
    text = REPORT.read_text() if text is None and REPORT.is_file() else (text or "")
    sections: dict[str, list[Usage]] = {}
    version = None
    names = {name: code for code, name in GATES.items()}
    for line in text.splitlines():
        heading = re.match(r"^## triton (\S+)$", line)
        if heading:
            version = heading.group(1)
            sections[version] = []
            continue
        row = ROW.match(line.strip())
        if row and version is not None:
            (kernel, target, config, dtype, head_dim, gate, registers, stack, shared, mma, verdict,
             message) = row.groups()
            config = tuple(int(v) for v in config.split(","))
            spec = Spec(kernel, int(target), tier_of(dtype, int(head_dim)), config, dtype, int(head_dim), names[gate])
            sections[version].append(Usage(spec, int(registers), int(stack), int(shared), verdict, message or "",
                                           instruction="" if mma == "-" else mma))
    return sections


def write_report(sections: dict[str, list[Usage]], headers: dict[str, str]) -> None:
    intro = ("# Every compile of the fused kernel for its GPU targets\n\nOne section per triton version, one row per "
             "compile, made by `python -m validation.compile_kernels --write` with that version installed "
             "(the summary, one row per config and target, is in docs/kernel.md; what the columns mean: "
             "`validation/kernel_compile.py`). Shared memory in bytes, dynamic and static; instruction: the "
             "tensor-core instructions of the compile's PTX, `none` where its dots are FMAs (fp32) or it has none.\n")
    body = [report_section(v, sections[v], headers.get(v, "")) for v in sorted(sections, key=version_key)]
    REPORT.write_text(intro + "\n" + "\n\n".join(body) + "\n")


def headers_of(text: str) -> dict[str, str]:
    """{version: the line under its heading} of a report's text (the date, the count)."""
    found = re.findall(r"^## triton (\S+)\n\n(.+)$", text, re.MULTILINE)
    return dict(found)


def version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+]", version))


# ----------------------------------------------------------------------------- what they say of the lists

def worst(usages: list[Usage]) -> Usage:
    """The compile a config's row shows: the worst verdict, and within it the most stack, then registers."""
    return max(usages, key=lambda u: (VERDICTS.index(u.verdict), u.stack, u.registers, u.shared))


def grouped(usages: list[Usage]) -> dict[tuple, list[Usage]]:
    """(kernel, tier, target, config) -> its compiles."""
    groups: dict[tuple, list[Usage]] = {}
    for u in usages:
        groups.setdefault((u.spec.kernel, u.spec.tier, u.spec.target, u.spec.config), []).append(u)
    return groups


def problems(usages: list[Usage], lists) -> list[str]:
    """Each listed config (and the preprocess launch) with a compile that is not ok, and each kernel, tier and
    target whose list keeps fewer ok configs than ``MIN_LISTED`` (counted where at least that many were
    compiled), one sentence each."""
    found, ok_count, compiled = [], {}, {}
    for (kernel, tier, target, config), group in grouped(usages).items():
        if not listed(group[0].spec, lists):
            continue
        key = (kernel, tier, target)
        compiled[key] = compiled.get(key, 0) + 1
        bad = worst(group)
        if bad.verdict == "ok":
            ok_count[key] = ok_count.get(key, 0) + 1
        else:
            found.append(f"{bad.describe()}: config {config} of the {kernel} {tier} list for sm_{target} is not ok "
                         f"({sum(u.verdict != 'ok' for u in group)} of {len(group)} compiles): remove it from "
                         f"GPU_CONFIGS[{target}] or fix it")
    for key, count in sorted(compiled.items()):
        need = MIN_LISTED[key[0]]
        if count >= need and ok_count.get(key, 0) < need:
            found.append(f"the {key[0]} {key[1]} list for sm_{key[2]} keeps {ok_count.get(key, 0)} config(s) that "
                         f"compile clean; expected at least {need}")
    return found


def differences(usages: list[Usage], committed: list[Usage]) -> list[str]:
    """Each compile whose registers, stack, shared memory, tensor-core instruction or verdict differ from the
    committed compile of the same spec (``committed``: the report's section of the same triton version), or that
    has none."""
    known = {u.spec: u for u in committed}
    found = []
    for u in usages:
        before = known.get(u.spec)
        now = (u.registers, u.stack, u.shared, u.instruction, u.verdict)
        if before is None:
            found.append(f"{u.spec.describe()}: not in reports/kernel-compile.md")
        elif (before.registers, before.stack, before.shared, before.instruction, before.verdict) != now:
            found.append(f"{u.spec.describe()}: now {u.registers} registers, {u.stack} B stack, {u.shared} B shared, "
                         f"{u.instruction or '-'}, {u.verdict}; committed {before.registers}, {before.stack}, "
                         f"{before.shared}, {before.instruction or '-'}, {before.verdict}")
    return found


# ----------------------------------------------------------------------------- the summary of docs/kernel.md

def instructions(group: list[Usage]) -> str:
    """The tensor-core instructions of a config's compiles, each kind once with its shapes (``wgmma m64n16k16,
    m64n64k16``), kinds joined by "; "; ``none`` where no compile has one, and where only some have none, the
    dtypes of those ("none (fp32)")."""
    shapes: dict[str, set[str]] = {}
    without = set()
    for u in group:
        if u.instruction == "none":
            without.add(u.spec.dtype)
        for token in filter(None, u.instruction.split(" + ") if u.instruction != "none" else []):
            kind, _, shape = token.partition(" ")
            shapes.setdefault(kind, set()).add(shape)
    parts = [f"{kind} " + ", ".join(sorted(found, key=lambda shape: instruction_key((kind, shape))))
             for kind, found in sorted(shapes.items())]
    if without:
        parts.append("none" + (f" ({', '.join(sorted(without))})" if parts else ""))
    return "; ".join(parts) or "-"


def summary_table(sections: dict[str, list[Usage]], lists) -> str:
    """One row per kernel, tier, target and config compiled in any version: whether its list holds it, and per
    version its most registers / stack bytes / shared KB over its compiles and its worst verdict, and the
    tensor-core instructions of its compiles (``instructions``)."""
    versions = sorted(sections, key=version_key)
    groups = {version: grouped(sections[version]) for version in versions}
    keys = {key for g in groups.values() for key in g}
    order = {k: i for i, k in enumerate(KERNELS)}
    lines = ["| kernel | tier | target | config (M, N, warps, stages) | in the list | "
             + " | ".join(f"triton {v}: registers / stack B / shared KB, worst verdict | triton {v}: instruction"
                          for v in versions) + " |",
             "|---|---|---|---|---|" + "---|---|" * len(versions)]
    for key in sorted(keys, key=lambda k: (order[k[0]], k[1] != "fast", k[2], -k[3][0], -k[3][1], -k[3][2], -k[3][3])):
        kernel, tier, target, config = key
        cells = []
        for version in versions:
            group = groups[version].get(key)
            if not group:
                cells += ["-", "-"]
                continue
            bad = worst(group)
            verdict = bad.verdict if bad.verdict == "ok" else (
                f"{bad.verdict} ({sum(u.verdict != 'ok' for u in group)} of {len(group)}, e.g. {bad.spec.dtype} "
                f"D={bad.spec.head_dim})")
            cells.append(f"{max(u.registers for u in group)} / {max(u.stack for u in group)} / "
                         f"{max(u.shared for u in group) / 1024:.0f}, {verdict}")
            cells.append(instructions(group))
        blocks = f"{config[0]} rows, {config[2]} warps" if kernel == "preprocess" else f"({', '.join(map(str, config))})"
        in_list = "yes" if listed(Spec(kernel, target, tier, config, "bf16", 64), lists) else "no"
        lines.append(f"| {kernel} | {tier} | sm_{target} | {blocks} | {in_list} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_summary(sections: dict[str, list[Usage]], lists) -> None:
    """Replace the table between the markers of docs/kernel.md."""
    text = DOCS.read_text()
    if BEGIN not in text or END not in text:
        raise RuntimeError(f"{DOCS} lacks the markers {BEGIN} ... {END}")
    before, rest = text.split(BEGIN, 1)
    DOCS.write_text(before + BEGIN + "\n" + summary_table(sections, lists) + "\n" + END + rest.split(END, 1)[1])


def committed_summary() -> str:
    """The table between the markers of docs/kernel.md as committed."""
    text = DOCS.read_text()
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip() if BEGIN in text and END in text else ""
