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
  else the branch checked out, else main);
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
import subprocess
import sys
import textwrap
import tomllib
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


HEADER = """\
# Stability check of this repository's model (written by `stability init`): the stability stress suites
# (pytest --pyargs stability.suites -m stress, configured by the settings in @SETTINGS@), their records into the
# job's own run directory ($STABILITY_RUN_DIR, named by the workflow run), then the regression check of exactly
# that directory against the committed baseline of the preset and device (@BASELINES@/<preset>-<device>.json,
# made by `stability baseline make`; no job passes without it). The regression table goes to the job summary;
# reports/ (records, report, JUnit XML) is uploaded; the job fails when a figure regressed (exit 1), changed
# (exit 3) or the inputs are unusable (exit 2).
#
# Which job gates merges (make them the branch's required checks): on a pull request, the CPU job (stress-cpu,
# @PRESET@ on the CPU) and the GPU job (stress-gpu, gpu-pr on one GPU, 240 minutes). The `full` preset runs nightly
# (stress-nightly, on the schedule) on a runner with 4 GPUs, one per pytest-xdist worker: it gates nothing, its
# failure is a failed nightly run. What a preset's job and baseline cost: `stability plan --preset NAME --gpu h200`.
name: stability

on:
  pull_request:
  push:
    branches: [@BRANCH@]
  schedule:
    - cron: "0 1 * * *"   # nightly: the full preset (stress-nightly)
  workflow_dispatch:
    inputs:
      nightly:
        description: >-
          With baseline: make the nightly job's baseline (full, 4 GPUs) instead of the pull-request jobs' ones.
        required: false
        default: false
        type: boolean
      baseline:
        description: >-
          Make a baseline on the runners instead of checking: "all" (the whole baseline), or the stress cases to
          remake (comma-separated, e.g. "standard"), keeping the committed baseline's other cases. The new
          baseline, its calibration and what moved from the committed one are uploaded for a maintainer to review
          and commit.
        required: false
        default: ""
        type: string

concurrency:
  group: stability-${{ github.ref }}
  cancel-in-progress: true

jobs:
"""

PULL_REQUEST = "github.event_name != 'schedule' && (github.event_name != 'workflow_dispatch' || inputs.baseline == '')"

GPU_JOB = """\
  stress-gpu:
    name: stress (gpu-pr, cuda)
    if: @PULL_REQUEST@
    runs-on: [self-hosted, gpu]
    timeout-minutes: 240
    env:
      BASELINE: @BASELINES@/gpu-pr-cuda.json
      STABILITY_RUN_DIR: reports/runs/job-${{ github.run_id }}-${{ github.run_attempt }}-cuda
      STABILITY_PACKAGE: "@PACKAGE@"
    steps:
      - uses: actions/checkout@v4
      - name: install (the runner provides the CUDA build of torch >= 2.11 and triton >= 3.6)
        run: |
          python3 -m venv --system-site-packages .venv
          . .venv/bin/activate
          pip install "$STABILITY_PACKAGE"
          pip install -e .
          python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU on this runner'"
      - name: stress suites
        id: stress
        run: |
          . .venv/bin/activate
          pytest --pyargs stability.suites -m stress --scale gpu-pr --device cuda --junitxml=reports/junit-stress-gpu-pr.xml
@KERNEL_GPU@"""

CPU_JOB = """\
  stress-cpu:
    name: stress (@PRESET@, cpu)
    if: @PULL_REQUEST@
    runs-on: ubuntu-latest
    timeout-minutes: 60
    env:
      BASELINE: @BASELINES@/@PRESET@-cpu.json
      STABILITY_RUN_DIR: reports/runs/job-${{ github.run_id }}-${{ github.run_attempt }}-cpu
      STABILITY_PACKAGE: "@PACKAGE@"
      # the plots go into the job's report, not again into the MLflow store of each case: reports/ stays small
      STABILITY_PLOTS: "0"
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - name: install (CPU build of torch)
        run: |
          python -m venv .venv
          . .venv/bin/activate
          pip install "torch>=2.11" --index-url https://download.pytorch.org/whl/cpu
          pip install "$STABILITY_PACKAGE"
          pip install -e .
      - name: stress suites
        id: stress
        run: |
          . .venv/bin/activate
          pytest --pyargs stability.suites -m stress --scale @PRESET@ --device cpu -n 2 --dist loadfile --junitxml=reports/junit-stress-@PRESET@.xml
@KERNEL_CPU@"""

