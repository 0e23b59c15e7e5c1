"""The engine seam for steps whose commands run on several hosts (a node group): `StepSpec.peer_hosts` and
`own_hosts`, `StepContext.peer`. A test kind of its own, found as the kinds in steps/ are, runs one command on
its host and one on each peer: each is audited and evented as its host's, reads that host's vars and only the
facts of the steps that passed on it; the loader refuses unknown hosts and a contradicting `host:` at their line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executor.faces.cli import main
from tests.executor.test_engine import audit_records, extra_kind, run, status

GROUP_KIND = """\
from typing import Literal
from executor.stepkind import FactsError, Outcome, RenderContext, StepContext, StepSpec

class Pair(StepSpec):
    kind: Literal["pair"] = "pair"
    members: list[str]

    def own_hosts(self) -> list[str]:
        return self.members[:1]

    def peer_hosts(self) -> list[str]:
        return self.members[1:]

    def plan(self, ctx: RenderContext) -> list[tuple[str, str]]:
        return [(f"on {m}: {ctx.peer(m).fact('mark', 'who')}", f"echo {m}") for m in self.members]

    async def execute(self, ctx: StepContext) -> Outcome:
        seen = {}
        for member in self.members:
            peer = ctx.peer(member)
            result = await peer.run('printf %s "$where"')
            try:
                mark = peer.fact("mark", "who")
            except KeyError:
                mark = None
            seen[member] = {"where": result.stdout_text, "mark": mark, "address": peer.host_address}
        try:
            ctx.peer("c")
        except FactsError as exc:
            seen["c"] = str(exc)
        return Outcome(result, seen)
"""

RUNBOOK = """\
name: peers
hosts:
  a: {address: local, vars: {where: here-a}}
  b: {address: local, vars: {where: here-b}}
  c: {address: local, vars: {where: here-c}}
vars: {where: nowhere}
steps:
  - {id: mark, kind: shell, hosts: [a, c], parse: json, script: 'printf "{\\"who\\": \\"%s\\"}" "$where"'}
  - {id: pair, kind: pair, members: [a, b], pass_env: [where]}
"""


@pytest.fixture
def pair_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extra_kind(tmp_path, monkeypatch, "pair", GROUP_KIND)


def test_peer_commands_run_audited_and_evented_as_their_host_with_its_own_vars_and_facts(
    pair_kind: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rb.yaml"
    path.write_text(RUNBOOK)
    code, out, err = run(path, tmp_path / "logs", capsys, "--json")
    assert code == 0, err
    steps = {(s["step"], s["host"]): s for s in status(tmp_path / "logs", capsys)["steps"]}
    assert ("pair", "b") not in steps  # the step runs on its own host: facts are recorded there only
    facts = steps[("pair", "a")]["facts"]
    assert facts["a"] == {"where": "here-a", "mark": "here-a", "address": "local"}
    # b's vars; and no facts of `mark`, which ran on a and c but not on b (a's never stand in for b's)
    assert facts["b"] == {"where": "here-b", "mark": None, "address": "local"}
    assert facts["c"] == "step 'pair' has no connection to host 'c' (not one of its peer hosts)"
    commands = [
        (r["step"], r["host"], r["attempt"]) for r in audit_records(tmp_path / "logs") if r["event"] == "command"
    ]
    assert commands[-2:] == [("pair", "a", 1), ("pair", "b", 1)]
    events = [json.loads(line) for line in out.splitlines()]
    finished = [(e["host"], e["attempt"]) for e in events if e["event"] == "command_finished" and e["step"] == "pair"]
    assert finished == [("a", 1), ("b", 1)]
    started = next(e for e in events if e["event"] == "step_started" and e["step"] == "pair")
    assert started["hosts"] == ["a"]


def test_plan_lists_the_peers_and_renders_their_facts_by_host(
    pair_kind: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rb.yaml"
    path.write_text(RUNBOOK)
    assert main(["plan", "--full", str(path)]) == 0
    out = capsys.readouterr().out
    assert "## step 2 'pair' (pair) on a [local], primary\n#   also on b [local]\n" in out
    assert "# on b: <known at run time: steps.mark.hosts.b.facts.who>" in out
    assert main(["plan", "--json", str(path)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["steps"][1]["hosts"] == ["a"] and document["steps"][1]["on"][0]["variants"][0]["peers"] == ["b"]


def test_a_peer_s_definition_counts_in_the_step_s_fingerprint(
    pair_kind: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rb.yaml"
    path.write_text(RUNBOOK)
    assert run(path, tmp_path / "logs", capsys)[0] == 0
    path.write_text(RUNBOOK.replace("here-b", "elsewhere-b"))  # only the peer's var changes
    code, out, err = run(path, tmp_path / "logs", capsys, "--resume")
    assert code == 0, err
    assert "runs again (changed since" in out + err and "peer b" in out + err


@pytest.mark.parametrize(
    ("step", "where", "said"),
    [
        ("{id: pair, kind: pair, members: [a, bx]}", "bx", "step 'pair': unknown host 'bx'; did you mean 'b'?"),
        (
            "{id: pair, kind: pair, members: [a, b], host: b}",
            "host",
            "step 'pair' runs on a (members[0]); `host: b` says otherwise",
        ),
    ],
)
def test_the_loader_refuses_unknown_peers_and_a_host_the_step_does_not_run_on_at_their_line(
    pair_kind: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], step: str, where: str, said: str
) -> None:
    path = tmp_path / "rb.yaml"
    body = RUNBOOK.replace("  - {id: pair, kind: pair, members: [a, b], pass_env: [where]}\n", "")
    body += f"  - {step}\n"
    path.write_text(body)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    line = len(body.splitlines())
    column = body.splitlines()[-1].index(where) + 1
    assert f"{path}:{line}:{column}: {said}" in err, err
