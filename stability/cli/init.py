"""``stability init``: make the current repository gate its merges on the stability suites.

    stability init [--factory mypackage.model:build] [--force]

Writes, asking nothing:

* the settings table, every key with its comment (``stability.plugin.settings.KEYS``): ``[tool.stability]``
  appended to ./pyproject.toml (the rest of the file kept byte for byte), or ./stability.toml when there is
  no pyproject.toml;
* ``.github/workflows/stability.yml``: on every pull request the CPU job (the preset on the CPU) and the GPU
  job (``gpu-pr`` on one GPU, sized to its 240 minutes by ``stability plan``), and every night the ``full``
  job on four GPUs (one per pytest-xdist worker), each running the stress suites, the kernel check where the
  model is the harness's own, ``stability check`` against the committed baseline, the report, the upload, and
  failing on a regression; its ``push`` trigger names the repository's default branch (``git``: origin's HEAD,
  else the branch checked out, else main). It is the template ``workflow.yml.in`` beside this module with its
  ``@NAME@`` markers filled (``workflow_values``; this package's own repository renders the same template
  with its values, ``tools/workflow.py``);
* ``.gitignore``: the run output (``reports/*``) ignored, the baselines (``reports/baselines/``) kept,
  appended to an existing file (lines it already has are not repeated);

then prints the command that makes the first baseline and the commands of the workflow's CPU job, as the job
runs them. With ``--factory``, the factory is imported and called once per arm on a tiny batch first
(``stability.model.contract``, as the suites will call it): a factory that does not import, returns no
model, makes no observer calls or ignores a gate setting is an error (exit 2, nothing written); otherwise
what was found is printed. An existing table or workflow is never overwritten without ``--force`` (exit 2
naming it, nothing written).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from importlib import resources
from pathlib import Path

from stability.config import ConfigError, ModelConfig
from stability.plugin.settings import KEYS, OWN_FILE, PYPROJECT, read_settings
from stability.record.rundir import DEFAULT_ROOT

WORKFLOW = Path(".github") / "workflows" / "stability.yml"
GITIGNORE = Path(".gitignore")
IGNORED = ("reports/*", "!reports/baselines/")   # the run output, not the committed baselines
TABLE_HEADER = "[tool.stability"   # the table and its sub-tables ([tool.stability.set])


class Refused(ConfigError):
    """A file that ``stability init`` would overwrite without --force."""


# ----------------------------------------------------------------------------- the settings table

def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def _comment(text: str) -> list[str]:
    return ["# " + line for line in textwrap.wrap(text, 108)]


def settings_text(table: str, factory: str = "") -> str:
    """The settings, every key after its comment; ``table`` is "tool.stability" in a pyproject.toml and ""
    in a stability.toml (keys at the top level)."""
    lines = [f"[{table}]"] if table else []
    lines += _comment("Settings of the stability stress suites (pytest --pyargs stability.suites -m stress) "
                      "and of `stability baseline make`, written by `stability init`; every key is optional "
                      "(docs/your-repository.md of the stability package).")
    for key in KEYS:
        if key.name == "set":
            continue
        lines += _comment(key.comment)
        if key.name == "model":
            lines.append(f"model.factory = {_toml(factory)}")
        elif key.name == "cases":
            from stability.cases.stress import CASES

            lines.append(f"cases = {_toml(list(CASES))}")
        else:
            lines.append(f"{key.name} = {_toml(key.initial)}")
    (set_key,) = [key for key in KEYS if key.name == "set"]
    lines += [""] + _comment(set_key.comment) + [f"[{table + '.' if table else ''}set]", ""]
    return "\n".join(lines)


def _without_table(text: str) -> str:
    """``text`` without its [tool.stability] and [tool.stability.*] sections (up to the next other header)."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith("["):
            inside = stripped.startswith(TABLE_HEADER) and stripped[len(TABLE_HEADER)] in "].]"
        if not inside:
            out.append(line)
    return "".join(out)


def _has_table(text: str, where: Path) -> bool:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise Refused(f"{where} is not valid TOML ({error}): fix it, then run stability init again") from None
    return "stability" in (data.get("tool") or {})


def new_settings_file(root: Path, factory: str, force: bool) -> tuple[Path, bytes]:
    """(path, new bytes) of the settings: appended to pyproject.toml, else a new stability.toml."""
    pyproject, own = root / PYPROJECT, root / OWN_FILE
    if pyproject.is_file():
        if own.is_file() and read_settings(own) is not None:
            raise Refused(f"{own} already holds the settings: remove it to write [tool.stability] into "
                          f"{pyproject}, or keep it and leave stability init out")
        old = pyproject.read_bytes()
        text = old.decode()
        if _has_table(text, pyproject):
            if not force:
                raise Refused(f"{pyproject} already has a [tool.stability] table: not overwritten (run "
                              f"stability init --force to replace it)")
            text = _without_table(text)
            if _has_table(text, pyproject):
                raise Refused(f"{pyproject} defines tool.stability outside a [tool.stability] table: remove it by "
                              f"hand, then run stability init again")
            old = text.encode()
        gap = b"" if not old else (b"\n" if old.endswith(b"\n") else b"\n\n")
        return pyproject, old + gap + settings_text("tool.stability", factory).encode()
    if own.is_file() and not force:
        raise Refused(f"{own} already exists: not overwritten (run stability init --force to replace it)")
    return own, settings_text("", factory).encode()


# ----------------------------------------------------------------------------- the workflow

def stability_requirement() -> tuple[str, str | None]:
    """How CI installs stability, from how this environment did (PEP 610 direct_url.json): a git URL at its
    commit, the index, or (a local path or wheel CI cannot reach) that location with a note to replace it."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        direct = distribution("stability").read_text("direct_url.json")
    except PackageNotFoundError:
        direct = None
    if not direct:
        return "stability[suites]", None
    info = json.loads(direct)
    vcs = info.get("vcs_info")
    if vcs:
        return f"stability[suites] @ {vcs['vcs']}+{info['url']}@{vcs['commit_id']}", None
    return (f"stability[suites] @ {info['url']}",
            (f"stability was installed here from {info['url']}, which CI cannot reach: set STABILITY_PACKAGE in "
            f"{WORKFLOW} to where CI gets it (a git URL, a wheel it can download, a package index)"))


TEMPLATE = "workflow.yml.in"   # beside this module: the workflow with @NAME@ markers, package data
HEADER_TEMPLATE = "workflow-header.txt.in"   # and the comment at its top, for a repository that installs stability
MARKER = re.compile(r"@([A-Z][A-Z_]*)@")


class TemplateError(ValueError):
    """A template and its values that do not match: a marker without a value, a value for no marker, or a
    value that does not fit its marker's place."""


def workflow_template(name: str = TEMPLATE) -> str:
    """A template installed with the package: the workflow (``TEMPLATE``) or its header (``HEADER_TEMPLATE``)."""
    return resources.files("stability.cli").joinpath(name).read_text()


def render(template: str, values: dict[str, str]) -> str:
    """``template`` with each marker ``@NAME@`` replaced by ``values[NAME]``. A marker alone on its line stands
    for whole lines: each line of its value indented as the marker is, or no line at all when the value is
    empty; any other marker's value is a single line. TemplateError names the markers without a value, the
    values of no marker and a value that does not fit its marker."""
    markers = set(MARKER.findall(template))
    unfilled, unknown = sorted(markers - values.keys()), sorted(values.keys() - markers)
    if unfilled or unknown:
        raise TemplateError(f"the workflow template's markers and values differ: no value for "
                            f"{', '.join(f'@{name}@' for name in unfilled) or 'none'}; no marker for "
                            f"{', '.join(unknown) or 'none'}")
    out = []
    for line in template.splitlines(keepends=True):
        alone = re.fullmatch(r"( *)@([A-Z][A-Z_]*)@\n", line)
        if alone:
            indent, value = alone.group(1), values[alone.group(2)]
            if value and not value.endswith("\n"):
                raise TemplateError(f"the value of @{alone.group(2)}@ (whole lines) does not end with a newline")
            out += [indent + part if part.strip() else part for part in value.splitlines(keepends=True)]
            continue
        for name in MARKER.findall(line):
            if "\n" in values[name]:
                raise TemplateError(f"the value of @{name}@ (within a line) has a newline")
        out.append(MARKER.sub(lambda found: values[found.group(1)], line))
    return "".join(out)


def header(settings_file: str, preset: str, baselines: str) -> str:
    """The comment at the top of the workflow ``stability init`` writes (its template, ``HEADER_TEMPLATE``)."""
    return render(workflow_template(HEADER_TEMPLATE),
                  {"SETTINGS_FILE": settings_file, "PRESET": preset, "BASELINES": baselines})


def workflow_values(settings_file: str, preset: str, baselines: str, package: str, branch: str) -> dict[str, str]:
    """The values of the template's markers in a repository that installs stability: the suites installed with
    the package (``STABILITY_PACKAGE``), the repository's own package installed editable beside it."""
    return {
        "HEADER": header(settings_file, preset, baselines),   # the comment at the top
        "BRANCH": branch,                                     # pushes to it run the workflow
        "PRESET": preset,                                     # the CPU jobs' preset
        "BASELINES": baselines,                               # the folder of the committed baselines
        "ENV": f'STABILITY_PACKAGE: "{package}"\n',           # the last lines of every job's env
        "CPU_ENV": ("# the plots go into the job's report, not again into the MLflow store of each case: "
                    "reports/ stays small\nSTABILITY_PLOTS: \"0\"\n"),   # then the CPU jobs' own
        "TORCH": '"torch>=2.11"',                             # the CPU jobs' torch (its CPU build)
        "INSTALL": 'pip install "$STABILITY_PACKAGE"\npip install -e .\n',   # the install commands
        "SUITES": "--pyargs stability.suites",                # where pytest finds the stress suites
        "KERNEL_SUITE": "--pyargs stability.suites",          # and the kernel suites
        "EXTRA_JOBS": "",                                     # jobs of the repository's own, after the CPU job
    }


def without_kernel_steps(workflow: str) -> str:
    """``workflow`` without the steps that test the harness's kernel (``id: kernel``) and their JUnit files in
    the check: a model of the repository's own (``--factory``) never runs that kernel."""
    steps = re.split(r"^(?=      - )", workflow, flags=re.MULTILINE)   # a job's steps are items at 6 spaces
    kept = "".join(step for step in steps if "\n        id: kernel\n" not in step)
    return re.sub(r" --junit reports/junit-kernel[^ \n]*", "", kept)


def workflow_text(settings_file: str, preset: str, baselines: str, package: str, own_model: bool,
                  branch: str = "main") -> str:
    """The workflow ``stability init`` writes: the template rendered with ``workflow_values``; the kernel steps
    only when the arms train the harness's own model (the code they check)."""
    text = render(workflow_template(), workflow_values(settings_file, preset, baselines, package, branch))
    return text if own_model else without_kernel_steps(text)


def job_commands(workflow: str, job: str, baseline: str) -> list[str]:
    """The commands of ``job`` in the workflow text that run the suites and the check (its ``pytest`` and
    ``stability check`` lines, in order), ``$BASELINE`` spelled out as ``baseline`` and the job's run
    directory as ``reports/runs`` (at a terminal: its newest run directory, which the check names)."""
    lines, inside = [], False
    for line in workflow.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            inside = line.strip() == f"{job}:"
        command = line.strip()
        if inside and command.startswith(("pytest ", "stability check ")):
            lines.append(command.replace('"$BASELINE"', baseline).replace("$BASELINE", baseline)
                         .replace('"$STABILITY_RUN_DIR"', str(DEFAULT_ROOT)))
    return lines


def default_branch(root: Path) -> str:
    """The repository's default branch: origin's HEAD, else the branch checked out, else "main"."""
    for ref in ("refs/remotes/origin/HEAD", "HEAD"):
        try:
            found = subprocess.run(["git", "symbolic-ref", "--quiet", "--short", ref], cwd=root, capture_output=True,
                                   text=True, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError):
            return "main"
        name = found.stdout.strip()
        if found.returncode == 0 and name:
            return name.split("/", 1)[1] if ref.startswith("refs/remotes/") and "/" in name else name
    return "main"


def gitignore_bytes(root: Path) -> bytes | None:
    """The new .gitignore: the existing one with the lines of ``IGNORED`` it lacks appended (None: it has them)."""
    path = root / GITIGNORE
    old = path.read_bytes() if path.is_file() else b""
    have = {line.strip() for line in old.decode(errors="replace").splitlines()}
    missing = [line for line in IGNORED if line not in have]
    if not missing:
        return None
    gap = b"" if not old or old.endswith(b"\n") else b"\n"
    block = "# stability: run output (records, MLflow store, report) ignored, the committed baselines kept\n"
    return old + gap + (block + "\n".join(missing) + "\n").encode()


def check_factory(factory: str, preset: str) -> list[str]:
    """Import ``factory`` and call it once per arm of the table ``stability init`` writes, on a tiny batch, as
    the suites will (``stability.cases.experiment.check_arm_models``): ConfigError naming the problem, else
    one line per arm saying what was found."""
    from stability.cases.experiment import check_arm_models
    from stability.config import resolve

    found = check_arm_models(resolve(preset, {"model.factory": factory, "run.device": "cpu"}), suites=True)
    return [f"{arm['arm']} arm: {arm['parameters']:,} parameters ({arm['gate_parameters']:,} in the gate), "
            f"{arm['blocks']} blocks, observer calls {', '.join(arm['observed'])}" for arm in found]


# ----------------------------------------------------------------------------- the command

def cmd_init(args) -> int:
    root, factory = Path.cwd(), args.factory or ""
    initial = {key.name: key.initial for key in KEYS}
    preset, baselines = initial["preset"], initial["baselines"]
    try:
        if factory:
            ModelConfig(factory=factory)   # ConfigError unless "package.module:function"
        settings_path, settings_bytes = new_settings_file(root, factory, args.force)
        workflow = root / WORKFLOW
        if workflow.exists() and not args.force:
            raise Refused(f"{workflow} already exists: not overwritten (run stability init --force to replace it)")
        found = check_factory(factory, preset) if factory else []
    except ConfigError as error:
        print(f"error: {error}; nothing written", file=sys.stderr)
        return 2
    package, note = stability_requirement()
    branch = default_branch(root)
    settings_path.write_bytes(settings_bytes)
    workflow.parent.mkdir(parents=True, exist_ok=True)
    text = workflow_text(settings_path.name, preset, baselines, package, own_model=not factory, branch=branch)
    workflow.write_text(text)
    ignore = gitignore_bytes(root)
    if ignore is not None:
        (root / GITIGNORE).write_bytes(ignore)
    where = "[tool.stability] in pyproject.toml" if settings_path.name == PYPROJECT else OWN_FILE
    model = f"model.factory = {args.factory!r}" if args.factory else "the harness's own model (set model.factory)"
    if factory:
        print(f"model.factory {factory!r} imports and builds each arm's model as the suites need it:")
        for line in found:
            print(f"    {line}")
    print(f"wrote {where}: preset {preset} on the cpu, {model}")
    print(f"wrote {WORKFLOW}: the CPU job ({preset}) and the GPU job (gpu-pr, cuda), run on pull requests and on "
          f"pushes to {branch}; the nightly job (full, cuda, four GPUs)")
    print(f"{'wrote' if ignore is not None else 'kept'} {GITIGNORE}: {' and '.join(IGNORED)} (the run output is "
          f"not committed, the baselines are)")
    if note:
        print(f"note: {note}")
    print("next, make the first baseline (commit it with the settings, the workflow and .gitignore):")
    print("    stability baseline make")
    print("then check a change the way the workflow's CPU job does, with its commands (the check runs, and judges, "
          "also when the suites fail):")
    for command in job_commands(text, "stress-cpu", f"{baselines}/{preset}-cpu.json"):
        print(f"    {command}")
    return 0


def add_parsers(sub) -> None:
    init = sub.add_parser("init", help="write the settings table and the CI workflow of the stability check "
                                       "into this repository")
    init.add_argument("--factory", metavar="PACKAGE.MODULE:FUNCTION",
                      help="your model's factory (model.factory; docs/your-repository.md); default: the "
                           "harness's own model")
    init.add_argument("--force", action="store_true", help="replace an existing settings table and workflow")
    init.set_defaults(func=cmd_init)
