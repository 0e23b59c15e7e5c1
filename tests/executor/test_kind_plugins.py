"""Step kinds as plugins (README, "Add a kind"): the example package examples/runbook-kind-example, installed
by pip into a folder of its own, adds `disk_free` to a runbook run on this machine without touching this
repository; every kind of steps/ comes through the same entry-point group; a broken plugin is named.

The broken plugins are distributions' metadata as an installer leaves it (a `*.dist-info` folder with
METADATA and entry_points.txt) on a folder put on sys.path: what `importlib.metadata` reads, nothing faked.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executor.faces.cli import main
from executor.stepkind import ENTRY_POINT_GROUP, StepSpec, _entry_points, step_kinds

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "runbook-kind-example"


@pytest.fixture(scope="module")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example package as pip installs it (its own folder: the test environment is left as it is)."""
    site, source = tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("example") / "src"
    shutil.copytree(EXAMPLE, source)  # setuptools builds in the source folder: not in the checkout
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-index"]
    pip += ["--no-build-isolation", "--target", str(site), str(source)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return site


def runbook_cli(site: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`runbook ARGV` in a fresh interpreter that sees the installed example (a new process: a new `sys.path`)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(site)])}
    command = [sys.executable, "-m", "executor.faces.cli", *argv]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_an_installed_package_adds_a_kind_that_a_runbook_runs(example_site: Path, tmp_path: Path) -> None:
    book = tmp_path / "room.yaml"
    book.write_text(
        textwrap.dedent(f"""\
        name: room
        hosts:
          box: {{address: local}}
        steps:
          - {{id: room, kind: disk_free, path: {tmp_path}}}
          - {{id: too_little, kind: disk_free, path: {tmp_path}, min_free_gb: 1e12, retry: {{attempts: 3}}}}
        """)
    )
    logs = tmp_path / "logs"
    ran = runbook_cli(example_site, "run", str(book), "--log-dir", str(logs))
    assert ran.returncode == 1, ran.stderr
    shown = runbook_cli(example_site, "status", "--log-dir", str(logs), "--json")
    room, too_little = json.loads(shown.stdout)["steps"]
    assert room["status"] == "passed" and room["facts"]["path"] == str(tmp_path)
    assert 0 < room["facts"]["free_bytes"] <= room["facts"]["total_bytes"]
    assert too_little["status"] == "failed" and too_little["attempts"] == 1  # a definite value: not retried
    assert "not retried: GateFalse: less than 1e+12 GB free under" in too_little["message"]

    unknown = runbook_cli(REPO, "validate", str(book))  # the same runbook where the package is not installed
    assert (
        unknown.returncode == 2 and f"{book}:5:" in unknown.stderr and "unknown step kind 'disk_free'" in unknown.stderr
    )


def test_every_kind_of_steps_is_registered_through_the_entry_point_group() -> None:
    """pyproject.toml's table names every StepSpec subclass of steps/ with a kind, by that kind's name."""
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]
    defined = {}
    for module in sorted((REPO / "steps").glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ClassDef):  # `kind: Literal["name"] = "name"` in a class's body
                for line in node.body:
                    if isinstance(line, ast.AnnAssign) and ast.unparse(line.target) == "kind" and line.value:
                        defined[ast.literal_eval(line.value)] = f"steps.{module.stem}"
    assert {name: value.partition(":")[0] for name, value in table.items()} == defined
    installed = {point.name: point.value for point in _entry_points().values()}  # `pip install -e .` made
    assert installed == table, "run `pip install -e .` again: the installed entry points are not pyproject's"
    assert all(isinstance(kind, type) and issubclass(kind, StepSpec) for kind in dict(step_kinds()).values())


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path where a test installs distributions' metadata; the entry points read afresh."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    _entry_points.cache_clear()
    yield site
    _entry_points.cache_clear()


def install(site: Path, distribution: str, entries: dict[str, str], module: str | None = None) -> None:
    """What pip leaves for `distribution`: its dist-info (METADATA, entry_points.txt) and its module's source."""
    info = site / f"{distribution.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entries.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")
    if module is not None:
        name = next(iter(entries.values())).partition(":")[0]
        (site / f"{name}.py").write_text(textwrap.dedent(module))


def validate(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, more: str = "") -> tuple[int, str]:
    book = tmp_path / "book.yaml"
    book.write_text(f"name: t\nsteps:\n  - {{id: s, kind: {kind}{more}}}\n")
    code = main(["validate", str(book)])
    return code, capsys.readouterr().err


def test_a_plugin_taking_a_built_in_kind_s_name_is_refused_naming_it(plugins: Path, tmp_path: Path, capsys) -> None:
    install(plugins, "shady-kinds", {"shell": "shady:Shell"})
    code, err = validate(tmp_path, capsys, "shell")
    assert code == 2 and "Traceback" not in err
    assert "step kind 'shell' of distribution 'shady-kinds' (shady:Shell) clashes with the built-in kind 'shell'" in err
    assert "of distribution 'runbook' (steps.shell:ShellStep)" in err


