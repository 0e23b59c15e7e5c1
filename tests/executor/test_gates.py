"""Gate expressions: Jinja2 in a sandbox; failures explain themselves."""

from __future__ import annotations

from executor.runbook.gates import evaluate, names_used, roots, syntax_error

NAMES = {
    "stdout": "",
    "exit_code": 0,
    "facts": {"gpus": [{"name": "NVIDIA H200"}], "free": 10},
    "steps": {"probe": {"facts": {"ok": True}}},
    "vars": {"min_free": 100},
}


def test_true_and_false_gates() -> None:
    assert evaluate("exit_code == 0 and steps.probe.facts.ok", NAMES).passed
    assert not evaluate("facts.free >= vars.min_free", NAMES).passed


def test_failed_gate_shows_the_values_it_used() -> None:
    verdict = evaluate("facts.free >= vars.min_free and 'x' in stdout", NAMES, "not enough space")
    text = verdict.describe()
    assert text.splitlines()[0] == "not enough space"
    assert "gate: facts.free >= vars.min_free and 'x' in stdout" in text
    assert "facts.free = 10" in text and "vars.min_free = 100" in text
    assert 'stdout = ""  (empty)' in text


def test_missing_name_is_named() -> None:
    verdict = evaluate("facts.gpu_count > 0", NAMES)
    assert not verdict.passed
    assert "names something missing" in verdict.detail and "gpu_count" in verdict.detail
    assert "nothing" in evaluate("nothing == 1", NAMES).detail


def test_sandbox_refuses_python_internals() -> None:
    verdict = evaluate("stdout.__class__.__mro__[1].__subclasses__()", NAMES)
    assert not verdict.passed
    assert "sandbox" in verdict.detail or "missing" in verdict.detail


def test_filters_and_tests_work() -> None:
    assert evaluate("facts.gpus | length == 1 and facts.gpus[0].name is string", NAMES).passed
    assert evaluate("facts.gpus | selectattr('name', 'search', 'H200') | list", NAMES).passed


def test_names_used_and_syntax() -> None:
    assert names_used("facts.gpus[0].name == 'x' and exit_code == 0 or facts.gpus") == [
        "facts.gpus[0].name",
        "exit_code",
        "facts.gpus",
    ]
    assert syntax_error("exit_code ==") is not None
    assert syntax_error("exit_code == 0") is None


def test_ansible_regex_tests() -> None:
    assert evaluate("stdout is search('H2\\\\d+')", {**NAMES, "stdout": "GPU 0: NVIDIA H200"}).passed
    assert not evaluate("stdout is match('H200')", {**NAMES, "stdout": "GPU 0: NVIDIA H200"}).passed


def test_a_gate_that_raises_still_shows_its_values() -> None:
    verdict = evaluate("'trtllm_mla' in facts.backends", {**NAMES, "facts": {"backends": None}})
    assert not verdict.passed
    assert "raised TypeError" in verdict.detail
    assert "facts.backends = null" in verdict.detail


def test_roots_are_the_names_a_gate_reads_a_bare_name_too() -> None:
    """The worker gets only these: a gate `stdout` (the whole expression one name) read `stdout` as undefined."""
    assert roots("stdout") == {"stdout"}
    assert roots("facts.n > 0 and exit_code == 0") == {"facts", "exit_code"}
    assert roots("1 + 1") == set()
