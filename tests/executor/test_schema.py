"""`runbook schema`: the JSON Schema of the runbook format and of an inventory, checked with a real JSON
Schema validator against the shipped runbooks, the repo's inventories and runbooks the loader accepts."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from executor import strict_json
from executor.errors import InvalidRunbook
from executor.faces.cli import main
from executor.redact import NO_SECRETS
from executor.runbook.loader import load_runbook, parse_runbook
from executor.runbook.planner import plan_document
from executor.runbook.schema import inventory_schema, plan_schema, report_schema, runbook_schema
from executor.stepkind import StepSpec, step_kinds
from sandbox.sshd import SSHServer
from sandbox.testhost import PoolHost, pool_inventory

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = sorted((REPO / "runbooks").glob("*.yaml"))
SCHEMAS = REPO / "runbooks" / "schema"
RUNBOOK_VALIDATOR = jsonschema.Draft202012Validator(runbook_schema(), format_checker=None)
INVENTORY_VALIDATOR = jsonschema.Draft202012Validator(inventory_schema())


@pytest.fixture(autouse=True)
def shipped_kinds_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kinds of `steps/` alone: a test that adds a kind of its own (a module of its tmp_path put on
    `steps.__path__`, test_engine's and test_shell's) leaves it in the registry for the rest of the session."""
    kinds = {k: v for k, v in step_kinds().items() if Path(inspect.getfile(v)).parent == REPO / "steps"}
    monkeypatch.setattr(StepSpec, "registry", kinds)


def problems(validator: jsonschema.Draft202012Validator, data: Any) -> list[str]:
    """Every message of the schema's errors, those inside the alternatives and branches included."""
    out: list[str] = []
    stack = list(validator.iter_errors(data))
    while stack:
        error = stack.pop()
        out.append(error.message)
        stack.extend(error.context or [])
    return out


def shipped(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "runbooks" / name).read_text())
    return data


def schema_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["schema", *args])
    return code, capsys.readouterr().out


def test_the_schemas_are_valid_draft_2020_12() -> None:
    for schema in (runbook_schema(), inventory_schema()):
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("runbook", RUNBOOKS, ids=lambda p: p.name)
def test_every_shipped_runbook_validates(runbook: Path) -> None:
    assert problems(RUNBOOK_VALIDATOR, yaml.safe_load(runbook.read_text())) == []


@pytest.mark.parametrize("runbook", RUNBOOKS, ids=lambda p: p.name)
def test_every_shipped_runbook_names_the_committed_schema(runbook: Path) -> None:
    first = runbook.read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=schema/runbook.schema.json"
    assert (runbook.parent / first.partition("$schema=")[2]).is_file()


#: Every form the loader reads that a plain pydantic schema would refuse or not know: lax numbers and booleans,
#: durations as text, gates as text, a var-typed parameter, `${{ }}` in typed parameters and fallbacks, a
#: one-step matrix, a group with a pool, placement, include and exclude.
FORMS = """\
name: edge
hosts:
  a: {address: local}
  b: {address: gpu-box.example, port: "2222", verify_host_key: no, vars: {port: 9000}}
pools: {gpus: [a, b]}
vars: {port: 8000, flag: true, ratio: 1.5}
secrets: {TOKEN: {env: TOKEN, required: false}}
defaults: {timeout: 1h30m, retry: {attempts: "2", delay: 0}, max_parallel: 4}
steps:
  - id: s1
    kind: shell
    hosts: all
    script: echo hi
    when: "vars.flag"
    gates: ["exit_code == 0", {that: "'hi' in stdout", message: m}]
    fallbacks: [{script: echo again, timeout: 5s}]
    pass_env: [port, "HF_*"]
  - id: one
    kind: shell
    host: a
    matrix: {n: [1, 2], m: [{name: x, v: [1, 2]}, {name: y, v: null}], exclude: [{n: 1, m: x}]}
    on_failure: continue
    timeout: ${{ matrix.n }}
    script: echo $matrix_n $matrix_m_v
  - group: g
    matrix: {port: [30001, 30002], include: [{port: 30002}]}
    hosts: gpus
    placement: spread
    on_failure: ~
    steps:
      - id: dep
        kind: deploy
        model_path: /m/${{ matrix.port }}
        tp_size: "1"
        speculative_num_draft_tokens: auto
        trust_remote_code: no
        port: ${{ matrix.port }}
        ready_timeout: $port
        fallbacks: [{port: "${{ matrix.port }}"}]
      - id: st
        kind: stop_server
        port: ${{ matrix.port }}
"""


