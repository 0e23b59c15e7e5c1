"""report.md is inert: host text (a failure's reason, a stderr line, a model name, a version, a value) reaches
it through one escape (steps/benchmark_report.py `md_text`), and a real Markdown parser (markdown-it-py,
CommonMark with GitHub's tables and strikethrough) renders no tag, link, image, code or block from it: each
piece of host text renders as itself, in its own cell, note or heading."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from markdown_it.token import Token

from executor.terminal import shown
from steps.benchmark_figures import write_report
from steps.benchmark_report import Document, build_report, markdown
from tests.steps.test_benchmark_report import ACCEPTANCE, BASELINE, DFLASH, PROVENANCE
from tests.steps.test_campaign_report import host_views, write_campaign

HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "[x](javascript:alert(1))",
    "![](http://example.com/a.png)",
    "<script>alert(1)</script>",
    "<http://example.com>",
    "http://example.com www.example.com a@example.com",
    "&lt;b&gt; &#60;i&#62;",
    "a | b",
    "line\nbreak\r\n- item",
    "`code` ``x``",
    "*em* __strong__ ~~gone~~",
    "\\[x\\](y) \\",
    "- - -",
    "--",
    "1. one",
    "> quote",
    "# heading #",
    "    indented",
    "x\x1b]52;c;aGk=\x07\u202e",
    ":octocat: $\\href{javascript:x}{y}$ 12:30:45",
]
hostile_text = (
    st.lists(st.sampled_from(HOSTILE) | st.text(max_size=6), max_size=5)
    .map("".join)
    .filter(lambda text: as_shown(text) != "")
)
#: What the writer's own structure may produce; anything else (a, img, code, em, html, ...) came from text.
STRUCTURE = {"heading", "paragraph", "bullet_list", "list_item", "table", "thead", "tbody", "tr", "th", "td"}
OOM = "torch.OutOfMemoryError: CUDA out of memory"  # the reason host_views gives a failed cell
PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])


def rendered_texts(page: str, figures: int) -> list[str]:
    """The text of every inline piece of `page` (each heading, note, cell), asserting that the page holds only
    the writer's structure and its `figures` images, and that every piece renders as plain text."""
    texts, images = [], 0
    for token in PARSER.parse(page):
        if token.type != "inline":
            assert token.type.removesuffix("_open").removesuffix("_close") in STRUCTURE, token
            continue
        children: list[Token] = token.children or []
        if children and children[0].type == "image":
            images += 1
            continue
        assert all(child.type in ("text", "text_special") for child in children), children
        texts.append("".join(child.content for child in children))
    assert images == figures
    return texts


def as_shown(text: str) -> str:
    """What a reader must see of host text: on one line, its control characters escaped, stripped."""
    return shown(" ".join(text.splitlines()), keep="").strip()


@settings(max_examples=60, deadline=None)
@given(text=hostile_text)
@example(text="--")  # a note's own `- ` made it a rule: `- --`
def test_host_text_in_any_cell_note_or_title_renders_as_itself(text: str) -> None:
    report = build_report(BASELINE, DFLASH, PROVENANCE)
    tables = [replace(t, title=text, rows=[[text] * len(t.columns)] * 2) for t in report.tables]
    hostile = Document.model_validate(report.model_dump() | {"title": text, "notes": [text, text], "tables": tables})
    texts = rendered_texts(markdown(hostile), len(report.figures))
    columns = [c for t in report.tables for c in t.columns]  # the writer's own
    pieces = 1 + 2 + len(tables) + 2 * len(columns)  # the title, the notes, per table its title and two rows
    assert sorted(texts) == sorted([as_shown(text)] * pieces + columns)


def test_a_failed_cell_and_a_served_version_of_a_campaign_report_render_inert(tmp_path: Path) -> None:
    said = "<img src=x onerror=alert(1)> [x](javascript:alert(1)) ![](http://e.example/a.png) | `x`\n<script>"
    views = [replace(v, message=v.message.replace(OOM, said)) if v.message else v for v in host_views()]
    assert write_campaign(tmp_path, views).failed["dflash[drafter=zlab,tokens=ddtree-64]"].endswith(said)
    page = (tmp_path / "report.md").read_text()
    texts = rendered_texts(page, 3)
    assert any(as_shown(said) in text for text in texts)


#: Words matplotlib would read as mathtext ($...$): a syntax error, an unknown symbol, a nesting past recursion.
TEX = ["$x^$", "$\\frac$", "a $\\foo{$ b", "$" + "{" * 500 + "$"]


def test_host_and_runbook_text_in_every_figure_is_drawn_as_written(tmp_path: Path) -> None:
    sets = {name: ACCEPTANCE.sets["math"] for name in TEX}
    acceptance = ACCEPTANCE.model_copy(update={"sets": sets, "lossless": None})
    baseline, candidate = (BASELINE.model_copy(update={"label": TEX[0]}), DFLASH.model_copy(update={"label": TEX[1]}))
    report, _ = write_report(tmp_path, baseline, candidate, PROVENANCE, acceptance)
    for figure in report.figures:
        assert (tmp_path / figure.path).read_bytes().startswith(b"\x89PNG")
