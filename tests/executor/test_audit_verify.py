"""`audit verify` against what the run recorded beside its log, and the audit key that seals it.

A cut (the last records removed, the head rolled back to match) is found through the head of a run
that finished and through state.db, which records at each step save how long the log was; a run
that was killed may have a head that lags its log, and is said to have crashed. An audit key
(`runbook audit key`, outside the run folder) seals every head: a log rewritten by someone who
can write the run folder (chain recomputed, head and state.db edited) passes the unkeyed checks and
is found only with `--key`. The runs are real, over the test sshd; the checks go through the CLI in this
process (tests.clirun, or its `main` directly where hypothesis draws many cases).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import shutil
import sqlite3
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.errors import AuditKeyError
from executor.faces import cli as cli_mod
from executor.run import audit as audit_mod
from executor.run.audit import GENESIS, record_hash
from executor.run.seal import AuditKey, load_key
from sandbox.sshd import SSHServer
from tests.clirun import runbook_cli
from tests.executor.killpoints import run_book
from tests.runfolders import run_folders


def cli(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    """The CLI with `config` as the user's config folder (where the audit key lives, or not)."""
    done = runbook_cli(*args, env={"XDG_CONFIG_HOME": str(config)})
    assert "Traceback" not in done.stderr, done.stderr
    return done


def book_text(hosts: str, marker: Path) -> str:
    """Three steps, one command each; the last passes only once `marker` exists."""
    return (
        f"name: cut\n{hosts}defaults:\n  retry: {{attempts: 1}}\nvars:\n  marker: {marker}\nsteps:\n"
        "  - id: a1\n    kind: shell\n    script: echo a1\n"
        "  - id: a2\n    kind: shell\n    script: echo a2\n"
        "  - id: a3\n    kind: shell\n    script: 'echo a3; test -f \"$marker\"'\n"
    )


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]


def write_records(run_dir: Path, kept: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in kept)
    (run_dir / "audit.jsonl").write_text(text)


def head(run_dir: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((run_dir / "audit.head").read_text())
    return loaded


def set_run_key(run_dir: Path, key: str, value: str) -> None:
    with contextlib.closing(sqlite3.connect(run_dir / "state.db")) as db, db:
        db.execute("INSERT OR REPLACE INTO run VALUES (?, ?)", (key, value))


def copy_logs(logs: Path, into: Path) -> Path:
    """A copy of a log folder to damage (without the runs' lock files: no run holds them)."""
    copy = into / "logs"
    shutil.copytree(logs, copy, ignore=shutil.ignore_patterns("lock"))
    return copy


@dataclass(frozen=True)
class Runs:
    book: Path
    logs: Path  # the runs' log folder
    config: Path  # the user's config folder they ran with (holding the audit key, or not)
    empty: Path  # a config folder without a key
    said: str  # everything the CLI printed while making them


def _book(folder: Path, sshd: SSHServer) -> Path:
    book = folder / "book.yaml"
    book.write_text(book_text(sshd.host_yaml(), folder / "marker"))
    (folder / "empty").mkdir()
    return book


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, sshd: SSHServer) -> Runs:
    """One passed run, made without an audit key."""
    folder = tmp_path_factory.mktemp("plain")
    book = _book(folder, sshd)
    (folder / "marker").touch()
    done = cli("run", str(book), "--log-dir", str(folder / "logs"), config=folder / "empty")
    assert done.returncode == 0, done.stderr
    return Runs(book, folder / "logs", folder / "empty", folder / "empty", done.stdout + done.stderr)


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory, sshd: SSHServer) -> Runs:
    """A failed run and the run that resumed it and passed, both sealed with the key in `config`."""
    folder = tmp_path_factory.mktemp("sealed")
    book, config, logs = _book(folder, sshd), folder / "config", folder / "logs"
    made = cli("audit", "key", config=config)
    assert made.returncode == 0, made.stderr
    failed = cli("run", str(book), "--log-dir", str(logs), config=config)
    assert failed.returncode == 1, failed.stderr
    (folder / "marker").touch()
    resumed = cli("run", str(book), "--resume", "--log-dir", str(logs), config=config)
    assert resumed.returncode == 0, resumed.stderr
    said = "".join(done.stdout + done.stderr for done in (made, failed, resumed))
    return Runs(book, logs, config, folder / "empty", said)


