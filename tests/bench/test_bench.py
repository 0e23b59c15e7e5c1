"""The harness, and benchmarks 1, 2 and 5 at tiny sizes: everything runs, the ratios come out.

No timing is asserted (speed is shown by `python -m bench`, never by a test): these prove that
interleaving and medians work, that every installed tool runs the cases against a real sshd, that
the self-checking transfer script catches damage, that a tool meeting the command-line limit is
reported failed, and that the report is written with its machine and the command to rerun.
"""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import pytest
import yaml

from bench import __main__ as bench_main
from bench import overhead, transfer
from bench.fleet import sshd_fleet
from bench.harness import Section, Series, Table, ToolFailed, fmt_seconds, interleave, paired_median
from bench.tools import Ansible, AsyncsshFloor, LongLivedBash, Pyinfra, RunbookCLI


def installed_names(*names: str) -> set[str]:
    """The runner names among `names` whose tool is installed here (ansible, pyinfra are optional)."""
    optional = {r.name: r for r in (Ansible(), Ansible("script"), Pyinfra(), Pyinfra("script"))}
    return {name for name in names if name not in optional or optional[name].missing() is None}


def rows(section: Section) -> dict[str, list[str]]:
    [table] = section.tables
    return {row[0]: row for row in table.rows}


def test_interleave_rotates_order_and_stops_a_failed_case() -> None:
    order: list[str] = []

    def case(name: str, seconds: float) -> float:
        order.append(name)
        return seconds

    def broken() -> float:
        order.append("c")
        raise ToolFailed("exit 7: Argument list too long")

    series = interleave(
        3, {"a": lambda: case("a", 1.0), "b": lambda: case("b", 3.0), "c": broken}, log=lambda _line: None
    )
    assert order == ["a", "b", "c", "b", "a", "a", "b"]  # rotated each repetition; "c" never again
    assert series["a"].times == [1.0, 1.0, 1.0] and series["a"].median == 1.0
    assert series["c"].failure == "exit 7: Argument list too long" and series["c"].median is None
    assert paired_median(series["b"], series["a"], lambda b, a: b / a) == 3.0
    assert paired_median(series["c"], series["a"], lambda c, a: c / a) is None
    assert Series([2.0, 9.0, 4.0]).median == 4.0


def test_table_escapes_cells() -> None:
    table = Table(["tool", "time"], [["a | b", "1\n2"]])
    assert table.markdown().splitlines()[-1] == "| a \\| b | 1 2 |"


