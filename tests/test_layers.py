"""The import layers of executor/ and steps/ (issue 28, item 9): no import circle, and no module importing a
layer above its own, counting every import: at the top of a module, inside a function (a lazy import that
closes a circle is still one), under `if TYPE_CHECKING:`, and `importlib.import_module("a.literal")`.

LAYERS is the table, lowest first; each module of executor/ and steps/ is in exactly one layer, named by its
dotted name (a trailing `.*`: every module below a package). A new module goes into the table, where its
imports say it belongs. The names are the modules' dotted names, so that moving a module into a room (issue
28, item 10: `executor.X` rewritten as `executor.runbook.X` everywhere) keeps the table true.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("executor", "steps")

#: Lowest first. A module may import its own layer and those below it, never one above.
LAYERS: list[tuple[str, list[str]]] = [
    # what everything stands on: errors, text and consoles made safe to show, secrets' masking, the quoting-safe
    # wrapper, JSON, files, durable writes, the debug log, a command's result, the host programs'
    # contract, the documents agents read (report.json's shape)
    (
        "ground",
        [
            "executor.errors",
            "executor.terminal",
            "executor.consoles",
            "executor.redact",
            "executor.render",
            "executor.strict_json",
            "executor.files",
            "executor.durable",
            "executor.diagnostics",
            "executor.command_result",
            "executor.hostprogram",
            "executor.documents",
        ],
    ),
    # the runbook's words: its typed model, durations, gate expressions, what a matrix expands to
    (
        "language",
        [
            "executor.runbook.model",
            "executor.runbook.durations",
            "executor.runbook.gates",
            "executor.runbook.search",
            "executor.runbook.campaign",
        ],
    ),
    # the transports: one interface, ssh (with its runner), local, and the scripted one
    ("transport", ["executor.transport", "executor.transport.*"]),
    # what a step kind builds on, and the kinds
    ("kinds", ["executor.stepkind", "steps", "steps.*"]),
    # reading, checking and planning a runbook
    (
        "runbook",
        [
            "executor.runbook.loader",
            "executor.runbook.matrix",
            "executor.runbook.references",
            "executor.runbook.schema",
            "executor.runbook.cells",
            "executor.runbook.placement",
            "executor.runbook.planner",
            "executor.runbook.plan_summary",
        ],
    ),
    # a run: the engine and its pieces, resume, the run folder's state, audit log, seal and events
    (
        "run",
        [
            "executor.run.engine",
            "executor.run.run_options",
            "executor.run.run_folder",
            "executor.run.scheduler",
            "executor.run.searching",
            "executor.run.attempts",
            "executor.run.resume",
            "executor.run.state",
            "executor.run.audit",
            "executor.run.seal",
            "executor.run.events",
            "executor.run.event_models",
            "executor.run.emitter",
        ],
    ),
    # what people and agents use: the CLI, the MCP server, the views they answer with; the package's API; the
    # pytest fixture that runs a runbook offline
    (
        "faces",
        [
            "executor.faces.cli",
            "executor.faces.mcp_server",
            "executor.faces.views",
            "executor.faces.report_csv",
            "executor.faces.compare",
            "executor.faces.compare_figure",
            "executor.faces.inputs",
            "executor.faces.campaign_overlay",
            "executor.faces.testing",
            "executor",
        ],
    ),
]


def modules(root: Path) -> dict[str, Path]:
    """Each module of executor/ and steps/ by its dotted name (a package by its own, from __init__.py; a room's
    package that holds only its docstring is no module to place: it imports nothing and nothing imports it)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
                body = ast.parse(path.read_text(encoding="utf-8")).body
                if len(parts) > 1 and all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body):
                    continue
            found[".".join(parts)] = path
    return found


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every dotted name the module imports, wherever the import statement is (module level, a function,
    `if TYPE_CHECKING:`), and each `importlib.import_module` of a literal name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, base] if base else here)
            yield from (f"{base}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of executor/ and steps/ it imports. `from executor import durable` is an import
    of executor.durable, not of the package; `from executor.errors import X` of executor.errors."""
    found = modules(root)
    graph: dict[str, set[str]] = {}
    for module, path in found.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        targets = set()
        for name in _imported_names(tree, module, path.name == "__init__.py"):
            while name and name not in found:  # a name of a module (`executor.errors.X`: executor.errors)
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def layer_of(module: str, layers: Sequence[tuple[str, list[str]]]) -> list[int]:
    """The places in `layers` of each layer that names `module` (one, where the table is right)."""
    return [i for i, (_, names) in enumerate(layers) if any(fnmatch.fnmatchcase(module, n) for n in names)]


def upward(graph: Mapping[str, set[str]], layers: Sequence[tuple[str, list[str]]]) -> list[str]:
    """Each import of a module in a higher layer than the importer's, as `importer (layer) -> imported (layer)`."""
    found = []
    for module, targets in sorted(graph.items()):
        own = min(layer_of(module, layers), default=None)
        for target in sorted(targets):
            theirs = max(layer_of(target, layers), default=None)
            if own is not None and theirs is not None and theirs > own:
                found.append(f"{module} ({layers[own][0]}) -> {target} ({layers[theirs][0]})")
    return found


def test_every_module_is_in_exactly_one_layer() -> None:
    placed = {module: layer_of(module, LAYERS) for module in modules(ROOT)}
    assert {m: [LAYERS[i][0] for i in at] for m, at in placed.items() if len(at) != 1} == {}, (
        "each module of executor/ and steps/ goes into one layer of LAYERS (tests/test_layers.py)"
    )


@functools.cache
def _graph() -> dict[str, set[str]]:
    return import_graph(ROOT)


def test_no_import_circle() -> None:
    assert circles(_graph()) == []


def test_no_module_imports_a_higher_layer() -> None:
    assert upward(_graph(), LAYERS) == []


def test_a_lazy_or_type_checking_import_is_counted(tmp_path: Path) -> None:
    """The checks themselves: an import inside a function closes a circle, one under TYPE_CHECKING climbs a
    layer, `importlib.import_module` of a literal counts, and a relative import resolves."""
    (tmp_path / "executor" / "sub").mkdir(parents=True)
    (tmp_path / "steps").mkdir()
    files = {
        "executor/__init__.py": "",
        "executor/low.py": "def f():\n    from executor import high\n",
        "executor/high.py": "import executor.low\n",
        "executor/sub/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..high import X\n",
        "executor/plugin.py": "import importlib\nimportlib.import_module('steps.kind')\n",
        "steps/__init__.py": "",
        "steps/kind.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path)
    assert circles(graph) == [["executor.high", "executor.low"]]
    assert graph["executor.plugin"] == {"steps.kind"}
    layers = [
        ("low", ["executor.low", "executor.sub", "executor.plugin", "steps", "steps.*"]),
        ("high", ["executor.high"]),
    ]
    assert layer_of("steps.kind", layers) == [0]
    assert upward(graph, layers) == [
        "executor.low (low) -> executor.high (high)",
        "executor.sub (low) -> executor.high (high)",
    ]


def test_the_readme_names_each_layers_modules_in_order() -> None:
    """README's "Layout" says the layers in words: each module of this table is named there (`steps/` for the
    kinds; the transports and the package's API in words), every one of a layer before any of the next."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("The imports go one way, in layers")
    paragraph = readme[start : readme.index("A module imports its own layer", start)]
    spans: list[tuple[int, int]] = []
    for _layer, names in LAYERS:
        shown = {"steps": "steps/"} | {name: name.rpartition(".")[2] for name in names if name.startswith("executor.")}
        words = [shown[name] for name in names if name in shown and not name.startswith("executor.transport")]
        missing = [word for word in words if f"`{word}`" not in paragraph]
        assert not missing, f"README's layers paragraph does not name {missing}"
        where = [paragraph.index(f"`{word}`") for word in words]
        spans += [(min(where), max(where))] if where else []  # the transports' layer: in words only
    assert all(before[1] < after[0] for before, after in itertools.pairwise(spans)), spans


def test_the_readme_layout_names_every_module() -> None:
    """README's "Layout" names each module of executor/ and steps/ (a step kind's module: as one of "one module per
    step kind"), so that a module split off or added is said where a reader looks for it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout") : readme.index("The imports go one way, in layers")]
    unnamed = [
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))  # the rooms' modules too: drawn, not in backticks
        if path.name != "__init__.py"
        and not re.search(rf"(?<![\w.]){re.escape(path.name)}(?!\w)", layout)
        and 'kind: Literal["' not in path.read_text(encoding="utf-8")
    ]
    assert unnamed == []
