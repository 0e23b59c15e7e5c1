"""The JSON Schemas (draft 2020-12) of the runbook format and of an inventory (`runbook schema [--inventory]`),
and of the documents runbook writes for agents: report.json (`--report`) and the plan (`--plan`).

Editors (yaml-language-server, in VS Code and neovim) complete and check a runbook with it. It is made from
the pydantic models the loader validates with (`RunbookHeader`, `Inventory`, every `StepSpec` kind), so a
new parameter appears in it without an edit here, and it accepts what the loader accepts where a schema
can say so. Where the loader parses by hand (matrices, groups) it says so here, from the loader's own key
sets. It never refuses a runbook the loader reads; it leaves some refusals to `runbook validate` (a
reference to a step that does not run before, a `${{ }}` outside a matrix, a host name no host has).

- **Lax values.** The loader validates in pydantic's lax mode, which reads `"8000"` as the int 8000 and
  `yes` as true: a number, or boolean, also takes the text that mode reads (`_LaxSchema`).
- **Matrices.** `${{ matrix.X }}` may stand for any parameter of a step (an int too: alone as the value it
  keeps the axis value's type) except `id`, `kind`, `description`, gates, `when:` and scripts; each such
  value also accepts a text holding `${{`. In a step without a matrix the loader refuses it; the schema
  does not tell the two apart (it would need every kind twice).
- **Editors.** yaml-language-server checks instances as draft-07 does (its issue #856): apart from
  `dependentRequired` (which it then ignores, and `validate` checks) only keywords draft-07 knows are used,
  and none beside a `$ref`, where draft-07 ignores them.
- **Kinds.** A step is a union on `kind` written as `if`/`then` per kind rather than `oneOf` with a
  `discriminator`: yaml-language-server ignores `discriminator`, and against a `oneOf` it reports a
  misspelled parameter as "matches no alternative" with the problems of all ten kinds; with `if`/`then`
  it applies the one kind's schema, so completion offers that kind's parameters and a typo is reported
  at its key. A misspelled kind is refused by the `enum` of `kind`.
"""

from __future__ import annotations

import inspect
import io
import re
import tokenize
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, models_json_schema
from pydantic_core import core_schema

from executor.documents import FIGURE_PATH
from executor.runbook.loader import _FALLBACK_FORBIDDEN
from executor.runbook.matrix import _FIXED_FIELDS, _GROUP_KEYS, _GROUP_NAME, _JINJA_FIELDS, _MATRIX_STEP_KEYS, _NAME
from executor.runbook.model import HOST_NAME, IDENTIFIER, Inventory, RunbookHeader
from executor.runbook.search import SearchSpec
from executor.stepkind import StepSpec, step_kinds

DRAFT = "https://json-schema.org/draft/2020-12/schema"
_REF = "#/$defs/{model}"

# What pydantic's lax mode reads as a number or a boolean from text (`int("1_000")`, `" 8 "`, `yes`, `On`).
# A text is checked no further (a bound such as `ge=1` applies to numbers only): `validate` does the rest.
_INT_TEXT = {"type": "string", "pattern": r"^\s*[+-]?[0-9][0-9_]*(\.0*)?\s*$"}
_FLOAT_TEXT = {"type": "string", "pattern": r"^\s*[+-]?([0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)([eE][+-]?[0-9]+)?\s*$"}
_BOOL_WORDS = ("true", "false", "yes", "no", "on", "off", "t", "f", "y", "n", "1", "0")


def _any_case(word: str) -> str:
    """`word` in any case, as a pattern: pydantic lower-cases the text, and a JSON Schema pattern has no flags."""
    return "".join(f"[{c.upper()}{c}]" if c.isalpha() else c for c in word)


_BOOL_TEXT = {"type": "string", "pattern": f"^({'|'.join(map(_any_case, _BOOL_WORDS))})$"}

EXPRESSION = "MatrixExpression"
_EXPRESSION_SCHEMA = {
    "type": "string",
    "pattern": r"\$\{\{",
    "description": "`${{ matrix.AXIS }}` or `${{ matrix.AXIS.FIELD }}`: alone as the value it keeps the axis "
    "value's type; inside text it is the value's text (a step of a matrix or a group only)",
}


