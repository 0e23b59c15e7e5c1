"""The engine's semantics on scripted hosts (executor.transport.scripted), in-process: gates, retries, fallbacks,
facts per host, max_parallel, timeouts, secrets, matrix cells (`on_failure`, `when`), a placed group's lanes,
what a resume, `--from` and `--only` run again. These ran through a real sshd or a whole CLI subprocess (tests/executor/
test_engine.py, test_campaign_run.py, test_resume.py) although they test no transport; what only a real
transport proves stays there (signals, kill -9, process groups, host keys, transfers)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from executor.faces.cli import main
from executor.run import audit as audit_log
from executor.run.engine import Engine, RunOptions
from executor.run.events import Reporter
from executor.runbook.loader import load_runbook
from executor.transport.scripted import Answer, ScriptedCommand

if TYPE_CHECKING:  # the plugin is imported as a plugin, below (imported before, pytest could not rewrite it)
    from executor.faces.testing import Offline, OfflineRun

pytest_plugins = ["executor.faces.testing"]  # runbook's own plugin, installed or not (pyproject's pytest11 entry point)


def book(tmp_path: Path, body: str, hosts: str = "box", name: str = "runbook.yaml") -> Path:
    """A runbook of `body` (its name, vars and steps) with hosts `hosts` (space separated), none reachable."""
    listed = "".join(f"  {host}: {{address: {host}.example}}\n" for host in hosts.split())
    path = tmp_path / name
    path.write_text("hosts:\n" + listed + textwrap.dedent(body))
    return path


def statuses(run: OfflineRun) -> dict[str, str]:
    return {r.step: r.status for r in run.records}


def commanded(run: OfflineRun, offline: Offline, since: int = 0, host: str = "box") -> list[str]:
    """The first words of the scripts `host` received, from command number `since` on."""
    return [c.script.split()[0] for c in offline.commands(host)[since:]]


# ---- gates, retries, fallbacks (tests/executor/test_engine.py) -----------------------------------------


def test_failed_gate_explains_itself_and_empty_output_is_loud(runbook_offline: Offline, tmp_path: Path) -> None:
    path = book(
        tmp_path,
        """\
        name: t
        steps:
          - id: probe
            kind: shell
            script: grep -rl trtllm_mla /opt
            gates:
              - that: "'trtllm_mla' in stdout"
                message: no MLA attention backend found
        """,
    )
    runbook_offline.host("box").on("grep", stderr="noise on stderr\n")
    run = runbook_offline.run(path)
    assert run.exit_code == 1
    finished = next(e for e in run.events if e["event"] == "step_finished")
    (failure,) = finished["failures"]
    assert failure.startswith("probe@box: [primary] no MLA attention backend found")
    for said in ("gate: 'trtllm_mla' in stdout", 'stdout = ""  (empty)', "(stdout was empty)", "| noise on stderr"):
        assert said in failure
    assert run.step("probe").status == "failed" and "no MLA attention backend" in str(run.step("probe").message)


def test_retries_are_attempted_and_recorded(runbook_offline: Offline, tmp_path: Path) -> None:
    path = book(
        tmp_path,
        """\
        name: t
        steps:
          - id: flaky
            kind: shell
            retry: {attempts: 4, delay: 10ms}
            script: ./flaky
        """,
    )
    runbook_offline.host("box").on("flaky", Answer(exit_code=1), Answer(exit_code=1), Answer())
    run = runbook_offline.run(path)
    assert run.exit_code == 0, run.failures()
    assert (run.step("flaky").status, run.step("flaky").attempts) == ("passed", 3)
    assert len(runbook_offline.commands("box")) == 3
    assert [e["attempt"] for e in run.events if e["event"] == "attempt_failed"] == [1, 2]
    assert [r["attempt"] for r in audit(run)] == [1, 2, 3]


def audit(run: OfflineRun) -> list[dict[str, Any]]:
    """The run's audit log's command records."""
    return [
        record for _, record, _ in audit_log.read_records(run.run_dir) if record and record.get("event") == "command"
    ]


def test_fallback_runs_after_retries_and_is_recorded(runbook_offline: Offline, tmp_path: Path) -> None:
    path = book(
        tmp_path,
        """\
        name: t
        steps:
          - id: download
            kind: shell
            retry: {attempts: 2, delay: 10ms}
            script: huggingface-cli download x
            gates:
              - that: "stderr == ''"
                message: the download method reported an error
            fallbacks:
              - script: snapshot_download x
                gates: ["'fetched' in stdout"]
        """,
    )
    box = runbook_offline.host("box")
    box.on("^huggingface-cli", stderr="huggingface-cli: command not found\n")
    box.on("^snapshot_download", stdout="fetched with snapshot_download\n")
    run = runbook_offline.run(path)
    assert run.exit_code == 0, run.failures()
    assert (run.step("download").via, run.step("download").attempts) == ("fallback 1", 3)
    assert [(r["via"], r["attempt"]) for r in audit(run)] == [("primary", 1), ("primary", 2), ("fallback 1", 3)]
    assert commanded(run, runbook_offline) == ["huggingface-cli", "huggingface-cli", "snapshot_download"]


def test_facts_flow_to_later_gates_per_host(runbook_offline: Offline, tmp_path: Path) -> None:
    path = book(
        tmp_path,
        """\
        name: t
        steps:
          - id: ident
            kind: shell
            hosts: all
            parse: json
            script: ident
          - id: use
            kind: shell
            hosts: [a, c]
            script: "true"
            gates:
              - that: steps.ident.facts.marker | length > 0
              - that: steps.ident.hosts.b.facts.marker != steps.ident.facts.marker
        """,
        hosts="a b c",
    )
    for name in "abc":
        runbook_offline.host(name).on("ident", stdout=f'{{"marker": "m-{name}"}}').on("true")
    run = runbook_offline.run(path)
    assert run.exit_code == 0, run.failures()
    assert [(r.step, r.host) for r in run.records] == [("ident", h) for h in "abc"] + [("use", "a"), ("use", "c")]
    assert [run.facts("ident", h)["marker"] for h in "abc"] == ["m-a", "m-b", "m-c"]
    assert {r["host"] for r in audit(run)} == {"a", "b", "c"}


def test_a_gate_reads_the_facts_of_its_own_host_and_fails_on_the_one_that_differs(
    runbook_offline: Offline, tmp_path: Path
) -> None:
    path = book(
        tmp_path,
        """\
        name: t
        steps:
          - {id: ident, kind: shell, hosts: all, parse: json, script: ident}
          - id: use
            kind: shell
            hosts: all
            script: "true"
            gates: ["steps.ident.facts.gpus > 0"]
        """,
        hosts="a b",
    )
    runbook_offline.host("a").on("ident", stdout='{"gpus": 1}').on("true")
    runbook_offline.host("b").on("ident", stdout='{"gpus": 0}').on("true")
    run = runbook_offline.run(path)
    assert run.exit_code == 1
    assert (run.step("use", "a").status, run.step("use", "b").status) == ("passed", "failed")


def test_max_parallel_bounds_concurrent_hosts(runbook_offline: Offline, tmp_path: Path) -> None:
    names = [f"h{i}" for i in range(5)]
    path = book(
        tmp_path,
        """\
        name: t
        defaults: {max_parallel: 2}
        steps:
          - {id: fan, kind: shell, hosts: all, script: work}
        """,
        hosts=" ".join(names),
    )
    spans: list[tuple[float, float]] = []

    def traced(command: ScriptedCommand) -> Answer:
        spans.append((time.monotonic(), time.monotonic() + 0.1))
        return Answer(delay=0.1)

    for name in names:
        runbook_offline.host(name).on("work", traced)
    assert runbook_offline.run(path).exit_code == 0
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = [sum(step for _, step in edges[: i + 1]) for i in range(len(edges))]
    assert len(spans) == 5 and max(running) == 2


def test_a_failed_step_keeps_the_facts_of_its_last_attempt(runbook_offline: Offline, tmp_path: Path) -> None:
    path = book(
        tmp_path,
        """\
        name: t
        steps:
          - id: probe
            kind: shell
            parse: json
            retry: {attempts: 1}
            script: probe
            gates: ["facts.gpus > 0"]
        """,
    )
    runbook_offline.host("box").on("probe", stdout='{"gpus": 0, "reason": "nvidia-smi not found"}\n')
    run = runbook_offline.run(path)
    assert run.exit_code == 1
    assert run.step("probe").status == "failed"
    assert run.facts("probe") == {"gpus": 0, "reason": "nvidia-smi not found"}


def test_a_timeout_fails_the_attempt_with_the_partial_output_and_a_retry_follows(
    runbook_offline: Offline, tmp_path: Path
) -> None:
    path = book(
        tmp_path,
        """\
        name: t
        steps:
          - {id: slow, kind: shell, timeout: 200ms, retry: {attempts: 2, delay: 10ms}, script: slow}
        """,
    )
    runbook_offline.host("box").on("slow", Answer(stdout="half way\n", hang=True), Answer(stdout="done\n"))
    run = runbook_offline.run(path)
    assert run.exit_code == 0, run.failures()
    (failure,) = run.failures()
    assert "timed out after 0.2s" in failure and "| half way" in failure
    assert run.step("slow").attempts == 2


def test_a_broken_connection_is_a_failed_attempt_that_keeps_the_output_so_far(
    runbook_offline: Offline, tmp_path: Path
) -> None:
    path = book(tmp_path, "name: t\nsteps:\n  - {id: s, kind: shell, retry: {attempts: 1}, script: s}\n")
    runbook_offline.host("box").on("^s$", stdout="started\n", error="connection to box lost")
    run = runbook_offline.run(path)
    assert run.exit_code == 1
    assert "transport error: connection to box lost" in str(run.step("s").message)
    (record,) = audit(run)
    assert record["stdout"] == "started\n" and record["exit_code"] is None


def test_an_unscripted_command_fails_its_step_naming_it(runbook_offline: Offline, tmp_path: Path) -> None:
    path = book(tmp_path, "name: t\nsteps:\n  - {id: s, kind: shell, retry: {attempts: 1}, script: rm -rf /data}\n")
    run = runbook_offline.run(path)
    assert run.exit_code == 1
    assert "no scripted answer on box for the command: 'rm -rf /data'" in str(run.step("s").message)


# ---- matrix cells (tests/executor/test_campaign_run.py) -----------------------------------------------

SWEEP = """\
    name: sweep
    steps:
      - {id: pre, kind: shell, script: echo pre}
      - group: grid
        matrix:
          srv: [x, y]
          conc: CONCS
        ON_FAILURE
        steps:
          - id: up
            kind: shell
            WHEN
            script: echo "up $matrix_srv"
          - id: bench
            kind: shell
            script: bench
            gates:
              - exit_code == 0
              - "steps.up.status == 'passed' and matrix.conc in [1, 2, 3]"
              - "stdout is search('bench ' ~ matrix.srv ~ ' ' ~ matrix.conc)"
          - id: note
            kind: shell
            script: echo "note $matrix_srv $matrix_conc"
      - {id: post, kind: shell, script: echo post}
    """


def sweep(tmp_path: Path, *, on_failure: str = "continue", when: str = "", concs: str = "[1, 2]") -> Path:
    text = (
        SWEEP.replace("ON_FAILURE", f"on_failure: {on_failure}")
        .replace("WHEN", f'when: "{when}"' if when else "")
        .replace("CONCS", concs)
    )
    return book(tmp_path, text)


def sweep_host(offline: Offline, fail: str = "none") -> None:
    """`bench` prints its cell (from the `matrix_*` environment) and fails in cell `fail` (as `y-1`)."""

    def bench(command: ScriptedCommand) -> Answer:
        cell = f"{command.env['matrix_srv']}-{command.env['matrix_conc']}"
        said = f"bench {command.env['matrix_srv']} {command.env['matrix_conc']}\n"
        return Answer(stdout=said, exit_code=1 if cell == fail else 0)

    offline.host("box").on("^echo ").on("^bench$", bench)


def test_on_failure_continue_records_the_cell_runs_the_others_and_exits_5(
    runbook_offline: Offline, tmp_path: Path, capsys: Any
) -> None:
    sweep_host(runbook_offline, fail="y-1")
    run = runbook_offline.run(sweep(tmp_path))
    assert run.exit_code == 5 and run.status == "cells-failed"
    steps = statuses(run)
    assert steps["bench[srv=y,conc=1]"] == "failed" and steps["note[srv=y,conc=1]"] == "skipped"
    assert str(run.step("note[srv=y,conc=1]").message).startswith("cell failed: bench[srv=y,conc=1]: ")
    assert all(status == "passed" for step, status in steps.items() if not step.endswith("[srv=y,conc=1]"))
    progress = [e for e in run.events if e["event"] == "cells_progress"]
    assert {e["group"] for e in progress} == {"grid"}
    assert progress[-1]["cells"] == {"total": 4, "passed": 3, "failed": 1, "skipped": 0, "running": 0}
    started = next(e for e in run.events if e["event"] == "step_started" and e["step"] == "bench[srv=x,conc=2]")
    assert (started["group"], started["cell"]) == ("grid", {"srv": "x", "conc": "2"})
    # `runbook status` lists the failed cell
    assert main(["status", "--log-dir", str(runbook_offline.log_dir)]) == 0
    shown = capsys.readouterr().out
    assert "failed cells (1):" in shown and "grid[srv=y,conc=1]: bench[srv=y,conc=1]:" in shown
    assert main(["status", "--log-dir", str(runbook_offline.log_dir), "--json"]) == 0
    [failed] = json.loads(capsys.readouterr().out)["failed_cells"]
    assert (failed["group"], failed["cell"]) == ("grid", "srv=y,conc=1")


def test_on_failure_stop_fails_the_run_at_the_failed_cell(runbook_offline: Offline, tmp_path: Path) -> None:
    sweep_host(runbook_offline, fail="x-2")
    run = runbook_offline.run(sweep(tmp_path, on_failure="stop"))
    assert run.exit_code == 1
    steps = statuses(run)
    assert steps["bench[srv=x,conc=2]"] == "failed"
    assert steps["up[srv=y]"] == "pending" and steps["post"] == "pending"


def test_a_false_when_skips_the_instance_with_its_message_and_its_cells_dependents(
    runbook_offline: Offline, tmp_path: Path
) -> None:
    sweep_host(runbook_offline)
    path = sweep(tmp_path, when="matrix.srv != 'y'")
    run = runbook_offline.run(path)
    assert run.exit_code == 0, run.failures()
    assert (run.step("up[srv=y]").status, run.step("up[srv=y]").message) == (
        "skipped",
        "when: matrix.srv != 'y' is false",
    )
    assert run.step("bench[srv=y,conc=1]").status == "skipped"
    assert "up[srv=y]" in str(run.step("bench[srv=y,conc=1]").message)
    assert run.step("up[srv=x]").status == "passed" and run.step("post").status == "passed"
    assert "up y" not in [c.script for c in runbook_offline.commands("box")]
    progress = [e for e in run.events if e["event"] == "cells_progress"]
    assert progress[-1]["cells"]["skipped"] == 2 and progress[-1]["cells"]["passed"] == 2
    sent = len(runbook_offline.commands("box"))
    again = runbook_offline.run(path, resume="latest")  # unchanged, the `when:` would be false again
    assert again.exit_code == 0 and runbook_offline.commands("box")[sent:] == []
    assert again.records[0].status == "passed"


def test_a_when_that_cannot_be_evaluated_fails_the_instance_instead_of_skipping_it(
    runbook_offline: Offline, tmp_path: Path
) -> None:
    """A typo in a fact's path is an error, not a `false`: skipping would hide it as a quiet `skipped` cell."""
    sweep_host(runbook_offline)
    run = runbook_offline.run(sweep(tmp_path, when="steps.pre.facts.no_such_fact"))
    assert run.exit_code == 5  # on_failure: continue; the run said its cells failed
    message = str(run.step("up[srv=x]").message)
    assert run.step("up[srv=x]").status == "failed"
    assert "when: steps.pre.facts.no_such_fact could not be evaluated" in message
    assert "names something missing" in message


