"""A failed gate that read an unknown fact says why, with what was tried and the next step (issue 29, item 1).

The probe's facts keep a reason next to what they could not tell; a failure shows it with the value the host
expanded (`$sglang_python` -> the path) and what to check, the same in the console, `run --json`'s events,
`status --json` and the MCP server's `status` and `events`. The probe runs for real on `address: local` (the
host program, in a fraction of a second); the other sections, and gates of later steps and of other kinds,
on scripted hosts (executor.faces.testing)."""

from __future__ import annotations

import asyncio
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.clirun import runbook_cli

if TYPE_CHECKING:  # the plugin is imported as a plugin, below (imported before, pytest could not rewrite it)
    from executor.faces.testing import Offline

pytest_plugins = ["executor.faces.testing"]  # runbook's own plugin, installed or not (pyproject's pytest11 entry point)

GATE = "the SGLang of sglang_python is missing or has no DFLASH speculative decoding"


def words(text: str) -> str:
    """`text` with every run of whitespace one space: what it says, however a console wraps its lines."""
    return " ".join(text.split())


def wrong_python_runbook(tmp_path: Path) -> Path:
    """The flagship's probe gate on this machine, `python: $sglang_python`, its models dir under `tmp_path`."""
    path = tmp_path / "probe.yaml"
    path.write_text(
        textwrap.dedent(f"""\
            name: probe-unknowns
            hosts:
              gpu: {{address: local}}
            vars:
              sglang_python: /root/venv_sglang/bin/python
            steps:
              - id: probe
                kind: probe
                models_dir: {tmp_path / "models"}
                paths: []
                python: $sglang_python
                gates:
                  - that: facts.sglang.installed and facts.sglang.dflash
                    message: {GATE}
            """)
    )
    return path


def said_about_the_python(python: Path) -> list[str]:
    """What a failure says of a `sglang_python` that names no file: the reason with the expanded path, what the
    probe tried, and the next step."""
    return [
        f"why (facts.sglang.installed, facts.sglang.dflash): python '{python}' (from '$sglang_python') "
        "does not exist or is not executable",
        f"tried: python: $sglang_python -> {python}",
        f"next step: check that {python} exists on this machine and is executable, or set `sglang_python` "
        "(--var sglang_python=..., or in your inventory)",
    ]


@dataclass(frozen=True)
class WrongPython:
    """One `runbook run` of `wrong_python_runbook` with `--var sglang_python=PYTHON` (no such file)."""

    root: Path
    python: Path
    logs: Path
    stderr: str


@pytest.fixture(scope="module")
def wrong_python(tmp_path_factory: pytest.TempPathFactory) -> WrongPython:
    root = tmp_path_factory.mktemp("wrong-python")
    python, logs = root / "venv" / "bin" / "python", root / "logs"
    ran = runbook_cli("run", str(wrong_python_runbook(root)), f"--var=sglang_python={python}", f"--log-dir={logs}")
    assert ran.returncode == 1, ran.stderr
    return WrongPython(root, python, logs, ran.stderr)


def test_a_wrong_sglang_python_says_the_expanded_path_the_reason_and_the_next_step(wrong_python: WrongPython) -> None:
    expected, console = said_about_the_python(wrong_python.python), words(wrong_python.stderr)
    assert all(line in console for line in expected), wrong_python.stderr
    assert console.index(GATE) < console.index(expected[0])

    status = runbook_cli("status", "--log-dir", str(wrong_python.logs), "--json")
    (record,) = json.loads(status.stdout)["steps"]
    assert all(line in words(record["message"]) for line in expected), record["message"]
    assert record["facts"]["python"]["resolved"] == str(wrong_python.python)


def test_the_mcp_servers_status_and_events_say_the_same(wrong_python: WrongPython) -> None:
    """`events` answers the lines `run --json` prints; `status` the step records `status --json` shows."""
    pytest.importorskip("mcp.server.mcpserver", reason="the optional extra runbook[mcp]")
    from mcp_types import CallToolResult

    from executor.faces.mcp_server import Launches, Roots, build_server

    def call(tool: str, **arguments: Any) -> dict[str, Any]:
        launches = Launches()
        try:
            result = asyncio.run(build_server(launches, Roots([wrong_python.root])).call_tool(tool, arguments))
        finally:
            launches.close()
        assert isinstance(result, CallToolResult) and not result.is_error, result
        assert isinstance(result.structured_content, dict)
        return result.structured_content

    expected, logs = said_about_the_python(wrong_python.python), str(wrong_python.logs)
    status = call("status", log_dir=logs)
    (step,) = status["steps"]
    assert all(line in words(step["message"]) for line in expected), step["message"]
    events = call("events", run_id=status["run"]["run_id"], log_dir=logs)["events"]
    for kind in ("attempt_failed", "step_finished"):
        (event,) = [e for e in events if e["event"] == kind]
        message = event["message"] if kind == "attempt_failed" else "\n".join(event["failures"])
        assert all(line in words(message) for line in expected), message