KERNEL_GPU = """\
      - name: kernel suite (compiled Triton kernels)
        id: kernel
        if: always()
        run: |
          . .venv/bin/activate
          pytest --pyargs stability.suites -m kernel --junitxml=reports/junit-kernel-gpu-pr.xml
"""

KERNEL_CPU = """\
      - name: kernel agreement (Triton interpreter)
        id: kernel
        if: always()
        run: |
          . .venv/bin/activate
          pytest --pyargs stability.suites -m agreement -n 0 --junitxml=reports/junit-kernel.xml
"""

CHECK_STEPS = """\
      - name: regression check
        id: check
        if: always()
        run: |
          . .venv/bin/activate
          if [ ! -f "$BASELINE" ]; then
            make="stability baseline make --preset @JOB_PRESET@ --device @JOB_DEVICE@ --out $BASELINE"
            echo "::error::no committed baseline $BASELINE: no job passes without one. Make it on this runner with '$make' and commit it"
            printf '### Stability check: :warning: UNUSABLE INPUT\\n\\nNo committed baseline `%s`: make it on this runner with `%s` and commit it.\\n' "$BASELINE" "$make" >> "$GITHUB_STEP_SUMMARY"
            echo "code=2" >> "$GITHUB_OUTPUT"; exit 0
          fi
          set +e
          stability check --baseline "$BASELINE" "$STABILITY_RUN_DIR" --json reports/check.json @JUNIT@
          echo "code=$?" >> "$GITHUB_OUTPUT"
      - name: report
        if: always()
        run: |
          . .venv/bin/activate
          if [ -f "$BASELINE" ]; then
            stability report "$STABILITY_RUN_DIR" --out reports/report.html --baseline "$BASELINE"
          else
            stability report "$STABILITY_RUN_DIR" --out reports/report.html
          fi
      - name: upload reports
        if: always()
        uses: actions/upload-artifact@v4
        with:
          name: stability-reports-@JOB_PRESET@-@JOB_DEVICE@
          path: reports/
      - name: fail on a regression
        if: always() && steps.check.outputs.code != '0'
        run: |
          echo "::error::stability check exit code ${{ steps.check.outputs.code }} (1 regressed, 2 unusable input, 3 changed)"
          exit 1
"""


BASELINE_STEPS = """\
      - name: make the baseline on this runner
        run: |
          . .venv/bin/activate
          mkdir -p @BASELINES@/new
          if [ "$CASES" = "all" ]; then
            stability baseline make --preset @JOB_PRESET@ --device @JOB_DEVICE@ --out "$NEW_BASELINE"
          else
            cp "$BASELINE" "$NEW_BASELINE"
            stability baseline make --preset @JOB_PRESET@ --device @JOB_DEVICE@ --cases "$CASES" --out "$NEW_BASELINE"
          fi
      - name: compare with the committed baseline
        if: always()
        run: |
          . .venv/bin/activate
          if [ -f "$BASELINE" ] && [ -f "$NEW_BASELINE" ]; then
            stability baseline compare "$BASELINE" "$NEW_BASELINE" > reports/baseline-compare.txt
            { echo "### New baseline \\`$NEW_BASELINE\\` against \\`$BASELINE\\`"; echo; echo '```'; cat reports/baseline-compare.txt; echo '```'; } >> "$GITHUB_STEP_SUMMARY"
          fi
      - name: upload the new baseline
        if: always()
        uses: actions/upload-artifact@v4
        with:
          name: stability-baseline-@JOB_PRESET@-@JOB_DEVICE@
          path: reports/
"""


def nightly_job(gpu_job: str) -> str:
    """The nightly job: ``gpu_job`` on the ``full`` preset, on a runner with four GPUs, one per pytest-xdist worker
    (docs/scale-out.md: by the plan ``full`` cannot fit the 240 minutes of a pull request's job)."""
    return (gpu_job.replace("  stress-gpu:", "  stress-nightly:", 1)
            .replace("name: stress (gpu-pr, cuda)", "name: stress (full, cuda, nightly)")
            .replace("if: @PULL_REQUEST@", "if: github.event_name == 'schedule'")
            .replace("runs-on: [self-hosted, gpu]", "runs-on: [self-hosted, gpu, gpu-4]")
            .replace("timeout-minutes: 240", "timeout-minutes: 600")
            .replace("gpu-pr-cuda.json", "full-cuda.json")
            .replace("-${{ github.run_attempt }}-cuda\n", "-${{ github.run_attempt }}-cuda-nightly\n")
            .replace("--scale gpu-pr --device cuda --junitxml=reports/junit-stress-gpu-pr.xml",
                     "--scale full --device cuda -n 4 --dist loadfile --junitxml=reports/junit-stress-full.xml")
            .replace("junit-kernel-gpu-pr.xml", "junit-kernel-full.xml"))


