"""The renderer: a fixed wrapper, scripts and vars as stdin bytes, heredocs with safe delimiters.

These tests run the rendered output through a real bash (and shellcheck); the transports'
own tests (test_transport.py) run it locally and over SSH.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor import render
from executor.render import (
    BASH_OWNED_NAMES,
    MASK,
    PAYLOAD_END,
    UNATTENDED_ENV,
    WRAPPER,
    WRAPPER_SHA256,
    RenderedCommand,
    export_block,
    heredoc,
    render_command,
)

# Text a var or a heredoc body may hold: anything but NUL (no environment carries it) and
# lone surrogates (not encodable as UTF-8).
TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
# Fragments that hit the quoting and heredoc corner cases more often than random text does.
NASTY = st.sampled_from(
    ["'", '"', "\\", "$(id)", "`id`", "${X}", "\n", "\r\n", "EOF", "RUNBOOK_EOF_", "\nRUNBOOK_EOF_x\n", "é", "✓", "*"]
)
NASTY_TEXT = st.lists(st.one_of(TEXT, NASTY), max_size=12).map("".join)

TRICKY_VALUES = {
    "SINGLE": "it's",
    "DOUBLE": 'say "hi"',
    "SUBST": "$(touch /tmp/x)",
    "BACKTICK": "`touch /tmp/x`",
    "BACKSLASH": "\\",
    "TRAILING_BACKSLASH": "a\\",
    "NEWLINE": "a\nb\n",
    "CRLF": "a\r\nb",
    "EMPTY": "",
    "GLOB": "*",
    "DASH": "-n",
    "UNICODE": "héllo ✓",
    "INJECT": "'; touch /tmp/pwned; '",
}

# Intentional in what the renderer emits, so excluded from shellcheck (info level only):
# SC2016: `$1` in single quotes is meant for the inner bash; `'$(x)'` in an export is literal data.
# SC1003: `'\'` in an export is a literal backslash, not an attempt to escape a quote.
SHELLCHECK = ["shellcheck", "--shell=bash", "--exclude=SC2016,SC1003"]


def bash(script: str | bytes, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    data = script.encode() if isinstance(script, str) else script
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", data], input=stdin, capture_output=True, timeout=30, check=False
    )


def run_rendered(
    script: str | bytes | RenderedCommand,
    env: dict[str, str] | None = None,
    payload: bytes | None = None,
    *,
    hold_stdin: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """Run the rendered command as a transport does: stdin stays open until the command ends
    (closing it early is the wrapper's signal to kill the step), unless `hold_stdin` is off."""
    command = script if isinstance(script, RenderedCommand) else render_command(script, env or {})
    proc = subprocess.Popen(command.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin and proc.stdout and proc.stderr
    proc.stdin.write(command.stdin if payload is None else payload)
    proc.stdin.flush()
    if not hold_stdin:
        proc.stdin.close()
    try:
        stdout, stderr = proc.stdout.read(), proc.stderr.read()  # outputs here are small
        returncode = proc.wait(timeout=30)
    finally:
        if not proc.stdin.closed:
            proc.stdin.close()
    return subprocess.CompletedProcess(command.argv, returncode, stdout, stderr)


# --- render_command ---------------------------------------------------------------------


def test_script_travels_on_stdin_never_in_argv() -> None:
    script = "echo 'MARKER_in_script' \"$(id)\"\n"
    command = render_command(script, {"V": "MARKER_in_var"})
    assert command.argv[:5] == ("bash", "--noprofile", "--norc", "-c", WRAPPER)
    assert command.argv[5] == "runbook"
    env_len, body_len = int(command.argv[6]), int(command.argv[7])
    assert body_len == len(script.encode())
    assert command.stdin[env_len:] == script.encode() + PAYLOAD_END
    assert len(command.stdin) == env_len + body_len + len(PAYLOAD_END)
    assert all("MARKER" not in arg for arg in command.argv)
    assert "MARKER" not in command.command_line


def test_wrapper_is_the_same_for_every_script() -> None:
    scripts = ["", "echo hi", "x" * 200_000, b"\xff\x00\r\n"]
    argvs = {render_command(s, {"A": "b"}).argv[:6] for s in scripts}
    assert len(argvs) == 1


def test_str_and_bytes_scripts_render_the_same() -> None:
    text = "echo héllo\r\nprintf 'x'"
    assert render_command(text, {}) == render_command(text.encode(), {})


def test_command_line_parses_back_to_argv() -> None:
    command = render_command("echo hi", {"A": "it's"})
    assert shlex.split(command.command_line) == ["exec", *command.argv]


def test_unattended_env_is_exported_and_vars_follow() -> None:
    command = render_command("true", {"A": "1"})
    env_len = int(command.argv[6])
    assert command.stdin[:env_len].decode() == export_block({**UNATTENDED_ENV, "A": "1"})
    assert UNATTENDED_ENV["DEBIAN_FRONTEND"] == "noninteractive"


def test_env_is_what_the_export_block_exports() -> None:
    """One definition of a step's environment: the wrapper's export block and the runner's data."""
    command = render_command("true", {"A": "it's"}, secrets={"TOKEN": "s3cret"})
    assert command.env == {**UNATTENDED_ENV, "A": "it's", "TOKEN": "s3cret"}
    assert command.stdin.startswith(export_block(command.env).encode())
    assert "env=" not in repr(command)


@pytest.mark.parametrize("name", sorted(BASH_OWNED_NAMES))
@pytest.mark.parametrize("as_secret", [False, True])
def test_names_bash_sets_itself_are_refused(name: str, as_secret: bool) -> None:
    """The wrapper's `. env` cannot export them alike on every path (readonly, or reset by each bash)."""
    with pytest.raises(ValueError, match=f"bash sets {re.escape(name)} itself"):
        render_command("true", {}, secrets={name: "1"}) if as_secret else render_command("true", {name: "1"})


def test_secrets_are_delivered_but_masked_in_display() -> None:
    command = render_command("echo run", {"PLAIN": "visible"}, secrets={"TOKEN": "hunter2-s3cret"})
    assert b"hunter2-s3cret" in command.stdin
    assert "hunter2-s3cret" not in command.display
    assert f"export TOKEN={MASK}" in command.display or f"export TOKEN='{MASK}'" in command.display
    assert "export PLAIN=visible" in command.display
    assert f"sha256:{WRAPPER_SHA256[:16]}" in command.display
    assert WRAPPER not in command.display
    assert command.display.endswith("echo run")


def test_secret_reaches_the_script() -> None:
    command = render_command('printf %s "$TOKEN"', {}, secrets={"TOKEN": "hunter2 's3cret'"})
    done = run_rendered(command)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"hunter2 's3cret'"


# --- the wrapper, run by a real bash ------------------------------------------------------


def test_wrapper_runs_script_with_its_vars() -> None:
    done = run_rendered('printf "%s|%s" "$A" "$DEBIAN_FRONTEND"; exit 3', {"A": "it's $(x)"})
    assert done.returncode == 3
    assert done.stdout == b"it's $(x)|noninteractive"


@pytest.mark.parametrize("cut", [1, 10])
def test_wrapper_refuses_a_truncated_payload(cut: int) -> None:
    command = render_command("echo SHOULD_NOT_RUN", {"A": "1"})
    done = run_rendered("echo SHOULD_NOT_RUN", {"A": "1"}, command.stdin[:-cut], hold_stdin=False)
    assert done.returncode == 125
    assert b"SHOULD_NOT_RUN" not in done.stdout
    assert b"did not arrive whole" in done.stderr


def test_wrapper_ignores_bytes_after_the_payload() -> None:
    command = render_command("echo ran", {})
    done = run_rendered("echo ran", {}, command.stdin + b"echo EXTRA\n")
    assert done.returncode == 0
    assert done.stdout == b"ran\n"


def test_closing_stdin_early_kills_the_step() -> None:
    # Right after the start the step may not have its own process group yet (setsid not run):
    # the kill must reach it anyway. Repeated, as that window is short.
    for _ in range(20):
        done = run_rendered("sleep 0.5; echo finished", {}, hold_stdin=False)
        assert done.returncode != 0
        assert b"finished" not in done.stdout


@settings(max_examples=60, deadline=None)
@given(value=TEXT)
def test_export_block_round_trips_through_bash(value: str) -> None:
    done = bash(export_block({"V": value}).encode() + b'printf %s "$V"; bash -c \'printf %s "$V"\'')
    assert done.returncode == 0, done.stderr
    assert done.stdout == value.encode() * 2


def test_export_block_injection_stays_literal(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    values = {
        f"V{i}": v
        for i, v in enumerate(
            [
                f"'; touch {pwned}; '",
                f"$(touch {pwned})",
                f"`touch {pwned}`",
                f'"; touch {pwned}; "',
                f"\\'; touch {pwned} #",
            ]
        )
    }
    script = export_block(values) + "".join(f'printf "%s\\n" "${name}"\n' for name in values)
    done = bash(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().splitlines() == list(values.values())
    assert not pwned.exists()


# --- shellcheck -------------------------------------------------------------------------


def shellcheck(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed")
    path = tmp_path / "check.sh"
    path.write_text(text)
    return subprocess.run([*SHELLCHECK, str(path)], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    "script", ["echo hi", "", "x" * 10_000, "printf 'é\\r\\n'"], ids=["simple", "empty", "long", "crlf-unicode"]
)
def test_shellcheck_passes_on_the_emitted_wrapper(tmp_path: Path, script: str) -> None:
    wrapper = render_command(script, TRICKY_VALUES).argv[4]
    done = shellcheck(tmp_path, wrapper)
    assert done.returncode == 0, done.stdout


def test_shellcheck_passes_on_the_command_line(tmp_path: Path) -> None:
    done = shellcheck(tmp_path, render_command("echo hi", TRICKY_VALUES).command_line + "\n")
    assert done.returncode == 0, done.stdout


def test_shellcheck_passes_on_the_export_block(tmp_path: Path) -> None:
    done = shellcheck(tmp_path, export_block({**UNATTENDED_ENV, **TRICKY_VALUES}))
    assert done.returncode == 0, done.stdout


def test_shellcheck_passes_on_a_heredoc(tmp_path: Path) -> None:
    done = shellcheck(tmp_path, heredoc("import os\nprint(os.environ['HOME'], '$(x)', `y`)\nEOF\n", "python3 -"))
    assert done.returncode == 0, done.stdout


# --- heredoc ----------------------------------------------------------------------------

DELIMITER = re.compile(r"<<'(RUNBOOK_EOF_[0-9a-f]{16})'\n")


def delimiter_of(text: str) -> str:
    match = DELIMITER.search(text.split("\n", 1)[0] + "\n")
    assert match, text
    return match.group(1)


def test_heredoc_shape() -> None:
    text = heredoc("line one\nline two", "python3 -")
    delimiter = delimiter_of(text)
    assert text == f"python3 - <<'{delimiter}'\nline one\nline two\n{delimiter}\n"


def test_heredoc_delimiter_is_random() -> None:
    delimiters = {delimiter_of(heredoc("same body\n")) for _ in range(20)}
    assert len(delimiters) == 20


def test_a_fixed_heredoc_delimiter_is_kept_unless_a_line_of_the_body_is_it() -> None:
    assert heredoc("FIXED inside a line\n", delimiter="FIXED").startswith("cat <<'FIXED'\n")
    body = "before\nFIXED\nafter\n"
    text = heredoc(body, delimiter="FIXED")
    assert delimiter_of(text) != "FIXED" and bash(text).stdout == body.encode()


def test_heredoc_delimiter_avoids_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = iter(["a" * 16, "a" * 16, "b" * 16])

    class FixedRandom:
        @staticmethod
        def token_hex(n: int) -> str:
            assert n == 8
            return next(tokens)

    monkeypatch.setattr(render, "_random", FixedRandom)
    body = "before\nRUNBOOK_EOF_" + "a" * 16 + "\nafter\n"
    text = heredoc(body)
    assert delimiter_of(text) == "RUNBOOK_EOF_" + "b" * 16
    done = bash(text)
    assert done.stdout == body.encode()


def test_heredoc_body_with_delimiter_lookalikes_runs() -> None:
    body = (
        "EOF\nRUNBOOK_EOF_\nRUNBOOK_EOF_x\n'RUNBOOK_EOF_0123456789abcdef'\n$(id) `id` ${HOME} \\ 'q' \"d\"\nno newline"
    )
    done = bash(heredoc(body))
    assert done.returncode == 0, done.stderr
    assert done.stdout == (body + "\n").encode()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=NASTY_TEXT)
def test_heredoc_round_trips_through_bash(body: str) -> None:
    text = heredoc(body)
    assert delimiter_of(text) not in body
    done = bash(text)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (body if body.endswith("\n") else body + "\n").encode()