class _LaxSchema(GenerateJsonSchema):
    """pydantic's JSON Schema as the loader validates: lax numbers and booleans, no generated titles (`Model
    Path` says nothing the key does not), and each field's `#:` comment or trailing comment as its
    description (the hover text in an editor)."""

    def int_schema(self, schema: core_schema.IntSchema) -> JsonSchemaValue:
        return {"anyOf": [super().int_schema(schema), _INT_TEXT, {"type": "boolean"}]}

    def float_schema(self, schema: core_schema.FloatSchema) -> JsonSchemaValue:
        return {"anyOf": [super().float_schema(schema), _FLOAT_TEXT, {"type": "boolean"}]}

    def bool_schema(self, schema: core_schema.BoolSchema) -> JsonSchemaValue:
        return {"anyOf": [super().bool_schema(schema), _BOOL_TEXT, {"enum": [0, 1]}]}

    def union_schema(self, schema: core_schema.UnionSchema) -> JsonSchemaValue:
        """A union's alternatives, flat; where any text is valid, no other text alternative (a var is
        `str | int | float | bool`: the lax number texts say nothing there)."""
        union = super().union_schema(schema)
        if "anyOf" not in union:
            return union
        flat = [item for alt in union["anyOf"] for item in (alt["anyOf"] if set(alt) == {"anyOf"} else [alt])]
        if {"type": "string"} in flat:
            flat = [alt for alt in flat if alt == {"type": "string"} or alt.get("type") != "string"]
        union["anyOf"] = [alt for i, alt in enumerate(flat) if alt not in flat[:i]]
        return union

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        json_schema = super().model_schema(schema)
        json_schema.pop("title", None)
        properties = json_schema.get("properties", {})
        for name, text in _field_comments(schema["cls"]).items():
            prop = properties.get(name)
            if prop is not None and "description" not in prop:
                properties[name] = _described(prop, text)
        return json_schema


def _described(node: dict[str, Any], text: str) -> dict[str, Any]:
    """`node` with `text` as its description; a `$ref` goes inside an `allOf` first, as draft-07 (an editor's
    validation) ignores every keyword beside a `$ref`."""
    if "$ref" not in node:
        return {**node, "description": text}
    beside = {key: value for key, value in node.items() if key != "$ref"}
    return {"allOf": [{"$ref": node["$ref"]}], **beside, "description": text}


def _field_comments(cls: type[Any]) -> dict[str, str]:
    """The comments that document `cls`'s fields (its bases' too): a `#:` block above a field, else a
    comment after it on its line. Read from the source, as the models are documented for their readers."""
    out: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if issubclass(k, BaseModel) and k is not BaseModel]):
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):  # a class made at run time
            continue
        out.update(_comments(source))
    return out


_FIELD = re.compile(r"^    ([A-Za-z_][A-Za-z0-9_]*)\s*:")


def _comments(source: str) -> Iterator[tuple[str, str]]:
    """(field, comment) of a class's source: the tokenizer tells a comment from a `#` inside a string."""
    lines = source.splitlines()
    trailing = {
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT and lines[token.start[0] - 1].lstrip()[:1] != "#"
    }
    block: list[str] = []
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if stripped.startswith("#:"):
            block.append(stripped[2:].strip())
            continue
        match = _FIELD.match(line)
        if match and (block or number in trailing):
            yield match.group(1), " ".join(block) if block else trailing[number]
        block = []


def runbook_schema() -> dict[str, Any]:
    """The JSON Schema of a runbook file."""
    kinds = step_kinds()
    models: list[type[BaseModel]] = [RunbookHeader, SearchSpec, *kinds.values()]
    refs, document = models_json_schema(
        [(m, "validation") for m in models], ref_template=_REF, schema_generator=_LaxSchema
    )
    defs: dict[str, Any] = document["$defs"]
    defs[EXPRESSION] = _EXPRESSION_SCHEMA
    kind_defs = {kind: _def_name(refs[(model, "validation")]) for kind, model in sorted(kinds.items())}
    opened: set[str] = set()
    for kind, name in kind_defs.items():
        _kind_schema(defs, defs[name], kinds[kind], opened)
    defs["step"] = _step_schema(kind_defs)
    defs["group"] = _group_schema(_def_name(refs[(SearchSpec, "validation")]))
    defs["matrix"] = _matrix_schema()
    header = defs.pop(_def_name(refs[(RunbookHeader, "validation")]))
    header["properties"]["steps"]["items"] = {
        "if": {"type": "object", "required": ["group"]},
        "then": {"$ref": "#/$defs/group"},
        "else": {"$ref": "#/$defs/step"},
    }
    _name_patterns(header["properties"], defs)
    return {"$schema": DRAFT, "title": "runbook", **header, "$defs": defs}


def inventory_schema() -> dict[str, Any]:
    """The JSON Schema of an inventory file (`--inventory`: hosts, vars and pools of one site)."""
    document = Inventory.model_json_schema(ref_template=_REF, schema_generator=_LaxSchema)
    defs = document.pop("$defs", {})
    _name_patterns(document["properties"], defs)
    return {"$schema": DRAFT, "title": "runbook inventory", **document, "$defs": defs}