def baseline_job(stress_job: str, job_preset: str, job_device: str, nightly: bool = False) -> str:
    """The job that makes a baseline on the runner of ``stress_job`` (its text up to its stress step, the
    same install), dispatched by hand with the input ``baseline`` (and ``nightly`` for the nightly job's)."""
    head = stress_job[:stress_job.index("      - name: stress suites")]
    head = head.replace("if: @PULL_REQUEST@" if not nightly else "if: github.event_name == 'schedule'",
                        "if: github.event_name == 'workflow_dispatch' && inputs.baseline != '' && "
                        + ("inputs.nightly" if nightly else "!inputs.nightly"))
    head = head.replace("  stress-", "  baseline-", 1).replace("    name: stress (", "    name: baseline (", 1)
    head = head.replace("timeout-minutes: 240", "timeout-minutes: 720").replace("timeout-minutes: 600",
                                                                                "timeout-minutes: 2880")
    name = f"{job_preset}-cuda" if job_device == "cuda" else "@PRESET@-cpu"
    head = head.replace(f"      BASELINE: @BASELINES@/{name}.json\n", f"      BASELINE: @BASELINES@/{name}.json\n"
                        f"      NEW_BASELINE: @BASELINES@/new/{name}.json\n      CASES: ${{{{ inputs.baseline }}}}\n")
    head = "\n".join(line for line in head.splitlines() if "STABILITY_RUN_DIR" not in line) + "\n"
    steps = BASELINE_STEPS.replace("@JOB_PRESET@", job_preset).replace("@JOB_DEVICE@", job_device)
    if nightly:
        steps = steps.replace('--out "$NEW_BASELINE"\n', '--out "$NEW_BASELINE" -- -n 4 --dist loadfile\n')
    return head + steps


def workflow_text(settings_file: str, preset: str, baselines: str, package: str, own_model: bool,
                  branch: str = "main") -> str:
    """The workflow: the GPU job (gpu-pr, cuda), the nightly job (full, cuda, four GPUs) and the CPU job
    (``preset``, cpu), as this package's own has them; the kernel steps only when the arms train the harness's
    own model (the code they check); pushes to ``branch`` run it."""
    def job(text: str, kernel: str, job_preset: str, job_device: str, junit: list[str]) -> str:
        text = text.replace("@KERNEL_GPU@", kernel).replace("@KERNEL_CPU@", kernel) + CHECK_STEPS
        junit = " ".join(f"--junit reports/{name}" for name in junit)   # the tests' outcome: one verdict
        return text.replace("@JOB_PRESET@", job_preset).replace("@JOB_DEVICE@", job_device).replace("@JUNIT@", junit)

    gpu = job(GPU_JOB, KERNEL_GPU if own_model else "", "gpu-pr", "cuda",
              ["junit-stress-gpu-pr.xml"] + (["junit-kernel-gpu-pr.xml"] if own_model else []))
    nightly = nightly_job(gpu).replace("@JOB_PRESET@", "full").replace("stability-reports-gpu-pr-cuda",
                                                                       "stability-reports-full-cuda-nightly")
    nightly = nightly.replace("--preset gpu-pr --device cuda", "--preset full --device cuda")
    nightly = nightly.replace("--junit reports/junit-stress-gpu-pr.xml", "--junit reports/junit-stress-full.xml")
    text = (HEADER + gpu + "\n" + nightly + "\n"
            + job(CPU_JOB, KERNEL_CPU if own_model else "", preset, "cpu",
                  [f"junit-stress-{preset}.xml"] + (["junit-kernel.xml"] if own_model else []))
            + "\n  # A baseline made where the job runs (dispatched by hand with the input `baseline`): the reference "
              "runs and their\n  # rounding replicates of every case (\"all\") or of the cases named, merged into "
              "the committed baseline.\n"
            + baseline_job(GPU_JOB, "gpu-pr", "cuda") + "\n"
            + baseline_job(nightly_job(GPU_JOB), "full", "cuda", nightly=True).replace(
                "stability-baseline-full-cuda", "stability-baseline-full-cuda-nightly") + "\n"
            + baseline_job(CPU_JOB, preset, "cpu"))
    return (text.replace("@SETTINGS@", settings_file).replace("@PRESET@", preset).replace("@PULL_REQUEST@", PULL_REQUEST)
            .replace("@BASELINES@", baselines).replace("@PACKAGE@", package).replace("@BRANCH@", branch))


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
