"""The machine in the evidence: records name the machine they were made on (stability/record/machine.py,
``env.machine``), kept null and zoo jobs name the commit, the git tree and the machine they ran
(validation/regression_zoo.py), the null table counts jobs per machine (validation/null_jobs.py), and
`stability check` says which machines the false-alarm rate rests on and whether the job's is among them."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
from _stability_records import pair_record, with_replicates

from stability.check import baseline as baselines
from stability.check import baseline_schema
from stability.check import calibration as cal
from stability.check import regression as reg
from stability.cli import main
from stability.record import RecordError, validate_record
from stability.record.machine import (
    describe,
    isa_flags,
    machine_key,
    machines_of,
    record_machine,
    torch_build,
)

HERE = {"cpu": "Intel(R) Xeon(R) Processor", "isa": ["avx", "avx2", "avx512f", "fma"], "cpu_capability": "AVX512",
        "torch": {"version": "2.13.0+cpu", "cuda": None, "blas": "mkl", "lapack": "mkl", "onednn": "3.12.0",
                  "mkldnn_available": True}, "gpu": None}
ELSEWHERE = {**HERE, "cpu": "AMD EPYC 7763 64-Core Processor", "isa": ["avx", "avx2", "fma"], "cpu_capability": "AVX2",
             "torch": {**HERE["torch"], "blas": "open"}}


def on(machine: dict | None, records: list[dict]) -> list[dict]:
    """Copies of ``records`` made on ``machine`` (None: written before records named their machine)."""
    out = copy.deepcopy(records)
    for record in out:
        record["env"].pop("machine", None)
        if machine is not None:
            record["env"]["machine"] = copy.deepcopy(machine)
    return out


# ----------------------------------------------------------------------------- describe() and machine_key()

def test_describe_names_this_machine():
    """The CPU's model, its rounding-relevant SIMD flags (sorted, from ISA_FLAGS), torch's dispatch level, the
    torch build's BLAS / LAPACK / oneDNN, and no GPU for a CPU device."""
    import platform

    import torch

    machine = describe("cpu")
    assert set(machine) == {"cpu", "isa", "cpu_capability", "torch", "gpu"}
    assert isinstance(machine["cpu"], str) and machine["cpu"]
    if Path("/proc/cpuinfo").is_file():
        models = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.split(":")[0].strip() == "model name"]
        assert machine["cpu"] == (models[0] if models else platform.processor() or platform.machine())
        assert machine["isa"] == sorted(machine["isa"])
        if platform.machine() in ("x86_64", "AMD64"):
            assert "sse4_2" in machine["isa"] and "pni" not in machine["isa"]   # only the listed flags
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["torch"]["version"] == str(torch.__version__) and machine["torch"]["cuda"] == torch.version.cuda
    assert machine["torch"]["blas"] and machine["torch"]["blas"] in torch.__config__.show()
    assert machine["torch"]["mkldnn_available"] is torch.backends.mkldnn.is_available()
    assert machine["gpu"] is None
    assert json.loads(json.dumps(machine)) == machine   # plain JSON
    assert describe("cpu") == machine                   # the same machine described twice


def test_the_machine_key_is_short_stable_and_names_what_changes_rounding():
    key = machine_key(HERE)
    assert key == "Intel(R) Xeon(R) Processor | AVX512 | torch 2.13.0+cpu mkl"
    assert machine_key(json.loads(json.dumps(HERE, sort_keys=True))) == key        # key order, a JSON round trip
    assert machine_key({**HERE, "isa": ["avx"]}) == key                            # the flags stay in the record
    assert machine_key(ELSEWHERE) != key
    assert machine_key({**HERE, "torch": {**HERE["torch"], "version": "2.12.0"}}) != key
    assert machine_key({**HERE, "gpu": "NVIDIA H100 80GB HBM3"}) == key + " | NVIDIA H100 80GB HBM3"
    assert machine_key({}) == "? | ? | torch ? ?"                                   # never raises on a sparse one
    here = describe("cpu")
    assert machine_key(here) == machine_key(describe("cpu")) and len(machine_key(here)) < 120