def test_a_new_axis_value_then_resume_runs_only_the_new_cells(runbook_offline: Offline, tmp_path: Path) -> None:
    sweep_host(runbook_offline)
    assert runbook_offline.run(sweep(tmp_path)).exit_code == 0
    sent = len(runbook_offline.commands("box"))
    done = runbook_offline.run(sweep(tmp_path, concs="[1, 2, 3]"), resume="latest")
    assert done.exit_code == 0, done.failures()
    ran = {r.step for r in done.records if r.reused_from is None and r.status == "passed"}
    assert ran == {f"{step}[srv={srv},conc=3]" for step in ("bench", "note") for srv in "xy"} | {"post"}
    assert len(runbook_offline.commands("box")[sent:]) == 5


# ---- a placed group's lanes (tests/executor/test_campaign_run.py) ---------------------------------------

LANES = """\
    name: pool
    steps:
      - group: spread_out
        matrix: {srv: SERVERS}
        hosts: HOSTS
        placement: spread
        steps:
          - {id: work, kind: shell, script: 'work "$matrix_srv"'}
    """


def lanes(tmp_path: Path, servers: str, hosts: str) -> Path:
    body = LANES.replace("SERVERS", servers).replace("HOSTS", f"[{', '.join(hosts.split())}]")
    return book(tmp_path, body, hosts=hosts, name="pool.yaml")


