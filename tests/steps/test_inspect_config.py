"""The `inspect_config` kind: the host program's checks (run here, then through the real sshd).

Every fault case is one edit of the realistic configs in sandbox/model_configs.py; the same
table of cases runs against the checking program in-process and, in one runbook, through sshd.
"""

from __future__ import annotations

import copy
import json
import subprocess
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.faces.cli import main
from executor.render import host_word
from executor.run.state import open_state, scan_runs
from executor.stepkind import FactsError
from executor.transport.base import Collector
from hostprograms import inspect_config as host
from sandbox.model_configs import custom_code_files, deepseek_v3_text_config, drafter_config, target_config
from steps.inspect_config import InspectConfigFacts, InspectConfigStep

Config = dict[str, Any]
Edit = Callable[[Config], "Config | str | None"]  # a config, raw file text, or None: no config.json


def keep(config: Config) -> Config:
    return config


def write_model(folder: Path, edit: Edit, base: Config) -> Path:
    """A model folder with config.json (edited) and the custom code its auto_map names."""
    folder.mkdir(parents=True, exist_ok=True)
    config = edit(copy.deepcopy(base))
    path = folder / "config.json"
    if isinstance(config, str):
        path.write_text(config)
    elif config is not None:
        path.write_text(json.dumps(config, indent=2))
    else:
        path.unlink(missing_ok=True)
    for name in custom_code_files(base):
        (folder / name).write_text("# custom code of the model (test stand-in)\n")
    return folder


def write_pair(root: Path, drafter: Edit = keep, target: Edit = keep) -> tuple[Path, Path]:
    return (
        write_model(root / "Kimi-K2.6-DFlash", drafter, drafter_config()),
        write_model(root / "Kimi-K2.6", target, target_config()),
    )


def inspect(root: Path, drafter: Edit = keep, target: Edit = keep) -> InspectConfigFacts:
    """Run the host program's check here and validate its document as the step does."""
    drafter_dir, target_dir = write_pair(root, drafter, target)
    document = host.inspect(str(target_dir), str(drafter_dir))
    return InspectConfigFacts.model_validate_json(json.dumps(document, allow_nan=False))


def edit(**changes: Any) -> Edit:
    """Set (or, with None, delete) fields; `a__b` names field b inside object a."""

    def apply(config: Config) -> Config:
        for name, value in changes.items():
            *parents, key = name.split("__")
            node = config
            for parent in parents:
                node = node.setdefault(parent, {})
            if value is None:
                node.pop(key, None)
            else:
                node[key] = value
        return config

    return apply


@dataclass
class Case:
    """One fault: the exact problems expected, `{drafter}`/`{target}` standing for the config paths."""

    name: str
    problems: list[str]
    drafter: Edit = keep
    target: Edit = keep
    check: Callable[[InspectConfigFacts], None] = lambda facts: None


def unknown_tokens(facts: InspectConfigFacts) -> None:
    assert facts.deploy.speculative_num_draft_tokens.value is None
    assert "block size is unknown" in (facts.deploy.speculative_num_draft_tokens.unknown_reason or "")


def tokens(count: int, field: str) -> Callable[[InspectConfigFacts], None]:
    def check(facts: InspectConfigFacts) -> None:
        assert facts.drafter is not None
        assert facts.deploy.speculative_num_draft_tokens.value == count
        assert facts.deploy.speculative_num_draft_tokens.source == f"{facts.drafter.config_path} {field}"

    return check


def target_unread(facts: InspectConfigFacts) -> None:
    assert not facts.target.config_read
    assert facts.target.num_layers.unknown_reason == f"{facts.target.config_path} could not be read"


def flat_target(facts: InspectConfigFacts) -> None:
    assert not facts.target.text_config_nested
    assert facts.target.num_layers.source == f"{facts.target.config_path} num_hidden_layers"
    assert facts.target.quantization.source == f"{facts.target.config_path} quantization_config"


