"""A second reader's attacks on secret redaction at the command line, each a leak or a traceback on the
main it was written against: a `--var` pair holding a secret, quoted back in its problem; a `--var`
value that YAML cannot read; a secret or a var whose bytes are not UTF-8 (os.environ and argv hold them
as lone surrogates).
"""

from __future__ import annotations

import secrets
import shlex
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.errors import InvalidRunbook
from executor.redact import MIN_SECRET_CHARS, Redactor
from executor.run.resume import parse_var_args
from executor.runbook.loader import Runbook, load_runbook
from tests.clirun import runbook_cli

BOOK = """\
name: pasted
hosts:
  box: {address: local}
vars:
  url: https://hub.example/
secrets:
  TOKEN: {env: RB_PASTED_TOKEN}
steps:
  - id: echo
    kind: shell
    script: echo "$url"
"""


@pytest.fixture
def book(tmp_path: Path) -> Path:
    path = tmp_path / "runbook.yaml"
    path.write_text(BOOK)
    return path


def token() -> str:
    """A base64 token: its `=` padding makes a pasted one read as `NAME=` to a K=V parser."""
    return "k" + secrets.token_urlsafe(18)[:21] + "=="  # never `-...`, which argparse reads as an option


@pytest.mark.parametrize("command", ["plan", "run"])
@pytest.mark.parametrize("shape", ["{t}", "{t}x", "url:{t}", "nope=https://u:{t}@h/"])
def test_a_var_pair_holding_a_secret_is_refused_without_it(
    command: str, shape: str, book: Path, tmp_path: Path
) -> None:
    """Before: `--var:1:1: expected K=V, got 'TOKEN'`, or `unknown var 'TOKEN-less-its-padding'`."""
    value = token()
    args = [command, str(book), "--var", shape.format(t=value)]
    done = runbook_cli(
        *args, *(["--log-dir", str(tmp_path / "logs")] if command == "run" else []), env={"RB_PASTED_TOKEN": value}
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("--var:1:1: ") and "Traceback" not in done.stderr, done.stderr
    assert value.rstrip("=") not in done.stderr + done.stdout
    assert not (tmp_path / "logs").exists()


#: a secret's characters (`=` for the K=V split, quotes and a backslash for the repr) and those of the
#: pair around it, disjoint from each other and (but `=`) from the problems' own words
SECRET_CHARS = '0123456789QZ="\\é'
LEAKED = set(SECRET_CHARS) - {"="}
AROUND = "XY_.-"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Runbook:
    path = tmp_path_factory.mktemp("pasted") / "runbook.yaml"
    path.write_text(BOOK)
    return load_runbook(path, None)


@settings(max_examples=200, deadline=None)
@given(
    secret=st.text(SECRET_CHARS, min_size=MIN_SECRET_CHARS, max_size=24),
    shape=st.sampled_from(["{s}", "{a}{s}{b}", "{a}={s}{b}", "{s}={b}", "{a}{s}={b}"]),
    before=st.text(AROUND, max_size=6),
    after=st.text(AROUND, max_size=6),
)
def test_no_var_problem_quotes_a_character_of_a_secret(
    loaded: Runbook, secret: str, shape: str, before: str, after: str
) -> None:
    """Whatever a bad pair holds around a secret, its problem holds none of the secret's characters."""
    pair = shape.format(s=secret, a=before, b=after)
    with pytest.raises(InvalidRunbook) as refused:
        parse_var_args([pair], loaded, Redactor([secret]))
    said = "\n".join(problem.message for problem in refused.value.problems)
    assert not LEAKED & set(said), said


@pytest.mark.parametrize("value", ["[::1]:8080", "*{t}", "[{t}", "a: b: {t}", "@{t}"])
def test_a_var_value_yaml_cannot_read_is_its_text(value: str, book: Path) -> None:
    """Before: a yaml ParserError traceback (exit 1) that quoted the value, secret and all."""
    secret = token()
    done = runbook_cli(
        "plan", "--full", str(book), "--var", f"url={value.format(t=secret)}", env={"RB_PASTED_TOKEN": secret}
    )
    assert done.returncode == 0, done.stderr
    assert f"export url={shlex.quote(value.format(t=secret)).replace(secret, '***')}\n" in done.stdout
    assert secret not in done.stdout + done.stderr


def test_a_secret_whose_bytes_are_not_utf8_is_refused_at_its_line(book: Path, tmp_path: Path) -> None:
    """Before: a UnicodeEncodeError traceback from the redactor, for `plan` and `run` alike."""
    line = BOOK.splitlines().index("  TOKEN: {env: RB_PASTED_TOKEN}") + 1
    not_utf8 = "hf_abc\udcffdefghij"  # the byte 0xff, as os.environ holds it
    for command in (["plan", str(book)], ["run", str(book), "--log-dir", str(tmp_path / "logs")]):
        done = runbook_cli(*command, env={"RB_PASTED_TOKEN": not_utf8})
        assert done.returncode == 2, done.stderr
        said = f"{book}:{line}:3: secret TOKEN: the value of environment variable RB_PASTED_TOKEN is not valid UTF-8"
        assert done.stderr.startswith(said), done.stderr
        assert "hf_abc" not in done.stderr
    assert not (tmp_path / "logs").exists()


def test_a_var_whose_bytes_are_not_utf8_is_refused(book: Path, tmp_path: Path) -> None:
    """Before: `plan` ended in a UnicodeEncodeError traceback; `run` failed the step at the host."""
    for command in (["plan", str(book)], ["run", str(book), "--log-dir", str(tmp_path / "logs")]):
        done = runbook_cli(*command, "--var", "url=https://h/\udcff", env={"RB_PASTED_TOKEN": token()})
        assert done.returncode == 2, done.stderr
        assert done.stderr == "--var:1:1: url: the value is not UTF-8 text\n"
    assert not (tmp_path / "logs").exists()


URL = """\
name: url
hosts:
  box: {address: local}
secrets:
  DB_PASSWORD: {env: RB_DB_PASSWORD}
steps:
  - id: connect
    kind: shell
    retry: {attempts: 1}
    script: |
      python3 -c 'import os, urllib.parse as u; p = os.environ["DB_PASSWORD"]
      print(f"could not connect to postgresql://app:{u.quote(p, safe=str())}@db:5432/app")
      print(f"GET /login?password={u.quote_plus(p)}")' >&2
      exit 1
"""


def test_a_password_percent_encoded_in_a_url_is_masked(tmp_path: Path) -> None:
    """A password with `@`, `/`, `+` and a space, as a failing client prints its URL. Before, the tail
    showed `p%40ss%2Fw%2Brd%20x...` in full."""
    book, logs = tmp_path / "url.yaml", tmp_path / "logs"
    book.write_text(URL)
    password = f"p@ss/w+rd {secrets.token_hex(4)}"
    done = runbook_cli("run", str(book), "--log-dir", str(logs), env={"RB_DB_PASSWORD": password})
    assert done.returncode == 1, done.stderr
    assert "postgresql://app:***@db:5432/app" in done.stderr and "password=***" in done.stderr, done.stderr
    (run_dir,) = logs.iterdir()
    assert password[-8:] not in done.stderr + (run_dir / "audit.jsonl").read_text()


WIDE = """\
name: wide
hosts:
  box: {address: local}
secrets:
  TOKEN: {env: RB_WIDE_TOKEN}
steps:
  - id: wide
    kind: shell
    retry: {attempts: 1}
    script: |
      printf '%s' "$TOKEN" | iconv -t UTF-16LE; echo
      printf '%s' "$TOKEN" | iconv -t UTF-16BE >&2
    gates:
      - that: "'never' in stdout"
"""


def test_a_secret_printed_in_utf16_is_masked_in_the_console_status_and_audit(tmp_path: Path) -> None:
    """Before: the failure's output tail showed `h\\x00f\\x00_\\x00...`, the token a NUL between each character."""
    book, logs, secret = tmp_path / "wide.yaml", tmp_path / "logs", token()
    book.write_text(WIDE)
    env = {"RB_WIDE_TOKEN": secret}
    done = runbook_cli("run", str(book), "--log-dir", str(logs), env=env)
    assert done.returncode == 1, done.stderr
    status = runbook_cli("status", "--log-dir", str(logs), env=env)
    (run_dir,) = logs.iterdir()
    stored = (run_dir / "audit.jsonl").read_bytes().decode() + (run_dir / "state.db").read_bytes().decode("latin-1")
    for text in (done.stderr, status.stdout, stored):
        assert "| ***" in text or '"stdout":"***\\n"' in text, text
        for width in (secret.encode("utf-16-le"), secret.encode("utf-16-be")):
            assert width.decode() not in text
            assert width.decode().encode("unicode_escape").decode() not in text  # as `shown` or JSON escape it
        assert "\\x00".join(secret[:6]) not in text and "\\u0000".join(secret[:6]) not in text


MOVED = """\
name: moved
hosts:
  box: {{address: local}}
vars:
  url: https://hub.example/
secrets:
  TOKEN: {{env: RB_MOVED_TOKEN, required: false}}
steps:
  - id: once
    kind: shell
    retry: {{attempts: 1}}
    script: test -e {marker}
"""


def test_a_resume_masks_a_carried_var_holding_a_secret_set_since(tmp_path: Path) -> None:
    """A token first given in a `--var` (stored: no secret held it then), then exported as the secret
    before `--resume`: the line naming the carried flags masks it. Before, it printed the token in clear."""
    book, logs, marker, secret = tmp_path / "moved.yaml", tmp_path / "logs", tmp_path / "marker", token()
    book.write_text(MOVED.format(marker=marker))
    first = runbook_cli("run", str(book), "--log-dir", str(logs), "--var", f"url=https://u:{secret}@h/")
    assert first.returncode == 1, first.stderr
    marker.touch()
    done = runbook_cli("run", str(book), "--log-dir", str(logs), "--resume", env={"RB_MOVED_TOKEN": secret})
    assert done.returncode == 0, done.stderr
    assert "as it was started: --var url=https://u:***@h/\n" in done.stderr
    assert secret.rstrip("=") not in done.stderr + done.stdout


@settings(max_examples=200, deadline=None)
@given(
    secret=st.text("abcdefgh0123'", min_size=MIN_SECRET_CHARS, max_size=20),
    before=st.text('XY" ', max_size=8),
    after=st.text('XY" ', max_size=8),
)
def test_a_secret_quoted_within_a_longer_repr_is_masked(secret: str, before: str, after: str) -> None:
    """A repr of a longer string holding both quotes escapes the secret's `'` as `\\'` (the runner's
    stderr quoted in a note: `stderr: '+ export TOKEN="it\\'s..."'`). Before, that form was not masked."""
    shown = Redactor([secret]).text(repr(before + secret + after))[1:-1]
    assert not set(shown) & set("abcdefgh0123"), shown


PORT = """\
name: port
hosts:
  box: {address: local}
vars:
  port: 30000
secrets:
  TOKEN: {env: RB_PORT_TOKEN}
steps:
  - {id: serve, kind: deploy, model_path: /m, tp_size: 1, port: $port}
"""


def test_validate_masks_a_secret_in_an_inventory_var_as_plan_does(tmp_path: Path) -> None:
    """The token pasted into the inventory's port: `validate` quoted it in `port = '...' does not fit`
    (plan masked it). Before, validate never read the secrets."""
    book, inventory, secret = tmp_path / "port.yaml", tmp_path / "site.yaml", token()
    book.write_text(PORT)
    inventory.write_text(f"vars:\n  port: '{secret}'\n")
    for command in ("validate", "plan"):
        done = runbook_cli(command, str(book), "--inventory", str(inventory), env={"RB_PORT_TOKEN": secret})
        assert done.returncode == 2, done.stderr
        assert "port: runbook var port = '***' does not fit: expected a whole number" in done.stderr, done.stderr
        assert secret.rstrip("=") not in done.stderr


@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_secret_written_as_a_matrix_value_is_refused_before_it_is_stored_or_shown(
    command: str, tmp_path: Path
) -> None:
    """An instance's id and a cell's id are kept and shown as written (state.db, `runbook status`): a
    secret pasted in as an axis value would be stored in clear. The run is refused, naming neither."""
    value = token().rstrip("=")
    path = tmp_path / "runbook.yaml"
    matrix = f"    matrix: {{key: [{value}, other]}}\n    script: echo $matrix_key\n"
    path.write_text(BOOK.replace('    script: echo "$url"\n', matrix))
    where = ["--log-dir", str(tmp_path / "logs")] if command == "run" else []
    done = runbook_cli(command, str(path), *where, env={"RB_PASTED_TOKEN": value})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "runbook.yaml:9:5: secret TOKEN: its value is in the step id 'echo[key=***]'" in done.stderr
    assert value not in done.stdout + done.stderr
    assert not (tmp_path / "logs").exists()


def test_a_var_holding_a_secret_with_a_quote_is_masked_in_the_plan_and_the_audit_log(
    book: Path, tmp_path: Path
) -> None:
    """Before: `plan --full` printed, and the run's audit.jsonl kept, `export url='abcd1234'"'"'efgh5678'`:
    the shell's quoting split the secret, so no form of it was found and both halves were shown."""
    secret = "abcd1234'efgh5678"
    logs = tmp_path / "logs"
    for command in (["plan", "--full", str(book)], ["run", str(book), "--log-dir", str(logs)]):
        done = runbook_cli(*command, "--var", f"url={secret}", env={"RB_PASTED_TOKEN": secret})
        assert done.returncode == 0, done.stderr
        assert "abcd1234" not in done.stdout + done.stderr and "efgh5678" not in done.stdout + done.stderr
    for stored in logs.glob("*/*"):
        assert b"abcd1234" not in stored.read_bytes() and b"efgh5678" not in stored.read_bytes(), stored.name