def test_the_torch_build_and_the_flags_are_read_from_their_text():
    shown = ("  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa7)\n  - Build settings: BLAS_INFO=open, BUILD_TYPE=Release, "
             "LAPACK_INFO=open, TORCH_VERSION=2.13.0, ")
    assert torch_build(shown) == {"blas": "open", "lapack": "open", "onednn": "3.12.0"}
    assert torch_build("  - Intel(R) oneDNN v2.7.3\n") == {"blas": None, "lapack": None, "onednn": "2.7.3"}
    assert torch_build("") == {"blas": None, "lapack": None, "onednn": None}
    cpuinfo = "processor\t: 0\nmodel name\t: X\nflags\t\t: fpu sse4_2 avx2 fma pni avx512_bf16\n\nprocessor\t: 1\n"
    assert isa_flags(cpuinfo) == ["avx2", "avx512_bf16", "fma", "sse4_2"]
    assert isa_flags("processor\t: 0\nFeatures\t: fp asimd sve bf16\n") == ["asimd", "bf16", "sve"]
    assert isa_flags("") is None


def test_the_machine_module_imports_no_torch():
    """stability.record reads JSON without torch: the machine module imports it only inside describe()."""
    import sys

    code = ("import sys\nfrom stability.record.machine import machine_key\nfrom stability.record import build\n"
            "assert 'torch' not in sys.modules, 'torch imported'\nprint(machine_key({}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


# ----------------------------------------------------------------------------- the record

def test_records_name_their_machine_and_old_records_still_read():
    """env_info keeps describe() under env.machine; a record with it validates, one without it (written before)
    too, and a machine with a key the schema does not know is refused."""
    from stability.record import env_info

    env = env_info("cpu")
    assert env["machine"] == describe("cpu") and env["device"] == "cpu"
    record = on(env["machine"], [pair_record()])[0]
    assert validate_record(record, "r") is record and record_machine(record) == env["machine"]
    old = on(None, [pair_record()])[0]
    assert validate_record(old, "old") is old and record_machine(old) is None
    wrong = on({**HERE, "cores": 2}, [pair_record()])[0]
    with pytest.raises(RecordError, match="env.machine.cores is not a key of Machine"):
        validate_record(wrong, "wrong")
    assert machines_of([record, old, record]) == ({machine_key(env["machine"]): 2}, 1)


def test_describing_the_machine_changes_no_figure():
    """The machine is metadata: the same config and seed train the same numbers whether or not the record's
    environment is described (describe() touches no random state and no torch setting)."""
    import torch

    torch.manual_seed(0)
    first = torch.randn(64, 64) @ torch.randn(64, 64)
    state = torch.get_rng_state()
    describe("cpu")
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(0)
    assert torch.equal(torch.randn(64, 64) @ torch.randn(64, 64), first)


# ----------------------------------------------------------------------------- kept jobs: commit, tree, machine

def _git(where: Path, *arguments: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *arguments], cwd=where, check=True,
                          capture_output=True, text=True).stdout.strip()


def _checkout(path: Path) -> Path:
    path.mkdir()
    _git(path, "init", "-q")
    (path / ".gitignore").write_text("ignored.txt\nreports/runs/\n")
    (path / "a.txt").write_text("one\n")
    workflow = path / ".github" / "workflows" / "stability.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text("name: stability\n")
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "one")
    return path


def test_the_tree_of_a_checkout_is_its_working_files(tmp_path):
    """tree_of: the commit's tree when clean; uncommitted and untracked (not ignored) files change it, ignored
    ones do not; a copy made by fresh_copy has the checkout's tree, a patched copy another; the checkout's
    index and status are untouched; None outside a git checkout."""
    from validation.regression_zoo import tree_of
    from validation.workflow import fresh_copy

    source = _checkout(tmp_path / "source")
    assert tree_of(source) == _git(source, "rev-parse", "HEAD^{tree}")
    (source / "ignored.txt").write_text("not the code\n")
    assert tree_of(source) == _git(source, "rev-parse", "HEAD^{tree}")
    (source / "a.txt").write_text("two\n")
    (source / "new.txt").write_text("new\n")
    status = _git(source, "status", "--porcelain")
    index = (source / ".git" / "index").read_bytes()
    changed = tree_of(source)
    assert changed and changed != _git(source, "rev-parse", "HEAD^{tree}")
    assert _git(source, "status", "--porcelain") == status and (source / ".git" / "index").read_bytes() == index
    _git(source, "add", "-A")
    assert _git(source, "write-tree") == changed   # what committing the working files would store
    _git(source, "reset", "-q")
    fresh_copy(tmp_path / "copy", source)
    assert tree_of(source, tmp_path / "copy") == changed
    (tmp_path / "copy" / "a.txt").write_text("patched\n")
    assert tree_of(source, tmp_path / "copy") not in (None, changed)
    (tmp_path / "plain").mkdir()
    assert tree_of(tmp_path / "plain") is None