def intervals(run: OfflineRun) -> dict[str, tuple[float, float]]:
    started = {e["step"]: e["time"] for e in run.events if e["event"] == "step_started"}
    return {e["step"]: (started[e["step"]], e["time"]) for e in run.events if e["event"] == "step_finished"}


def test_a_placed_group_runs_one_lane_per_host_in_parallel(runbook_offline: Offline, tmp_path: Path) -> None:
    for name in "abc":
        runbook_offline.host(name).on("^work ", delay=0.3)
    run = runbook_offline.run(lanes(tmp_path, "[x, y, z]", "a b c"))
    assert run.exit_code == 0, run.failures()
    assert sorted(r.host for r in run.records) == ["a", "b", "c"]
    # some moment lies inside all three [started, finished] intervals: the lanes ran at once
    spans = intervals(run)
    assert len(spans) == 3 and max(s for s, _ in spans.values()) < min(e for _, e in spans.values()), spans


def test_in_a_placed_group_without_a_server_an_instance_runs_after_and_beside_the_mate_it_needs(
    runbook_offline: Offline, tmp_path: Path
) -> None:
    """`check[srv=x,n=1]` reads `steps.work`: placed alone it would run on another host while `work[srv=x]`
    still runs, and its gate would see `steps.work.status = "running"`."""
    check = "{id: check, kind: shell, script: 'check $matrix_n', gates: [\"steps.work.status == 'passed'\"]}"
    body = LANES.replace("{srv: SERVERS}", "{srv: [x, y], n: [1, 2]}").replace("HOSTS", "[a, b]")
    body = body.replace('"$matrix_srv"\'}\n', f'"$matrix_srv"\'}}\n          - {check}\n')
    for name in "ab":
        runbook_offline.host(name).on("^work ", delay=0.1).on("^check ")
    run = runbook_offline.run(book(tmp_path, body, hosts="a b"))
    assert run.exit_code == 0, run.failures()
    hosts_of = {r.step: r.host for r in run.records}
    assert all(hosts_of[f"check[srv={srv},n={n}]"] == hosts_of[f"work[srv={srv}]"] for srv in "xy" for n in (1, 2))