CASES = [
    Case("realistic", [], check=tokens(8, "block_size")),
    Case(
        "block_size_only_in_dflash_config",
        [],
        drafter=edit(block_size=None, dflash_config__block_size=16),
        check=tokens(16, "dflash_config.block_size"),
    ),
    Case(
        "block_size_in_both_places_agreeing",
        [],
        drafter=edit(dflash_config__block_size=8),
        check=tokens(8, "dflash_config.block_size"),
    ),
    Case(
        "block_size_conflict",
        ["{drafter}: dflash_config.block_size = 16 and block_size = 8 differ; SGLang uses dflash_config.block_size"],
        drafter=edit(dflash_config__block_size=16),
        check=tokens(16, "dflash_config.block_size"),
    ),
    Case(
        "block_size_missing",
        [
            "{drafter}: block_size is missing: SGLang reads dflash_config.block_size, then block_size, and without "
            "either silently uses 16 draft tokens, whatever the drafter was trained for"
        ],
        drafter=edit(block_size=None),
        check=unknown_tokens,
    ),
    Case(
        "block_size_null_in_dflash_config_hides_the_top_level_one",
        [
            "{drafter}: dflash_config.block_size = null and block_size = 8 differ; "
            "SGLang uses dflash_config.block_size",
            "{drafter}: dflash_config.block_size is null: SGLang reads dflash_config.block_size, then block_size, "
            "and without either silently uses 16 draft tokens, whatever the drafter was trained for",
        ],
        drafter=lambda c: {**c, "dflash_config": {**c["dflash_config"], "block_size": None}},
        check=unknown_tokens,
    ),
    Case(
        "block_size_not_an_integer",
        ['{drafter}: block_size = "8" must be an integer >= 1'],
        drafter=edit(block_size="8"),
        check=unknown_tokens,
    ),
    Case("drafter_config_missing", ["{drafter}: no such file"], drafter=lambda c: None),
    Case(
        "target_config_invalid_json",
        ["{target}: invalid JSON at line 3 column 3: Expecting ',' delimiter"],
        target=lambda c: '{\n  "architectures": ["KimiK25ForConditionalGeneration"]\n  "model_type": "kimi_k25"\n}\n',
        check=target_unread,
    ),
    Case(
        "num_target_layers_mismatch",
        ["{drafter}: num_target_layers = 60 but the target has 61 layers ({target} text_config.num_hidden_layers)"],
        drafter=edit(num_target_layers=60),
    ),
    Case(
        "target_layer_id_out_of_range",
        ["{drafter}: dflash_config.target_layer_ids[3] = 64 is out of range for a target with 61 layers"],
        drafter=edit(dflash_config__target_layer_ids=[1, 12, 24, 64, 47, 58]),
    ),
    Case(
        "hidden_size_and_vocab_mismatch",
        [
            "{drafter}: hidden_size = 4096 but the target's width is 7168 ({target} text_config.hidden_size)",
            "{drafter}: vocab_size = 151936 but the target's vocabulary is 163840 ({target} text_config.vocab_size)",
        ],
        drafter=edit(hidden_size=4096, vocab_size=151936),
    ),
    Case(
        "conv_pair_half_set",
        [
            "{drafter}: dflash_config.conv_kernel_size = 4 and dflash_config.conv_group_size = 0: "
            "SGLang needs both set or neither"
        ],
        drafter=edit(dflash_config__conv_kernel_size=4),
    ),
    Case(
        "flat_deepseek_v3_target",
        [],
        target=lambda c: deepseek_v3_text_config(),
        check=flat_target,
    ),
]


def expected(case: Case, drafter_dir: Path, target_dir: Path) -> list[str]:
    paths = {"drafter": drafter_dir / "config.json", "target": target_dir / "config.json"}
    return [p.format(**paths) for p in case.problems]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_case_in_process(case: Case, tmp_path: Path) -> None:
    facts = inspect(tmp_path, case.drafter, case.target)
    assert facts.problems == expected(case, tmp_path / "Kimi-K2.6-DFlash", tmp_path / "Kimi-K2.6")
    case.check(facts)