def test_a_kept_job_names_the_commit_the_tree_and_the_machine(tmp_path, monkeypatch):
    """run_entry keeps, with the job, the commit of its checkout (code_of), the tree of the files the job ran
    (tree_of, the entry's patch included) and the machine (describe()); kept and read back, they are there. A
    job kept before jobs named them reads as unrecorded (None), never an error."""
    from types import SimpleNamespace

    from validation import regression_zoo as zoo

    source = _checkout(tmp_path / "source")
    record = on(HERE, [pair_record()])[0]

    def fake_job(workflow, job, copy, install=None, env=None, timeout=None):
        session = copy / "reports" / "runs" / "20260101T000000-run-abc123"
        session.mkdir(parents=True)
        (session / "manifest.json").write_text("{}")
        (session / "r.json").write_text(json.dumps(record, allow_nan=False))
        return SimpleNamespace(steps={}, log=lambda: "")

    monkeypatch.setattr(zoo, "run_job", fake_job)
    monkeypatch.setattr(zoo, "KEPT", tmp_path / "kept")
    document = zoo.run_entry(zoo.UNCHANGED, "smoke", tmp_path / "work", name="draw500", source=source)
    zoo.keep("smoke", document)
    kept = zoo.read_kept("smoke", "draw500")
    assert kept["code"] == _git(source, "rev-parse", "HEAD")
    assert kept["tree"] == _git(source, "rev-parse", "HEAD^{tree}")   # unchanged code: the commit's own tree
    assert kept["machine"] == describe("cpu") and zoo.job_machine(kept) == kept["machine"]
    assert [r["env"]["machine"] for r in kept["records"]] == [HERE]
    old = {k: v for k, v in kept.items() if k not in ("tree", "machine")}
    assert zoo.job_machine(old) == HERE                                 # the records name it
    older = {**old, "records": on(None, old["records"])}
    assert zoo.job_machine(older) is None and older.get("tree") is None


# ----------------------------------------------------------------------------- the null table, per machine

def _row(replicate: int, machine: dict | None, failed: bool = False) -> dict:
    """A judged null job (``regression_zoo.judged``'s keys the table reads)."""
    return {"entry": f"draw{replicate}", "failed": failed, "regressed": [], "stress_failures": [], "errors": [],
            "kernel_exit": 0, "margin": "12", "seconds": 180.0, "code": "0123456789abcdef", "tree": None,
            "machine": machine}


def test_the_null_table_groups_the_jobs_by_machine():
    from validation import null_jobs

    rows = [_row(20, HERE), _row(21, ELSEWHERE, failed=True), _row(22, HERE), _row(23, None), _row(24, HERE)]
    text = null_jobs.table(rows, "smoke", {"commit": "abc", "replicates": [0, 1]}, chose={"draw24"})
    lines = text.splitlines()
    start = lines.index("| machine | jobs | failed | 95% upper bound (exact) |")
    section = lines[start + 2:lines.index("", start)]
    escaped = {key: key.replace("|", "\\|") for key in (machine_key(HERE), machine_key(ELSEWHERE))}
    assert section == [f"| {escaped[machine_key(ELSEWHERE)]} | 1 | 1 | 100.0% |",
                       f"| {escaped[machine_key(HERE)]} | 2 | 0 | 77.6% |",
                       f"| {null_jobs.UNRECORDED} | 1 | 0 | 95.0% |"]   # draw24 chose the rule: not counted
    assert "| 4 | 1 | 25.0% |" in text   # the whole count stays as it was
    assert null_jobs.machines([r for r in rows if r["entry"] != "draw24"]) == {machine_key(ELSEWHERE): 1,
                                                                              machine_key(HERE): 2}
    old = null_jobs.table([_row(20, None), _row(21, None)], "smoke", {"commit": "abc", "replicates": [0, 1]})
    assert f"| {null_jobs.UNRECORDED} | 2 | 0 | 77.6% |" in old


# ----------------------------------------------------------------------------- the check

