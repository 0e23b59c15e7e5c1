"""The commands that need no SSH import nothing they do not use (issue 17: a CLI that starts fast).

Each command runs in a fresh interpreter, through `executor.faces.cli.main` as the console script calls it, and
the modules it left in `sys.modules` are read back: a behaviour test, not a timed one (bench/startup.py
measures the time). `run` against an SSH host is the control: it does import asyncssh, so the check sees
what a command imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLAGSHIP = REPO / "runbooks" / "k26_dflash.yaml"

#: What no command that needs no SSH may import: the SSH library, plotting, the programs shipped to hosts,
#: the Hub's client, the run's retrying and diagnostics, the engine and the SSH transport, the MCP SDK.
NEVER = ("asyncssh", "matplotlib", "hostprograms", "huggingface_hub", "tenacity", "structlog", "executor.run.engine")
NEVER += ("executor.transport.ssh", "executor.run.events", "rich.traceback", "rich.live", "pygments", "mcp")
#: ... nor, for those that only read a run folder, the runbook's parts: YAML, pydantic, Jinja2, asyncio.
NO_RUNBOOK = ("yaml", "pydantic", "jinja2", "asyncio", "executor.runbook.loader", "steps", "importlib.metadata")

PROBE = """
import json, sys
from executor.faces.cli import main
try:
    code = main(sys.argv[2:])
except SystemExit as exc:  # --help
    code = exc.code
with open(sys.argv[1], "w") as out:
    json.dump({"code": code, "modules": sorted(sys.modules)}, out)