def test_realistic_configs_give_the_deploy_facts(tmp_path: Path) -> None:
    facts = inspect(tmp_path)
    drafter, target, deploy = facts.drafter, facts.target, facts.deploy
    assert drafter is not None
    assert (drafter.draft_layers.value, drafter.num_target_layers.value, drafter.block_size.value) == (6, 61, 8)
    assert drafter.target_layer_ids.value == [1, 12, 24, 35, 47, 58]
    assert (drafter.mask_token_id.value, drafter.mask_token.value) == (163838, "<|MASK|>")
    assert drafter.has_dflash_py and drafter.architectures.value == ["DFlashDraftModel"]
    assert target.architectures.value == ["KimiK25ForConditionalGeneration"] and target.text_config_nested
    assert target.text_architectures.value == ["DeepseekV3ForCausalLM"]
    assert (target.num_layers.value, target.hidden_size.value, target.vocab_size.value) == (61, 7168, 163840)
    assert (target.n_routed_experts.value, target.num_experts_per_tok.value, target.kv_lora_rank.value) == (384, 8, 512)
    quant = target.quantization.value
    assert quant is not None and (quant.method, quant.format, quant.bits) == ("compressed-tensors", "pack-quantized", 4)
    assert quant.groups[0].group_size == 32 and "re:.*self_attn.*" in quant.ignore
    assert target.quantization.source == f"{target.config_path} text_config.quantization_config"
    assert deploy.speculative_num_draft_tokens.value == 8
    assert deploy.speculative_num_draft_tokens.source == f"{drafter.config_path} block_size"
    assert deploy.attention_arch.value == "MLA" and deploy.trust_remote_code
    assert (deploy.model_path, deploy.draft_model_path) == (str(tmp_path / "Kimi-K2.6"), drafter.dir)


def test_a_tokenizer_that_is_remote_code_asks_for_trust_remote_code(tmp_path: Path) -> None:
    """A target whose only custom code is its tokenizer (tokenizer_config.json's auto_map, as Kimi's tiktoken one):
    SGLang refuses to load it without --trust-remote-code, so every launch of it needs the flag."""
    target = write_model(tmp_path / "target", edit(auto_map=None), target_config())
    plain = InspectConfigFacts.model_validate(host.inspect(str(target)))
    assert not plain.deploy.trust_remote_code and plain.target.auto_map == {}
    auto_map = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
    (target / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "TikTokenTokenizer", "auto_map": auto_map})
    )
    (target / "tokenization_kimi.py").write_text("# the tokenizer's code\n")
    facts = InspectConfigFacts.model_validate(host.inspect(str(target)))
    assert facts.deploy.trust_remote_code and facts.problems == []
    assert facts.target.auto_map == {"AutoTokenizer": "tokenization_kimi.TikTokenTokenizer"}
    (target / "tokenization_kimi.py").unlink()  # named but missing: a problem of the tokenizer's config
    missing = InspectConfigFacts.model_validate(host.inspect(str(target)))
    assert missing.problems == [
        f"{target / 'tokenizer_config.json'}: auto_map.AutoTokenizer names tokenization_kimi.TikTokenTokenizer, "
        "but tokenization_kimi.py is not in the folder"
    ]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (edit(architectures=["Qwen3ForCausalLM"]), 'architectures = ["Qwen3ForCausalLM"] names no DFlash draft model'),
        (edit(architectures=None), "architectures is missing"),
        (edit(num_hidden_layers=0), "num_hidden_layers = 0 must be an integer >= 1"),
        (edit(dflash_config__target_layer_ids=[]), "dflash_config.target_layer_ids = [] must be a non-empty list"),
        (edit(dflash_config__mask_token_id=-1), "dflash_config.mask_token_id = -1 must be an integer >= 0"),
        (edit(dflash_config__mask_token_id=True), "dflash_config.mask_token_id = true must be an integer >= 0"),
        (edit(dflash_config__mask_token_id=163840), "mask_token_id = 163840 is not a token of a vocabulary of 163840"),
        (edit(dflash_config__mask_token=""), 'dflash_config.mask_token = "" must not be empty'),
        (edit(dflash_config__selector_top_k=4), "selector_rank = 0 and dflash_config.selector_top_k = 4: SGLang needs"),
        (edit(dflash_config__output_multiplier=0), "dflash_config.output_multiplier = 0 must be a number > 0"),
        (edit(conv_kernel_size=4, conv_group_size=2), "conv_kernel_size is at the top level, where SGLang ignores it"),
        (edit(layer_types=["full_attention"] * 5), "has 5 entries for 6 layers"),
        (edit(layer_types=["sliding_attention"] * 6), "sliding_window = null must be an integer >= 1"),
        (edit(auto_map={"AutoModel": "modeling_dflash.DFlashDraftModel"}), "modeling_dflash.py is not in the folder"),
        (lambda c: [c], "expected a JSON object at the top, got list"),
        (lambda c: '{"block_size": 8, "block_size": 16}', 'key "block_size" appears twice in one object'),
    ],
)
def test_drafter_faults_name_file_and_field(tmp_path: Path, change: Edit, problem: str) -> None:
    facts = inspect(tmp_path, drafter=change)
    path = str(tmp_path / "Kimi-K2.6-DFlash" / "config.json")
    assert any(p.startswith(f"{path}: ") and problem in p for p in facts.problems), facts.problems