def report_schema() -> dict[str, Any]:
    """The JSON Schema of report.json: a benchmark step's comparison (steps/benchmark_report.py `Report`) or a
    campaign's (steps/campaign_report_document.py `CampaignReport`), each with its `schema_version`. Made from
    the models the steps write it with, as the document is written (strict types: no lax text)."""
    from steps.benchmark_report import Report  # here: the steps' models, which `runbook schema` alone needs
    from steps.campaign_report_document import CampaignReport

    document = TypeAdapter(Report | CampaignReport).json_schema(ref_template=_REF)
    document["$defs"]["Figure"]["properties"]["path"]["pattern"] = FIGURE_PATH.pattern  # checked by hand
    return {"$schema": DRAFT, **document, "title": "runbook report (report.json)"}


def plan_schema() -> dict[str, Any]:
    """The JSON Schema of the plan document (`runbook plan --json`, the MCP `plan`): executor/runbook/planner.py's
    `PlanDocument`."""
    from executor.runbook.planner import PlanDocument

    document = PlanDocument.model_json_schema(ref_template=_REF)
    return {"$schema": DRAFT, **document, "title": "runbook plan"}


def _def_name(ref: dict[str, Any]) -> str:
    return str(ref["$ref"]).removeprefix("#/$defs/")


def _name_patterns(properties: dict[str, Any], defs: dict[str, Any]) -> None:
    """The names the models' validators check by hand: hosts and pools name folders of the run, vars and
    secrets are environment variables."""
    for key, pattern in (("hosts", HOST_NAME), ("pools", HOST_NAME), ("vars", IDENTIFIER), ("secrets", IDENTIFIER)):
        if key in properties:
            properties[key]["propertyNames"] = {"pattern": pattern.pattern}
    if "Host" in defs:  # a host's own vars
        defs["Host"]["properties"]["vars"]["propertyNames"] = {"pattern": IDENTIFIER.pattern}


def _kind_schema(defs: dict[str, Any], schema: dict[str, Any], model: type[StepSpec], opened: set[str]) -> None:
    """A kind's schema as a step of the runbook: its parameters open to `${{ }}`, its fallbacks typed (the
    kind's keys but the ones a fallback cannot change), and a one-step matrix's keys."""
    properties: dict[str, Any] = schema["properties"]
    fixed = {*_FIXED_FIELDS, *_JINJA_FIELDS, *model.script_fields, "fallbacks"}  # a fallback's own keys: below
    for key in list(properties):
        if key not in fixed:
            properties[key] = _open(properties[key], defs, opened)
    for key in model.host_list_fields:  # a pool's name stands for its hosts (the loader puts them in)
        hosts = properties[key]
        outer = {name: hosts.pop(name) for name in ("description", "default") if name in hosts}
        properties[key] = {"anyOf": [hosts, {"type": "string", "description": "a pool's name: its hosts"}], **outer}
    override = {k: v for k, v in properties.items() if k not in _FALLBACK_FORBIDDEN}
    properties["fallbacks"]["items"] = {"type": "object", "additionalProperties": False, "properties": override}
    properties["matrix"] = _described({"$ref": "#/$defs/matrix"}, _MATRIX_KEY)
    properties["on_failure"] = _ON_FAILURE
    properties["placement"] = _PLACEMENT


_MATRIX_KEY = "makes the step a one-step matrix: one instance per combination of its axes' values"
_ON_FAILURE = {
    "enum": ["stop", "continue", None],
    "description": "what a failed cell does: `stop` the run (the default) or `continue` with the other cells",
}
_PLACEMENT = {
    "enum": ["spread", None],
    "description": "`spread`: each server configuration on one host of `hosts` (the one with the fewest so far)",
}


def _open(node: dict[str, Any], defs: dict[str, Any], opened: set[str]) -> dict[str, Any]:
    """`node`, and every value inside it, also accepting a `${{ }}` expression; a text takes one already."""
    _open_inside(node, defs, opened)
    if _takes_text(node):
        return node
    outer: dict[str, Any] = {key: node.pop(key) for key in ("description", "default") if key in node}
    expression = {"$ref": f"#/$defs/{EXPRESSION}"}
    if set(node) == {"anyOf"}:  # a union: one more alternative
        return {"anyOf": [*node["anyOf"], expression], **outer}
    return {"anyOf": [node, expression], **outer}


