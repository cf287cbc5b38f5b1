"""The first screen in a real browser (Debian chromium via playwright, a 1280x800 window): the
list in the window's top third with at least 15 rows on screen, no Streamlit toolbar items, one
sidebar width whichever way a stack was chosen, a result's answer before its figures, reproduce
commands without the server's paths, and a stand-in's ranking never shown as the Hub's. Each
test saves screenshots to test-artifacts/ (landing page, a FAIL, an ERROR)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
from browser_support import PAINTED, READY, TABLE, launch_chromium
from playwright.sync_api import Page, expect, sync_playwright
from viewer_support import NEW_CC, START, long_model, make_record, serve_viewer

from model_support.rankings import RankedModel, Ranking, save_snapshot
from model_support.store import ResultsStore
from model_support.viewer.app import SIDEBAR_PX

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
WIDTH, HEIGHT = 1280, 800
ROW_PX = 35
SELECTED = 20
"""Models in the long dataset's curated list: more than a window shows."""
STAND_IN = "http://127.0.0.1:9"
"""A stand-in Hub that stored a ranking with the dataset (as a test or a benchmark's would)."""


@contextmanager
def window() -> Iterator[Page]:
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            yield browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
        finally:
            browser.close()


def drawn(page: Page) -> None:
    """Wait until the page's script is done and every element painted."""
    page.wait_for_selector(READY, timeout=60_000)
    page.wait_for_function(PAINTED, timeout=60_000)