def test_a_failure_in_a_placed_group_that_stops_lets_running_lanes_finish_and_starts_nothing_new(
    runbook_offline: Offline, tmp_path: Path
) -> None:
    """Four units on three hosts: x and w on a, y on b, z on c. x fails at once while y and z still run: they
    finish, w (next on a's lane) never starts."""
    runbook_offline.host("a").on("^work", exit_code=1)
    for name in "bc":
        runbook_offline.host(name).on("^work", delay=0.2)
    run = runbook_offline.run(lanes(tmp_path, "[x, y, z, w]", "a b c"))
    assert run.exit_code == 1
    assert {(r.step, r.host): r.status for r in run.records} == {
        ("work[srv=x]", "a"): "failed",
        ("work[srv=y]", "b"): "passed",
        ("work[srv=z]", "c"): "passed",
        ("work[srv=w]", "a"): "pending",
    }


def test_a_resumed_placed_group_keeps_each_instance_on_the_host_it_ran_on(
    runbook_offline: Offline, tmp_path: Path
) -> None:
    """No server step: each instance is its own unit. A new first value would place x on a and y on b afresh
    (w, x on a; y on b); the resume keeps x on b and y on c where they passed, so neither runs again."""
    for name in "abc":
        runbook_offline.host(name).on("^work ")
    assert runbook_offline.run(lanes(tmp_path, "[v, x, y]", "a b c")).exit_code == 0
    sent = {name: len(runbook_offline.commands(name)) for name in "abc"}
    done = runbook_offline.run(lanes(tmp_path, "[w, v, x, y]", "a b c"), resume="latest")
    assert done.exit_code == 0, done.failures()
    again = [(name, c.script) for name in "abc" for c in runbook_offline.commands(name)[sent[name] :]]
    assert again == [("a", 'work "$matrix_srv"')] and runbook_offline.commands("a")[-1].env["matrix_srv"] == "w"
    placed = {r.step: r.host for r in done.records}
    assert placed == {"work[srv=v]": "a", "work[srv=x]": "b", "work[srv=y]": "c", "work[srv=w]": "a"}