def test_both_pairs_set_are_reported(tmp_path: Path) -> None:
    pairs = {"conv_kernel_size": 4, "conv_group_size": 2, "selector_rank": 64, "selector_top_k": 16}
    facts = inspect(tmp_path, drafter=lambda c: {**c, "dflash_config": {**c["dflash_config"], **pairs}})
    assert facts.problems == [] and facts.drafter is not None
    assert facts.drafter.model_dump(include=set(pairs)) == pairs


def test_without_a_target_config_ids_are_checked_against_num_target_layers(tmp_path: Path) -> None:
    facts = inspect(tmp_path, drafter=edit(dflash_config__target_layer_ids=[1, 61]), target=lambda c: None)
    drafter = tmp_path / "Kimi-K2.6-DFlash" / "config.json"
    assert f"{drafter}: dflash_config.target_layer_ids[1] = 61 is out of range for num_target_layers = 61" in (
        facts.problems
    )
    assert facts.deploy.attention_arch.unknown_reason == f"{tmp_path / 'Kimi-K2.6' / 'config.json'} could not be read"


def test_missing_model_folder(tmp_path: Path) -> None:
    document = host.inspect(str(tmp_path / "nowhere"))
    facts = InspectConfigFacts.model_validate(document)
    assert facts.problems == [f"{tmp_path / 'nowhere'}: no such directory"]
    assert facts.drafter is None and facts.deploy.speculative_num_draft_tokens.unknown_reason == (
        "no drafter_dir was given"
    )


@pytest.mark.parametrize(
    ("target", "method", "bits", "source"),
    [
        (
            lambda c: {k: v for k, v in deepseek_v3_text_config().items() if k != "quantization_config"},
            "none",
            None,
            "no quantization_config",
        ),
        (
            edit(text_config__quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}),
            "fp8",
            8,
            "text_config.quantization_config",
        ),
        (
            lambda c: {**c, "quantization_config": c["text_config"].pop("quantization_config")},
            "compressed-tensors",
            4,
            " quantization_config",
        ),
    ],
)
def test_quantization_is_found_where_sglang_looks(
    tmp_path: Path, target: Edit, method: str, bits: int | None, source: str
) -> None:
    quant = inspect(tmp_path, target=target).target.quantization
    assert quant.value is not None and (quant.value.method, quant.value.bits) == (method, bits)
    assert quant.source is not None and source in quant.source


@pytest.mark.parametrize(
    ("quantization", "problem"),
    [
        ({"quant_method": "compressed-tensors"}, "quantization_config.config_groups is missing or empty"),
        ({"quant_method": "compressed-tensors", "config_groups": {}}, "config_groups is missing or empty"),
        ({"config_groups": {}}, "quantization_config.quant_method = null must name the method"),
        ("int4", 'text_config.quantization_config = "int4" must be a JSON object'),
    ],
)
def test_broken_quantization_config_is_a_problem(tmp_path: Path, quantization: Any, problem: str) -> None:
    facts = inspect(tmp_path, target=edit(text_config__quantization_config=quantization))
    target = tmp_path / "Kimi-K2.6" / "config.json"
    assert len(facts.problems) == 1 and facts.problems[0].startswith(f"{target}: text_config.")
    assert problem in facts.problems[0]