def table_on_screen(page: Page) -> tuple[float, int]:
    """The first table's top (pixels from the window's top) and its rows on screen."""
    page.wait_for_selector(TABLE, timeout=60_000)
    box = page.locator('[data-testid="stDataFrame"]').first.bounding_box()
    assert box is not None
    bottom = min(box["y"] + box["height"], HEIGHT)
    return box["y"], int((bottom - box["y"] - ROW_PX) // ROW_PX)  # less the header row


def sidebar_width(page: Page) -> float:
    box = page.locator('[data-testid="stSidebar"]').bounding_box()
    assert box is not None
    return box["width"]


def test_the_list_starts_in_the_top_third_with_fifteen_rows_and_no_toolbar_items(
    long_dataset: Path, tmp_path: Path
) -> None:
    """Landing (Selected) and All results (1,234 rows, a page at a time): the list starts in
    the window's top third, at least 15 of its rows on screen; Streamlit's own toolbar items
    (Deploy) are not shown. A ranking a stand-in Hub stored with the dataset names where it
    came from, never passing as the Hub's."""
    results = tmp_path / "results"
    shutil.copytree(long_dataset, results)
    (results / "selected.yaml").write_text(
        "".join(f"- model: {long_model(i)}\n  task: text-generation\n" for i in range(SELECTED))
    )
    ranked = [RankedModel(rank=i + 1, model_id=long_model(i), trending_score=1e6) for i in range(3)]
    fetched = datetime(2026, 11, 30, tzinfo=UTC)
    save_snapshot(
        str(results),
        Ranking(
            task="text-generation",
            sort="trending_score",
            endpoint=STAND_IN,
            fetched_at=fetched,
            models=ranked,
        ),
    )
    ARTIFACTS.mkdir(exist_ok=True)
    with serve_viewer(results, STAND_IN) as url, window() as page:
        for query in ("", "?view=all"):
            page.goto(f"{url}/{query}")
            drawn(page)
            top, rows = table_on_screen(page)
            assert top <= HEIGHT / 3, query
            assert rows >= 15, query
            if not query:
                page.screenshot(path=str(ARTIFACTS / "first-screen-landing.png"))
        expect(page.locator('[data-testid="stAppDeployButton"]')).to_have_count(0)
        expect(page.get_by_text("Deploy", exact=True)).to_have_count(0)
        page.goto(f"{url}/?view=trending&task=text-generation")
        drawn(page)
        said = page.locator('[data-testid="stAlert"]', has_text="stored with the dataset")
        expect(said).to_contain_text(f"{STAND_IN}, not the Hugging Face Hub")
        expect(said).to_contain_text("its models and scores are that server's")


def test_the_sidebar_is_as_wide_picked_as_linked(tmp_path: Path, dead_hub: str) -> None:
    """A Neuron compiler's version carries its build (``2.21.33363.0+82129205``): picked in the
    sidebar or named by a link, the sidebar is one width; the picker shows the version
    shortened, nothing clipped, and its help the whole name."""
    version = "2.21.33363.0+82129205"
    store = ResultsStore(str(tmp_path))
    for compiler in (version, NEW_CC):
        store.add(make_record("Qwen/Qwen3-0.6B", "text-generation", "PASS", compiler, START))
    store.materialize()
    with serve_viewer(tmp_path, dead_hub) as url, window() as page:
        page.goto(f"{url}/?view=all")
        drawn(page)
        widths = [sidebar_width(page)]
        picker = page.get_by_role("combobox", name="Compiler version")
        picker.click()
        page.get_by_role("option", name="neuronx-cc 2.21.33363.0+").click()
        page.wait_for_url(f"**compiler={version.replace('+', '%2B')}**", timeout=30_000)
        drawn(page)
        widths.append(sidebar_width(page))  # picked
        page.goto(f"{url}/?view=all&compiler={version.replace('+', '%2B')}")
        drawn(page)
        widths.append(sidebar_width(page))  # linked
        assert widths == [SIDEBAR_PX] * 3
        shown = picker.input_value()
        assert shown.startswith("neuronx-cc 2.21.33363.0+") and shown.endswith("…")
        clipped = page.evaluate(
            """() => [...document.querySelectorAll('[data-testid="stSidebar"] input')]
                .filter(e => e.scrollWidth > e.clientWidth).length"""
        )
        assert clipped == 0
        page.locator('[data-testid="stSidebar"] [data-testid="stTooltipIcon"]').first.hover()
        expect(page.get_by_text(f"neuronx-cc {version}")).to_be_visible(timeout=30_000)


def _top(page: Page, selector: str, text: str) -> float:
    box = page.locator(selector, has_text=text).first.bounding_box()
    assert box is not None, text
    return box["y"]


@pytest.mark.slow  # two pages, each waited for to its last element (10 s on 2 busy cores)
def test_a_fail_and_an_error_answer_before_their_figures(
    explained_dataset: Path, dead_hub: str
) -> None:
    """Opened from a link, a result's details show, in the window, the answer under the name
    and above every figure; an ERROR's message right under its sentence. The reproduce
    command names no path of the server's, and shows the docker run line."""
    ARTIFACTS.mkdir(exist_ok=True)
    with serve_viewer(explained_dataset, dead_hub) as url, window() as page:
        page.goto(f"{url}/?view=all&model=org/fails")
        drawn(page)
        name = _top(page, '[data-testid="stHeading"] h3', "org/fails")
        answer = _top(page, '[data-testid="stMarkdownContainer"]', "The output diverges")
        figure = _top(page, '[data-testid="stMetric"]', "cores")
        assert 0 <= name < answer < figure
        assert answer < HEIGHT  # on screen, where the details were scrolled to
        page.screenshot(path=str(ARTIFACTS / "first-screen-fail.png"))
        reproduce = page.locator('[data-testid="stCode"]', has_text="model-support reproduce")
        reproduce.first.scroll_into_view_if_needed()
        command = reproduce.first.inner_text()
        assert "--results RESULTS -o reproduce" in command and "docker run" in command
        assert str(explained_dataset) not in command
        page.goto(f"{url}/?view=all&model=org/errors")
        drawn(page)
        answer = _top(page, '[data-testid="stMarkdownContainer"]', "The compile stage failed")
        message = _top(page, '[data-testid="stCode"]', "neuronx-cc failed: SBUF overflow")
        figure = _top(page, '[data-testid="stMetric"]', "time until it failed")
        assert answer < message < figure < HEIGHT
        expect(page.locator('[data-testid="stMetric"]', has_text="decode")).to_have_count(0)
        page.screenshot(path=str(ARTIFACTS / "first-screen-error.png"))
