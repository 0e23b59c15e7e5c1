"""Bounds on what hostile host output can make the controller do: gates, facts, and the runbook's limits.

Gates run in worker processes (executor.runbook.gates) bounded in time and memory; facts are bounded in depth;
durations must be bounds. Through the CLI against the real sshd, and at the worker directly.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.faces.cli import main
from executor.runbook import gates
from executor.runbook.gates import GATE_MEMORY_BYTES, GateWorkers
from executor.stepkind import FACTS_MAX_DEPTH
from tests.clirun import runbook_cli
from tests.executor.test_resume import start

NAMES: dict[str, Any] = {"stdout": "a" * 48 + "!", "stderr": "", "exit_code": 0, "facts": {}, "steps": {}, "vars": {}}


def run(path: Path, log_dir: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(["run", str(path), "--log-dir", str(log_dir), *extra])
    return code, capsys.readouterr().err


def gate_step(script: str, gate: str, parse: str = "text") -> str:
    return f"""\
        name: bounded
        __HOSTS__
        steps:
          - id: hostile
            kind: shell
            parse: {parse}
            script: {json.dumps(script)}
            gates:
              - that: {json.dumps(gate)}
          - id: after
            kind: shell
            script: echo after
        """


def evaluate_all(expressions: list[str], names: dict[str, Any] = NAMES) -> list[gates.GateVerdict]:
    async def go() -> list[gates.GateVerdict]:
        pool = GateWorkers()
        try:
            verdicts = []
            for expression in expressions:
                async with pool.session(names) as worker:
                    verdicts.append(await worker.evaluate(expression, None))
            return verdicts
        finally:
            await pool.close()

    return asyncio.run(go())


# ---- gates: time and memory ------------------------------------------------------------------------


def test_a_backtracking_regex_gate_fails_the_attempt_naming_the_gate_and_the_bound(
    write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_runbook(gate_step("printf 'a%.0s' $(seq 48); echo '!'", "stdout is search('(a+)+$')"))
    code, err = run(path, tmp_path / "logs", capsys)
    assert code == 1
    assert "gate: stdout is search('(a+)+$')" in err
    assert f"did not finish within the time bound of a gate ({gates.GATE_TIME_S:g}s)" in err
    assert main(["status", "--log-dir", str(tmp_path / "logs"), "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert [(s["step"], s["status"]) for s in steps] == [("hostile", "failed"), ("after", "pending")]


def test_a_gate_that_allocates_too_much_fails_with_the_memory_bound(
    write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_runbook(gate_step("echo hi", "('a' * 10**10) | length > 0"))
    code, err = run(path, tmp_path / "logs", capsys)
    assert code == 1
    assert f"exceeded the memory bound of a gate ({GATE_MEMORY_BYTES // 2**20} MiB)" in err


def test_a_worker_killed_at_its_bound_is_replaced_and_ordinary_gates_still_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gates, "GATE_TIME_S", 0.5)
    slow, fine, big, fine_again = evaluate_all(
        ["10 ** (10 ** 8) > 1", "exit_code == 0 and '!' in stdout", "[0] * 10**10", "stdout | length == 49"]
    )
    assert not slow.passed and "time bound of a gate (0.5s)" in slow.detail
    assert fine.passed and fine_again.passed
    assert not big.passed and "memory bound" in big.detail


HOSTILE_PARTS = st.sampled_from(
    [
        "10 ** (10 ** 8)",
        "'x' * 10 ** 10",
        "stdout * 10 ** 9",
        "stdout is search('(a|aa)+$')",
        "stdout is match('(a*)*b')",
        "range(10 ** 12) | list",
        "'%s' % stdout",
        "stdout.__class__.__mro__",
        "exit_code == 0",
        "stdout | length",
    ]
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(HOSTILE_PARTS, min_size=1, max_size=3), joiner=st.sampled_from([" and ", " or ", " + "]))
def test_any_gate_built_of_hostile_parts_gives_a_verdict_within_its_bound(
    monkeypatch: pytest.MonkeyPatch, parts: list[str], joiner: str
) -> None:
    monkeypatch.setattr(gates, "GATE_TIME_S", 0.3)
    started = time.monotonic()
    (verdict,) = evaluate_all([joiner.join(f"({p})" for p in parts)])
    assert isinstance(verdict.passed, bool)
    # bounded: one gate's bound plus the worker's start and clean-up, never the expression's own time
    assert time.monotonic() - started < 20


def start_spinning_gate(write_runbook: Any, tmp_path: Path) -> subprocess.Popen[str]:
    """`runbook run` of a step whose gate spins in its worker, returned once the gate is spinning."""
    marker = tmp_path / "gate-started"
    path = write_runbook(gate_step(f"touch {marker}; echo x", "10 ** (10 ** 9) > 0"))
    proc = start("run", str(path), "--log-dir", str(tmp_path / "logs"))
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not marker.exists():
        proc.kill()
        proc.communicate()
        pytest.fail("the step never ran")
    time.sleep(1.0)  # the command has finished; the gate is spinning in its worker
    return proc


def test_sigterm_during_a_spinning_gate_ends_the_run_with_130(write_runbook: Any, tmp_path: Path) -> None:
    proc = start_spinning_gate(write_runbook, tmp_path)
    try:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=gates.GATE_TIME_S - 1)  # sooner than the gate's own bound
    finally:
        proc.kill()  # whatever happened: never leave a spinning run behind
        proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    done = runbook_cli("status", "--log-dir", str(tmp_path / "logs"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps"][0]["status"] == "interrupted"


# ---- facts: depth ------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [FACTS_MAX_DEPTH + 1, 900, 200_000])
def test_deeply_nested_json_from_the_host_fails_the_attempt_not_the_run(
    write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], depth: int
) -> None:
    script = f"python3 -c \"print('[' * {depth} + ']' * {depth})\""
    path = write_runbook(gate_step(script, "exit_code == 0", parse="json"))
    code, err = run(path, tmp_path / "logs", capsys)
    assert code == 1
    assert f"nested deeper than {FACTS_MAX_DEPTH} levels" in err  # counted before the parser (executor.files)
    assert main(["status", "--log-dir", str(tmp_path / "logs"), "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert [s["status"] for s in steps] == ["failed", "pending"]


def test_facts_at_the_depth_bound_pass(write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    depth = FACTS_MAX_DEPTH
    script = f"python3 -c \"print('[' * {depth} + ']' * {depth})\""
    path = write_runbook(gate_step(script, "facts | length == 1", parse="json"))
    code, err = run(path, tmp_path / "logs", capsys)
    assert code == 0, err


# ---- limits that are limits --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [".inf", "1e999", ".nan", "0", "-5", "0s", "99999999h", "0.0000001ms", "1 5m", "'1_000'", "10" * 200]
)
def test_a_duration_that_is_no_bound_is_refused_at_validate_with_its_position(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    path = tmp_path / "book.yaml"
    path.write_text(
        f"name: t\nhosts: {{h: {{address: local}}}}\nsteps:\n  - id: a\n    kind: shell\n    timeout: {value}\n"
        "    script: echo\n"
    )
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:6:14: steps[0].timeout: " in err and "duration" in err


@pytest.mark.parametrize(
    ("key", "value"),
    [("connect_timeout", ".inf"), ("keepalive", "-1"), ("connect_timeout", "0")],
)
def test_host_durations_are_bounds_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: str
) -> None:
    path = tmp_path / "book.yaml"
    path.write_text(
        f"name: t\nhosts:\n  h:\n    address: local\n    {key}: {value}\nsteps:\n  - id: a\n    kind: shell\n"
        "    script: echo\n"
    )
    assert main(["validate", str(path)]) == 2
    assert f"{path}:5:" in capsys.readouterr().err


def test_a_parameter_float_cannot_be_infinite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "book.yaml"
    path.write_text(
        "name: t\nhosts: {h: {address: local}}\nsteps:\n  - id: e\n    kind: eval_acceptance\n"
        "    base_url: http://127.0.0.1:1\n    request_timeout: .inf\n"
    )
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:7:" in err and "finite" in err


@pytest.mark.parametrize("key", ["request_timeout", "flush_retry_delay"])
@pytest.mark.parametrize("value", ["1e308", "31d", "-1"])
def test_an_eval_s_request_timeout_and_flush_delay_are_bounds_like_any_duration(
    key: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1e308 passed as a finite float, then the host program failed with a traceback (OverflowError: its
    # deadline's timer, a socket timeout, a sleep); a duration is at most 30 days
    path = tmp_path / "book.yaml"
    path.write_text(
        "name: t\nhosts: {h: {address: local}}\nsteps:\n  - id: e\n    kind: eval_acceptance\n"
        f"    base_url: http://127.0.0.1:1\n    {key}: {value}\n"
    )
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:7:" in err and "Traceback" not in err


def test_a_retry_delay_of_zero_is_a_pause_not_a_bound_and_is_allowed(tmp_path: Path) -> None:
    path = tmp_path / "book.yaml"
    path.write_text(
        "name: t\nhosts: {h: {address: local}}\ndefaults: {retry: {delay: 0}}\n"
        "steps:\n  - id: a\n    kind: shell\n    script: echo\n"
    )
    assert main(["validate", str(path)]) == 0


# ---- names that reach file paths --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["..", "../x", "a/b", ".hidden", "/", "-rf", "a\\u0000b", "h\\n"])
def test_a_host_name_that_could_leave_the_run_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path = tmp_path / "book.yaml"
    path.write_text(
        f'name: t\nhosts:\n  "{name}": {{address: local}}\nsteps:\n  - id: a\n    kind: shell\n    script: echo\n'
    )
    assert main(["validate", str(path)]) == 2
    assert f"{path}:3:3: hosts: host name" in capsys.readouterr().err


def test_an_inventory_host_name_is_checked_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    book, site = tmp_path / "book.yaml", tmp_path / "site.yaml"
    book.write_text("name: t\nhosts: {h: {address: local}}\nsteps:\n  - id: a\n    kind: shell\n    script: echo\n")
    site.write_text('hosts:\n  "../../etc": {address: local}\n')
    assert main(["validate", str(book), "--inventory", str(site)]) == 2
    assert "host name '../../etc'" in capsys.readouterr().err


@pytest.mark.parametrize("dest", ["../../outside", "/tmp/outside", "a/../../b", "", ".", "./."])
def test_a_fetch_that_would_write_outside_the_run_folder_is_refused_at_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dest: str
) -> None:
    path = tmp_path / "book.yaml"
    path.write_text(
        "name: t\nhosts: {h: {address: local}}\nsteps:\n  - id: a\n    kind: shell\n    script: echo\n"
        f"    fetch: [{{src: /etc/hostname, dest: {json.dumps(dest)}}}]\n"
    )
    assert main(["validate", str(path)]) == 2
    assert "must be a relative path inside the host's folder of the run" in capsys.readouterr().err


def test_connecting_never_outlives_the_step_s_own_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    silent = socket.socket()  # accepts TCP, never says a word of SSH: a host that stopped answering
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        path = tmp_path / "book.yaml"
        path.write_text(
            "name: t\nhosts:\n  box:\n    address: 127.0.0.1\n"
            f"    port: {silent.getsockname()[1]}\n    user: nobody\n    connect_timeout: 10m\n"
            "steps:\n  - id: a\n    kind: shell\n    timeout: 1s\n    script: echo\n"
        )
        code, err = run(path, tmp_path / "logs", capsys)
    finally:
        silent.close()
    assert code == 1
    assert "could not connect to box within 1s" in err


# ---- gates: what a second reader found ---------------------------------------------------------------


def test_any_use_of_vars_but_a_plain_lookup_makes_a_gate_read_every_var() -> None:
    assert gates.var_refs("vars.port > 1 and vars['x'] == 'y'") == ["port", "x"]
    for expression in ("vars.get('want') == stdout", "vars['wa' ~ 'nt']", "vars | length", "vars[stdout]"):
        assert "*" in gates.var_refs(expression), expression
    assert gates.var_refs("facts.vars.port") == []


def test_a_resume_reruns_a_step_whose_gate_reads_a_changed_var_through_get(tmp_path: Path, write_runbook: Any) -> None:
    from tests.executor.test_resume import cli

    book = write_runbook(
        "name: t\n__HOSTS__\nvars: {want: hi}\nsteps:\n"
        "  - id: a\n    kind: shell\n    pass_env: []\n    script: echo hi\n"
        "    gates: [\"stdout.strip() == vars.get('want')\"]\n"
    )
    logs = tmp_path / "logs"
    assert cli("run", str(book), "--log-dir", str(logs)).returncode == 0
    again = cli("run", str(book), "--resume", "--var", "want=bye", "--log-dir", str(logs))
    assert again.returncode == 1 and "runs again (changed since" in again.stderr, again.stderr


def test_a_generator_is_tested_for_what_it_yields() -> None:
    names = {**NAMES, "facts": {"gpus": [{"ok": False}]}}
    never, some = evaluate_all(["facts.gpus | selectattr('ok')", "facts.gpus | rejectattr('ok')"], names)
    assert not never.passed and some.passed


def test_a_failed_gate_s_detail_is_cut_whatever_the_host_printed() -> None:
    (verdict,) = evaluate_all(["vars[stdout] == 1"], {**NAMES, "stdout": "A" * 2_000_000})
    assert not verdict.passed and len(verdict.detail) < gates.DETAIL_MAX + 100


def test_a_failed_gate_leaves_its_worker_for_the_next_attempt() -> None:
    async def go() -> tuple[int, int]:
        pool = GateWorkers()
        try:
            with pytest.raises(RuntimeError):
                async with pool.session(NAMES) as worker:
                    assert not (await worker.evaluate("exit_code == 1", None)).passed
                    raise RuntimeError("the attempt failed")  # as the engine's AttemptFailed does
            async with pool.session(NAMES) as again:
                return id(worker), id(again)
        finally:
            await pool.close()

    first, second = asyncio.run(go())
    assert first == second


def test_a_gate_that_parses_only_inside_a_wrapper_is_refused() -> None:
    assert gates.syntax_error("exit_code == 0) or (true") is not None
    assert gates.syntax_error("exit_code == 0") is None


def test_a_worker_dies_with_a_run_that_was_killed_mid_gate(write_runbook: Any, tmp_path: Path) -> None:
    proc = start_spinning_gate(write_runbook, tmp_path)
    try:
        workers = [p for p in Path("/proc").glob("[0-9]*") if _is_worker_of(p, proc.pid)]
    finally:
        proc.kill()
        proc.communicate()  # its pipes too
    assert workers, "no gate worker found"
    deadline = time.monotonic() + 10
    while any(w.exists() and _state(w) != "Z" for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(w.exists() and _state(w) != "Z" for w in workers)


def _is_worker_of(proc_dir: Path, parent: int) -> bool:
    try:
        stat = (proc_dir / "stat").read_text()
        cmdline = (proc_dir / "cmdline").read_bytes()
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"gates.py" in cmdline


def _state(proc_dir: Path) -> str:
    try:
        return (proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


@pytest.mark.parametrize(
    ("expression", "alone"),
    [
        ("exit_code == 0", True),
        ("exit_code != 1", True),
        ("exit_code < 3", True),
        ("exit_code >= 0 != 7", True),
        ("exit_code == 0 and 'ok' in stdout", False),  # reads the output
        ("exit_code == 10 ** 10 ** 8", False),  # work of its own
        ("exit_code == 99999999999999999999", False),  # no small number
        ("exit_code == '0'", False),
        ("exit_code == true", False),
        ("exit_code in [0, 1]", False),
        ("0 == exit_code", False),
        ("exit_code == 0) or (1", False),
    ],
)
def test_only_a_gate_comparing_the_exit_code_with_numbers_is_evaluated_without_a_worker(
    expression: str, alone: bool
) -> None:
    assert gates.bounded_by_itself(expression) is alone


def test_such_gates_give_the_verdicts_a_worker_gives_and_start_no_worker() -> None:
    expressions = ["exit_code == 0", "exit_code != 1", "exit_code < 3"]

    async def go() -> tuple[list[tuple[bool, str]], list[tuple[bool, str]], int]:
        pool = GateWorkers()
        try:
            inline, worker = [], []
            codes = (0, 1, 5, None)
            for code in codes:
                async with pool.session({**NAMES, "exit_code": code}, expressions) as evaluator:
                    inline += [((v := await evaluator.evaluate(e, "m")).passed, v.detail) for e in expressions]
            started = len(pool._all)
            for code in codes:
                async with pool.session({**NAMES, "exit_code": code}) as evaluator:  # no expressions: a worker
                    worker += [((v := await evaluator.evaluate(e, "m")).passed, v.detail) for e in expressions]
            return inline, worker, started
        finally:
            await pool.close()

    inline, worker, started = asyncio.run(go())
    assert started == 0
    assert inline == worker and (True, "") in inline and any(not passed for passed, _ in inline)