def test_no_document_is_a_facts_error_with_the_reason() -> None:
    collect = Collector()
    collect.stderr.feed(b"bash: line 1: /opt/venv/bin/python: No such file or directory\n")
    step = InspectConfigStep(id="i", target_dir="/m/t", python="/opt/venv/bin/python")
    with pytest.raises(FactsError, match=r"printed no JSON document \(exit 127\); stderr: bash: .*No such file"):
        step.parse_facts(collect.result(127))


# property: whatever the configs hold, the checker answers with a facts document

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 200_000) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
DRAFTER_PATHS = [
    *(k.split("__") for k in ["architectures", "block_size", "num_hidden_layers", "num_target_layers", "hidden_size"]),
    *(k.split("__") for k in ["vocab_size", "dflash_config", "dflash_config__block_size", "auto_map", "layer_types"]),
    *(k.split("__") for k in ["dflash_config__target_layer_ids", "dflash_config__mask_token_id", "text_config"]),
    *(k.split("__") for k in ["dflash_config__mask_token", "dflash_config__conv_kernel_size", "sliding_window"]),
    *(k.split("__") for k in ["dflash_config__output_multiplier", "dflash_config__selector_rank", "mask_token_id"]),
]
TARGET_PATHS = [
    *(k.split("__") for k in ["architectures", "text_config", "auto_map", "quantization_config", "num_hidden_layers"]),
    *(k.split("__") for k in ["text_config__num_hidden_layers", "text_config__hidden_size", "text_config__vocab_size"]),
    *(k.split("__") for k in ["text_config__kv_lora_rank", "text_config__quantization_config", "compression_config"]),
    *(k.split("__") for k in ["text_config__quantization_config__config_groups", "text_config__dtype"]),
    *(k.split("__") for k in ["text_config__quantization_config__ignore", "text_config__n_routed_experts"]),
    *(k.split("__") for k in ["text_config__quantization_config__config_groups__group_0__weights"]),
]
DELETE = object()


def mutations(paths: list[list[str]]) -> st.SearchStrategy[list[tuple[list[str], Any]]]:
    return st.lists(st.tuples(st.sampled_from(paths), st.just(DELETE) | JSON), max_size=5)


def mutate(config: Any, changes: list[tuple[list[str], Any]]) -> Any:
    for path, value in changes:
        node = config
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            if value is DELETE:
                node.pop(path[-1], None)
            else:
                node[path[-1]] = value
    return config


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    drafter=mutations(DRAFTER_PATHS),
    target=mutations(TARGET_PATHS),
    whole=st.none() | JSON,
)
def test_the_checker_always_answers_with_facts(
    tmp_path_factory: pytest.TempPathFactory, drafter: list[Any], target: list[Any], whole: Any
) -> None:
    """Never a crash, and every fact either known or with its reason; no problems means the
    launch facts are complete."""
    root = tmp_path_factory.getbasetemp() / "property"
    facts = inspect(
        root,
        drafter=lambda c: whole if whole is not None else mutate(c, drafter),
        target=lambda c: mutate(c, target),
    )
    for known in known_facts(facts.model_dump()):
        assert (known["value"] is None) == (known["unknown_reason"] is not None), known
    if not facts.problems:
        assert facts.deploy.speculative_num_draft_tokens.value is not None
        assert facts.target.num_layers.value is not None and facts.deploy.attention_arch.value is not None