# ---- every section of the probe that can be unknown, and gates of other steps and kinds (scripted hosts) -----


def flagship_probe(tmp_path: Path) -> Path:
    """The flagship runbook with its probe step alone, its gates as written, tried once (a gate that cannot be
    evaluated, on a null size, is otherwise tried again after 10 s)."""
    flagship = yaml.safe_load(Path("runbooks/k26_dflash.yaml").read_text())
    flagship["steps"] = [flagship["steps"][0] | {"retry": {"attempts": 1}}]
    path = tmp_path / "k26_probe.yaml"
    path.write_text(yaml.safe_dump(flagship, sort_keys=False))
    return path


def _no_gpu(doc: dict[str, Any]) -> None:
    doc["gpu"].update(gpus=[], nvidia_smi=None, reason="nvidia-smi not found on PATH (/usr/bin:/bin)")


def _no_token(doc: dict[str, Any]) -> None:
    doc["hf_token"].update(available=False, source=None, reason="no HF_TOKEN in the environment and no token file")


def _disk_unknown(doc: dict[str, Any]) -> None:
    doc["models"]["disk"].update(avail_bytes=None, unknown_reason="statvfs /root/models: Permission denied")


def _hub_refused(doc: dict[str, Any]) -> None:
    doc["hub"]["moonshotai/Kimi-K2.6"].update(bytes=None, unknown_reason="401 Client Error (endpoint https://hf.co)")


def _sglang_missing(doc: dict[str, Any]) -> None:
    doc["sglang"].update(installed=False, dflash=None)
    doc["sglang"]["unknown"]["dflash"] = "sglang is not installed for /root/venv_sglang/bin/python"


def test_every_gate_that_fails_is_said_at_once_so_a_newcomer_fixes_them_in_one_run(
    runbook_offline: Offline, tmp_path: Path
) -> None:
    """A host without a token, without SGLang and without a GPU: the first failed gate fails the probe (its class
    and headline), and the same failure says each other gate that failed, with why and the next step."""
    from executor.faces.testing import h200_probe

    probe = h200_probe()
    for change in (_no_token, _sglang_missing, _no_gpu):
        change(probe)
    runbook_offline.host("gpu").program("probe", probe)
    run = runbook_offline.run(flagship_probe(tmp_path))
    message = words(run.step("probe").message or "")
    assert message.startswith("[primary] no Hugging Face token reaches the host"), message
    for said in (
        "also failed: the SGLang of sglang_python is missing or has no DFLASH speculative decoding",
        "next step: install SGLang for /root/venv_sglang/bin/python on gpu-box.example, or set `sglang_python`",
        "also failed: no GPU found by nvidia-smi",
        "next step: check that `nvidia-smi` lists the GPUs on gpu-box.example",
    ):
        assert said in message, message
    assert message.index("also failed: the SGLang") < message.index("also failed: no GPU") < message.index("output")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            _no_gpu,
            [
                "why (facts.gpu_count): nvidia-smi not found on PATH (/usr/bin:/bin)",
                "next step: check that `nvidia-smi` lists the GPUs on gpu-box.example",
            ],
        ),
        (
            _no_token,
            [
                "why (facts.hf_token.available): no HF_TOKEN in the environment and no token file",
                "next step: give the secret HF_TOKEN in the controller's environment, or log in on gpu-box.example",
            ],
        ),
        (
            _disk_unknown,
            [
                "why (facts.models.disk.avail_bytes): statvfs /root/models: Permission denied",
                "tried: $models_dir -> /root/models",
                "next step: check that /root/models (or the folder it would be made in) is readable on gpu-box.example",
            ],
        ),
        (
            _hub_refused,
            [
                "why (facts.hub): 401 Client Error (endpoint https://hf.co)",
                "tried: moonshotai/Kimi-K2.6@main, asked with the huggingface_hub of /root/venv_sglang/bin/python",
                "next step: check that gpu-box.example reaches the Hub (HF_ENDPOINT) and that the token may read "
                "moonshotai/Kimi-K2.6@main",
            ],
        ),
        (
            _sglang_missing,
            [
                "why (facts.sglang.dflash): sglang is not installed for /root/venv_sglang/bin/python",
                "next step: install SGLang for /root/venv_sglang/bin/python on gpu-box.example, or set `sglang_python`",
            ],
        ),
    ],
    ids=["no-gpu", "no-token", "disk", "hub", "no-sglang"],
)
def test_each_probe_section_says_why_it_is_unknown_and_what_to_check(
    runbook_offline: Offline, tmp_path: Path, change: Any, said: list[str]
) -> None:
    from executor.faces.testing import h200_probe

    probe = h200_probe()
    change(probe)
    runbook_offline.host("gpu").program("probe", probe)
    run = runbook_offline.run(flagship_probe(tmp_path))
    assert run.ran("failed") == ["probe"]
    message = words(run.step("probe").message or "")
    assert all(line in message for line in said), message


