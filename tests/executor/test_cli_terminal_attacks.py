"""A second reader's attacks on terminal safety, each a raw control sequence or rich markup on the main it
was written against: `runbook demo`'s first line (its log folder's name), and argparse's usage errors
(`unrecognized arguments:` quotes argv as given)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executor.faces.cli import main
from sandbox import demo
from tests.clirun import runbook_cli

TINY = """\
name: tiny
hosts:
  gpu: {address: local}
secrets:
  HF_TOKEN: {env: HF_TOKEN}
steps:
  - {id: hello, kind: shell, script: echo hello}
"""


def test_the_demo_s_lines_show_the_log_folder_as_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the first line went through rich markup, so `[red]` vanished and an ESC reached the terminal."""
    logs = tmp_path / "logs [red]x[/red] \x1b]0;t\x07"
    book = tmp_path / "tiny.yaml"
    book.write_text(TINY)

    @contextlib.contextmanager
    def site(log_dir: Path, ssh: str, say: Any, **_sweep: Any) -> Iterator[demo.DemoSite]:
        inventory = log_dir.resolve() / "demo-host" / "inventory.yaml"
        inventory.parent.mkdir(parents=True)
        inventory.write_text("vars: {}\n")
        yield demo.DemoSite(book, inventory, "hf_local_hub_token", "embedded", inventory.parent)

    monkeypatch.setattr(demo, "demo_site", site)
    assert main(["demo", "--log-dir", str(logs)]) == 0
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith("demo: tiny.yaml against the test host") and "\x1b" not in err
    assert f"laid over with {tmp_path}/logs [red]x[/red] \\x1b]0;t\\x07/demo-host/inventory.yaml" in first


def test_a_usage_error_shows_argv_escaped() -> None:
    """Before: `runbook: error: unrecognized arguments: ` and the ESC, BEL and override as given."""
    done = runbook_cli("plan", "book.yaml", "\x1b]0;t\x07 \u202e")
    assert done.returncode == 2
    assert "unrecognized arguments: \\x1b]0;t\\x07 \\u202e" in done.stderr
    assert not {"\x1b", "\x07", "\u202e"} & set(done.stderr)


ACCENTS = """\
name: caf\u00e9 \u2713
hosts:
  box: {address: local}
steps:
  - {id: say, kind: shell, retry: {attempts: 1}, script: 'echo "\u65e5\u672c \U0001f600"; exit 1'}
"""


def test_an_encoding_without_the_host_s_characters_shows_their_escapes(tmp_path: Path) -> None:
    """stdout in ASCII (cron, a serial console; Latin-1 alike): `status`, `runs` and `audit show` write a
    character it lacks as `shown` writes an escape. Before: a UnicodeEncodeError traceback, exit 1."""
    book, logs = tmp_path / "accents.yaml", tmp_path / "logs"
    book.write_text(ACCENTS, encoding="utf-8")
    assert runbook_cli("run", str(book), "--log-dir", str(logs)).returncode == 1
    (run_dir,) = logs.iterdir()
    env = {"PYTHONIOENCODING": "ascii"}
    for command in (
        ["status", "--log-dir", str(logs)],
        ["runs", "--log-dir", str(logs)],
        ["audit", "show", str(run_dir)],
    ):
        done = runbook_cli(*command, env=env)
        assert done.returncode == 0, done.stderr
        assert "\\u2713" in done.stdout if command[0] != "audit" else "\\u65e5\\u672c \\U0001f600" in done.stdout