def known_facts(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        if node.keys() == {"value", "source", "unknown_reason"}:
            return [node]
        return [k for child in node.values() for k in known_facts(child)]
    return []


# host_word: vars and ~ expand on the host, nothing else does


@pytest.mark.parametrize(
    ("text", "env", "out"),
    [
        ("$models_dir/Kimi-K2.6", {"models_dir": "/m"}, "/m/Kimi-K2.6"),
        ("${models_dir}x/'q' \"$(id)\" `id` *", {"models_dir": "/a b"}, "/a bx/'q' \"$(id)\" `id` *"),
        ("~/models", {"HOME": "/home/u"}, "/home/u/models"),
        ("a~/$", {}, "a~/$"),
        ("", {}, ""),
    ],
)
def test_host_word_expands_only_vars(text: str, env: dict[str, str], out: str) -> None:
    run = subprocess.run(
        ["bash", "--norc", "-c", f"printf %s {host_word(text)}"], env=env, capture_output=True, text=True, check=True
    )
    assert run.stdout == out


def test_host_word_stops_on_an_unset_var() -> None:
    run = subprocess.run(["bash", "--norc", "-c", f"echo {host_word('$models_dir/x')}"], env={}, capture_output=True)
    assert run.returncode != 0 and b"runbook var models_dir is unset or empty" in run.stderr


# through the real sshd


def run_runbook(path: Path, logs: Path) -> tuple[int, dict[str, Any]]:
    """Run in-process; the exit code and each step's facts, read back from the run's state."""
    code = main(["run", str(path), "--log-dir", str(logs)])
    with open_state(logs / scan_runs(logs).runs[0].run_id) as state:
        return code, {r.step: r.facts for r in state.records()}


def test_every_case_through_sshd(tmp_path: Path, write_runbook: Callable[..., Path]) -> None:
    """All cases in one run (gates off, so every step runs); facts as the engine stored them."""
    steps = []
    for case in CASES:
        write_pair(tmp_path / "models" / case.name, case.drafter, case.target)
        steps.append(
            f"  - {{id: {case.name}, kind: inspect_config, gates: [],"
            f' drafter_dir: "$models_dir/{case.name}/Kimi-K2.6-DFlash",'
            f' target_dir: "${{models_dir}}/{case.name}/Kimi-K2.6"}}'
        )
    body = "name: cases\n__HOSTS__\nvars:\n  models_dir: " + str(tmp_path / "models") + "\nsteps:\n" + "\n".join(steps)
    code, facts = run_runbook(write_runbook(body + "\n"), tmp_path / "logs")
    assert code == 0
    for case in CASES:
        folder = tmp_path / "models" / case.name
        parsed = InspectConfigFacts.model_validate(facts[case.name])
        assert parsed.problems == expected(case, folder / "Kimi-K2.6-DFlash", folder / "Kimi-K2.6"), case.name
        case.check(parsed)


def test_later_steps_use_the_facts_and_problems_fail_the_default_gate(
    tmp_path: Path, write_runbook: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    write_pair(tmp_path / "good")
    write_pair(tmp_path / "bad", drafter=edit(dflash_config__target_layer_ids=[1, 12, 24, 64, 47, 58]))
    runbook = write_runbook(
        textwrap.dedent(f"""\
        name: k26
        __HOSTS__
        defaults: {{retry: {{attempts: 1}}}}
        steps:
          - {{id: inspect, kind: inspect_config,
              drafter_dir: {tmp_path}/good/Kimi-K2.6-DFlash, target_dir: {tmp_path}/good/Kimi-K2.6}}
          - id: launch
            kind: shell
            script: "true"
            gates:
              - steps.inspect.facts.deploy.speculative_num_draft_tokens.value == 8
              - steps.inspect.facts.target.quantization.value.bits == 4
          - {{id: bad, kind: inspect_config, drafter_dir: {tmp_path}/bad/Kimi-K2.6-DFlash,
              target_dir: {tmp_path}/bad/Kimi-K2.6}}
        """)
    )
    code, facts = run_runbook(runbook, tmp_path / "logs")
    err = capsys.readouterr().err
    assert code == 1
    assert InspectConfigFacts.model_validate(facts["inspect"]).deploy.speculative_num_draft_tokens.value == 8
    assert "config.json problems, each listed below" in err
    bad = tmp_path / "bad" / "Kimi-K2.6-DFlash" / "config.json"
    assert f"problem: {bad}: dflash_config.target_layer_ids[3] = 64 is out of range for a target with 61 layers" in err


def test_plan_shows_the_program_and_its_config() -> None:
    step = InspectConfigStep(id="i", target_dir="$models_dir/Kimi-K2.6", drafter_dir="/m/d k", python="~/venv/python")
    script = step.render(None)  # type: ignore[arg-type]
    assert script.startswith("# hostprograms/inspect_config.py with the kit, zip sha256:")
    assert '{"target_dir": "$models_dir/Kimi-K2.6", "drafter_dir": "/m/d k"}\n' in script  # expanded on the host
    assert script.endswith('"${HOME:?is not set}"/venv/python "$prog/program.pyz" "$prog/config.json"\n')