# ---- resume, --from, --only (tests/executor/test_resume.py) -------------------------------------------


def steps_yaml(ids: list[str]) -> str:
    return "steps:\n" + "".join(f"  - {{id: {i}, kind: shell, script: 'run {i}'}}\n" for i in ids)


def plan_of(run: OfflineRun) -> dict[str, str]:
    """What the run said it does with each step (run_started's `plan`)."""
    return {s["id"]: s["plan"] for s in run.events[0]["steps"]}


def test_editing_a_step_reruns_it_and_everything_after(runbook_offline: Offline, tmp_path: Path) -> None:
    text = "name: edit-step\n" + steps_yaml(["e1", "e2", "e3", "e4"]).replace(
        "{id: e1,", "{id: e1, description: first take,"
    )
    path = book(tmp_path, text)
    box = runbook_offline.host("box")
    box.on("^run ").on("^run e4", Answer(exit_code=1), Answer())  # e4 fails once
    assert runbook_offline.run(path).exit_code == 1
    # e2's script changes, and only the description of e1, which must not count as a change
    path.write_text(path.read_text().replace("'run e2'", "'run e2 --v2'").replace("first take", "second take"))
    sent = len(box.commands)
    second = runbook_offline.run(path, resume="latest")
    assert second.exit_code == 0, second.failures()
    assert plan_of(second)["e2"].startswith("runs again (changed since ") and plan_of(second)["e2"].endswith(": step)")
    assert box.scripts()[sent:] == ["run e2 --v2", "run e3", "run e4"]
    assert main(["audit", "verify", str(second.run_dir)]) == 0