@pytest.mark.parametrize(
    ("condition", "read"),
    [
        ("gates: [{that: steps.probe.facts.sglang.ddtree, message: no DDTREE}]", "steps.probe.facts.sglang.ddtree"),
        (
            "when: \"'DDTREE' in steps.probe.hosts.gpu.facts.sglang.speculative_algorithms\"",
            "steps.probe.hosts.gpu.facts.sglang.speculative_algorithms",
        ),
    ],
    ids=["gate", "when"],
)
def test_a_later_steps_gate_or_when_on_the_probes_facts_says_why_too(
    runbook_offline: Offline, tmp_path: Path, condition: str, read: str
) -> None:
    """A gate that reads `steps.probe.facts...`, and a `when:` that cannot be evaluated on a null one (the step
    fails rather than being skipped on an error), explain it by the probe's reasons and hints."""
    from executor.faces.testing import h200_probe

    probe = h200_probe()
    probe["python"].update(executable=None, resolved="/opt/sglang/bin/python", unknown_reason="no such python")
    probe["sglang"].update(installed=None, ddtree=None, speculative_algorithms=None)
    probe["sglang"]["unknown"].update(ddtree="no such python", speculative_algorithms="no such python")
    host = runbook_offline.host("gpu")
    host.program("probe", probe)
    host.on(r"echo deploy", stdout="deployed\n")
    book = tmp_path / "later.yaml"
    book.write_text(
        textwrap.dedent("""\
            name: later
            hosts:
              gpu: {address: gpu-box.example}
            vars: {sglang_python: /opt/sglang/bin/python}
            steps:
              - {id: probe, kind: probe, python: $sglang_python}
              - id: deploy
                kind: shell
                script: echo deploy
            """)
        + f"    {condition}\n"
    )
    run = runbook_offline.run(book)
    assert run.ran("failed") == ["deploy"]
    message = words(run.step("deploy").message or "")
    assert f"why ({read}): no such python" in message, message
    assert "next step: check that /opt/sglang/bin/python exists on gpu-box.example and is executable" in message


def test_any_kinds_facts_give_their_reason_by_the_convention(runbook_offline: Offline, tmp_path: Path) -> None:
    """A kind that knows no next step (a shell step's JSON) still shows the reason its facts keep next to the
    value: an `unknown_reason` of the section, or the section's `unknown` map naming the fact."""
    host = runbook_offline.host("box")
    said = {
        "disk": {"free": None, "unknown_reason": "df: /data: No such file"},
        "gpu": {"n": None, "unknown": {"n": "lspci is not installed"}},
    }
    host.on(r"measure", stdout=json.dumps(said) + "\n")
    book = tmp_path / "shell.yaml"
    book.write_text(
        textwrap.dedent("""\
            name: shell
            hosts:
              box: {address: box.example}
            steps:
              - id: measure
                kind: shell
                parse: json
                script: measure
                gates: [{that: "facts.disk.free > 0 or facts.gpu.n", message: nothing measured}]
            """)
    )
    run = runbook_offline.run(book)
    message = run.step("measure").message or ""
    assert "  why (facts.disk.free): df: /data: No such file\n" in message, message
    assert "  why (facts.gpu.n): lspci is not installed" in message, message
    assert "next step" not in message


