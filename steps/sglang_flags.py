"""SGLang's launch flags as its parser reads them: which flags `deploy` renders (managed), and which flag a word of
`extra_args` really sets. One place for the rule, used by `validate` (no host yet), by `deploy` at run time (the
option table the probe read from the host's SGLang) and by the campaign's baseline parity.

SGLang's `launch_server` parser is argparse with `allow_abbrev=True` and aliases (0.5.23: srt/server_args.py
`prepare_server_args`, srt/arg_groups/fields/*.py `aliases=`): `--attention-back`, `--mem-frac`, `--tp-s` and
`--tp` set the full flags, `--nccl-init-addr` is `--dist-init-addr`. argparse takes a word starting with `--` as an
option: the exact option string (or the part before `=`), else the only option string it is a prefix of; a prefix
of several is refused ("ambiguous option"); anything else is "unrecognized". A guard on exact names lets an
abbreviation override a flag the step chose from facts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

#: The flags `deploy` renders, each with the parameter that sets it and its aliases in SGLang 0.5.23 (argparse
#: takes an alias as the flag). `--config` names a file of flags that SGLang merges in (server_args_config_parser):
#: it could set any of them, so extra_args may not give it either.
MANAGED: dict[str, tuple[str, tuple[str, ...]]] = {
    "--model-path": ("model_path", ("--model",)),
    "--speculative-algorithm": ("speculative_algorithm", ()),
    "--speculative-draft-model-path": ("draft_model_path", ("--speculative-draft-model",)),
    "--speculative-num-draft-tokens": ("speculative_num_draft_tokens", ()),
    "--speculative-dflash-block-size": ("speculative_num_draft_tokens", ()),
    "--speculative-ddtree-budget": ("speculative_ddtree_budget", ()),
    "--tp-size": ("tp_size", ("--tensor-parallel-size",)),
    "--attention-backend": ("attention_backend", ()),
    "--speculative-draft-attention-backend": ("draft_attention_backend", ()),
    "--mem-fraction-static": ("mem_fraction_static", ()),
    "--trust-remote-code": ("trust_remote_code", ()),
    "--enable-metrics": ("metrics", ()),
    "--host": ("bind", ()),
    "--port": ("port", ()),
    "--nnodes": ("nodes", ()),
    "--node-rank": ("nodes", ()),
    "--dist-init-addr": ("dist_init_addr", ("--nccl-init-addr",)),
    "--dist-timeout": ("dist_timeout", ()),
    "--config": ("the step's parameters and extra_args: a config file could set any flag above", ()),
}
#: Flags this step does not render that SGLang prefers to one it does (0.5.23 srt/arg_groups/fields/exec_.py: the
#: decode and prefill attention backends "have priority over --attention-backend"): given in extra_args, the server
#: would run another backend than the one the step chose and recorded, so they are refused as the managed flag is.
OVERRIDING: dict[str, str] = {
    "--decode-attention-backend": "--attention-backend",
    "--prefill-attention-backend": "--attention-backend",
}
#: Flags of speculative decoding: a campaign's baseline and cells may differ in them (and only in them).
SPECULATIVE_PREFIX = "--speculative-"
#: Flags that say where a server listens or how its nodes meet, not what it computes: never a parity difference.
ADDRESSING = ("--host", "--port", "--node-rank", "--dist-init-addr", "--dist-timeout")

Kind = Literal["exact", "abbreviation", "ambiguous", "unknown"]


@dataclass(frozen=True)
class Resolved:
    """What argparse makes of one word: `flag` is the canonical option string (the first of its action) when
    the word sets one; `matches` the option strings an ambiguous word could be."""

    word: str
    kind: Kind
    flag: str | None
    matches: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The word up to `=`: what argparse matched."""
        return self.word.partition("=")[0]


def is_option(word: str) -> bool:
    """Whether argparse takes `word` for a long option (`--` alone ends the options: not one)."""
    return word.startswith("--") and word != "--"


def canonical_table(groups: Sequence[Sequence[str]]) -> dict[str, str]:
    """option string -> the first option string of its action (the probe's `sglang.launch_options`)."""
    return {option: group[0] for group in groups if group for option in group}