def test_looking_kinds_up_reads_no_distribution_s_metadata_unless_two_name_one_kind(
    plugins: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A distribution's name is its METADATA, parsed by the email parser at each read: read for every kind,
    it was a third of `validate`'s start (issue 29, item 12). Only a clash, which names both, reads it."""
    reads: list[str] = []
    metadata = importlib.metadata.Distribution.metadata

    def counted(dist: importlib.metadata.Distribution) -> Any:
        reads.append(str(getattr(dist, "_path", dist)))
        return metadata.fget(dist)  # type: ignore[attr-defined]

    monkeypatch.setattr(importlib.metadata.Distribution, "metadata", property(counted))
    assert main(["validate", str(REPO / "runbooks" / "k26_dflash.yaml")]) == 0
    assert reads == []
    install(plugins, "shady-kinds", {"shell": "shady:Shell"})
    _entry_points.cache_clear()
    assert validate(tmp_path, capsys, "shell")[0] == 2
    assert len(set(reads)) == 2  # the two that name `shell`: the clash names both


def test_a_plugin_that_fails_to_import_is_named_when_its_kind_is_used(plugins: Path, tmp_path: Path, capsys) -> None:
    install(plugins, "broken-kinds", {"broken_kind": "broken_kind:Broken"}, "import no_such_module\n")
    code, err = validate(tmp_path, capsys, "broken_kind")
    assert code == 2 and "Traceback" not in err
    assert (
        "step kind 'broken_kind' of distribution 'broken-kinds' (broken_kind:Broken) cannot be imported: "
        "ModuleNotFoundError: No module named 'no_such_module'" in err
    )
    assert validate(tmp_path, capsys, "shell", ", script: 'true'")[0] == 0  # a runbook not using it: not stopped


def test_a_plugin_whose_object_is_not_its_kind_is_named(plugins: Path, tmp_path: Path, capsys) -> None:
    source = """\
        from typing import Literal
        from executor import StepSpec
        class Other(StepSpec):
            kind: Literal["other_name"] = "other_name"
        NOT_A_KIND = 3
        """
    install(plugins, "mixed-kinds", {"misnamed": "mixed_kinds:Other", "not_a_kind": "mixed_kinds:NOT_A_KIND"}, source)
    code, err = validate(tmp_path, capsys, "misnamed")
    assert code == 2 and "declares kind: Literal['other_name'], not 'misnamed'" in err
    code, err = validate(tmp_path, capsys, "not_a_kind")
    assert code == 2
    assert "distribution 'mixed-kinds' (mixed_kinds:NOT_A_KIND) is no subclass of executor.stepkind.StepSpec" in err


def test_what_a_plugin_prints_while_imported_goes_to_stderr_not_into_json(
    plugins: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """stdout is data (`plan --json`, `run --json`'s events, the MCP server's stream): a plugin's print must not
    make it unreadable."""
    source = """\
        from typing import Literal
        from executor import StepSpec
        print("noisy_kind imported")
        class Noisy(StepSpec):
            kind: Literal["noisy"] = "noisy"
            def render(self, ctx):
                return "true"
        """
    install(plugins, "noisy-kinds", {"noisy": "noisy_kind:Noisy"}, source)
    book = tmp_path / "book.yaml"
    book.write_text("name: t\nhosts:\n  box: {address: local}\nsteps:\n  - {id: s, kind: noisy}\n")
    assert main(["plan", str(book), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["steps"][0]["kind"] == "noisy" and "noisy_kind imported" in err


def test_a_plugin_that_exits_while_imported_is_named_not_obeyed(
    plugins: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sys.exit(0)` in a plugin's module must not end `validate` with 0, as if the runbook were valid."""
    install(plugins, "exiting-kinds", {"exiting": "exiting_kind:Exiting"}, "import sys\nsys.exit(0)\n")
    code, err = validate(tmp_path, capsys, "exiting")
    assert code == 2 and "Traceback" not in err
    assert (
        "step kind 'exiting' of distribution 'exiting-kinds' (exiting_kind:Exiting) cannot be imported: SystemExit: 0"
        in err
    )


def test_where_no_kind_is_registered_the_message_says_to_install_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """runbook installed (editable) before its kinds became entry points, or not installed: not `(known: )`."""
    monkeypatch.setattr("executor.stepkind._entry_points", dict)
    monkeypatch.setattr(StepSpec, "registry", {})
    code, err = validate(tmp_path, capsys, "shell", ", script: 'true'")
    assert code == 2 and "unknown step kind 'shell' (known: none: no step kind is registered under" in err
    assert "run `pip install -e .` again where runbook is checked out" in err