@pytest.fixture(scope="module")
def record():
    return pair_record(seeds=(0, 1, 2))


@pytest.fixture(scope="module")
def baseline(record):
    return baselines.make_baseline(with_replicates(record), commit="abc123")


def _measured(baseline: dict, machines: dict | None) -> dict:
    return {**baseline, "null_jobs": cal.null_job_evidence(150, 0, "abc", list(range(20, 170)), 31.0, machines)}


def test_the_check_names_the_machines_of_its_rate_and_whether_the_jobs_is_among_them(record, baseline):
    here, elsewhere = machine_key(HERE), machine_key(ELSEWHERE)
    measured = _measured(baseline, {here: 120, elsewhere: 30})
    same = reg.check(on(HERE, [record]), measured)
    assert same.exit_code == 0 and same.job_machines == {here: 1}
    assert same.rate_lines()[-1] == (f"  machines of the null jobs: {here} (120 jobs), {elsewhere} (30 jobs); "
                                     f"this job's machine: {here} (among them)")
    other = {**HERE, "cpu": "Apple M3"}
    away = reg.check(on(other, [record]), measured)
    assert away.rate_lines()[-1].endswith(f"this job's machine: {machine_key(other)} (not among them: the rate is "
                                          f"unmeasured on it)")
    assert away.exit_code == 0 and away.rate_lines()[-1] in away.table()   # a statement, never a failure
    assert away.to_dict()["machines"] == {"job": {machine_key(other): 1}, "job_records_unrecorded": 0,
                                          "null_jobs": {elsewhere: 30, here: 120}, "measured_on_job_machine": False}
    partly = reg.check(on(other, [record]), _measured(baseline, {here: 100}))   # 50 jobs on machines unrecorded
    assert partly.rate_lines()[-1] == (f"  machines of the null jobs: {here} (100 jobs), not recorded (50 jobs kept "
                                       f"before jobs named their machine); this job's machine: {machine_key(other)} "
                                       f"(not among those recorded: the rate may be unmeasured on it)")
    old_baseline = reg.check(on(HERE, [record]), _measured(baseline, None))
    assert old_baseline.rate_lines()[-1] == f"  machines of the null jobs: machines not recorded; this job's machine: {here}"
    assert old_baseline.to_dict()["machines"]["measured_on_job_machine"] is None
    old_records = reg.check(on(None, [record]), measured)
    assert old_records.rate_lines()[-1].endswith("this job's machine: not recorded")
    assert reg.check(on(HERE, [record]), baseline).rate_lines()[-1] == f"  this job's machine: {here}"


def test_the_baseline_keeps_the_null_jobs_machines_and_old_baselines_load(tmp_path, baseline):
    here = machine_key(HERE)
    measured = _measured(baseline, {here: 150})
    assert measured["null_jobs"]["machines"] == {here: 150}
    assert "machines" not in _measured(baseline, None)["null_jobs"]   # as baselines were written before
    for document in (measured, _measured(baseline, None), _measured(baseline, {})):
        path = tmp_path / "b.json"
        path.write_text(json.dumps(document, allow_nan=False))
        assert baseline_schema.load_baseline(path)["null_jobs"] == document["null_jobs"]
    for machines, message in (({here: 151}, "machines counts 151 jobs, more than null_jobs.jobs = 150"),
                              ({here: 0}, "machines\\['.*'\\] = 0: expected a whole number >= 1"),
                              ({here: "2"}, "expected a whole number"), ({" ": 1}, "empty key")):
        with pytest.raises(RecordError, match=message):
            baseline_schema.validate_baseline(_measured(baseline, machines), "b")


def test_cli_check_prints_the_machines_and_writes_them_into_its_json(tmp_path, record, baseline, capsys):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(_measured(baseline, {machine_key(ELSEWHERE): 150}), allow_nan=False))
    job = tmp_path / "r.json"
    job.write_text(json.dumps(on(HERE, [record])[0], allow_nan=False))
    assert main(["check", "--baseline", str(path), str(job), "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert (f"  machines of the null jobs: {machine_key(ELSEWHERE)} (150 jobs); this job's machine: "
            f"{machine_key(HERE)} (not among them: the rate is unmeasured on it)") in out
    written = json.loads((tmp_path / "c.json").read_text())["machines"]
    assert written["job"] == {machine_key(HERE): 1} and written["measured_on_job_machine"] is False