def _open_inside(node: dict[str, Any], defs: dict[str, Any], opened: set[str]) -> None:
    for key in ("properties", "patternProperties"):
        for name, value in node.get(key, {}).items():
            node[key][name] = _open(value, defs, opened)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            node[key] = _open(node[key], defs, opened)
    for key in ("anyOf", "oneOf", "allOf"):
        for alternative in node.get(key, []):
            _open_inside(alternative, defs, opened)
    name = _def_name(node) if "$ref" in node else None
    if name is not None and name not in opened:
        opened.add(name)
        _open_inside(defs[name], defs, opened)


def _takes_text(node: dict[str, Any]) -> bool:
    """Whether any text is valid here (a plain string, or a union with one)."""
    if node.get("type") == "string" and not {"pattern", "enum", "const", "minLength", "maxLength"} & set(node):
        return True
    return any(_takes_text(alternative) for alternative in node.get("anyOf", []))


def _step_schema(kind_defs: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "object",
        "description": "a step: `id`, `kind` and the kind's parameters (a `matrix:` makes it a one-step matrix)",
        "required": ["id", "kind"],
        "properties": {"kind": {"enum": list(kind_defs), "description": "the step kind"}},
        "dependentRequired": {key: ["matrix"] for key in _MATRIX_STEP_KEYS if key != "matrix"},
        "allOf": [
            {
                "if": {
                    "type": "object",
                    "properties": {"kind": {"const": kind, "description": "the step kind"}},
                    "required": ["kind"],
                },
                "then": {"$ref": f"#/$defs/{name}"},
            }
            for kind, name in kind_defs.items()
        ],
    }


def _group_schema(search: str) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "group": {
            "type": "string",
            "pattern": _GROUP_NAME.pattern,
            "description": "a name unique among step ids and groups",
        },
        "description": {"description": "what the group is for"},
        "matrix": _described({"$ref": "#/$defs/matrix"}, "the axes its steps expand over, a cell per combination"),
        "on_failure": _ON_FAILURE,
        "hosts": {
            "anyOf": [{"type": "array", "items": {"type": "string"}, "minItems": 1}, {"type": "string"}],
            "description": "the group's hosts (its steps inherit them): a list, `all` or a pool's name",
        },
        "placement": _PLACEMENT,
        "strategy": {
            "enum": ["grid", "search"],
            "description": "grid: every server configuration (default); search: judged from bounds (README, Search)",
        },
        "search": _described({"$ref": f"#/$defs/{search}"}, "the search's budget, measuring step, baseline, tolerance"),
        "steps": {
            "type": "array",
            "minItems": 1,
            "description": "consecutive steps expanded per cell of the matrix; none carries its own matrix",
            "items": {  # allOf, not keywords beside `$ref`: draft-07 (yaml-language-server's validation) ignores those
                "allOf": [
                    {"$ref": "#/$defs/step"},
                    {"not": {"anyOf": [{"required": [key]} for key in ("group", *_MATRIX_STEP_KEYS)]}},
                ]
            },
        },
    }
    assert set(properties) == _GROUP_KEYS, "the group's keys are the matrix loader's"
    return {
        "type": "object",
        "description": "a `group:` of consecutive steps expanded over a `matrix:`",
        "required": ["group", "matrix", "steps"],
        "additionalProperties": False,
        "properties": properties,
    }


_SCALAR = {"type": ["string", "number", "boolean"]}


def _matrix_schema() -> dict[str, Any]:
    named_value = {
        "type": "object",
        "required": ["name"],
        "propertyNames": {"pattern": _NAME.pattern},
        "properties": {"name": {"type": ["string", "number"], "description": "the value's text in cell ids"}},
        "additionalProperties": {"anyOf": [_SCALAR, {"type": "null"}, {"type": "array", "items": _SCALAR}]},
    }
    value = {"anyOf": [_SCALAR, named_value]}
    combination = {"type": "object", "minProperties": 1, "additionalProperties": value}
    return {
        "type": "object",
        "description": "named axes, each a list of values (scalars, or mappings with a `name`); a cell per "
        "combination, less `exclude:` (partial combinations), plus `include:` (full ones)",
        "minProperties": 1,
        "propertyNames": {"pattern": _NAME.pattern},
        "properties": {
            "exclude": {
                "type": ["array", "null"],
                "items": combination,
                "description": "combinations left out: each names some axes' values, and every cell matching it goes",
            },
            "include": {
                "type": ["array", "null"],
                "items": combination,
                "description": "combinations added back: each names a value of every axis",
            },
        },
        "additionalProperties": {"type": "array", "minItems": 1, "items": value},
    }