"""


def imported(tmp_path: Path, *argv: str) -> tuple[int, set[str]]:
    """The exit status of `runbook ARGV` in a fresh interpreter, and every module it imported."""
    found = tmp_path / "modules.json"
    subprocess.run(
        [sys.executable, "-c", PROBE, str(found), *argv],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=True,
    )
    said = json.loads(found.read_text())
    return said["code"], set(said["modules"])


def among(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The modules of `modules` that are one of `names` or inside one of them (a package's modules)."""
    return sorted(m for m in modules if any(m == n or m.startswith(f"{n}.") for n in names))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder of a real run (the local demo runbook), with a report for `runbook report` to show."""
    logs = tmp_path_factory.mktemp("startup") / "logs"
    code, _ = imported(logs.parent, "run", str(REPO / "runbooks" / "demo_local.yaml"), "--log-dir", str(logs))
    assert code == 0
    (folder,) = logs.iterdir()
    provenance = {"generated_at": "2026-12-02T00:00:00Z", "repos": [], "deployments": [], "gpus": None}
    report = {
        "title": "demo",
        "notes": ["a note"],
        "tables": [{"title": "t", "columns": ["a", "b"], "rows": [["1", "2"]]}],
        "figures": [],
        "provenance": provenance | {"benchmarks": [], "unknown": {}},
    }
    (folder / "report.json").write_text(json.dumps(report))
    return folder


READERS = {
    "status": lambda d: ["status", "--log-dir", str(d.parent)],
    "runs": lambda d: ["runs", "--log-dir", str(d.parent)],
    "audit show": lambda d: ["audit", "show", str(d)],
    "report": lambda d: ["report", str(d)],
    "--help": lambda d: ["--help"],
}


@pytest.mark.parametrize("command", list(READERS))
def test_a_command_that_reads_a_run_folder_imports_neither_the_run_nor_the_runbook_s_parts(
    command: str, run_dir: Path, tmp_path: Path
) -> None:
    code, modules = imported(tmp_path, *READERS[command](run_dir))
    assert code == 0
    assert among(modules, NEVER + NO_RUNBOOK) == []


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_validate_and_plan_import_no_ssh_no_host_program_and_no_run(command: str, tmp_path: Path) -> None:
    code, modules = imported(tmp_path, command, str(FLAGSHIP))
    assert code == 0
    assert among(modules, NEVER) == []
    assert {"yaml", "pydantic", "jinja2", "steps.deploy"} <= modules  # what they do need: the check sees imports


#: What a kind's run reads or writes, which no `validate` or `plan` of the flagship (one node per server) defines:
#: the benchmark's facts, report, provenance and figures, the probe's facts, the node group's documents.
RUN_ONLY = (
    "steps.benchmark_report",
    "steps.benchmark_figures",
    "steps.provenance",
    "steps.probe_facts",
    "steps.server.node_group",
)
TWO_NODES = REPO / "runbooks" / "sites" / "two_h100_nodes.yaml"


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_validate_and_plan_leave_the_kinds_run_time_models_undefined(command: str, tmp_path: Path) -> None:
    """Issue 29, item 12: defining ~50 facts and report models (pydantic collects each field at class creation,
    validators deferred or not) was a good part of `validate`'s start; those modules are imported by the step that
    runs. The controls: a node group's plan does import its module, and `schema --report` the report's."""
    code, modules = imported(tmp_path, command, str(FLAGSHIP))
    assert code == 0
    assert among(modules, RUN_ONLY) == []
    code, grouped = imported(tmp_path, command, str(FLAGSHIP), "--inventory", str(TWO_NODES))
    assert code == 0
    assert "steps.server.node_group" in grouped
    _, reported = imported(tmp_path, "schema", "--report")
    assert {"steps.benchmark_report", "steps.provenance"} <= reported


def test_validate_imports_the_kinds_the_runbook_uses_and_no_other(tmp_path: Path) -> None:
    """Kinds come through entry points, each imported when a runbook uses it (README, "Add a kind")."""
    code, modules = imported(tmp_path, "validate", str(REPO / "runbooks" / "demo_local.yaml"))  # shell steps
    assert code == 0
    assert among(modules, ("steps",)) == ["steps", "steps.shell"]


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_validate_and_plan_print_plain_text_without_rich_and_open_no_audit_log(
    command: str, run_dir: Path, tmp_path: Path
) -> None:
    """`validate` and `plan` write their lines with print: rich's console (and its text) and the audit log's
    reader stay unloaded (issue 29, item 12: `plan` loaded rich to print a text without styles); `status`
    prints a table through rich, so it is the control."""
    code, modules = imported(tmp_path, command, str(FLAGSHIP))
    assert code == 0
    assert among(modules, ("rich", "executor.run.audit")) == []
    _, listed = imported(tmp_path, *READERS["status"](run_dir))
    assert {"rich.console", "rich.table"} <= listed


BUILT = """
import json, sys
from pydantic import BaseModel
from executor.faces.cli import main
from executor.runbook.model import Model
code = main(sys.argv[2:])
def subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from subclasses(sub)
built = {f"{c.__module__}.{c.__qualname__}": c.__pydantic_complete__ for c in subclasses(BaseModel)}
runbook = {f"{c.__module__}.{c.__qualname__}" for c in subclasses(Model)}
with open(sys.argv[1], "w") as out:
    json.dump({"code": code, "built": built, "runbook": sorted(runbook)}, out)