def test_every_form_the_loader_reads_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "forms.yaml").write_text(FORMS)
    assert main(["validate", str(tmp_path / "forms.yaml")]) == 0, capsys.readouterr().err
    assert problems(RUNBOOK_VALIDATOR, yaml.safe_load(FORMS)) == []


def test_the_repos_inventories_validate(tmp_path: Path) -> None:
    server = SSHServer(2222, "root", tmp_path / "key", tmp_path / "known_hosts", tmp_path, 0)
    hosts = [PoolHost(f"gpu{n}", server, "h200x8", tmp_path / f"gpu{n}", 30000 + n) for n in (1, 2)]
    demo = {**pool_inventory(hosts, {"sglang_python": "/v/bin/python", "HF_ENDPOINT": "http://127.0.0.1:1"})}
    examples = [
        demo,
        {**demo, "pools": {"gpus": ["gpu1", "gpu2"]}},
        yaml.safe_load(server.host_yaml("box")),  # what the tests lay over a runbook
        {"hosts": {"gpu": {"address": "gpu-box.example", "user": "root"}}, "vars": {"models_dir": "/data/models"}},
    ]
    for example in examples:
        assert problems(INVENTORY_VALIDATOR, json.loads(json.dumps(example, default=str))) == []


def test_schema_prints_the_committed_files(capsys: pytest.CaptureFixture[str]) -> None:
    """The files the modelines name are `runbook schema`'s output: they cannot rot. Compared as JSON, since
    pydantic versions (the floor's) write a bound as `0` or `0.0`, the same number in JSON Schema."""
    for args, committed in (((), "runbook.schema.json"), (("--inventory",), "inventory.schema.json")):
        code, out = schema_cli(capsys, *args)
        assert code == 0
        printed = json.loads(out)
        assert printed == (inventory_schema() if args else runbook_schema())
        text = (SCHEMAS / committed).read_text()
        assert json.loads(text) == printed, f"regenerate it: runbook schema {' '.join(args)} > {committed}"
        assert text == json.dumps(json.loads(text), indent=2) + "\n"  # as the command writes it