# ---- a cut is found ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rolled_back", ["to nothing", "to the record before"])
def test_a_cut_last_record_with_its_head_rolled_back_is_found(plain: Runs, tmp_path: Path, rolled_back: str) -> None:
    """The issue's case: cut the last record and write the head to match. On main this verified as
    intact: the head may lag the log, and nothing looked at state.db."""
    (run_dir,) = run_folders(copy_logs(plain.logs, tmp_path))
    kept = records(run_dir)[:-1]
    write_records(run_dir, kept)
    if rolled_back == "to nothing":
        (run_dir / "audit.head").write_text(json.dumps({"count": 0, "hash": GENESIS}))
    else:
        (run_dir / "audit.head").write_text(json.dumps({"count": len(kept), "hash": kept[-1]["hash"]}))
    done = cli("audit", "verify", str(run_dir), config=plain.empty)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("tampered: 2 records")
    said = "state.db says the log held 3 records when the run last saved a step, but it holds 2"
    assert f"TAMPERED: {run_dir.name}: {said}" in done.stderr, done.stderr
    ran = f"TAMPERED: {run_dir.name}: state.db records that step 'a3' ran on box (attempt 1), but the log holds no"
    assert ran in done.stderr, done.stderr
    if rolled_back == "to nothing":
        assert "the run finished (passed), but its head records 0 of the log's 2 records" in done.stderr


FINISHED = ["passed", "failed", "interrupted", "crashed"]
UNFINISHED = {"running": "the run did not finish (crashed?)", "write-failed": "a write to its run folder failed"}