"""


def test_validate_builds_the_validators_of_the_kinds_it_checks_and_of_no_facts_or_report_model(tmp_path: Path) -> None:
    """A kind's facts, its host programs' documents and the reports are models too; `validate` imports every
    kind with them but checks a runbook only: building their validators at import was most of its start."""
    found = tmp_path / "built.json"
    argv = [sys.executable, "-c", BUILT, str(found), "validate", str(FLAGSHIP)]
    subprocess.run(
        argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, timeout=120, check=True
    )
    said = json.loads(found.read_text())
    assert said["code"] == 0
    ours = {name: done for name, done in said["built"].items() if name.startswith("steps.")}
    data = {name for name in ours if name not in said["runbook"]}
    assert {"steps.download.DownloadFacts", "steps.verify.VerifyFacts", "steps.server.documents.DeployFacts"} <= data
    assert sorted(name for name in data if ours[name]) == []
    assert ours["steps.deploy.DeployStep"] and ours["steps.benchmark.BenchmarkStep"]  # what it checked: built


def test_plan_builds_the_validator_of_its_document_and_of_none_of_its_parts(tmp_path: Path) -> None:
    """`plan` makes its document's parts (steps, hosts, variants, gates, ...) unvalidated and validates the whole
    once: one validator built, not one per part model."""
    found = tmp_path / "built.json"
    argv = [sys.executable, "-c", BUILT, str(found), "plan", str(FLAGSHIP)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(argv, cwd=REPO, env=env, capture_output=True, timeout=120, check=True)
    said = json.loads(found.read_text())
    planner = {name for name in said["built"] if name.startswith("executor.runbook.planner.")}
    assert len(planner) >= 10  # the check sees the part models
    assert sorted(name for name in planner if said["built"][name]) == ["executor.runbook.planner.PlanDocument"]


TOKENIZED = """
import sys, tokenize
from executor.faces.cli import main
code = main(sys.argv[1:])
print(code, tokenize._compile.cache_info().currsize)
"""


def test_validate_parses_no_builtin_s_signature_from_its_text() -> None:
    """pydantic reads each default factory's signature when it builds a model; `default_factory=list` made it parse
    `list`'s from its text, compiling tokenize's regex (~3 ms of `validate`'s start): no factory of a runbook's
    models is a builtin, so tokenize's regex is never compiled."""
    argv = [sys.executable, "-c", TOKENIZED, "validate", str(FLAGSHIP)]
    done = subprocess.run(
        argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["0", "0"], done.stderr


def test_a_run_on_an_ssh_host_does_import_asyncssh(tmp_path: Path) -> None:
    """The control: a run whose host refuses the connection (port 1 on 127.0.0.1) fails, having used SSH."""
    book = tmp_path / "refused.yaml"
    book.write_text(
        "name: refused\nhosts:\n  box: {address: 127.0.0.1, port: 1}\n"
        "steps:\n  - id: one\n    kind: shell\n    script: 'true'\n"
    )
    code, modules = imported(tmp_path, "run", str(book), "--log-dir", str(tmp_path / "logs"))
    assert code == 1
    assert {"asyncssh", "tenacity", "structlog", "executor.run.engine", "executor.transport.ssh"} <= modules


def test_the_package_names_its_api_and_imports_each_part_on_first_use() -> None:
    code = (
        "import sys, executor; before = 'executor.run.engine' in sys.modules; "
        "assert all(getattr(executor, name) for name in executor.__all__); "
        "print(before, 'executor.run.engine' in sys.modules, executor.Engine.__module__, "
        "executor.CommandResult.__name__)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True", "executor.run.engine", "CommandResult"]
    with pytest.raises(AttributeError, match="no attribute 'Engin'"):
        import executor

        _ = executor.Engin  # type: ignore[attr-defined]


EXIT = """
import atexit, gc, runpy, sys
atexit.register(lambda: sys.stderr.write(f"\\nfrozen at exit: {gc.get_freeze_count()}\\n"))
sys.argv = ["runbook", *sys.argv[1:]]
runpy.run_module("executor.faces.cli", run_name="__main__")
"""


@pytest.mark.parametrize(("book", "code"), [(FLAGSHIP, 0), (REPO / "pyproject.toml", 2)], ids=["ok", "invalid"])
def test_the_process_exits_with_mains_status_leaving_its_heap_to_the_os(book: Path, code: int) -> None:
    """`python -m executor.faces.cli` (and the `runbook` script, `entry`) ends without the interpreter collecting every
    object the command loaded, one by one (bench/RESULTS.md, 9c): before, nothing was frozen at exit."""
    done = subprocess.run(
        [sys.executable, "-c", EXIT, "validate", str(book)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == code, done.stderr
    frozen = int(done.stderr.rsplit("frozen at exit: ", 1)[1])
    assert frozen > 10_000, frozen  # the pydantic models, validators and modules validate loaded (~40 000)
