"""The real-release tier: what runbook assumes about SGLang, checked against the pinned release's files.

`python -m sandbox.prepare` installs the SGLang release pinned in sandbox/prepare.py PINS (`pip install --no-deps`:
its files, no torch). This tier reads those files with ast and text, never importing SGLang's runtime, and checks
each fact runbook builds on, gathered from runbook's own code rather than listed here by hand where the code names
them: the launch flags the planner renders and their aliases, the serving benchmark's entry points, the flags the
benchmark step renders and the fields it parses, the Prometheus metric names (steps/sglang_metrics.py), the
tokenizer's need for --trust-remote-code, the speculative algorithm names with their aliases. A failure says which
fact changed, in which file of the release, and which part of runbook relies on it.

Bumping the pin (README, "The real-release tier") is on purpose: this tier then lists what the new release changed.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hostprograms.probe import (
    SPEC_INFO_FILE,
    _read_launch_options,
    _sglang_blank,
    argument_options,
    bench_entry_points,
    class_attributes,
)
from sandbox.prepare import PINS, site_packages
from sandbox.sglang_standin.bench_client import build_parser as standin_bench_parser
from sandbox.sglang_standin.bench_client import implementation
from steps import server_metrics, sglang_flags, sglang_metrics
from steps.bench_entry import ENTRY_POINTS
from steps.benchmark import BenchmarkStep
from steps.benchmark_results import FLOAT_FIELDS, INT_FIELDS, RunInfo, parse_run
from steps.benchmark_slo import CLIENT_KEYS, RESULT_FIELDS, SLO_MAX_MS, Slo

ROOT = Path(__file__).resolve().parents[2]
PIN = next(version for name, version, _ in PINS if name == "sglang")
SITE = site_packages()
SGLANG = (SITE or Path("/nonexistent")) / "sglang"
#: the code that renders launch flags: the deploy step and the server modules it builds on
LAUNCH_CODE = [ROOT / "steps" / "deploy.py", *sorted((ROOT / "steps" / "server").glob("*.py"))]
#: Flags and algorithm names runbook renders that no release has yet, with why (the DDTree pull request, which a
#: probe finds in a build that has it). The tier checks that the release still lacks each: when one lands, it says so.
NOT_RELEASED = {"--speculative-ddtree-budget": "DDTree pull request #29907", "DDTREE": "DDTree pull request #29907"}
#: What runbook assumes of SGLang's other names for algorithms (srt/speculative/spec_registry.py `_RESERVED_ALIASES`,
#: mapped to EAGLE by `SpeculativeAlgorithm.from_string`): none of them is an algorithm runbook names or reads.
ALGORITHM_ALIASES = {"NEXTN"}
METRICS_FILE = "srt/observability/metrics_collector.py"
TOKENIZER_FILE = "srt/utils/hf_transformers/tokenizer.py"
ALIASES_FILE = "srt/speculative/spec_registry.py"

pytestmark = pytest.mark.skipif(not SGLANG.is_dir(), reason="run `python -m sandbox.prepare` first")


def fact(what: str, where: str, relies: str) -> str:
    """A failure's message: the fact that changed, where in the release, and what in runbook relies on it."""
    return f"SGLang {PIN}, {where}: {what} (runbook relies on it: {relies})"


def release_source(relative: str) -> str:
    path = SGLANG / relative
    assert path.is_file(), fact(f"{relative} is gone", str(SGLANG), "reading it")
    return path.read_text()