def test_a_step_that_failed_on_one_host_runs_again_only_there(runbook_offline: Offline, tmp_path: Path) -> None:
    path = book(
        tmp_path,
        "name: two-hosts\nsteps:\n"
        "  - {id: both, kind: shell, hosts: all, script: run both}\n"
        "  - {id: after, kind: shell, hosts: all, script: run after}\n",
        hosts="box here",
    )
    runbook_offline.host("here").on("^run ")
    runbook_offline.host("box").on("^run ").on("^run both", Answer(exit_code=1), Answer())
    first = runbook_offline.run(path, var=[])
    assert first.exit_code == 1
    assert {(r.step, r.host): r.status for r in first.records} == {
        ("both", "box"): "failed",
        ("both", "here"): "passed",
        ("after", "box"): "pending",
        ("after", "here"): "pending",
    }
    second = runbook_offline.run(path, resume="latest")
    assert second.exit_code == 0, second.failures()
    assert "runs again on box (did not pass there in" in plan_of(second)["both"]
    assert "reused on here" in plan_of(second)["both"]
    assert sorted((r["step"], r["host"]) for r in audit(second)) == [
        ("after", "box"),
        ("after", "here"),
        ("both", "box"),
    ]
    assert second.step("both", "here").reused_from == first.run_id
    assert all(r.status == "passed" for r in second.records)