def resolve(word: str, table: Mapping[str, str]) -> Resolved:
    """`word` (an option, see `is_option`) as argparse with allow_abbrev reads it against `table` (option string
    -> canonical flag): exact, the part before `=` exact, else the one option string it prefixes. Prefixes of
    several option strings of ONE action are taken as that action (argparse refuses them on Python 3.11 as
    ambiguous: either way they cannot set another flag)."""
    if word in table:
        return Resolved(word, "exact", table[word])
    name = word.partition("=")[0]
    if name in table:
        return Resolved(word, "exact", table[name])
    matches = tuple(option for option in table if option.startswith(name))
    flags = {table[option] for option in matches}
    if len(flags) == 1:
        return Resolved(word, "abbreviation", flags.pop(), matches)
    if flags:
        return Resolved(word, "ambiguous", None, matches)
    return Resolved(word, "unknown", None)


#: The managed flags and their aliases as a table: what `validate` resolves against, before any host is known.
MANAGED_TABLE: dict[str, str] = {
    **{option: flag for flag, (_, aliases) in MANAGED.items() for option in (flag, *aliases)},
    **{flag: flag for flag in OVERRIDING},
}


def rendered_from(flag: str) -> str:
    """What becomes of `flag` (a value of MANAGED_TABLE) in this step, after "FLAG, which": the parameter it
    renders it from, or for a flag SGLang prefers to a managed one (OVERRIDING), the managed one it overrides."""
    if flag in OVERRIDING:
        managed = OVERRIDING[flag]
        return f"SGLang prefers to {managed}, which this step renders from `{MANAGED[managed][0]}`"
    return f"this step renders from `{MANAGED[flag][0]}`"


def managed_clash(word: str) -> str | None:
    """Why `word` of extra_args may not be given (None: it may), without the host's option table: it is a
    managed flag, an alias of one, or a prefix of one (argparse's abbreviation). A prefix of several managed flags
    is refused too: SGLang would refuse it as ambiguous or set one of them."""
    if not is_option(word):
        return None
    found = resolve(word, MANAGED_TABLE)
    if found.flag is not None:
        if found.name == found.flag and found.flag in MANAGED:
            return f"{found.name} is rendered by this step from `{MANAGED[found.flag][0]}`"
        if found.name == found.flag:
            return f"{found.name} is a flag {rendered_from(found.flag)}"
        how = "abbreviates" if found.kind == "abbreviation" else "is an alias of"
        return f"{found.name} {how} {found.flag}, which {rendered_from(found.flag)}"
    if found.kind == "ambiguous":
        flags = sorted({MANAGED_TABLE[option] for option in found.matches})
        return f"{found.name} abbreviates {', '.join(flags)}, which this step renders (SGLang's parser takes a prefix)"
    return None


def flag_values(words: Sequence[str]) -> dict[str, list[str]]:
    """The options of a command's words (after the program) -> their values as written: `--flag value ...` or
    `--flag=value`; a flag given twice keeps its last values, as argparse does."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for word in words:
        if is_option(word):
            name, equals, value = word.partition("=")
            current = found[name] = [value] if equals else []
        elif current is not None:
            current.append(word)
    return found


def positive(flag: str) -> str:
    """`--no-FLAG` as `--FLAG` (argparse's BooleanOptionalAction: the same setting, the other value), else `flag`."""
    return "--" + flag.removeprefix("--no-") if flag.startswith("--no-") else flag


def is_speculative(flag: str) -> bool:
    """Whether `flag` (or the flag it negates) is one of speculative decoding's."""
    return positive(flag).startswith(SPECULATIVE_PREFIX)


def parity_differences(baseline: Mapping[str, list[str]], cell: Mapping[str, list[str]]) -> list[str]:
    """The flags (canonical, as `flag_values` of the argv each server ran with) in which a baseline and a cell
    differ, but the speculative ones and those that only address the server (ADDRESSING)."""
    names = dict.fromkeys([*baseline, *cell])
    return [
        name
        for name in names
        if not is_speculative(name) and name not in ADDRESSING and baseline.get(name) != cell.get(name)
    ]


def managed_of(flag: str | None, table: Mapping[str, str]) -> str | None:
    """The managed flag (a key of MANAGED) that `flag`, a canonical flag of the host's `table`, is: one of its
    action's option strings is a managed flag or alias, or negates one (`--no-FLAG`); None for a flag this step
    leaves to extra_args."""
    if flag is None:
        return None
    return next(
        (MANAGED_TABLE[positive(o)] for o, f in table.items() if f == flag and positive(o) in MANAGED_TABLE), None
    )
