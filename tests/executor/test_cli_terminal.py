"""A hostile host's output, through the real CLI against the real sshd: never raw on the operator's terminal.

One run prints every class of control sequence (and a runbook carries some of its own); each test reads
one display of it (`run`'s console, `status`, `runs`, `audit show`, `report`, `plan`, a usage error) and
finds the escapes, never a raw control character, while the audit log and `--json` keep the exact text.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox.sshd import SSHServer
from tests.clirun import runbook_cli
from tests.executor.test_cli_report import PROVENANCE

# what the host prints: OSC 52 (clipboard), OSC 0 (title), clear screen, cursor moves, a one-byte C1 CSI,
# a bidi override, a bare CR, then text that only looks like an escape, rich markup and an emoji code
PAYLOAD = (
    "clip \x1b]52;c;ZXZpbA==\x07 title \x1b]0;pwned\x07 clear \x1b[2J cursor \x1b[10A\x1b[H c1 \x9b2J"
    " bidi \u202eevil\u202c cr real\rFAKE lookalike \\x1b markup [red]r[/red] [link=http://evil.example]l[/link]"
    " :thumbs_up:"
)
#: each raw character above, and how every display writes it
RAW = "\x1b\x07\x9b\u202e\u202c\r"
ESCAPED = [
    "clip \\x1b]52;c;ZXZpbA==\\x07",
    "title \\x1b]0;pwned\\x07",
    "clear \\x1b[2J",
    "cursor \\x1b[10A\\x1b[H",
    "c1 \\x9b2J",
    "bidi \\u202eevil\\u202c",
    "cr real\\x0dFAKE",
    "lookalike \\\\x1b",  # a literal backslash-x-1-b is told apart from an escaped ESC
    "markup [red]r[/red] [link=http://evil.example]l[/link] :thumbs_up:",  # never markup, never an emoji
]
SHOWN_PAYLOAD = " ".join(ESCAPED)
#: the runbook's own name and gate message carry a title sequence too (YAML's \e and \a)
NAME, NAME_SHOWN = "book \x1b]0;named\x07", "book \\x1b]0;named\\x07"
MESSAGE, MESSAGE_SHOWN = "gate says \x1b[2J\u202e", "gate says \\x1b[2J\\u202e"

RUNBOOK = """\
name: {name}
{hosts}
steps:
  - id: hostile
    kind: shell
    retry: {{attempts: 1}}
    script: {script}
    gates:
      - that: "'never printed' in stdout"
        message: {message}
"""


@dataclass(frozen=True)
class HostileRun:
    book: Path
    logs: Path
    run_dir: Path
    console: subprocess.CompletedProcess[str]  # `runbook run`
    events: subprocess.CompletedProcess[str]  # `runbook run --json`, in a log dir of its own


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`runbook ARGS` as into a pipe, each message whole on its line (how lines fit a terminal:
    tests/executor/test_console_width.py)."""
    done = runbook_cli(*args)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def assert_safe(shown: str, *expected: str) -> None:
    """No raw control character of the payload is in `shown`, and every expected escape is."""
    assert not [c for c in RAW if c in shown], shown
    for piece in expected:
        assert piece in shown, (piece, shown)


@pytest.fixture(scope="module")
def hostile(sshd: SSHServer, tmp_path_factory: pytest.TempPathFactory) -> HostileRun:
    root = tmp_path_factory.mktemp("hostile")
    book = root / "hostile.yaml"
    script = f"printf '%s\\n' '{PAYLOAD}'\n"
    # json.dumps writes each control character as \\uXXXX, which YAML's double-quoted scalars read back
    book.write_text(
        RUNBOOK.format(
            name=json.dumps(NAME), hosts=sshd.host_yaml(), script=json.dumps(script), message=json.dumps(MESSAGE)
        )
    )
    console = cli("run", str(book), "--log-dir", str(root / "logs"))
    events = cli("run", str(book), "--log-dir", str(root / "json-logs"), "--json")
    assert (console.returncode, events.returncode) == (1, 1), console.stderr
    (run_dir,) = [p for p in (root / "logs").iterdir() if p.is_dir()]
    return HostileRun(book, root / "logs", run_dir, console, events)


def test_the_run_console_shows_the_host_s_output_escaped(hostile: HostileRun) -> None:
    assert_safe(hostile.console.stderr, NAME_SHOWN, MESSAGE_SHOWN, f"output tail:\n    | {SHOWN_PAYLOAD}\n")