def _main(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_mod.main(list(args))
    return code, out.getvalue(), err.getvalue()


@settings(max_examples=60, deadline=None)
@given(
    status=st.sampled_from([*FINISHED, *UNFINISHED]),
    cut=st.integers(0, 3),
    head_at=st.integers(0, 3),
    torn=st.booleans(),
)
def test_any_cut_is_found_and_only_an_unfinished_run_may_lag(
    plain: Runs, status: str, cut: int, head_at: int, torn: bool
) -> None:
    """Whatever the run's status, a cut of the last `cut` records is found, even with the head written
    to match what is left; a head that lags a whole log is tampering for a run that finished, and
    tolerated (and said) for one that did not (a lock nobody holds: its process is gone)."""
    with tempfile.TemporaryDirectory() as scratch:
        (run_dir,) = run_folders(copy_logs(plain.logs, Path(scratch)))
        every = records(run_dir)
        kept = every[: len(every) - cut]
        head_at = min(head_at, len(kept))
        write_records(run_dir, kept)
        if torn:  # what a kill halfway through a write leaves
            with (run_dir / "audit.jsonl").open("a") as handle:
                handle.write('{"event":"command","step":"a4","comm')
        start = [GENESIS, *(r["hash"] for r in every)]
        (run_dir / "audit.head").write_text(json.dumps({"count": head_at, "hash": start[head_at]}))
        set_run_key(run_dir, "status", status)
        code, out, err = _main("audit", "verify", str(run_dir))
    assert "Traceback" not in err
    if cut:
        assert code == 1 and "records were cut from its end" in err, (out, err)
    elif head_at < len(every) and status in FINISHED:
        assert code == 1 and f"the run finished ({status}), but its head records {head_at}" in err, (out, err)
    elif head_at < len(every):
        assert code == 0 and f"head lags by {len(every) - head_at} record(s)" in err, (out, err)
        assert UNFINISHED[status] in err, err
    else:
        assert code == 0 and out.startswith("intact: 3 records"), (out, err)
        assert err.count("note: ") == int(torn), err  # a whole, untouched log: nothing to say but a torn line


def test_a_store_from_before_the_audit_position_is_said_to_be_checked_by_its_head(plain: Runs, tmp_path: Path) -> None:
    (run_dir,) = run_folders(copy_logs(plain.logs, tmp_path))
    with contextlib.closing(sqlite3.connect(run_dir / "state.db")) as db, db:
        db.execute("DELETE FROM run WHERE key = 'audit_position'")
    code, out, err = _main("audit", "verify", str(run_dir))
    assert code == 0 and out.startswith("intact: 3 records"), (out, err)
    assert "its state.db does not record the log's length (an older runbook wrote it)" in err, err


def test_a_killed_run_may_lag_and_is_said_to_have_crashed(tmp_path: Path, sshd: SSHServer) -> None:
    """Killed (-9) between an audit line and its head: the head lags by one, tolerated, and the message
    says the run did not finish (with the key: that the seal does not cover that record); the resumed
    run verifies over both. A cut below what state.db saw is found in a killed run too."""
    (tmp_path / "marker").touch()
    book = tmp_path / "book.yaml"
    book.write_text(book_text(sshd.host_yaml(), tmp_path / "marker"))
    config = tmp_path / "config"
    assert cli("audit", "key", config=config).returncode == 0
    keyed = {"XDG_CONFIG_HOME": str(config)}
    baseline = run_book(book, tmp_path / "baseline", tmp_path / "journal", env=keyed)
    assert baseline.returncode == 0, baseline.stderr
    points = (tmp_path / "journal").read_text().split()
    second_line = [n for n, point in enumerate(points, start=1) if point == "audit.line"][1]
    logs = tmp_path / "logs"
    killed = run_book(book, logs, tmp_path / "journal-killed", kill_at=second_line, env=keyed)
    assert killed.returncode == -9, killed.stderr
    (run_dir,) = run_folders(logs)
    assert (head(run_dir)["count"], len(records(run_dir))) == (1, 2)

    done = cli("audit", "verify", str(run_dir), config=config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{run_dir.name}: head lags by 1 record(s): the run did not finish (crashed?)" in done.stderr
    assert done.stdout.startswith("intact: 2 records")
    checked = cli("audit", "verify", str(run_dir), "--key", config=config)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{run_dir.name}: the last 1 record(s) come after its sealed head: the seal does not cover them" in (
        checked.stderr
    )

    resumed = cli("run", str(book), "--resume", "--log-dir", str(logs), config=config)
    assert resumed.returncode == 0, resumed.stderr
    whole = cli("audit", "verify", str(run_folders(logs)[-1]), "--key", config=config)
    assert whole.returncode == 0 and "2 run(s)" in whole.stdout, whole.stdout + whole.stderr
    assert f"{run_dir.name}: head lags by 1 record(s)" in whole.stderr

    write_records(run_dir, [])  # state.db saw a1's record: the killed run's log cannot be emptied unseen
    (run_dir / "audit.head").write_text(json.dumps({"count": 0, "hash": GENESIS}))
    cut = cli("audit", "verify", str(run_dir), config=config)
    assert cut.returncode == 1 and "state.db says the log held 1 records" in cut.stderr, cut.stderr


# ---- the audit key ----------------------------------------------------------------------------------


def key_of(config: Path) -> AuditKey:
    path = config / "runbook" / "audit.key"
    return AuditKey(path, bytes.fromhex(path.read_text()))


def test_the_audit_key_is_made_private_once_and_never_shown(tmp_path: Path) -> None:
    config = tmp_path / "config"
    made = cli("audit", "key", config=config)
    assert made.returncode == 0, made.stderr
    key = key_of(config)
    assert stat.S_IMODE(key.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.path.parent.stat().st_mode) == 0o700
    assert f"key id {key.key_id}" in made.stderr and key.secret.hex() not in made.stdout + made.stderr
    again = cli("audit", "key", config=config)
    assert again.returncode == 2 and "a key is already there; it is never overwritten" in again.stderr
    assert key_of(config) == key


def test_a_sealed_history_verifies_with_its_key_and_says_so_without(sealed: Runs) -> None:
    first, resumed = run_folders(sealed.logs)
    key = key_of(sealed.config)
    unkeyed = cli("audit", "verify", str(resumed), config=sealed.empty)
    assert unkeyed.returncode == 0 and unkeyed.stdout.startswith("intact: 4 records in 2 run(s)"), unkeyed.stdout
    for run_dir in (first, resumed):
        assert f"{run_dir.name}: sealed (key id {key.key_id}); pass --key to check the seal" in unkeyed.stderr
    for key_args in (["--key"], ["--key", str(key.path)]):  # the default key, then a path
        checked = cli("audit", "verify", str(resumed), *key_args, config=sealed.config)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert f"intact: 4 records in 2 run(s): {first.name}, {resumed.name}; sealed with key id {key.key_id}" in (
            checked.stdout
        )
    # the key's bytes are in no run folder and were never printed
    assert key.secret.hex() not in sealed.said
    for path in sealed.logs.rglob("*"):
        assert not path.is_file() or key.secret.hex().encode() not in path.read_bytes(), path


def rewrite(run_dir: Path, start: str, edit: dict[str, Any] | None = None) -> str:
    """Rewrite a log as someone without the key can: edit its first record, chain every record again
    from `start`, and write the head and state.db to match (the head's seal is kept). The new tail."""
    rewritten, previous = [], start
    for index, record in enumerate(records(run_dir)):
        record = record | (edit if edit and index == 0 else {}) | {"prev_hash": previous}
        record["hash"] = previous = record_hash(record)
        rewritten.append(record)
    write_records(run_dir, rewritten)
    (run_dir / "audit.head").write_text(json.dumps(head(run_dir) | {"count": len(rewritten), "hash": previous}))
    set_run_key(run_dir, "audit_position", json.dumps({"count": len(rewritten), "hash": previous}))
    return previous


def test_a_rewritten_sealed_history_is_found_only_with_the_key(sealed: Runs, tmp_path: Path) -> None:
    """a1's output edited, every hash after it computed again, heads, state.db and the link of the
    resumed run rewritten to match: the unkeyed checks cannot tell; the seal can."""
    first, resumed = run_folders(copy_logs(sealed.logs, tmp_path))
    tail = rewrite(first, GENESIS, {"stdout": "forged\n"})
    meta = json.loads((resumed / "run.json").read_text())
    (resumed / "run.json").write_text(json.dumps(meta | {"audit_prev_hash": tail}))
    rewrite(resumed, tail)
    unkeyed = cli("audit", "verify", str(resumed), config=sealed.empty)
    assert unkeyed.returncode == 0 and unkeyed.stdout.startswith("intact"), unkeyed.stdout + unkeyed.stderr
    checked = cli("audit", "verify", str(resumed), "--key", config=sealed.config)
    assert checked.returncode == 1 and checked.stdout.startswith("tampered"), checked.stdout
    for run_dir in (first, resumed):
        assert f"TAMPERED: {run_dir.name}: its seal does not match its head" in checked.stderr, checked.stderr


@pytest.mark.parametrize("damage", ["detached from the run it resumed", "seal removed"])
def test_a_sealed_run_unlinked_or_unsealed_is_found_with_the_key(sealed: Runs, tmp_path: Path, damage: str) -> None:
    """The seal covers the link to the resumed run: with `resumed_from` taken out of run.json, the run
    verifies alone as intact, but not with the key; a head whose seal was removed is not sealed."""
    _first, resumed = run_folders(copy_logs(sealed.logs, tmp_path))
    if damage == "seal removed":
        (resumed / "audit.head").write_text(json.dumps({k: v for k, v in head(resumed).items() if k != "seal"}))
        expected = "its head carries no seal"
    else:
        meta = json.loads((resumed / "run.json").read_text())
        (resumed / "run.json").write_text(json.dumps(meta | {"resumed_from": None}))
        expected = "its seal does not match its head"
    unkeyed = cli("audit", "verify", str(resumed), config=sealed.empty)
    assert unkeyed.returncode == 0, unkeyed.stdout + unkeyed.stderr
    checked = cli("audit", "verify", str(resumed), "--key", config=sealed.config)
    assert checked.returncode == 1 and f"TAMPERED: {resumed.name}: {expected}" in checked.stderr, checked.stderr


def test_another_key_or_an_unsealed_run_is_refused(sealed: Runs, plain: Runs, tmp_path: Path) -> None:
    other = tmp_path / "other"
    assert cli("audit", "key", config=other).returncode == 0
    theirs, ours = key_of(other), key_of(sealed.config)
    resumed = run_folders(sealed.logs)[-1]
    wrong = cli("audit", "verify", str(resumed), "--key", str(theirs.path), config=sealed.empty)
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert f"it was sealed with another key (key id {ours.key_id}), not {theirs.path}" in wrong.stderr
    (unsealed_run,) = run_folders(plain.logs)
    unsealed = cli("audit", "verify", str(unsealed_run), "--key", str(ours.path), config=sealed.empty)
    assert unsealed.returncode == 1 and "its head carries no seal" in unsealed.stderr, unsealed.stderr


@pytest.mark.parametrize("kind", ["missing", "open to others", "malformed", "a folder"])
def test_an_unusable_key_is_named_with_exit_2(plain: Runs, tmp_path: Path, kind: str) -> None:
    """`verify --key` and a run that would seal with it both refuse, before anything runs."""
    config = tmp_path / "config"
    path = config / "runbook" / "audit.key"
    path.parent.mkdir(parents=True)
    expected = {
        "missing": "no audit key there (create one with: runbook audit key)",
        "open to others": f"the audit key is open to other users (mode 0644); make it private: chmod 600 {path}",
        "malformed": f"{path}:1:1: expected 64 hex digits",
        "a folder": "the audit key must be a regular file",
    }[kind]
    if kind == "open to others":
        path.write_text(secrets.token_hex(32) + "\n")
        path.chmod(0o644)
    elif kind == "malformed":
        path.write_text("not a key\n")
        path.chmod(0o600)
    elif kind == "a folder":
        path.mkdir()
    (run_dir,) = run_folders(plain.logs)
    done = cli("audit", "verify", str(run_dir), "--key", str(path), config=plain.empty)
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    if kind != "missing":  # no key at all means no sealing
        logs = tmp_path / "logs"
        refused = cli("run", str(plain.book), "--log-dir", str(logs), config=config)
        assert refused.returncode == 2 and expected in refused.stderr, refused.stderr
        assert not logs.exists() or not any(logs.iterdir())


@settings(max_examples=100, deadline=None)
@given(content=st.binary(max_size=300) | st.text("0123456789abcdefABCDEF \n\t", max_size=80).map(str.encode))
def test_any_key_file_content_loads_or_is_named(content: bytes) -> None:
    """A key file holds 64 hex digits (blanks around them allowed); anything else is an AuditKeyError
    naming the file, never another exception."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "audit.key"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, content)
        os.close(fd)
        text = content.decode("ascii", "replace").strip()
        valid = len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text)
        try:
            key = load_key(path)
        except AuditKeyError as exc:
            assert not valid and str(exc).startswith(f"{path}:1:1: expected 64 hex digits"), exc
        else:
            assert valid and key.secret == bytes.fromhex(text)


# ---- found by a second reader ---------------------------------------------------------------------


@pytest.mark.parametrize("what", ["fifo", "/dev/zero"])
@pytest.mark.parametrize("name", ["audit.jsonl", "audit.head"])
def test_a_log_or_head_that_is_no_regular_file_is_answered_at_once(
    plain: Runs, tmp_path: Path, name: str, what: str
) -> None:
    """A FIFO in its place hung `audit verify` (and `audit show`) waiting for a writer, a link to
    /dev/zero read forever: a log that is no file is an unreadable run folder (2), a head that is none is
    an unreadable head (1)."""
    (run_dir,) = run_folders(copy_logs(plain.logs, tmp_path))
    (run_dir / name).unlink()
    if what == "fifo":
        os.mkfifo(run_dir / name)
    else:
        (run_dir / name).symlink_to(what)
    for action in ("verify", "show"):
        done = runbook_cli("audit", action, str(run_dir), env={"XDG_CONFIG_HOME": str(plain.empty)})
        assert "Traceback" not in done.stderr, done.stderr
        if name == "audit.jsonl":
            assert done.returncode == 2, done.stdout + done.stderr
            assert f"{run_dir} is unreadable (audit.jsonl: not a regular file" in done.stderr, done.stderr
        elif action == "verify":
            assert done.returncode == 1, done.stdout + done.stderr
            assert f"TAMPERED: {run_dir.name}: audit.head is missing or unreadable" in done.stderr, done.stderr


@pytest.mark.parametrize("count", ["1e400", "3.5", '"3"', "true", "-1", "null"])
def test_a_head_whose_count_no_run_writes_is_an_unreadable_head(plain: Runs, tmp_path: Path, count: str) -> None:
    """`int()` of the head's count read 3.5 and "3" as 3 (intact), true as 1, -1 as the last record, and
    1e400 raised OverflowError (a traceback): a count that is no whole number from 0 is no head."""
    (run_dir,) = run_folders(copy_logs(plain.logs, tmp_path))
    last = records(run_dir)[-1]["hash"]
    (run_dir / "audit.head").write_text(f'{{"count": {count}, "hash": "{last}"}}')
    code, out, err = _main("audit", "verify", str(run_dir))
    assert code == 1, (out, err)
    assert f"TAMPERED: {run_dir.name}: audit.head is missing or unreadable" in err, err


@pytest.mark.parametrize("where", ["middle", "end"])
def test_a_line_longer_than_any_record_is_tampering_read_in_bounded_pieces(
    plain: Runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A line of gigabytes was read whole into memory; now no more than MAX_RECORD_BYTES of a line is
    held, and such a line, wherever it is, ended by a newline or not, is no record (a torn write is the
    prefix of a record, never that long)."""
    monkeypatch.setattr(audit_mod, "MAX_RECORD_BYTES", 4096)
    (run_dir,) = run_folders(copy_logs(plain.logs, tmp_path))
    lines = (run_dir / "audit.jsonl").read_bytes().splitlines(keepends=True)
    long_line = b"x" * 50_000 + (b"\n" if where == "middle" else b"")
    lines.insert(1 if where == "middle" else len(lines), long_line)
    (run_dir / "audit.jsonl").write_bytes(b"".join(lines))
    held = [len(raw) for _number, _record, raw in audit_mod.read_records(run_dir)]
    assert max(held) <= 4096 + 1 and len(held) == len(lines)
    code, out, err = _main("audit", "verify", str(run_dir))
    assert code == 1, (out, err)
    assert out.startswith("tampered"), out