def test_only_and_from_reuse_earlier_facts(runbook_offline: Offline, tmp_path: Path) -> None:
    path = book(
        tmp_path,
        """\
        name: from-only
        steps:
          - {id: a, kind: shell, parse: json, script: run a}
          - id: b
            kind: shell
            script: run b
            gates:
              - exit_code == 0
              - that: steps.a.facts.x == 5
                message: step a's facts did not arrive
          - {id: c, kind: shell, script: run c}
        """,
    )
    box = runbook_offline.host("box")
    box.on("^run ").on("^run a", stdout='{"x": 5}')
    first = runbook_offline.run(path)
    assert first.exit_code == 0, first.failures()

    only = runbook_offline.run(path, only_step="b")
    assert only.exit_code == 0, only.failures()
    assert [r["step"] for r in audit(only)] == ["b"]
    assert only.step("a").reused_from == first.run_id and only.facts("a") == {"x": 5}
    assert only.step("b").status == "passed" and only.step("b").reused_from is None
    assert only.step("c").status == "skipped" and "--only" in str(only.step("c").message)

    from_b = runbook_offline.run(path, from_step="b")
    assert from_b.exit_code == 0, from_b.failures()
    assert [r["step"] for r in audit(from_b)] == ["b", "c"]
    assert "although the step changed" not in plan_of(from_b)["a"]
    assert main(["audit", "verify", str(from_b.run_dir)]) == 0

    # a step before --from changed: its earlier facts are still used, and the plan says they may be stale
    path.write_text(path.read_text().replace("script: run a}", "script: run a --edited}"))
    stale = runbook_offline.run(path, from_step="b")
    assert stale.exit_code == 0, stale.failures()
    assert "although the step changed since (step; --from a runs it again)" in plan_of(stale)["a"]
    assert [r["step"] for r in audit(stale)] == ["b", "c"]
    assert box.scripts() == ["run a", "run b", "run c", "run b", "run b", "run c", "run b", "run c"]


def test_a_secret_the_host_prints_is_written_nowhere(runbook_offline: Offline, tmp_path: Path) -> None:
    path = book(
        tmp_path,
        """\
        name: t
        secrets:
          TOKEN: {env: TOKEN}
        steps:
          - {id: s, kind: shell, parse: json, retry: {attempts: 1}, script: whoami}
        """,
    )
    runbook_offline.environ["TOKEN"] = "tok_abcdef123456"
    runbook_offline.host("box").on("whoami", stdout='{"said": "tok_abcdef123456"}')
    run = runbook_offline.run(path)
    assert run.exit_code == 0, run.failures()
    assert runbook_offline.commands("box")[0].env["TOKEN"] == "tok_abcdef123456"  # the host got it
    assert run.facts("s") == {"said": "***"}
    assert not [p for p in run.run_dir.rglob("*") if p.is_file() and b"tok_abcdef123456" in p.read_bytes()]


# ---- runs as the CLI lists them, a runbook as loaded (tests/executor/test_engine.py) ------------------------