@pytest.mark.parametrize("size", [2048, 8192, transfer.SIZE])
def test_checking_script_is_exact_and_catches_damage(size: int) -> None:
    script = transfer.checking_script(7, size)
    assert len(script.encode()) == size and script != transfer.checking_script(8, size)
    assert subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True).stdout.startswith("ok ")
    at = script.index("<<'PAYLOAD_EOF'\n") + 40  # a byte inside the payload
    damaged = script[:at] + ("A" if script[at] != "A" else "B") + script[at + 1 :]
    done = subprocess.run(["bash", "-s"], input=damaged, capture_output=True, text=True)
    assert done.returncode == 4 and "payload sha256 is" in done.stderr
    assert subprocess.run(["bash", "-s"], input=script[: size // 2], capture_output=True, text=True).returncode != 0


def test_overhead_and_audit_compute_ratios_for_every_tool() -> None:
    first, audit = overhead.sections(("overhead", "audit"), steps=3, reps=1)
    tools = rows(first)
    runner_floor, inside_bash = LongLivedBash(), LongLivedBash(fork=False)
    expected = installed_names(
        "runbook (CLI)",
        "runbook (in-process)",
        "runbook (CLI, runner: exec)",
        "runbook (in-process, runner: exec)",
        "runbook transport, persistent runner",
        "runbook transport, exec channels",
        "ansible-playbook",
        "pyinfra",
        runner_floor.name,
        inside_bash.name,
        "raw asyncssh (floor)",
    )
    assert set(tools) == expected
    for row in tools.values():  # at 3 steps a marginal cost can come out <= 0, and its ratio "—"
        assert all(cell != "—" and "failed" not in cell for cell in row[:-2]), row
        assert row[-1].endswith("x")
    assert tools["raw asyncssh (floor)"][-1] == "1x"
    assert all(": not run: " in note for note in first.notes)  # only tools not installed here
    floor_target, ansible_target, *runner_targets = first.targets
    assert "within 1.5x of the raw asyncssh floor" in floor_target.text and " per step = " in floor_target.detail
    assert ("ansible-playbook not run" in ansible_target.detail) == ("ansible-playbook" not in tools)
    assert [t.text.split(":")[0] for t in runner_targets] == ["runbook transport, persistent runner"] * 2 + [
        "runbook (CLI)"
    ] * 2  # issue 7's two targets, for the runner alone and as users run it
    assert f"within 2x of {runner_floor.name}" in runner_targets[0].text
    assert "at least 100x lower than Ansible's" in runner_targets[1].text
    cases = rows(audit)
    assert set(cases) == {"runbook (in-process)", "runbook (in-process, audit log off)", "raw asyncssh (floor)"}
    assert all(row[2] != "—" for row in cases.values())
    assert audit.notes[0].startswith("The audit log costs ")


def test_the_cli_of_another_checkout_runs_from_that_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--before TREE`: the row's CLI is TREE's (its folder first on PYTHONPATH, run from it), not this one's;
    TREE here is a checkout from before executor/ had its rooms (executor/cli.py, not executor/faces/cli.py)."""
    tree = tmp_path / "before"
    (tree / "executor").mkdir(parents=True)
    (tree / "executor" / "__init__.py").write_text("")
    mark = "import os, sys\nopen(os.environ['MARK'], 'w').write(__file__ + ' ' + sys.argv[1])\n"
    (tree / "executor" / "cli.py").write_text(mark)
    monkeypatch.setenv("MARK", str(tmp_path / "mark"))
    cli = RunbookCLI(tree=tree)
    assert cli.run([], ["true"]) > 0
    assert (tmp_path / "mark").read_text() == f"{tree / 'executor' / 'cli.py'} run"
    assert cli.name == f"runbook (CLI), before: {tree}" and RunbookCLI().tree is None


def test_transfer_computes_ratios_for_every_way_of_every_tool() -> None:
    section = transfer.section(steps=2, size=8192, reps=1)
    tools = rows(section)
    assert set(tools) == installed_names(*(r.name for r in transfer.runners()))
    assert all(row[-1].endswith("x") for row in tools.values()), tools  # 8 KiB fits every way
    assert all(": not run: " in note for note in section.notes)


def test_a_script_over_the_command_line_limit_fails_and_is_reported(tmp_path: Path) -> None:
    floor, stdin = AsyncsshFloor(), AsyncsshFloor(stdin=True)
    with sshd_fleet(tmp_path, 1) as servers:
        with pytest.raises(ToolFailed, match="Argument list too long"):
            floor.run(servers, [transfer.checking_script(0, 160 * 1024)])
        assert stdin.run(servers, [transfer.checking_script(0, 160 * 1024)]) > 0
    failed = Series(failure="exit 1: /bin/bash: Argument list too long")
    times = overhead.StepTimes(
        2,
        {
            f"{floor.name}, 1 step": failed,
            f"{floor.name}, 2 steps": failed,
            f"{stdin.name}, 1 step": Series([0.1]),
            f"{stdin.name}, 2 steps": Series([0.3]),
        },
    )
    table = overhead.step_table(times, [floor, stdin], stdin)
    assert table.rows[0] == [floor.name, "failed (see below)", *["—"] * 5]
    assert table.rows[1][1:] == ["100 ms", "300 ms", "150 ms", "200 ms", "1x", "1x"]
    assert times.failures([floor, stdin]) == [f"{floor.name}: failed: {failed.failure}"]


def test_main_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    assert bench_main.main(["--quick", "--only", "audit", "--out", str(out)]) == 0
    text = out.read_text()
    assert "`python -m bench --quick --only audit --out " in text
    assert "## Machine" in text and "| OpenSSH | OpenSSH_" in text and "| cores |" in text
    assert "## 5. Audit cost — clean shell" in text


def test_the_gate_benchmark_measures_both_ways_side_by_side() -> None:
    from bench import gates

    section = gates.section(reps=1, log=lambda _line: None, attempts=3)
    (table,) = section.tables
    assert [row[0] for row in table.rows] == ["1 KiB", "1 MiB", "1 MiB, one gate reads it"]
    assert all("—" not in cell for row in table.rows for cell in row[1:])  # every case ran and was timed
    assert [t.reached is not None for t in section.targets] == [True, True, True]


def test_the_redaction_benchmark_measures_each_secret_set_against_none() -> None:
    from bench import redaction

    section = redaction.section(reps=1, log=lambda _line: None, size=1 << 20)
    (table,) = section.tables
    assert [row[0] for row in table.rows] == ["no secret", "one token", "a 20-line SSH key"]
    assert all("—" not in cell for row in table.rows for cell in row[1:])  # every case ran and was timed


def test_the_launch_benchmark_sets_the_same_cells_in_runbooks_order_against_a_naive_loop(tmp_path: Path) -> None:
    from bench import launches
    from executor.runbook.loader import parse_runbook

    host = {"address": "127.0.0.1", "port": 22}
    books = launches.runbooks(host, tmp_path, 30000)
    ours_data, naive_data = books.values()
    matrix = parse_runbook(yaml.safe_dump(ours_data), tmp_path / "m.yaml")
    flat = parse_runbook(yaml.safe_dump(naive_data), tmp_path / "n.yaml")
    cells = len(launches.TOKENS) * len(launches.OUTPUT_LENS)
    assert len(matrix.groups[0].cells) == cells and len(matrix.groups[0].servers) == len(launches.TOKENS)
    deploys = [s for s in flat.steps if s.kind == "deploy"]
    assert len(deploys) == cells  # a launch per cell: no two neighbours share a configuration
    tokens = [d.speculative_num_draft_tokens for d in deploys]
    assert all(a != b for a, b in itertools.pairwise(tokens))
    benches = [s for s in matrix.steps if s.kind == "benchmark"]
    assert sorted((b.output_len, b.server) for b in benches) == sorted(
        (o, f"deploy[tokens={t}]") for t in launches.TOKENS for o in launches.OUTPUT_LENS
    )


def test_the_startup_benchmark_times_every_command_against_the_baseline_and_judges_the_targets() -> None:
    from bench import startup

    section = startup.section(reps=1, log=lambda _line: None)
    (table,) = section.tables
    names = [f"runbook {name}" for name in startup.commands(Path())]
    assert [row[0] for row in table.rows] == [startup.BASELINE, startup.FLOOR, *names]
    assert table.columns[1:5] == ["median start to exit", "vs baseline", "median CPU", "CPU vs baseline"]
    assert all("failed" not in cell and "—" not in cell for row in table.rows for cell in row[1:5])  # each ran, timed
    assert [t.text.split("`")[1] for t in section.targets] == [
        "runbook status",
        "runbook runs",
        "runbook validate",
        "runbook plan",
    ]
    assert all(t.reached is not None for t in section.targets)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.9996, "1 s"), (0.9994, "999 ms"), (0.0009996, "1 ms"), (0.0009994, "999 µs"), (88.3, "88.3 s"), (None, "—")],
)
def test_a_duration_that_rounds_up_to_the_next_unit_is_written_in_it(seconds: float | None, text: str) -> None:
    assert fmt_seconds(seconds) == text
