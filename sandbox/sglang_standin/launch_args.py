"""The launch flags of the installed SGLang, read from its own field declarations (TEST DOUBLE).

SGLang 0.5.23 declares almost every server flag as a field `name: A[type, "help" | Arg(...)]` in
`srt/arg_groups/fields/*.py` and builds its argparse parser from them (`--name-with-dashes`,
`aliases=`, `choices=` (literal or a list in `srt/arg_groups/choices.py`), bool -> store_true,
`Literal[...]` -> choices, `list[...]` -> nargs "+", `no_cli=True` -> no flag); a few more
(`--reasoning-parser`, `--tool-call-parser`, `--config`, ...) are plain `parser.add_argument`
calls in `srt/server_args.py`. This module reads those files with `ast` (nothing is imported)
and builds the same parser, so the stand-in accepts exactly the real flags, abbreviations
included, and rejects the rest with argparse's own errors.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FIELDS_DIR = "srt/arg_groups/fields"
CHOICES_FILE = "srt/arg_groups/choices.py"
SERVER_ARGS_FILE = "srt/server_args.py"
SPEC_INFO_FILE = "srt/speculative/spec_info.py"
_TYPES: dict[str, Any] = {"int": int, "float": float, "str": str}


def sglang_dir() -> Path:
    """The real SGLang package folder of this interpreter (found, never imported)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the SGLang stand-in reads the real sglang release files: run `python -m sandbox.prepare`")
    return Path(next(iter(spec.submodule_search_locations)))


def _literal_lists(source: str) -> dict[str, list[Any]]:
    lists = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.List | ast.Tuple):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            lists.update({t.id: list(value) for t in targets if isinstance(t, ast.Name)})
    return lists


def _inner(annotation: ast.expr) -> tuple[str, ast.expr | None]:
    """(kind, literal values node): kind is bool|int|float|str|list|literal; Optional unwrapped."""
    if isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name):
        name = annotation.value.id
        if name == "Optional":
            return _inner(annotation.slice)
        if name == "Literal":
            return "literal", annotation.slice
        if name in ("list", "List"):
            return "list", None
    if isinstance(annotation, ast.BinOp):  # X | None
        side = annotation.left if not _is_none(annotation.left) else annotation.right
        return _inner(side)
    if isinstance(annotation, ast.Name):
        return annotation.id, None
    return "str", None


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _fields(source: str) -> list[tuple[str, ast.expr, dict[str, ast.expr]]]:
    """(field name, type annotation, Arg keywords) of every `name: A[type, meta]` field."""
    found = []
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in cls.body:
            ann = node.annotation if isinstance(node, ast.AnnAssign) else None
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id == "A"):
                continue
            if not isinstance(ann.slice, ast.Tuple) or len(ann.slice.elts) < 2:
                continue
            kind, meta = ann.slice.elts[0], ann.slice.elts[1]
            keywords = {k.arg: k.value for k in meta.keywords if k.arg} if isinstance(meta, ast.Call) else {}
            found.append((node.target.id, kind, keywords))
    return found


def plain_flags(source: str) -> dict[str, dict[str, Any]]:
    """argparse options of every `parser.add_argument("--flag", ...)` call: store_true for flags
    with an action, nargs "+" where the call has nargs, else one value (types are not read)."""
    flags: dict[str, dict[str, Any]] = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "add_argument" or not node.args:
            continue
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith("--"):
            keywords = {k.arg for k in node.keywords}
            dest = first.value[2:].replace("-", "_")
            if "action" in keywords:
                flags[first.value] = {"dest": dest, "action": "store_true", "default": None}
            else:
                flags[first.value] = {"dest": dest, "default": None} | ({"nargs": "+"} if "nargs" in keywords else {})
    return flags


def speculative_algorithms(sglang_dir: Path) -> list[str]:
    """The names `SpeculativeAlgorithm.from_string` accepts: the enum's members but NONE (DDTREE only in
    a build with SGLang's DDTree pull request, sandbox.prepare's DDTREE_BUILD)."""
    for node in ast.parse((sglang_dir / SPEC_INFO_FILE).read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == "SpeculativeAlgorithm":
            assigned = [item.targets for item in node.body if isinstance(item, ast.Assign)]
            return [t.id for targets in assigned for t in targets if isinstance(t, ast.Name) and t.id != "NONE"]
    return []


def build_parser(sglang_dir: Path) -> argparse.ArgumentParser:
    """argparse parser of `python -m sglang.launch_server`, from the release in `sglang_dir`."""
    choice_lists = _literal_lists((sglang_dir / CHOICES_FILE).read_text())
    parser = argparse.ArgumentParser(prog="launch_server.py")
    for path in sorted((sglang_dir / FIELDS_DIR).glob("*.py")):
        for name, annotation, keywords in _fields(path.read_text()):
            if "no_cli" in keywords and ast.literal_eval(keywords["no_cli"]) is True:
                continue
            flag = ast.literal_eval(keywords["cli_name"]) if "cli_name" in keywords else "--" + name.replace("_", "-")
            aliases = ast.literal_eval(keywords["aliases"]) if "aliases" in keywords else []
            options: dict[str, Any] = {"dest": name, "default": None}
            kind, literal = _inner(annotation)
            action = keywords.get("action")
            if isinstance(action, ast.Attribute) and action.attr == "BooleanOptionalAction":
                options["action"] = argparse.BooleanOptionalAction  # --FLAG and --no-FLAG, as the real parser
            elif action is not None:
                options["action"] = "store_true"  # custom actions (deprecations) take no value in 0.5.23
            elif kind == "bool":
                options["action"] = "store_true"
            else:
                if kind == "list":
                    options["nargs"] = "+"
                options["type"] = _TYPES.get(kind, str)
                choices = keywords.get("choices")
                if isinstance(choices, ast.Name) and choices.id in choice_lists:
                    options["choices"] = choice_lists[choices.id]
                elif isinstance(choices, ast.List):
                    options["choices"] = ast.literal_eval(choices)
                elif literal is not None:
                    values = ast.literal_eval(literal)
                    options["choices"] = list(values) if isinstance(values, tuple) else [values]
                    options["type"] = type(options["choices"][0])
            try:
                parser.add_argument(flag, *aliases, **options)
            except argparse.ArgumentError:
                continue  # a name declared twice across namespaces: the first one wins, as in SGLang
    for flag, options in plain_flags((sglang_dir / SERVER_ARGS_FILE).read_text()).items():
        parser.add_argument(flag, **options)
    return parser


def parse(sglang_dir: Path, argv: Sequence[str]) -> argparse.Namespace:
    """The launch arguments; argparse's usage error and exit status 2 on a flag SGLang rejects."""
    return build_parser(sglang_dir).parse_args(list(argv))