def test_a_python_path_holding_a_secret_is_masked_and_its_next_step_is_no_var(tmp_path: Path) -> None:
    """`python: /opt/$TOK/bin/python` with TOK a secret: what was tried shows `***` where the value was, and the
    next step says where a secret is set (the controller's environment); it said `--var TOK=...`, which run
    refuses ("unknown var 'TOK'")."""
    token = "tok_Sup3rS3cretV4lue"
    book, logs = tmp_path / "secret.yaml", tmp_path / "logs"
    text = wrong_python_runbook(tmp_path).read_text().replace("python: $sglang_python", "python: /opt/$TOK/bin/python")
    book.write_text(text.replace("vars:\n", "secrets:\n  TOK: {env: RUNBOOK_TEST_PROBE_TOK}\nvars:\n"))
    ran = runbook_cli("run", str(book), f"--log-dir={logs}", env={"RUNBOOK_TEST_PROBE_TOK": token})
    assert ran.returncode == 1, ran.stderr
    status = runbook_cli("status", "--log-dir", str(logs), "--json").stdout
    for shown in (words(ran.stderr), words(json.loads(status)["steps"][0]["message"])):
        assert "tried: python: /opt/$TOK/bin/python -> /opt/***/bin/python" in shown, shown
        assert "or set `TOK` (the controller's $RUNBOOK_TEST_PROBE_TOK)" in shown, shown
        assert "--var TOK" not in shown
    assert token not in ran.stderr + status


def test_a_reason_of_many_lines_stays_inside_the_failure(tmp_path: Path) -> None:
    """A reason is the host's text: its later lines started at the console's first column, where a host could
    write what passes for the executor's own (`run passed`); each is indented under its `why` now, in the
    console and the stored message alike."""
    book = tmp_path / "lines.yaml"
    facts = {"free": None, "unknown_reason": "df failed\nrun passed in 1s\n  s  shell  h  passed"}
    step = {"id": "s", "kind": "shell", "parse": "json", "script": f"echo '{json.dumps(facts)}'"}
    doc = {"name": "lines", "hosts": {"h": {"address": "local"}}, "steps": [step | {"gates": ["facts.free > 0"]}]}
    book.write_text(yaml.safe_dump(doc, sort_keys=False))
    logs = tmp_path / "logs"
    ran = runbook_cli("run", str(book), "--log-dir", str(logs))
    assert ran.returncode == 1, ran.stderr
    (record,) = json.loads(runbook_cli("status", "--json", "--log-dir", str(logs)).stdout)["steps"]
    for shown in (ran.stderr, record["message"]):
        assert "  why (facts.free): df failed\n      run passed in 1s\n        s  shell  h  passed\n" in shown, shown
        assert "run passed" not in [line.split(" in ")[0] for line in shown.splitlines()]


def test_a_kind_whose_explanation_raises_still_fails_its_gate_saying_so(
    runbook_offline: Offline, tmp_path: Path
) -> None:
    """A bug in a kind's `unknown_facts` is named where the reason would be; the gate's failure stands."""
    from typing import Literal

    from executor.stepkind import FactHost, StepSpec, UnknownFact
    from steps.shell import ShellStep

    class Explaining(ShellStep):
        kind: Literal["explaining_test"] = "explaining_test"  # type: ignore[assignment]

        def unknown_facts(self, facts: Any, path: tuple[Any, ...], host: FactHost) -> list[UnknownFact]:
            raise RuntimeError("no hints today")

    try:
        runbook_offline.host("box").on(r"measure", stdout='{"free": null, "unknown_reason": "df failed"}\n')
        book = tmp_path / "explaining.yaml"
        book.write_text(
            "name: explaining\nhosts:\n  box: {address: box.example}\nsteps:\n"
            "  - {id: m, kind: explaining_test, parse: json, script: measure, gates: ['facts.free > 0']}\n"
        )
        run = runbook_offline.run(book)
    finally:
        StepSpec.registry.pop("explaining_test")  # a test kind: out of the registry the other tests read
    assert run.ran("failed") == ["m"]
    message = run.step("m").message or ""
    assert "why (facts.free): step kind 'explaining_test' could not say: RuntimeError: no hints today" in message
