"""Text that came from a run is shown as text: never Markdown, never HTML (AppTest)."""

from __future__ import annotations

from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest
from viewer_support import (
    HOSTILE_COMPILER,
    HOSTILE_ERROR,
    HOSTILE_ERROR_MODEL,
    HOSTILE_MODEL,
    HOSTILE_PROMPT,
    HOSTILE_REASON,
    HOSTILE_TEXT,
    viewer_page,
)

from model_support.markdown import inline_code, literal

MARKDOWN_ELEMENTS = {
    "markdown", "caption", "title", "header", "subheader", "info", "warning", "error", "success",
}  # fmt: skip
LITERAL_ELEMENTS = {"text", "code", "json"}
NASTY = [
    HOSTILE_MODEL, HOSTILE_REASON, HOSTILE_ERROR, HOSTILE_TEXT, HOSTILE_PROMPT, HOSTILE_COMPILER,
    "a\\*b\\*", "`tick` ``two``", "1. list\n- item\n> quote\n    indented", "<!-- comment -->",
    "&lt;&#65;", "[ref]: http://x", "![img](x.png)", "~~strike~~ | a | b |", "",
]  # fmt: skip


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def rendered(source: str) -> tuple[str, list[str]]:
    """Markdown as a CommonMark renderer shows it (raw HTML allowed): its text and its tags."""
    parser = _Text()
    parser.feed(MarkdownIt("commonmark").render(source))
    return " ".join("".join(parser.parts).split()), parser.tags


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("value", NASTY)
def test_escaped_values_render_as_exactly_their_text(value: str) -> None:
    text, tags = rendered(literal(value))
    assert text == one_line(value)
    assert tags in ([], ["p"])
    code_text, code_tags = rendered(inline_code(value))
    assert code_text == one_line(value)
    assert code_tags in ([], ["p", "code"])


def walk(node: Any) -> Iterator[Any]:
    yield node
    for child in (getattr(node, "children", None) or {}).values():
        yield from walk(child)


def page_text(at: AppTest) -> tuple[list[str], list[str]]:
    """(Markdown sources, literal texts) of everything on the page, labels included."""
    markdown, plain = [], []
    for node in walk(at._tree):
        kind = getattr(node, "type", None)
        if kind in MARKDOWN_ELEMENTS:
            markdown.append(node.value)
        elif kind in LITERAL_ELEMENTS:
            plain.append(node.value)
        elif kind == "dataframe":
            plain += [str(v) for v in node.value.to_numpy().ravel() if not pd.isna(v)]
        label = getattr(node, "label", None)
        if isinstance(label, str):
            markdown.append(label)  # widget and expander labels are Markdown too
        plain += [str(o) for o in getattr(node, "options", None) or []]
    return markdown, plain


@pytest.fixture
def hostile_page(hostile_dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str) -> AppTest:
    return viewer_page(hostile_dataset, monkeypatch, dead_hub)


def assert_literal_everywhere(at: AppTest, shown: dict[str, str]) -> None:
    """Each value of ``shown`` is on the page as its exact text; no Markdown holds it raw."""
    assert not at.exception, at.exception
    markdown, plain = page_text(at)
    texts = [rendered(source)[0] for source in markdown]
    for where, value in shown.items():
        if where == "markdown":
            assert any(one_line(value) in text for text in texts), value
        else:
            assert any(value in text for text in plain), value
    for source in markdown:
        for value in shown.values():
            # Unescaped, these would turn into links, emphasis, HTML, headings or directives.
            assert value not in source, f"{value!r} reached Markdown unescaped in {source!r}"


def test_a_failed_models_details_show_run_values_literally(hostile_page: AppTest) -> None:
    hostile_page.query_params.update(view="all", model=HOSTILE_MODEL)
    hostile_page.run()
    assert_literal_everywhere(
        hostile_page,
        {
            "markdown": HOSTILE_REASON,  # the verification reason, in a sentence
            "table": HOSTILE_MODEL,  # the table cell and the details heading
            "text": HOSTILE_TEXT,  # the generated text
            "compiler": HOSTILE_COMPILER,  # selector option; "no compile cache" sentence
        },
    )
    markdown, _ = page_text(hostile_page)
    texts = [rendered(source)[0] for source in markdown]
    assert one_line(HOSTILE_MODEL) in texts  # the details heading
    assert any(repr(HOSTILE_PROMPT) in text for text in texts)  # the prompt, as a literal
    assert any(f"compiler: {HOSTILE_COMPILER}" in text for text in texts)


def test_an_error_message_is_shown_verbatim(hostile_page: AppTest) -> None:
    hostile_page.query_params.update(view="triage", model=HOSTILE_ERROR_MODEL)
    hostile_page.run()
    assert_literal_everywhere(
        hostile_page,
        {"code": HOSTILE_ERROR, "table": HOSTILE_ERROR_MODEL, "markdown": HOSTILE_ERROR_MODEL},
    )


def test_a_model_missing_from_the_stack_is_named_literally(hostile_page: AppTest) -> None:
    missing = "nobody/[here](javascript:alert(1)) **x**"
    hostile_page.query_params.update(view="all", model=missing)
    hostile_page.run()
    assert any("has no result" in i.value for i in hostile_page.info)
    assert_literal_everywhere(hostile_page, {"markdown": missing})
