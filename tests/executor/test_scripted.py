"""The ScriptedTransport's own promises (executor/transport/scripted.py): rules newest first and answers in turn,
host programs answered by name from the script `host_program` renders, an unscripted command refused by name,
output masked and capped as a real transport's, stops and breaks as the real ones report them, files in
memory. The transport contract it shares with the real ones: tests/executor/test_transport.py (`contract`)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from executor.errors import HostKeyError, TransportError
from executor.hostprogram import host_program
from executor.redact import Redactor
from executor.render import KILLED_NOTE, render_command
from executor.stepkind import ProgressLines
from executor.transport.base import CommandInterrupted, CommandResult
from executor.transport.scripted import Answer, ScriptedTransport, UnscriptedCommand, program_output


def run(host: ScriptedTransport, script: str, timeout: float = 5, **kwargs: object) -> CommandResult:
    return asyncio.run(host.run(render_command(script, {}), timeout, **kwargs))  # type: ignore[arg-type]


def test_the_newest_rule_answers_and_a_rule_gives_its_answers_in_turn() -> None:
    host = ScriptedTransport("box")
    host.on("flaky", Answer(exit_code=1), Answer(exit_code=2), Answer(stdout="ok"))
    host.on(r"^flaky --now", stdout="overridden")
    assert [run(host, "flaky").exit_code for _ in range(4)] == [1, 2, 0, 0]  # the last answer again
    assert run(host, "flaky --now").stdout == b"overridden"
    assert host.scripts() == ["flaky"] * 4 + ["flaky --now"]


def test_an_answer_can_be_made_from_the_command() -> None:
    host = ScriptedTransport("box").on(lambda c: "TOKEN" in c.env, lambda c: Answer(stdout=c.env["N"] * 2))
    result = asyncio.run(host.run(render_command("echo", {"N": "ab"}, {"TOKEN": "hf_secret"}), 5))
    assert result.stdout == b"abab"
    assert host.commands[0].env["TOKEN"] == "hf_secret"  # what the host got, for a test to check
    assert "hf_secret" not in repr(host.commands[0])  # the environment (its secrets) is never in a repr


def test_an_unscripted_command_is_refused_at_once_naming_the_host_and_the_command() -> None:
    host = ScriptedTransport("gpu").on("^ls ")
    with pytest.raises(UnscriptedCommand, match=r"no scripted answer on gpu for the command: 'rm -rf /data'") as caught:
        run(host, "rm -rf /data\n", timeout=3600)
    assert isinstance(caught.value, TransportError)
    assert host.scripts() == ["rm -rf /data\n"]  # recorded all the same


def test_a_host_program_is_answered_by_name_with_its_document_and_the_command_carries_its_config() -> None:
    host = ScriptedTransport("gpu")
    host.program("download", {"state": "missing"}, {"state": "complete"}, progress=[{"disk_bytes": 10}])
    host.program("download", {"state": "known"}, when=lambda call: "known" in call.config)
    script = host_program("download", {"command": "check", "repo": "org/name"})
    first = run(host, script)
    assert first.stdout == b'{"state": "missing"}\n'
    seen: list[dict[str, object]] = []
    lines = ProgressLines(seen.append)
    second = run(host, script, on_output=lines.feed)
    assert second.stdout == b'{"state": "complete"}\n' and seen == [{"disk_bytes": 10}]
    assert run(host, host_program("download", {"command": "check", "known": {}})).stdout == b'{"state": "known"}\n'
    call = host.commands[0].program
    assert call is not None and (call.name, dict(call.config)) == ("download", {"command": "check", "repo": "org/name"})
    assert host.programs_run() == ["download"] * 3
    with pytest.raises(UnscriptedCommand, match=r"host program 'probe' \(config \{\"x\": 1\}\)"):
        run(host, host_program("probe", {"x": 1}))


def test_program_output_is_the_kits_wire_format() -> None:
    stdout, stderr = program_output({"a": [1, 2]}, progress=[{"phase": "start"}])
    assert stdout == b'{"a": [1, 2]}\n'
    assert stderr == b'runbook-progress {"phase": "start"}\n'
    with pytest.raises(ValueError):
        program_output({"a": float("nan")})  # no document a program could print


def test_output_is_masked_as_it_arrives_even_across_pieces_and_capped_as_a_real_transport_caps_it() -> None:
    host = ScriptedTransport("box")
    host.redactor = Redactor(["hf_secret_token"])
    chunks: list[bytes] = []
    split = b"x" * (65536 - 5) + b"hf_secret_token tail"  # the secret straddles the first 64 KiB piece's end
    host.on("print", stdout=split)
    result = run(host, "print", on_output=lambda _stream, chunk: chunks.append(chunk))
    assert b"hf_secret_token" not in result.stdout and b"hf_secret_token" not in b"".join(chunks)
    assert result.stdout.endswith(b"*** tail")
    assert result.stdout_sha256 == hashlib.sha256(result.stdout).hexdigest()


def test_a_hanging_command_times_out_as_a_result_with_its_output_and_a_confirmed_kill() -> None:
    host = ScriptedTransport("box").on("wait", stdout="half way\n", hang=True)
    result = run(host, "wait", timeout=0.2)
    assert (result.timed_out, result.interrupted, result.kill_confirmed) == (True, False, True)
    assert result.stdout == b"half way\n" and result.stderr.rstrip().endswith(KILLED_NOTE.encode())
    assert result.exit_code == 143


def test_a_cancelled_command_raises_command_interrupted_with_its_partial_output() -> None:
    host = ScriptedTransport("box").on("wait", stdout="begun\n", hang=True)

    async def cancelled() -> CommandInterrupted:
        task = asyncio.ensure_future(host.run(render_command("wait", {}), 3600))
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except CommandInterrupted as exc:
            return exc
        raise AssertionError("not interrupted")

    caught = asyncio.run(cancelled())
    assert isinstance(caught, asyncio.CancelledError)
    assert (caught.result.interrupted, caught.result.stdout, caught.result.kill_confirmed) == (True, b"begun\n", True)


def test_a_broken_connection_raises_the_transport_error_asked_for_with_the_masked_output_so_far() -> None:
    host = ScriptedTransport("box").on("go", stdout="token hf_secret_token\n", error="connection lost")
    host.redactor = Redactor(["hf_secret_token"])
    with pytest.raises(TransportError, match="connection lost") as caught:
        run(host, "go")
    assert caught.value.partial_stdout == b"token ***\n"
    host.on("key", error="host key of box not trusted", error_type=HostKeyError)
    with pytest.raises(HostKeyError):
        run(host, "key")


def test_files_go_up_and_come_back_with_their_size_and_sha256(tmp_path: Path) -> None:
    host = ScriptedTransport("box")
    local = tmp_path / "model.bin"
    local.write_bytes(b"\x00weights\r\n")
    put = asyncio.run(host.put(local, "/srv/model.bin"))
    digest = hashlib.sha256(b"\x00weights\r\n").hexdigest()
    assert (put.direction, put.size, put.sha256) == ("put", 10, digest)
    host.files["/srv/log.txt"] = b"served\n"
    got = asyncio.run(host.get("/srv/log.txt", tmp_path / "log.txt"))
    assert (tmp_path / "log.txt").read_bytes() == b"served\n" and got.direction == "get"
    assert [t.remote for t in host.transfers] == ["/srv/model.bin", "/srv/log.txt"]
    with pytest.raises(TransportError, match="download of box:/srv/none failed: no such file"):
        asyncio.run(host.get("/srv/none", tmp_path / "none"))
    assert host.files["/srv/model.bin"] == b"\x00weights\r\n"