def test_status_shows_the_failure_message_and_its_output_tail_escaped(hostile: HostileRun) -> None:
    done = cli("status", "--log-dir", str(hostile.logs))
    assert done.returncode == 0
    assert_safe(done.stdout, NAME_SHOWN, MESSAGE_SHOWN, f"output tail:\n    | {SHOWN_PAYLOAD}\n")


def test_runs_shows_the_runbook_s_name_escaped(hostile: HostileRun) -> None:
    done = cli("runs", "--log-dir", str(hostile.logs))
    assert done.returncode == 0
    assert_safe(done.stdout, NAME_SHOWN)


def test_audit_show_shows_the_command_escaped(hostile: HostileRun) -> None:
    done = cli("audit", "show", str(hostile.run_dir))
    assert done.returncode == 0
    assert_safe(done.stdout, "printf '%s\\n' 'clip \\x1b]52;c;ZXZpbA==\\x07 title \\x1b]0;pwned\\x07")


def test_plan_shows_the_script_escaped(hostile: HostileRun) -> None:
    done = cli("plan", "--full", str(hostile.book))
    assert done.returncode == 0
    assert_safe(done.stdout, f"printf '%s\\n' '{SHOWN_PAYLOAD}'\n")
    summary = cli("plan", str(hostile.book))  # the readable plan: its first lines, wrapped, escaped as well
    assert summary.returncode == 0
    assert_safe(summary.stdout, "script: printf '%s\\n' 'clip \\x1b]52;c;ZXZpbA==\\x07 title")


def test_report_shows_a_stored_report_escaped(hostile: HostileRun) -> None:
    """A report's cells come from host facts; a run folder is data, whoever wrote it."""
    report = {
        "title": PAYLOAD,
        "notes": [PAYLOAD],
        "tables": [{"title": PAYLOAD, "columns": ["label", "value"], "rows": [[PAYLOAD, "1.0"]]}],
        "figures": [{"title": PAYLOAD, "path": "speedup.png"}],
        "provenance": PROVENANCE,
    }
    (hostile.run_dir / "report.json").write_text(json.dumps(report))
    try:
        done = cli("report", str(hostile.run_dir))
    finally:
        (hostile.run_dir / "report.json").unlink()
    assert done.returncode == 0
    assert_safe(done.stdout, f"- {SHOWN_PAYLOAD}\n", f"│ {SHOWN_PAYLOAD} │ 1.0", f"{SHOWN_PAYLOAD}: {hostile.run_dir}")
    assert done.stdout.count(SHOWN_PAYLOAD) == 5  # the title, the note, the table's title, its cell, the figure


def test_an_error_naming_hostile_input_shows_it_escaped(hostile: HostileRun) -> None:
    """Exit 2 messages (`runbook: ...`) quote what they were given: a run id, a folder, a --var."""
    for args, escaped in (
        (["status", "--log-dir", str(hostile.logs), "x\x1b]0;t\x07"], "no run x\\x1b]0;t\\x07 in"),
        (["report", str(hostile.logs / "x\x1b[2J\u202e")], "x\\x1b[2J\\u202e: no report.json"),
        (["run", str(hostile.book), "--var", "x\x1b]0;t\x07=1"], "unknown var 'x\\x1b]0;t\\x07'"),
    ):
        done = cli(*args)
        assert done.returncode == 2, done.stderr
        assert_safe(done.stderr, escaped)


def test_the_audit_log_keeps_the_exact_text(hostile: HostileRun) -> None:
    (record,) = [json.loads(line) for line in (hostile.run_dir / "audit.jsonl").read_text().splitlines()]
    assert record["stdout"] == PAYLOAD + "\n"
    assert PAYLOAD in record["command"]


def test_json_events_carry_the_exact_text_as_json_escapes(hostile: HostileRun) -> None:
    out = hostile.events.stdout
    assert not [c for c in out if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F], out
    assert "\\u001b]52;c;ZXZpbA==\\u0007" in out and "\\u202e" in out
    events = [json.loads(line) for line in out.splitlines()]
    (failed,) = [e for e in events if e["event"] == "attempt_failed"]
    assert PAYLOAD in failed["message"] and MESSAGE in failed["message"]
    assert not [c for c in RAW if c in hostile.events.stderr]