def _undescribed(node: Any, path: str = "") -> Iterable[str]:
    """The path of every property of a schema (at any depth, `$defs`, branches and fallbacks included) that has no
    description: what an editor's hover shows of a key."""
    if isinstance(node, dict):
        for name, value in (node.get("properties") or {}).items():
            if not (isinstance(value, dict) and value.get("description")):
                yield f"{path}/properties/{name}"
        for key, value in node.items():
            yield from _undescribed(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _undescribed(value, f"{path}/{index}")


@pytest.mark.parametrize("make", [runbook_schema, inventory_schema], ids=["runbook", "inventory"])
def test_every_key_has_a_description_to_hover(make: Callable[[], dict[str, Any]]) -> None:
    """Before: 166 of the runbook schema's properties had none (a kind's parameters, a host's fields, `defaults`)."""
    assert list(_undescribed(make())) == []


def _rename(path: tuple[str | int, ...], old: str, new: str) -> Callable[[dict[str, Any]], None]:
    def mutate(data: dict[str, Any]) -> None:
        target: Any = data
        for part in path:
            target = target[part]
        target[new] = target.pop(old)

    return mutate


def _step(data: dict[str, Any], step_id: str) -> tuple[str | int, ...]:
    index = next(i for i, s in enumerate(data["steps"]) if s.get("id") == step_id)
    return ("steps", index)


MISSPELLED = {
    "top level": ("demo_local.yaml", lambda d: _rename((), "defaults", "defualts")(d), "defualts"),
    "a step's common key": ("demo_local.yaml", lambda d: _rename(_step(d, "facts"), "parse", "prase")(d), "prase"),
    "a kind's parameter": (
        "k26_dflash.yaml",
        lambda d: _rename(_step(d, "deploy_dflash"), "draft_model_path", "draft_modle_path")(d),
        "draft_modle_path",
    ),
    "a step's retry": ("demo_local.yaml", lambda d: _rename(("defaults", "retry"), "delay", "dleay")(d), "dleay"),
    "a group": ("k26_dflash_sweep.yaml", lambda d: _rename(_group(d), "on_failure", "on_falure")(d), "on_falure"),
    "a step of a group": (
        "k26_dflash_sweep.yaml",
        lambda d: _rename((*_group(d), "steps", 0), "local_dir", "locl_dir")(d),
        "locl_dir",
    ),
    "a fallback": (
        "k26_dflash.yaml",
        lambda d: d["steps"][1].setdefault("fallbacks", []).append({"metods": ["http"]}),
        "metods",
    ),
}


def _group(data: dict[str, Any]) -> tuple[str | int, ...]:
    return ("steps", next(i for i, s in enumerate(data["steps"]) if "group" in s))


@pytest.mark.parametrize("case", list(MISSPELLED), ids=str)
def test_a_misspelled_key_is_caught_by_the_schema_and_by_validate(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name, mutate, key = MISSPELLED[case]
    data = shipped(name)
    mutate(data)
    assert any(f"'{key}'" in message for message in problems(RUNBOOK_VALIDATOR, data)), case
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["validate", str(path)]) == 2
    assert f"'{key}'" in capsys.readouterr().err


def test_a_misspelled_kind_and_an_inventory_typo_are_caught() -> None:
    data = shipped("demo_local.yaml")
    data["steps"][0]["kind"] = "shel"
    assert problems(RUNBOOK_VALIDATOR, data)
    assert problems(INVENTORY_VALIDATOR, {"hosts": {"gpu": {"adress": "gpu-box.example"}}})
    assert problems(INVENTORY_VALIDATOR, {"host": {}})


# ---- runbooks the loader accepts, the schema accepts -----------------------------------------------------

durations = st.one_of(
    st.integers(1, 86400),
    st.floats(0.5, 3600, allow_nan=False),
    st.builds(lambda n, u: f"{n}{u}", st.integers(1, 59), st.sampled_from(["ms", "s", "m", "h"])),
    st.builds(lambda h, m: f"{h}h{m}m", st.integers(1, 9), st.integers(1, 59)),
    st.builds(str, st.integers(1, 3600)),  # quoted seconds
)
counts = st.one_of(st.integers(1, 10), st.integers(1, 10).map(str))  # lax ints: YAML `"3"` is the int 3
retries = st.fixed_dictionaries(
    {},
    optional={
        "attempts": counts,
        "delay": st.one_of(st.just(0), durations),
        "backoff": st.floats(1, 10, allow_nan=False),
        "max_delay": durations,
    },
)
flags = st.sampled_from([True, False, "true", "no", "On", 1, 0])  # what pydantic's lax bool reads


@st.composite
def accepted_runbooks(draw: st.DrawFn) -> dict[str, Any]:
    """A shipped runbook with its values varied where the format allows other forms."""
    data = shipped(draw(st.sampled_from([p.name for p in RUNBOOKS])))
    data.setdefault("defaults", {})["timeout"] = draw(durations)
    if draw(st.booleans()):
        data["defaults"]["retry"] = draw(retries)
    for host in data.get("hosts", {}).values():
        if host["address"] != "local":
            host["port"] = draw(st.one_of(st.integers(1, 65535), st.integers(1, 65535).map(str)))
            host["verify_host_key"] = draw(flags)
            host["connect_timeout"] = draw(durations)
    entries = [(s, "group" in entry) for entry in data["steps"] for s in entry.get("steps", [entry])]
    for step, in_group in entries:
        if draw(st.booleans()):
            step["timeout"] = draw(durations)
        if draw(st.booleans()):
            step["retry"] = draw(retries)
        if draw(st.booleans()):
            step["description"] = draw(st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"])))
        gates = step.get("gates")
        if gates and draw(st.booleans()):  # a gate may be its expression alone
            step["gates"] = [g["that"] if isinstance(g, dict) and "message" not in g else g for g in gates]
        if step.get("kind") == "benchmark" and "concurrencies" in step and draw(st.booleans()):
            step["concurrencies"] = draw(st.lists(counts, min_size=1, max_size=4, unique_by=int))
        named = any(f"steps.{step['id']}." in str(other.get("gates")) for other, _ in entries)
        if step.get("kind") == "shell" and not (in_group or named) and draw(st.booleans()):
            # a one-step matrix whose axis sets a typed parameter, whole (`${{ }}` keeps the int)
            step["matrix"] = {"t": draw(st.lists(st.integers(1, 600), min_size=1, max_size=3, unique=True))}
            step["timeout"] = "${{ matrix.t }}"
            step["on_failure"] = draw(st.sampled_from(["stop", "continue"]))
    return data


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=accepted_runbooks())
def test_what_the_loader_accepts_the_schema_accepts(data: dict[str, Any]) -> None:
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    try:
        parse_runbook(text, REPO / "runbooks" / "generated.yaml")
    except InvalidRunbook:
        assume(False)
    assert problems(RUNBOOK_VALIDATOR, yaml.safe_load(text)) == []


# ---- the documents agents read: report.json and the plan ------------------------------------------------

REPORT_VALIDATOR = jsonschema.Draft202012Validator(report_schema())
PLAN_VALIDATOR = jsonschema.Draft202012Validator(plan_schema())


def test_the_report_and_plan_schemas_are_valid_and_printed_by_their_options(capsys: pytest.CaptureFixture[str]) -> None:
    for option, made in (("--report", report_schema), ("--plan", plan_schema)):
        code, out = schema_cli(capsys, option)
        assert code == 0 and json.loads(out) == made()
        jsonschema.Draft202012Validator.check_schema(json.loads(out))


def test_the_reports_the_demo_and_its_sweep_write_validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """report.json as the flagship's benchmark step writes it (`write_report`'s document through the one writer,
    `write_document`, from the canned facts of tests/steps/test_benchmark_report.py) and as `demo --sweep`'s
    campaign_report step writes it (the step itself on tests/steps/test_campaign_report.py's canned records of
    two hosts), their figures left undrawn (seconds of matplotlib): both validate, each carries schema_version
    1, and neither validates as the other kind or as a newer version."""
    from steps import campaign_report
    from steps import campaign_report_document as campaign
    from steps.benchmark_report import build_report, write_document
    from tests.steps.test_benchmark_report import ACCEPTANCE, BASELINE, DFLASH, PROVENANCE
    from tests.steps.test_campaign_report import host_views, write_campaign

    def undrawn(paths: Iterable[str]) -> dict[str, Callable[[BinaryIO], None]]:
        return dict.fromkeys(paths, lambda out: None)

    report = build_report(BASELINE, DFLASH, PROVENANCE, ACCEPTANCE)
    write_document(tmp_path / "demo", report, undrawn(f.path for f in report.figures), NO_SECRETS)
    figures = (campaign.THROUGHPUT_PNG, campaign.PARETO_PNG, campaign.ACCEPTANCE_PNG)
    monkeypatch.setattr(campaign_report, "drawings", lambda cells, comparisons: undrawn(figures))
    write_campaign(tmp_path / "sweep", host_views("gpu1") + host_views("gpu2", "NVIDIA B200", scale=2.0))
    for run in ("demo", "sweep"):
        document = json.loads((tmp_path / run / "report.json").read_text())
        assert document["schema_version"] == 1
        assert problems(REPORT_VALIDATOR, document) == [], run
        assert not REPORT_VALIDATOR.is_valid(document | {"schema_version": 2})
    flagship = json.loads((tmp_path / "demo" / "report.json").read_text())
    sweep = json.loads((tmp_path / "sweep" / "report.json").read_text())
    assert not REPORT_VALIDATOR.is_valid({**flagship, "data": sweep["campaign"]})
    assert not REPORT_VALIDATOR.is_valid({**sweep, "provenance": flagship["provenance"]})


@pytest.mark.parametrize("runbook", ["k26_dflash.yaml", "k26_dflash_sweep.yaml"])
def test_the_plans_of_the_demo_and_its_sweep_validate(runbook: str) -> None:
    """The plan documents of the runbooks `demo` and `demo --sweep` run, as `plan --json` writes them (the MCP
    `plan`'s, cut to its cap: tests/executor/test_mcp_server.py)."""
    loaded = load_runbook(REPO / "runbooks" / runbook)
    document = json.loads(strict_json.dumps(plan_document(loaded, {})))
    assert document["schema_version"] == 1
    assert problems(PLAN_VALIDATOR, document) == []
    assert not PLAN_VALIDATOR.is_valid(document | {"steps": [{"id": "s"}]})


@pytest.mark.parametrize(
    "path", ["speedup.png", "plots/a..b.png", "../../etc/passwd", "/etc/passwd", "a\n/../x", ".", ""]
)
def test_the_report_schema_refuses_the_figures_runbook_report_refuses(path: str) -> None:
    """A figure's path that is no file of the run folder: the schema an agent validates with says so too."""
    from executor.documents import Figure

    try:
        read = Figure(title="f", path=path) is not None
    except ValueError:
        read = False
    figure = {"$defs": REPORT_VALIDATOR.schema["$defs"], "$ref": "#/$defs/Figure"}
    assert jsonschema.Draft202012Validator(figure).is_valid({"title": "f", "path": path}) == read
    assert read == (path in ("speedup.png", "plots/a..b.png"))
