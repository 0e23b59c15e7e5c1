"""Gate expressions: Jinja2 expressions in a sandbox (what Ansible users write in `that:`).

Never `eval`. A name that is missing fails the gate with a message naming it, and a failed
gate explains itself with the values of the names it used.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, nodes
from jinja2.environment import TemplateExpression
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment

_ENV = ImmutableSandboxedEnvironment(undefined=StrictUndefined)
_STEP_REF = re.compile(r"""\bsteps\s*(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*['"]([^'"]+)['"]\s*\])""")
# the two regex tests Ansible users write in `that:` (`stdout is search('H200')`)
_ENV.tests["search"] = lambda value, pattern: re.search(pattern, str(value)) is not None
_ENV.tests["match"] = lambda value, pattern: re.match(pattern, str(value)) is not None


@dataclass(frozen=True)
class GateVerdict:
    passed: bool
    expression: str
    message: str | None
    detail: str  # why it failed: the values of the names it used, or the missing name

    def describe(self) -> str:
        head = self.message or "gate failed"
        return f"{head}\n  gate: {self.expression}\n{self.detail}".rstrip()


@functools.lru_cache(maxsize=4096)
def _compiled(expression: str) -> TemplateExpression:
    """Compile once per distinct expression: a runbook evaluates the same gates on every host and attempt."""
    return _ENV.compile_expression(expression, undefined_to_none=False)


def step_refs(text: str) -> list[str]:
    """Ids of the steps whose facts a text refers to (`steps.probe...`, `steps['dl-1']...`)."""
    return [m.group(1) or m.group(2) for m in _STEP_REF.finditer(text)]


def syntax_error(expression: str) -> str | None:
    """None if the expression parses, else the parser's complaint."""
    try:
        _ENV.parse(f"{{{{ ({expression}) }}}}")
    except TemplateSyntaxError as exc:
        return exc.message or str(exc)
    return None


def _chain_text(node: nodes.Node) -> str | None:
    """`facts.gpus[0]`-style text for a chain of lookups on a name, else None."""
    if isinstance(node, nodes.Name):
        return node.name
    if isinstance(node, nodes.Getattr):
        base = _chain_text(node.node)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        base = _chain_text(node.node)
        return f"{base}[{node.arg.value!r}]" if base else None
    return None


def names_used(expression: str) -> list[str]:
    """The longest lookup chains in an expression, in order of appearance, without repeats."""
    tree = _ENV.parse(f"{{{{ ({expression}) }}}}")
    found: list[str] = []

    def walk(node: nodes.Node) -> Iterator[str]:
        text = _chain_text(node)
        if text is not None:
            yield text
            return
        for child in node.iter_child_nodes():
            yield from walk(child)

    for text in walk(tree):
        if text not in found:
            found.append(text)
    return found


def _show(value: Any, limit: int = 600) -> str:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    if isinstance(value, str) and value == "":
        text += "  (empty)"
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def evaluate(expression: str, names: Mapping[str, Any], message: str | None = None) -> GateVerdict:
    """Evaluate one gate against the names a gate sees."""
    try:
        value = _compiled(expression)(**names)
        if isinstance(value, StrictUndefined):
            raise UndefinedError(f"{expression} is undefined")
        if value:
            return GateVerdict(True, expression, message, "")
        why = ""
    except UndefinedError as exc:
        why = f"  names something missing: {exc.message}"
    except SecurityError as exc:
        why = f"  refused by the sandbox: {exc}"
    except Exception as exc:  # a gate is user code: any error it raises is a failed gate
        why = f"  raised {type(exc).__name__}: {exc}"
    return GateVerdict(False, expression, message, "\n".join(filter(None, [why, _values(expression, names)])))


def _values(expression: str, names: Mapping[str, Any]) -> str:
    """`  name = value` for each lookup chain the expression uses: what a reader needs to see why."""
    lines = []
    for name in names_used(expression):
        try:
            shown = _show(_compiled(name)(**names))
        except Exception as exc:
            shown = f"<{exc}>"
        lines.append(f"  {name} = {shown}")
    return "\n".join(lines)