def strings(path: Path) -> list[tuple[str, int]]:
    """Every string literal of a Python file, with its line."""
    return [
        (node.value, node.lineno)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def rendered_launch_flags() -> dict[str, str]:
    """flag -> where runbook's code renders or names it (FILE:LINE): every `--flag` literal of the launch code, and
    every flag and alias sglang_flags.py manages or refuses."""
    found: dict[str, str] = {}
    for path in LAUNCH_CODE:
        for text, line in strings(path):
            if re.fullmatch(r"--[a-z0-9][a-z0-9-]*", text):
                found.setdefault(text, f"{path.relative_to(ROOT)}:{line}")
    for flag, (_, aliases) in sglang_flags.MANAGED.items():
        for name in (flag, *aliases):
            found.setdefault(name, f"steps/sglang_flags.py MANAGED[{flag!r}]")
    for flag in sglang_flags.OVERRIDING:
        found.setdefault(flag, "steps/sglang_flags.py OVERRIDING")
    return found


@functools.cache
def launch_table() -> tuple[dict[str, str], str]:
    """option string -> its argument's flag (first option string), as the probe reads the release; and from where."""
    facts = _sglang_blank()
    _read_launch_options(str(SGLANG), facts)
    groups = facts["launch_options"]
    assert groups is not None, fact(f"the option table is unreadable: {facts['unknown']}", str(SGLANG), "the probe")
    source = facts["sources"]["launch_options"].replace(f"{SGLANG}/", "")
    return {option: group[0] for group in groups for option in group}, source


def test_the_installed_release_is_the_pin() -> None:
    dist = sorted(SGLANG.parent.glob("sglang-*.dist-info"))
    assert [d.name for d in dist] == [f"sglang-{PIN}.dist-info"], "run `python -m sandbox.prepare`: the pin changed"


def test_every_launch_flag_runbook_renders_is_in_the_release_option_table() -> None:
    table, source = launch_table()
    flags = rendered_launch_flags()
    assert {"--model-path", "--tp-size", "--nnodes", "--dist-init-addr"} <= set(flags)  # the gathering works
    for flag, where in flags.items():
        if flag in NOT_RELEASED:
            assert flag not in table, fact(f"{flag} is now an option ({NOT_RELEASED[flag]} landed?)", source, where)
        else:
            assert flag in table, fact(f"no launch option {flag}", source, where)


def test_the_aliases_runbook_manages_are_the_release_aliases() -> None:
    """An alias sets its flag (argparse), so deploy refuses it in extra_args as the flag itself."""
    table, source = launch_table()
    for flag, (_, aliases) in sglang_flags.MANAGED.items():
        for alias in aliases:
            assert table.get(alias) == table.get(flag), fact(
                f"{alias} is no longer an alias of {flag} (it sets {table.get(alias)})",
                source,
                f"steps/sglang_flags.py MANAGED[{flag!r}]",
            )


def test_the_release_has_the_serving_benchmark_the_step_prefers() -> None:
    have = bench_entry_points(str(SGLANG))
    assert have[:1] == [ENTRY_POINTS[0][0]], fact(
        f"the serving benchmark modules are {have}", str(SGLANG), "steps/bench_entry.py ENTRY_POINTS"
    )


def bench_flags() -> dict[str, str]:
    """flag -> how the benchmark step renders it: every `--flag` of its command lines (default and every option)."""
    steps = [BenchmarkStep(id="b", server="d"), BenchmarkStep(id="b", server="d", num_prompts=9, warmup_requests=0)]
    steps.append(BenchmarkStep(id="b", server="d", slo=Slo(ttft_ms=1, tpot_ms=1, e2e_ms=1)))
    words = [w for step in steps for w in shlex.split(step.command("http://127.0.0.1:1", 4, 1, {}, "f", module="m"))]
    return {word: "steps/benchmark.py BenchmarkStep.command" for word in words if word.startswith("--")}


@pytest.mark.parametrize("module", [module for module, _ in ENTRY_POINTS])
def test_the_benchmark_flags_runbook_renders_are_the_clients(module: str) -> None:
    if module not in bench_entry_points(str(SGLANG)):
        pytest.skip(f"SGLang {PIN} has no {module}")
    writer = implementation(SGLANG, module)
    options = {option for group in argument_options(writer.read_text()) for option in group}
    for flag, where in bench_flags().items():
        assert flag in options, fact(f"{module} takes no {flag}", str(writer.relative_to(SITE or ROOT)), where)


def writer_fields(path: Path) -> list[str]:
    """The keys of the `result = {...}` dict a serving benchmark writes as its JSONL line (in its `benchmark()`)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            names = [target.id for target in node.targets if isinstance(target, ast.Name)]
            keys = [key.value for key in node.value.keys if isinstance(key, ast.Constant)]
            if names == ["result"] and "output_throughput" in keys:
                return [str(key) for key in keys]
    raise AssertionError(fact("no `result = {...}` dict with output_throughput", str(path), "benchmark_results.py"))


def written_line(fields: list[str]) -> dict[str, Any]:
    """A line with exactly these keys, as the writer fills them: numbers, and its few non-numbers as it writes them."""
    special = {"tag": None, "backend": "sglang", "dataset_name": "random-ids", "server_info": {"version": PIN}}
    line = {name: special.get(name, float(number + 1)) for number, name in enumerate(fields)}
    return line | {"completed": 8, "total_input_tokens": 80, "total_output_tokens": 64}


@pytest.mark.parametrize("module", [module for module, _ in ENTRY_POINTS])
def test_every_field_runbook_parses_is_one_the_client_writes(module: str) -> None:
    if module not in bench_entry_points(str(SGLANG)):
        pytest.skip(f"SGLang {PIN} has no {module}")
    writer = implementation(SGLANG, module)
    fields = writer_fields(writer)
    parsed = ("completed", *FLOAT_FIELDS, *INT_FIELDS, "accept_length")
    where = str(writer.relative_to(SITE or ROOT))
    for name in parsed:
        assert name in fields, fact(f"{module}'s JSONL line has no {name!r}", where, "steps/benchmark_results.py")
    info = RunInfo(max_concurrency=4, num_prompts=8, repeat=1, seed=1, started_at="", finished_at="", command="")
    run = parse_run(json.dumps(written_line(fields)), info)
    assert run.unknown == {} and run.completed == 8 and run.shortfall is None
    assert [getattr(run, name) for name in FLOAT_FIELDS] == [float(fields.index(n) + 1) for n in FLOAT_FIELDS]


def declared_metrics(source: str) -> dict[str, str]:
    """name -> class of each `Counter|Gauge|Histogram|Summary(name="...")` a metrics file declares."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = next((k.value for k in node.keywords if k.arg == "name"), None)
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                found[name.value] = node.func.id
    return found


def test_the_metrics_runbook_reads_are_declared_by_the_release() -> None:
    # every family the scrapes keep (benchmark and eval_acceptance) is one this tier checks
    assert set(server_metrics.FAMILIES) <= set(sglang_metrics.METRICS), "steps/server_metrics.py FAMILIES"
    declared = declared_metrics(release_source(METRICS_FILE))
    for name, kind in sglang_metrics.METRICS.items():
        assert declared.get(name) == kind, fact(
            f"metric {name} is {declared.get(name, 'not declared')}, not a {kind}",
            METRICS_FILE,
            "steps/sglang_metrics.py",
        )


def test_a_remote_code_tokenizer_needs_trust_remote_code() -> None:
    """Kimi's tokenizer is remote code: without the flag the release stops with this error, so deploy renders
    --trust-remote-code for every launch of a model whose tokenizer_config names an auto_map (the baseline too)."""
    said = [text for text, _ in strings(SGLANG / TOKENIZER_FILE) if "Failed to load the tokenizer" in text]
    assert any("--trust-remote-code" in text for text in said), fact(
        "the tokenizer no longer asks for --trust-remote-code", TOKENIZER_FILE, "hostprograms/inspect_config.py"
    )


def algorithm_names() -> dict[str, str]:
    """name -> FILE:LINE: the --speculative-algorithm values deploy compares `self.algorithm` with."""
    path = ROOT / "steps" / "deploy.py"
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and ast.unparse(node.left) == "self.algorithm":
            for constant in ast.walk(node):
                if isinstance(constant, ast.Constant) and isinstance(constant.value, str):
                    found.setdefault(constant.value, f"steps/deploy.py:{constant.lineno}")
    return found


def test_the_speculative_algorithms_runbook_names_are_the_release() -> None:
    members = class_attributes(release_source(SPEC_INFO_FILE), "SpeculativeAlgorithm")
    assert members is not None, fact("no class SpeculativeAlgorithm", SPEC_INFO_FILE, "the probe's dflash fact")
    names = algorithm_names()
    assert "DFLASH" in names  # the gathering works
    for name, where in names.items():
        if name in NOT_RELEASED:
            assert name not in members, fact(
                f"{name} is now an algorithm ({NOT_RELEASED[name]} landed?)", SPEC_INFO_FILE, where
            )
        else:
            assert name in members, fact(f"no speculative algorithm {name}", SPEC_INFO_FILE, where)


def test_the_algorithm_aliases_are_the_ones_runbook_knows() -> None:
    """SGLang takes a name in any case and NEXTN for EAGLE (from_string); runbook names none of those aliases."""
    tree = ast.parse(release_source(ALIASES_FILE))
    assigned = [n for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_RESERVED_ALIASES"]
    aliases = {str(c.value) for n in assigned for c in ast.walk(n.value) if isinstance(c, ast.Constant)}
    assert aliases == ALGORITHM_ALIASES, fact(f"the algorithm aliases are {sorted(aliases)}", ALIASES_FILE, "deploy")
    assert not aliases & set(algorithm_names()), fact("an alias is an algorithm runbook names", ALIASES_FILE, "deploy")
    spec_info = release_source(SPEC_INFO_FILE)
    assert "upper = name.upper()" in spec_info, fact("from_string no longer ignores case", SPEC_INFO_FILE, "deploy")


GOODPUT_FILE = "benchmark/goodput.py"
SERVING_FILE = "benchmark/serving.py"


def module_constant(source: str, name: str) -> Any:
    """The literal value of a module-level `NAME = ...` of a release file."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(fact(f"no {name}", GOODPUT_FILE, "steps/benchmark_slo.py"))


def struct_fields(source: str, name: str) -> list[str]:
    """The annotated fields of a class of a release file, in order (a msgspec Struct's are its JSON keys)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    raise AssertionError(fact(f"no class {name}", GOODPUT_FILE, "steps/benchmark_slo.py RESULT_FIELDS"))


@functools.cache
def release_goodput_parser() -> argparse.ArgumentParser:
    """A parser with the release's own `--goodput` argument: its `_goodput_slo` and `_finite_positive_float`, lifted
    from serving.py (the module itself needs the client's dependencies, which the tier does not install)."""
    tree = ast.parse(release_source(SERVING_FILE))
    wanted = {"_goodput_slo", "_finite_positive_float"}
    functions: list[ast.stmt] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    found = {getattr(f, "name", None) for f in functions}
    assert found == wanted, fact(f"{sorted(wanted)} are gone", SERVING_FILE, "--goodput")
    metrics = module_constant(release_source(GOODPUT_FILE), "GOODPUT_SLO_METRICS")
    scope: dict[str, Any] = {"argparse": argparse, "math": math, "Tuple": tuple, "GOODPUT_SLO_METRICS": metrics}
    exec(compile(ast.Module(body=functions, type_ignores=[]), SERVING_FILE, "exec"), scope)
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--goodput", nargs="+", type=scope["_goodput_slo"], default=None)
    return parser


def test_goodput_is_the_clients_flag_and_its_keys_and_fields_are_the_releases() -> None:
    """The step's SLO keys are the release's GOODPUT_SLO_METRICS, and the fields it reads are GoodputMetrics'."""
    source = release_source(GOODPUT_FILE)
    assert tuple(CLIENT_KEYS.values()) == module_constant(source, "GOODPUT_SLO_METRICS"), fact(
        "the --goodput keys changed", GOODPUT_FILE, "steps/benchmark_slo.py CLIENT_KEYS"
    )
    assert struct_fields(source, "GoodputMetrics") == list(RESULT_FIELDS), fact(
        "GoodputMetrics' fields changed", GOODPUT_FILE, "steps/benchmark_slo.py RESULT_FIELDS"
    )
    assert "result.update(msgspec.structs.asdict(goodput))" in release_source(SERVING_FILE), fact(
        "the goodput no longer goes into the result line", SERVING_FILE, "steps/benchmark_results.py parse_run"
    )


slo_value = st.floats(min_value=1e-3, max_value=SLO_MAX_MS, allow_nan=False, exclude_min=False) | st.integers(1, 10**6)


@given(st.fixed_dictionaries({}, optional={name: slo_value for name in CLIENT_KEYS}).filter(bool))
def test_the_rendered_goodput_reads_back_exactly_through_the_releases_own_parser(slos: dict[str, float]) -> None:
    """Every SLO a runbook may state, rendered as the step renders it, is what the release's parser reads."""
    slo = Slo(**slos)
    parsed = release_goodput_parser().parse_args(slo.goodput_args())
    assert dict(parsed.goodput) == {CLIENT_KEYS[name]: float(value) for name, value in slos.items()}
    assert [key for key, _ in parsed.goodput] == [CLIENT_KEYS[n] for n in CLIENT_KEYS if n in slos]  # its order


@functools.cache
def standin_goodput_parser() -> argparse.ArgumentParser:
    """The SGLang stand-in's client parser, raising rather than exiting."""
    parser = standin_bench_parser(SGLANG)
    parser.exit_on_error = False
    return parser


@pytest.mark.parametrize("pair", ["ttft:0", "ttft:-1", "tpot:nan", "e2el:inf", "e2e:100", "ttft", "TTFT:5"])
def test_the_release_refuses_what_the_step_refuses(pair: str) -> None:
    """What the release's parser refuses, the step's model refuses before anything runs (exit 2 at validate), and the
    SGLang stand-in's client refuses it with the release's own message."""
    with pytest.raises(argparse.ArgumentError) as release:
        release_goodput_parser().parse_args(["--goodput", pair])
    standin = standin_goodput_parser()
    with pytest.raises(argparse.ArgumentError) as double:
        standin.parse_args(["--goodput", pair])
    assert str(double.value) == str(release.value)
    key, _, value = pair.partition(":")
    name = {v: k for k, v in CLIENT_KEYS.items()}.get(key, key)
    with pytest.raises(ValueError):
        Slo.model_validate({name: value or None})