def test_runs_lists_recent_runs(runbook_offline: Offline, tmp_path: Path, capsys: Any) -> None:
    path = book(tmp_path, 'name: listed\nsteps:\n  - {id: a, kind: shell, script: "true"}\n')
    runbook_offline.host("box").on("true")
    for _ in range(2):
        assert runbook_offline.run(path).exit_code == 0
    assert main(["runs", "--log-dir", str(runbook_offline.log_dir), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["runbook"] for r in rows] == ["listed", "listed"] and {r["status"] for r in rows} == {"passed"}


def test_a_runbook_removed_after_loading_still_runs_as_loaded(runbook_offline: Offline, tmp_path: Path) -> None:
    """run.json records the digest of the text the run was loaded from: the file is not read again (an API
    caller's file may be gone or edited by the time the run starts). The Engine as an API caller makes it,
    with the scripted hosts as its transport factory."""
    path = book(tmp_path, 'name: t\nsteps:\n  - {id: a, kind: shell, script: "true"}\n')
    runbook_offline.host("box").on("true")
    loaded = path.read_bytes()
    runbook = load_runbook(path)
    path.unlink()
    engine = Engine(
        runbook, RunOptions(log_dir=tmp_path / "logs"), Reporter(), transport_factory=runbook_offline.transport
    )
    assert asyncio.run(engine.run()) == 0
    (run_dir,) = (tmp_path / "logs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["runbook_sha256"] == hashlib.sha256(loaded).hexdigest()
    assert runbook_offline.host("box").scripts() == ["true"]


def test_an_async_test_runs_a_runbook_on_its_own_event_loop(runbook_offline: Offline, tmp_path: Path) -> None:
    path = book(tmp_path, 'name: t\nsteps:\n  - {id: a, kind: shell, script: "true"}\n')
    runbook_offline.host("box").on("true")

    async def in_a_running_loop() -> OfflineRun:
        return await runbook_offline.run_async(path)

    assert asyncio.run(in_a_running_loop()).ran("passed") == ["a"]


def _port_taken() -> dict[str, Any]:
    """What hostprograms/deploy.py answers for a port held by a process the runbook did not start."""
    offline = Path(__file__).parents[1] / "runbooks" / "offline" / "k26_dflash_host.json"
    served: dict[str, Any] = json.loads(offline.read_text())["deploy"]["baseline"]
    holder = "pid 4242 (python3 -m http.server 30000)"
    return served | {
        "ready": False,
        "pid": None,
        "health": None,
        "generate": None,
        "ready_s": None,
        "server_version": None,
        "log_file": None,
        "port_holder": holder,
        "failure_class": "PortInUse",
        "failure": f"port 30000 is taken by {holder}, which is not a server this runbook started; stop it or ...",
    }


def test_a_taken_port_names_the_var_the_runbook_gave_as_the_port(runbook_offline: Offline, tmp_path: Path) -> None:
    """The canonical var-caused failure: deploy's PortInUse blames its `port` (`failure_params`), which the runbook
    gave as `$sglang_port`: the failure's headline leads with `sglang_port=30000`, and the attempt_failed event and
    the step's record carry the cause. A port written as a number names no var."""
    runbook_offline.host("box").program("deploy", _port_taken())
    deploy = "{id: serve, kind: deploy, model_path: /m, tp_size: 1, port: PORT}"
    named = book(
        tmp_path, f"name: t\nvars: {{sglang_port: 30000}}\nsteps:\n  - {deploy.replace('PORT', '$sglang_port')}\n"
    )
    run = runbook_offline.run(named)
    assert run.exit_code == 1
    assert run.failures()[0].startswith("serve@box: sglang_port=30000: port 30000 is taken by pid 4242")
    cause = {"var": "sglang_port", "value": "30000", "param": "port"}
    assert run.step("serve").cause == cause
    assert next(e for e in run.events if e["event"] == "attempt_failed")["cause"] == cause

    written = book(tmp_path, f"name: t\nsteps:\n  - {deploy.replace('PORT', '30000')}\n", name="literal.yaml")
    run = runbook_offline.run(written)
    assert run.exit_code == 1 and run.step("serve").cause is None
    assert run.failures()[0].startswith("serve@box: the SGLang server is not serving")
