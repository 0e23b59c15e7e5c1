"""`extra_args` cannot set a flag `deploy` renders, however SGLang's parser would read it (steps/sglang_flags.py):
not by its name, an alias (`--nccl-init-addr`) or an abbreviation (`--attention-back`, `--tp`), argparse's
allow_abbrev. Checked against the real SGLang 0.5.23 parser (its option strings as the probe reads them, and the
stand-in's argparse parser built from the same release's files), offline and in-process."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from executor.faces.cli import main
from executor.stepkind import FactsError
from hostprograms.probe import _read_launch_options, _sglang_blank
from sandbox.prepare import DDTREE_BUILD, VENV
from sandbox.sglang_standin import launch_args
from steps import sglang_flags
from steps.deploy import DeployStep
from steps.provenance import gpus_of
from steps.server.documents import Choice
from tests.steps.test_deploy import Facts, inspect_facts, probe_facts

SGLANG = next(VENV.glob("lib/python*/site-packages")) / "sglang"


@functools.cache
def options(package: Path = SGLANG) -> list[list[str]]:
    facts = _sglang_blank()
    _read_launch_options(str(package), facts)
    assert facts["launch_options"] is not None, facts["unknown"]
    groups: list[list[str]] = facts["launch_options"]
    return groups


@functools.cache
def real_parser() -> argparse.ArgumentParser:
    """The launch parser of the real release (the stand-in's, built from its files), refusing by ValueError."""
    parser = launch_args.build_parser(SGLANG)
    parser.error = _refuse  # type: ignore[method-assign]  # "ambiguous option": argparse would exit 2
    return parser


def real_dest(word: str) -> str | None:
    """The field the real release's parser (argparse, allow_abbrev) sets for `word`; None when it refuses it."""
    try:
        action = real_parser()._parse_optional(word)  # argparse's own resolution of an option word (no value needed)
    except ValueError:
        return None
    return None if action is None or action[0] is None else str(action[0].dest)


def _refuse(message: str) -> NoReturn:
    raise ValueError(message)


def deploy(**params: Any) -> DeployStep:
    base = {"id": "deploy", "kind": "deploy", "model_path": "/m/Kimi-K2.6", "probe": "probe", "inspect": "inspect"}
    return DeployStep.model_validate(base | params)


MANAGED_DESTS = {"model_path", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_draft_tokens",
                 "speculative_dflash_block_size", "tp_size", "attention_backend", "speculative_draft_attention_backend",
                 "mem_fraction_static", "trust_remote_code", "host", "port", "nnodes", "node_rank", "dist_init_addr",
                 "dist_timeout", "config", "decode_attention_backend", "prefill_attention_backend"}  # fmt: skip
MANAGED_OPTIONS = sorted(o for group in options() for o in group if real_dest(group[0]) in MANAGED_DESTS)


@st.composite
def managed_words(draw: st.DrawFn) -> str:
    """A managed option string of the real release, or an alias, cut to any prefix, with or without `=value`."""
    option = draw(st.sampled_from(MANAGED_OPTIONS))
    word = option[: draw(st.integers(3, len(option)))]
    return word + draw(st.sampled_from(["", "=8", "=x=y"]))


@settings(max_examples=300, deadline=None)
@given(managed_words())
def test_validate_refuses_every_word_the_real_parser_reads_as_a_managed_flag(word: str) -> None:
    dest = real_dest(word)
    if dest in MANAGED_DESTS:  # argparse sets a managed flag with it: refused, naming the flag
        with pytest.raises(ValidationError) as refused:
            deploy(extra_args=[word, "1"])
        said = str(refused.value)
        assert f"extra_args: {word.partition('=')[0]} " in said and "--" + dest.replace("_", "-") in said
    # whatever argparse does with it (sets a managed flag, or refuses it as ambiguous), validate refuses it
    assert sglang_flags.managed_clash(word) is not None or dest not in MANAGED_DESTS


@pytest.mark.parametrize(
    ("word", "flag"),
    [
        ("--attention-back", "--attention-backend"),
        ("--mem-frac", "--mem-fraction-static"),
        ("--tp-s", "--tp-size"),
        ("--tp", "--tp-size"),
        ("--speculative-num-draft", "--speculative-num-draft-tokens"),
        ("--nccl-init-addr", "--dist-init-addr"),
        ("--tensor-parallel-size=8", "--tp-size"),
        ("--model", "--model-path"),
        ("--trust-remote", "--trust-remote-code"),
    ],
)
def test_the_issues_words_are_refused_naming_the_flag_they_set(word: str, flag: str) -> None:
    assert real_dest(word.partition("=")[0]) == flag[2:].replace("-", "_")  # what SGLang 0.5.23 really does
    with pytest.raises(ValidationError, match=f"extra_args: {word.partition('=')[0]} .*{flag}, which this step"):
        deploy(extra_args=[word, "x"])


def test_config_is_refused_and_other_flags_pass() -> None:
    with pytest.raises(ValidationError, match="--config is rendered by this step from `the step's parameters"):
        deploy(extra_args=["--config", "/etc/sglang.yaml"])
    step = deploy(extra_args=["--reasoning-parser", "kimi_k2", "--tool-call-parser=kimi_k2", "--served-model-name"])
    assert step.extra_args[0] == "--reasoning-parser"


def ran(step: DeployStep, groups: list[list[str]] | None = None, **variables: str) -> tuple[list[str], Choice]:
    """extra_args as the launch gives them on a host whose SGLang has the option table `groups` (the real
    release's unless given), and the choice that says how they were read."""
    probe = probe_facts("sm100")
    probe["sglang"] = probe["sglang"] | {"launch_options": options() if groups is None else groups}
    ctx = Facts(probe=probe, inspect=inspect_facts())
    ctx.vars = variables
    launch = step.launch(ctx)
    choice = launch.choices["extra_args"]
    assert isinstance(choice, Choice)
    return [arg.text for arg in launch.groups[-1]], choice


def test_at_run_time_extra_args_are_written_as_the_flags_the_server_reads() -> None:
    words, choice = ran(deploy(extra_args=["--reasoning-pars", "kimi_k2", "--tool-call-p=kimi_k2", "--context-bucket"]))
    assert words == ["--reasoning-parser", "kimi_k2", "--tool-call-parser=kimi_k2", "--cuda-graph-prefill-max-context"]
    assert choice.value == words
    assert choice.source.startswith("--reasoning-pars -> --reasoning-parser; --tool-call-p -> --tool-call-parser")
    assert choice.source.endswith("(steps.probe.facts.sglang.launch_options)")


def test_the_gpus_the_report_counts_are_those_the_server_ran_on() -> None:
    """An abbreviated `--pipeline-parallel 2` runs on twice the GPUs: launched as `--pp-size 2`, the report's
    provenance (steps/provenance.py `gpus_of`, which reads the flags by name) counts them; as written it did not."""
    step = deploy(extra_args=["--pipeline-parallel", "2", "--data-parallel=2"])
    launch = step.launch(Facts(probe=probe_facts("sm100"), inspect=inspect_facts()))
    argv = [arg.text for group in launch.groups for arg in group]
    assert argv[-3:] == ["--pp-size", "2", "--dp-size=2"] and gpus_of(argv) == 8 * 2 * 2
    assert gpus_of([*argv[:-3], *step.extra_args]) == 8  # what the written words would have told the report


def test_at_run_time_the_hosts_table_decides() -> None:
    """A release with an alias validate cannot know (`--attn-backend`), a var that hides a flag, an ambiguous
    prefix: each fails the step before anything starts, naming what the host's SGLang would make of it."""
    newer = [*options(), ["--attention-backend", "--attn-backend"]]
    newer = [g for g in newer if g != ["--attention-backend"]]
    with pytest.raises(FactsError, match=r"reads --attn-backend as --attention-backend, .* from `attention_backend`"):
        ran(deploy(extra_args=["--attn-backend", "triton"]), newer)
    with pytest.raises(FactsError, match=r"--mem-frac abbreviates --mem-fraction-static, .*\(`\$flag` on this host\)"):
        ran(deploy(extra_args=["$flag", "0.5"]), flag="--mem-frac")
    with pytest.raises(FactsError, match="ambiguous option: --enable-hi could match --enable-hierarchical-cache"):
        ran(deploy(extra_args=["--enable-hi"]))
    words, choice = ran(deploy(extra_args=["--no-such-flag", "1"]))  # SGLang itself refuses it, with its words
    assert words == ["--no-such-flag", "1"] and choice.source.startswith("every option as written")


def test_without_the_hosts_table_extra_args_stay_as_written_and_say_why() -> None:
    probe = probe_facts("sm100")
    del probe["sglang"]["launch_options"]  # a probe of a run from before the probe read them (a resume)
    launch = deploy(extra_args=["--reasoning-pars", "kimi_k2"]).launch(Facts(probe=probe, inspect=inspect_facts()))
    assert launch.choices["extra_args"] == Choice(
        value=["--reasoning-pars", "kimi_k2"], source="as written: steps.probe.facts has no sglang.launch_options"
    )


def test_the_probe_reads_the_releases_option_strings() -> None:
    """Every option string of the real parser (as the stand-in builds it from the release's files), each with its
    flag first; the DDTree build's own flag too."""
    real = launch_args.build_parser(SGLANG)
    read = {o: group[0] for group in options() for o in group}
    assert set(read) == set(real._option_string_actions)
    assert all(real._option_string_actions[o].dest == real._option_string_actions[f].dest for o, f in read.items())
    assert read["--nccl-init-addr"] == "--dist-init-addr" and read["--ep"] == "--ep-size"
    ddtree = {o for group in options(DDTREE_BUILD / "sglang") for o in group}
    assert "--speculative-ddtree-budget" in ddtree - set(read)


def test_validate_refuses_a_runbook_var_that_hides_a_managed_flag(tmp_path: Path) -> None:
    """`extra_args: [$flag, ...]`: the var's value is known at validate (and per `--var` at run), so is the flag."""
    path = tmp_path / "hidden.yaml"
    path.write_text(
        "name: hidden\nhosts: {gpu: {address: 127.0.0.1}}\nvars: {flag: --attention-back}\nsteps:\n"
        "  - {id: probe, kind: probe}\n"
        "  - {id: serve, kind: deploy, model_path: /m, probe: probe, extra_args: [$flag, triton]}\n"
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        assert main(["validate", str(path)]) == 2
    assert (
        f"{path}:6:5: step 'serve': extra_args: --attention-back abbreviates --attention-backend, which this step "
        "renders from `attention_backend` (`$flag` on this host): use its parameters"
    ) in out.getvalue()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        assert main(["plan", str(path), "--var", "flag=--reasoning-parser"]) == 0  # another flag: as written


def test_an_older_release_s_flags_and_an_unreadable_one_s_reason(tmp_path: Path) -> None:
    """Releases before the field declarations kept every flag in server_args.py (`add_argument`, aliases
    included); a file that does not parse leaves the table unknown with the reason, never an empty table."""
    (tmp_path / "srt").mkdir()
    server_args = tmp_path / "srt" / "server_args.py"
    server_args.write_text(
        "def add_cli_args(parser):\n"
        "    parser.add_argument('--model-path', '--model', type=str)\n"
        "    parser.add_argument('--tp-size', '--tensor-parallel-size', type=int)\n"
        "    parser.add_argument(name_from_a_variable)\n"
    )
    facts = _sglang_blank()
    _read_launch_options(str(tmp_path), facts)
    assert facts["launch_options"] == [
        ["--help", "-h"],
        ["--model-path", "--model"],
        ["--tp-size", "--tensor-parallel-size"],
    ]
    assert facts["sources"]["launch_options"] == str(server_args)
    server_args.write_text("def add_cli_args(parser:\n")
    facts = _sglang_blank()
    _read_launch_options(str(tmp_path), facts)
    assert facts["launch_options"] is None and "does not parse with Python" in facts["unknown"]["launch_options"]


@pytest.mark.parametrize("word", ["--decode-attention-backend", "--prefill-attention-backend=fa3", "--decode-att"])
def test_a_flag_sglang_prefers_to_the_attention_backend_is_refused(word: str) -> None:
    """0.5.23's decode and prefill attention backends "have priority over --attention-backend": given in extra_args,
    the server would run another backend than the one the step chose (and the choices record); refused at validate
    and, as the host's parser reads it, at run time."""
    assert real_dest(word.partition("=")[0]) in {"decode_attention_backend", "prefill_attention_backend"}
    with pytest.raises(ValidationError, match="SGLang prefers to --attention-backend, which this step renders"):
        deploy(extra_args=[word, "flashinfer"])
    with pytest.raises(FactsError, match=r"SGLang prefers to --attention-backend, .* from `attention_backend`"):
        ran(deploy(extra_args=["$flag", "flashinfer"]), flag=word)  # known only at run time: a host var's value


def test_a_negated_boolean_is_read_as_the_real_parser_reads_it() -> None:
    """BooleanOptionalAction adds `--no-FLAG` (0.5.23: `--no-speculative-enable-w4a4-mxfp4-megamoe`): the probe's
    table lists it, so an abbreviation of it is launched as it (never as the flag it negates), it counts as
    speculative in a campaign's parity, and a host whose managed flag is negatable refuses `--no-` of it."""
    negated = "--no-speculative-enable-w4a4-mxfp4-megamoe"
    assert real_dest(negated) == "speculative_enable_w4a4_mxfp4_megamoe"
    assert any(negated in group for group in options())
    words, _ = ran(deploy(extra_args=["--no-speculative-enable-w4a4"]))
    assert words == [negated]
    assert sglang_flags.parity_differences({}, {negated: []}) == []
    negatable = [*options(), ["--no-trust-remote-code"]]  # a release whose --trust-remote-code is negatable
    with pytest.raises(FactsError, match="reads --no-trust-remote as --no-trust-remote-code, which this step renders"):
        ran(deploy(extra_args=["--no-trust-remote"]), negatable)


@pytest.mark.parametrize("word", ["$SGLANG_EXTRA", "${SGLANG_EXTRA}", "$SGLANG_EXTRA=4"])
def test_a_word_that_starts_with_a_var_the_runbook_does_not_give_is_refused(word: str) -> None:
    """The host expands `$name` from its own environment (hostprograms/kit.py expand_path): a var the runbook does
    not declare has a value the controller cannot check (`SGLANG_EXTRA=--tp-size` on the host would override the
    step's tp size). Refused before anything starts; a declared var and a var inside a value still pass."""
    with pytest.raises(FactsError, match=r"starts with \$SGLANG_EXTRA, no runbook var: .* declare it in `vars`"):
        ran(deploy(extra_args=[word, "8"]))
    words, _ = ran(deploy(extra_args=["$parser", "kimi_k2", "--download-dir=$SGLANG_EXTRA"]), parser="--reasoning-p")
    assert words == ["$parser", "kimi_k2", "--download-dir=$SGLANG_EXTRA"]
