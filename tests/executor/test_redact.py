"""Secrets stay secret everywhere: every form in which a value can leave a host is masked, in the stream,
before any cut; a secret too short to mask safely is refused; no stored digest is of a secret.

The property tests work on the redactor and the output capture; the CLI tests run against the real
sshd and read every place a value could land: the console, `--json` events, audit.jsonl, state.db,
run.json, `status`, `runs`, `audit show` and `plan`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import secrets
import shlex
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.faces.cli import main
from executor.redact import MIN_SECRET_CHARS, Redactor, forms
from executor.transport import base as transport_base
from executor.transport.base import Captured
from tests.clirun import runbook_cli
from tests.runfolders import run_folders

# ---- the redactor and the stream ------------------------------------------------------------------

#: Secrets are drawn from these characters (quotes, a backslash and a non-ASCII letter for the escaped
#: forms, whitespace for the stripped ones); host output around them from disjoint ones, so that any
#: secret character left in what is kept is a leak, of whatever length.
SECRET_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-+/=\"'\\é "
FILLER_CHARS = "XYZ:|.#_"

line = st.text(SECRET_CHARS, min_size=1, max_size=24)
secret_value = st.builds(
    lambda lines, newline: "\n".join(lines) + newline,
    st.lists(line, min_size=1, max_size=4),
    st.sampled_from(["", "\n"]),  # read from a file, with its trailing newline
).filter(lambda v: len(v.strip()) >= MIN_SECRET_CHARS)


def printed_forms(value: str) -> list[str]:
    """What a host may print of a secret: each form the redactor promises to mask."""
    return sorted(forms(value))


@st.composite
def host_output(draw: st.DrawFn) -> tuple[list[str], bytes]:
    """Secrets, and output holding their forms between runs of filler."""
    values = draw(st.lists(secret_value, min_size=1, max_size=3))
    pieces = [draw(st.text(FILLER_CHARS, min_size=1, max_size=20))]
    for _ in range(draw(st.integers(1, 6))):
        pieces.append(draw(st.sampled_from(printed_forms(draw(st.sampled_from(values))))))
        pieces.append(draw(st.text(FILLER_CHARS, min_size=1, max_size=20)))
    return values, "".join(pieces).encode("utf-8")


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=200, deadline=None)
@given(output=host_output(), cuts=st.lists(st.integers(0, 10_000), max_size=40))
def test_the_stream_is_redacted_as_the_whole_output_would_be(output: tuple[list[str], bytes], cuts: list[int]) -> None:
    values, data = output
    redactor = Redactor(values)
    stream = redactor.stream()
    redacted = b"".join(stream.feed(chunk) for chunk in chunked(data, cuts)) + stream.flush()
    assert redacted == redactor.data(data)
    assert set(redacted.decode()) <= set(FILLER_CHARS + "*")


@st.composite
def nested_secrets(draw: st.DrawFn) -> tuple[list[str], bytes]:
    """Secrets that hold one another, in a two-letter alphabet, and output made of their forms and of
    filler of the same letters: forms overlap everywhere."""
    core = draw(st.text("ab", min_size=MIN_SECRET_CHARS, max_size=10))
    wraps = draw(st.lists(st.tuples(st.text("ab\n", max_size=3), st.text("ab\n", max_size=3)), max_size=3))
    values = [core, *(before + core + after for before, after in wraps)]
    every_form = sorted({form for value in values for form in forms(value)})
    pieces = draw(st.lists(st.one_of(st.sampled_from(every_form), st.text("ab\n", max_size=4)), max_size=12))
    return values, "".join(pieces).encode()


@settings(max_examples=300, deadline=None)
@given(case=nested_secrets())
def test_the_search_replaces_what_the_alternation_of_every_form_would(case: tuple[list[str], bytes]) -> None:
    """The fast search (the cores found with bytes.find, the alternation run only from where a match may
    start) masks exactly what one alternation of every form, longest first, would."""
    values, data = case
    encoded = sorted({form.encode() for value in values for form in forms(value)}, key=len, reverse=True)
    reference = re.compile(b"|".join(map(re.escape, encoded))).sub(b"***", data)
    assert Redactor(values).data(data) == reference


@settings(max_examples=200, deadline=None)
@given(
    output=host_output(),
    cuts=st.lists(st.integers(0, 10_000), max_size=40),
    head=st.integers(0, 60),
    tail=st.integers(0, 60),
)
def test_no_byte_of_a_secret_survives_a_cut_at_any_offset(
    output: tuple[list[str], bytes], cuts: list[int], head: int, tail: int
) -> None:
    """The promise: what is kept of a capped output (head, tail), what the live display saw, and the
    count and hash hold no form of a secret and no prefix or suffix of one, of any length (1 byte
    included): redaction happens before the cut. Secret lines under MIN_SECRET_CHARS are masked only as
    part of a longer form, which is all that is printed here."""
    values, data = output
    redactor = Redactor(values)
    seen: list[bytes] = []
    captured = Captured(head_limit=head, tail_limit=tail, redactor=redactor, sink=lambda _name, c: seen.append(c))
    for chunk in chunked(data, cuts):
        captured.feed(chunk)
    whole = redactor.data(data)
    kept_tail = captured.end(tail) if tail and captured.dropped > 0 else b""
    kept = bytes(captured._head) + kept_tail if captured.dropped > 0 else captured.data
    assert set(kept.decode("utf-8", "replace")) <= set(FILLER_CHARS + "*")
    assert b"".join(seen) == whole
    assert captured.total == len(whole) and captured.sha256 == hashlib.sha256(whole).hexdigest()
    assert captured.data.startswith(whole[:head]) and captured.data.endswith(whole[len(whole) - tail :])


def test_a_text_under_the_minimum_is_never_masked_on_its_own() -> None:
    assert Redactor(["e"]).text("step: e") == "step: e"
    key = "-----BEGIN KEY-----\nb3BlbnNzaC1rZXktdjE\n==\n-----END KEY-----\n"
    redactor = Redactor([key])
    assert redactor.text("==") == "=="  # a short line of it: masked only within the whole value
    assert redactor.text(f"[{key}]") == "[***]"
    assert redactor.text("got b3BlbnNzaC1rZXktdjE") == "got ***"


def test_the_strings_of_a_json_credential_are_forms_of_it() -> None:
    credential = json.dumps({"type": "service_account", "private_key": "-----BEGIN-----\nMIIEvgIBADANBg\n"}, indent=2)
    redactor = Redactor([credential])
    assert redactor.text("MIIEvgIBADANBg") == "***"
    assert redactor.text(repr("-----BEGIN-----\nMIIEvgIBADANBg\n")) == "'***'"


@pytest.mark.parametrize("token", ["hf_abcdefgh\r\nijklmnop\n", "  hf_abcdefgh\nijklmnop  "])
def test_a_token_of_several_lines_is_masked_as_the_hub_uses_it_joined(token: str) -> None:
    """huggingface_hub (and the host programs' kit.HubToken) drop CR and LF from a token before sending it:
    `Authorization: Bearer hf_abcdefghijklmnop` in a verbose client's output is that secret."""
    assert Redactor([token]).text("Authorization: Bearer hf_abcdefghijklmnop") == "Authorization: Bearer ***"


# ---- through the CLI, against the real sshd --------------------------------------------------------


def fake_key() -> str:
    body = [secrets.token_urlsafe(48) for _ in range(3)]
    return "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(body) + "\n==\n-----END OPENSSH PRIVATE KEY-----\n"


LEAKY = """\
    name: leaky
    __HOSTS__
    vars:
      url: https://hub.example/none
    secrets:
      KEY: {env: RB_LEAK_KEY}
      TOKEN: {env: RB_LEAK_TOKEN}
    steps:
      - id: lines
        kind: shell
        script: |
          printf '%s\\n' "$KEY" | sed -n 2p
          printf '%s\\n' "$KEY" | sed -n 3p >&2
          printf '[%s]\\n' "${TOKEN%$'\\n'}"
          python3 -c 'import json, os; print(json.dumps({"k": os.environ["KEY"]}))'
          echo "fetching $url"
      - id: only
        kind: shell
        script: printf %s "${TOKEN%$'\\n'}"
      - id: gate
        kind: shell
        script: printf '%s\\n' "$KEY" | sed -n 4p
        gates:
          - that: "vars.url == 'nothing' and stdout == 'nothing'"
"""


def forms_of(*values: str) -> set[str]:
    """What must appear nowhere: every form the redactor masks (the key's `==` line is too short)."""
    return {form for value in values for form in forms(value)}


def test_no_form_of_a_secret_reaches_any_output_or_file(tmp_path: Path, write_runbook: Any) -> None:
    key, token = fake_key(), f"tok-{secrets.token_hex(12)}\n"  # the token read from a file: a newline
    book = write_runbook(LEAKY)
    logs = tmp_path / "logs"
    env = {"RB_LEAK_KEY": key, "RB_LEAK_TOKEN": token}
    url = f"url=https://u:{token.strip()}@hub.example/"
    outputs = []
    for extra in ([], ["--json"]):
        done = runbook_cli("run", str(book), "--log-dir", str(logs), "--var", url, *extra, env=env)
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr
        outputs += [done.stdout, done.stderr]
    assert 'url = "https://u:***@hub.example/"' in outputs[1]  # a failed gate's values, masked
    for command in (
        ["status", "--log-dir", str(logs)],
        ["status", "--json", "--log-dir", str(logs)],
        ["runs", "--json", "--log-dir", str(logs)],
        *(["audit", "show", str(run)] for run in logs.iterdir()),
    ):
        done = runbook_cli(*command, env=env)
        assert done.returncode == 0, done.stderr
        outputs += [done.stdout, done.stderr]
    plan = runbook_cli("plan", "--full", str(book), "--var", url, env=env).stdout
    masked = "export url=https://u:***@hub.example/\n"
    first = json.loads((min(logs.iterdir()) / "audit.jsonl").read_text().splitlines()[0])
    assert masked in plan and masked in first["command"]  # plan masks as run does
    outputs.append(plan)
    every = forms_of(key, token)
    assert token.strip() in every and key.splitlines()[1] in every
    for text in outputs:
        assert not [form for form in every if form in text], text
    files = [path for path in logs.rglob("*") if path.is_file()]
    for path in files:
        data = path.read_bytes()
        assert not [form for form in every if form.encode() in data], path
    # no digest a guess of the secret could be checked against: output that was only the token is
    # hashed as stored (`***`), and the var that held it counts by its redacted text
    digests = {hashlib.sha256(token.encode()).hexdigest(), hashlib.sha256(token.strip().encode()).hexdigest()}
    digests.add(hashlib.sha256(json.dumps(url.partition("=")[2]).encode()).hexdigest())
    for path in files:
        assert not [d for d in digests if d.encode() in path.read_bytes()], path
    run_dir = run_folders(logs)[0]  # the first run: by started_at (two in one second order by chance by name)
    assert "[***]" in (run_dir / "audit.jsonl").read_text()  # the host printed it; the run masked it
    only = [json.loads(r) for r in (run_dir / "audit.jsonl").read_text().splitlines() if '"step":"only"' in r]
    assert only[0]["stdout"] == "***" and only[0]["stdout_sha256"] == hashlib.sha256(b"***").hexdigest()
    with sqlite3.connect(run_dir / "state.db") as db:
        assert db.execute("select count(*) from steps").fetchone()[0] == 3


@pytest.mark.parametrize(("offset", "runner"), [(1, "persistent"), (5, "exec"), (12, "persistent"), (20, "exec")])
def test_a_secret_straddling_the_output_cap_leaves_no_part(
    offset: int,
    runner: str,
    sshd: Any,
    write_runbook: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: Any,
) -> None:
    """The cap (64 bytes here: 32 kept at each end) cuts `offset` bytes into the token, at the head's end
    and at the tail's start; before the fix the cut came first and left the token's prefix and suffix.
    Both ways of running a command on a host redact alike."""
    monkeypatch.setattr(transport_base, "OUTPUT_KEEP_BYTES", 64)
    token = "".join(secrets.choice("ghjkmnpqrsvwxyz") for _ in range(23))  # no hex digit: digests differ
    monkeypatch.setenv("RB_CAP_TOKEN", token)
    hosts = sshd.host_yaml() + f"    runner: {runner}\n"
    book = write_runbook(
        f"""\
        name: capped
        __HOSTS__
        secrets:
          TOKEN: {{env: RB_CAP_TOKEN}}
        steps:
          - id: long
            kind: shell
            script: |
              head -c {32 - offset} /dev/zero | tr '\\0' X; printf %s "$TOKEN"; head -c 200 /dev/zero | tr '\\0' Y
              printf %s "$TOKEN"; head -c {32 - offset} /dev/zero | tr '\\0' Z
            gates:
              - that: "stdout == ''"
        """,
        hosts=hosts,
    )
    logs = tmp_path / "logs"
    assert main(["run", str(book), "--log-dir", str(logs)]) == 1
    err = capsys.readouterr().err
    (run_dir,) = logs.iterdir()
    (record,) = [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    head, _, rest = record["stdout"].partition("\n[runbook] ")
    tail = rest.partition("\n")[2]
    masked_at_cut = "X" * (32 - offset) + "***"  # the cut falls in the mask, or after it
    assert head.startswith(masked_at_cut[:32]) and set(head) <= {"X", "Y", "*"}, record["stdout"]
    assert tail.endswith(("***" + "Z" * (32 - offset))[-32:]) and set(tail) <= {"Y", "Z", "*"}, record["stdout"]
    stored = err + (run_dir / "state.db").read_bytes().decode("utf-8", "replace")
    for size in range(4, len(token) + 1):  # fragments long enough to be the token's own, not chance
        assert not [part for part in (token[:size], token[-size:]) if part in stored], size


# ---- refused at run start -------------------------------------------------------------------------

REFUSED = """\
    name: refused
    __HOSTS__
    vars:
      marker: {marker}
    secrets:
      TOKEN: {{env: RB_SHORT_TOKEN{optional}}}
    steps:
      - id: touch
        kind: shell
        script: touch "$marker"; echo "token=${{TOKEN-absent}}"
"""


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("e", "the value of environment variable RB_SHORT_TOKEN has fewer than 8 characters"),
        ("  abc12  \n", "the value of environment variable RB_SHORT_TOKEN has fewer than 8 characters"),
        ("", "environment variable RB_SHORT_TOKEN is empty"),
        ("  \n", "environment variable RB_SHORT_TOKEN is empty"),
        (None, "environment variable RB_SHORT_TOKEN is not set"),
    ],
)
def test_a_secret_too_short_or_empty_is_refused_at_its_line_before_anything_runs(
    value: str | None, said: str, write_runbook: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    marker = tmp_path / "marker"
    book = write_runbook(REFUSED.format(marker=marker, optional=""))
    line = book.read_text().splitlines().index("  TOKEN: {env: RB_SHORT_TOKEN}") + 1
    monkeypatch.delenv("RB_SHORT_TOKEN", raising=False)
    env = {} if value is None else {"RB_SHORT_TOKEN": value}
    logs = tmp_path / "logs"
    commands = [["run", str(book), "--log-dir", str(logs)]]
    if value and value.strip():  # there but too short: plan refuses it as run does (plan needs no value)
        commands.append(["plan", str(book)])
    for command in commands:
        done = runbook_cli(*command, env=env)
        assert done.returncode == 2, done.stderr
        assert f"{book}:{line}:3: secret TOKEN: {said}" in done.stderr
        assert "Traceback" not in done.stderr
        if value and len(value.strip()) > 1:  # the message never holds the value (nor `e` in its words)
            assert value.strip() not in done.stderr.replace(str(book), "")
    assert not marker.exists() and not logs.exists()  # nothing connected, no run folder


def test_an_optional_secret_left_empty_is_absent(write_runbook: Any, tmp_path: Path) -> None:
    book = write_runbook(REFUSED.format(marker=tmp_path / "marker", optional=", required: false"))
    done = runbook_cli("run", str(book), "--log-dir", str(tmp_path / "logs"), env={"RB_SHORT_TOKEN": ""})
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "logs").iterdir()
    assert '"stdout":"token=absent\\n"' in (run_dir / "audit.jsonl").read_text()


@pytest.mark.parametrize("around", ["{s}", "https://u:{s}@hub.example/"])
def test_a_secret_holding_a_quote_is_masked_as_the_shell_quotes_it(around: str) -> None:
    """`export url='abcd1234'"'"'efgh5678'`: a run's audit log (and `plan --full`) render a `--var`
    holding a secret so, and masked nothing of it: both halves were readable."""
    secret = "abcd1234'efgh5678"
    masked = Redactor([secret]).text(f"export url={shlex.quote(around.format(s=secret))}")
    assert "abcd" not in masked and "efgh" not in masked, masked
