"""One real browser (Debian chromium via playwright) against `streamlit run` on a test dataset."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest
from browser_support import READY, TABLE, click_row, launch_chromium
from playwright.sync_api import Page, expect, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from viewer_support import (
    HOSTILE_MODEL,
    HOSTILE_REASON,
    HOSTILE_TEXT,
    LONG_ROWS,
    long_model,
    serve_viewer,
)

from model_support.store import ResultsStore
from model_support.viewer.scroll import DETAILS_ANCHOR
from model_support.viewer.table_pages import PAGE_ROWS
from model_support.viewer.views import GLYPH_PX, GRID_FONT, text_px

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture
def server(dataset: Path, dead_hub: str) -> Iterator[str]:
    with serve_viewer(dataset, dead_hub) as url:
        yield url


@contextmanager
def browser_page(width: int = 1400, height: int = 1800) -> Iterator[Page]:
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


def wait_ready(page: Page) -> None:
    page.wait_for_selector(TABLE, timeout=60_000)
    page.wait_for_selector(READY, timeout=60_000)


ROW_COUNTED = '[data-testid="stDataFrame"] [aria-rowcount]'
"""The first table's grid, whose aria-rowcount counts its rows and the header row."""


def expect_rows(page: Page, rows: int) -> None:
    """The first table comes to hold ``rows`` rows. Waited for, not read once: the page
    reruns when it writes its stack selectors into the URL, and once, beside a CPU-heavy run
    of the suite, a read right after the page said ready found 1 row of the history's 3."""
    try:
        page.wait_for_function(
            f"() => document.querySelector('{ROW_COUNTED}')?.getAttribute('aria-rowcount') "
            f"=== '{rows + 1}'",
            timeout=30_000,
        )
    except PlaywrightTimeout:
        raise AssertionError(f"the table holds {row_count(page)} rows, not {rows}") from None


def row_count(page: Page) -> int:
    """Rows in the first table (the grid's aria-rowcount counts the header row too)."""
    return int(page.locator(ROW_COUNTED).first.get_attribute("aria-rowcount") or 0) - 1


def test_page_search_details_and_screenshot(server: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with browser_page() as page:
        page.goto(f"{server}/?view=all")
        wait_ready(page)
        expect_rows(page, 7)
        search = page.get_by_label("Search models")
        search.fill("qwen")
        search.press("Enter")
        expect_rows(page, 2)  # the two Qwen models
        wait_ready(page)
        expect_rows(page, 2)  # and still once the page says ready
        assert "q=qwen" in page.url  # the state is written back into the URL
        page.goto(f"{server}/?view=all&q=qwen&model=Qwen/Qwen3-1.7B")
        wait_ready(page)
        page.get_by_text("BEGIN MODEL-SUPPORT CONFIG").first.wait_for(  # run.py's config block
            timeout=30_000
        )
        # The script's end is no promise that every element is drawn yet (the code blocks'
        # highlighter is a chunk the browser loads on demand): wait for it, as a reader would.
        page.get_by_text("python3 run.py").first.wait_for(timeout=30_000)
        page.get_by_text("Download run.py").first.wait_for()
        page.screenshot(path=str(ARTIFACTS / "viewer.png"), full_page=True)
    assert (ARTIFACTS / "viewer.png").stat().st_size > 10_000


OVERFLOW = """() => [document.documentElement, document.querySelector('[data-testid="stMain"]')]
    .filter(e => e && e.scrollWidth > e.clientWidth).length"""
"""How many of the page and its main column are wider than the window (a sideways scroll)."""
CUT = """() => [...document.querySelectorAll(
        '[data-testid="stMain"] *, [data-testid="stSidebar"] *')]
    .filter(e => (getComputedStyle(e).textOverflow === 'ellipsis' || e.tagName === 'INPUT')
        && e.scrollWidth > e.clientWidth)
    .map(e => e.value || e.textContent)"""
"""The texts the page cuts (with an ellipsis: a metric's value too wide for its column; a picker's
value clipped: a stack's version too wide for the sidebar)."""
LIST_OVERFLOW = """() => [...document.querySelectorAll('[data-testid="stDataFrame"] .dvn-scroller')]
    .map(e => e.scrollWidth - e.clientWidth)"""
"""How many pixels each table is wider than its frame (a list that scrolls sideways)."""


@pytest.mark.parametrize(
    "query",
    ["view=all&model=Qwen/Qwen3-1.7B", "view=selected", "view=history&model=Qwen/Qwen3-0.6B"],
)
def test_nothing_is_cut_off_in_a_1280_pixel_window(server: str, query: str) -> None:
    """At 1280 pixels the page fits the window: lists, details and run.py included, the sidebar's
    stack versions whole, the All results list without a sideways scroll (a list wider than its
    frame, e.g. with a long exclusion reason, scrolls inside it, under its pinned model column)."""
    ARTIFACTS.mkdir(exist_ok=True)
    with browser_page(1280, 800) as page:
        page.goto(f"{server}/?{query}")
        wait_ready(page)
        if "model=" in query and "history" not in query:
            page.get_by_text("BEGIN MODEL-SUPPORT CONFIG").first.wait_for(timeout=30_000)
        assert page.evaluate(OVERFLOW) == 0
        assert page.evaluate(CUT) == []
        if query.startswith("view=all"):
            # All results: eleven columns of real model names, whole, without a sideways scroll.
            assert page.evaluate(LIST_OVERFLOW)[0] <= 0
        name = query.split("&")[0].removeprefix("view=")
        page.screenshot(path=str(ARTIFACTS / f"viewer-1280-{name}.png"), full_page=True)


def test_text_columns_are_sized_in_the_grids_own_font(server: str) -> None:
    """The glyph widths a text column is sized by are the browser's, in the grid's font (a
    Streamlit that changed its font would cut names or waste the width)."""
    with browser_page(1280, 800) as page:
        page.goto(f"{server}/?view=all")
        wait_ready(page)
        measured = page.evaluate(
            """(font) => { const c = document.createElement('canvas').getContext('2d');
            c.font = font; const w = {};
            for (let i = 32; i < 127; i++) w[String.fromCharCode(i)] =
                c.measureText(String.fromCharCode(i)).width;
            w.model = c.measureText('mistralai/Mistral-7B-v0.3').width; return w; }""",
            GRID_FONT,
        )
        grid_font = page.evaluate(
            "() => getComputedStyle(document.querySelector('[data-testid=\"stApp\"]')).fontFamily"
        )
    assert "Source Sans" in grid_font and "Source Sans" in GRID_FONT
    for glyph, px in GLYPH_PX.items():
        assert 0 <= px - measured[glyph] < 0.1, glyph
    # A name's width is its glyphs' at most (kerning takes a little off), and not much more.
    assert 0 <= text_px("mistralai/Mistral-7B-v0.3") - measured["model"] < 0.03 * measured["model"]


def test_run_values_render_as_text_in_the_browser(hostile_dataset: Path, dead_hub: str) -> None:
    """Streamlit's own Markdown renderer shows escaped run values as exactly their text."""
    with serve_viewer(hostile_dataset, dead_hub) as url, browser_page() as page:
        page.goto(f"{url}/?view=all&model={quote(HOSTILE_MODEL, safe='')}")
        wait_ready(page)
        reason = page.get_by_text(HOSTILE_REASON, exact=True)
        reason.wait_for(timeout=30_000)
        heading = page.locator('[data-testid="stHeading"]').get_by_text(HOSTILE_MODEL, exact=True)
        heading.wait_for(timeout=30_000)  # the details' heading shows the name as its text
        expect(page.get_by_text(HOSTILE_TEXT, exact=True)).to_have_count(1, timeout=30_000)
        markdown = page.locator('[data-testid="stMarkdownContainer"]')
        assert markdown.locator('a[href^="javascript"]').count() == 0
        assert markdown.locator("script, img").count() == 0
        assert markdown.locator("strong", has_text="bold").count() == 0


def test_history_and_regressions_views_in_the_browser(server: str) -> None:
    """The new views render in a real browser: a model's runs with a flip and a chart, and the
    regressions between the two newest stacks with their reproduce commands."""
    ARTIFACTS.mkdir(exist_ok=True)
    with browser_page() as page:
        page.goto(f"{server}/?view=history&model=Qwen/Qwen3-0.6B")
        wait_ready(page)
        expect_rows(page, 3)  # two runs on the newer stack, one on the older
        page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "viewer-history.png"), full_page=True)
        page.goto(f"{server}/?view=regressions")
        wait_ready(page)
        expect_rows(page, 2)  # Qwen3-1.7B (ERROR compile) and llava (TIMEOUT)
        page.get_by_text("The report for a bug report (Markdown, JSON)").first.click()
        page.get_by_text("Download the report (Markdown)").first.wait_for(timeout=30_000)
        page.get_by_text("### ERROR compile (1)").first.wait_for(timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "viewer-regressions.png"), full_page=True)
    assert (ARTIFACTS / "viewer-regressions.png").stat().st_size > 10_000


def test_back_returns_to_the_previous_view_and_the_title_names_the_model(server: str) -> None:
    """Each change of view or model is a browser history entry (Back restores it), and a model's
    details name the tab."""
    with browser_page() as page:
        page.goto(f"{server}/?view=all&model=Qwen/Qwen3-1.7B")
        wait_ready(page)
        page.wait_for_function("() => document.title.startsWith('Qwen/Qwen3-1.7B')", timeout=30_000)
        page.get_by_text("Triage", exact=True).first.click()
        page.wait_for_url("**view=triage**", timeout=30_000)
        wait_ready(page)
        page.go_back()
        page.wait_for_url("**view=all**", timeout=30_000)
        wait_ready(page)
        checked = page.locator('[data-testid="stRadio"] input:checked')
        page.wait_for_function(
            "() => document.querySelector('[data-testid=\"stRadio\"] input:checked')"
            "?.closest('label')?.innerText.includes('All results')",
            timeout=30_000,
        )
        assert checked.count() == 1
        assert "view=all" in page.url and "model=Qwen" in page.url  # not overwritten again
        # The details (which name the tab) come after the list in the page's run: the title
        # follows once they are drawn, a moment after the view's radio.
        page.wait_for_function("() => document.title.startsWith('Qwen/Qwen3-1.7B')", timeout=30_000)


HIGHLIGHTED = """() => Array.from(document.querySelectorAll(
    '[data-testid="stDataFrame"]')[0]?.querySelectorAll('tbody tr[aria-selected="true"]') ?? []
).map(row => row.querySelector('td')?.innerText)"""
"""The first column of the first table's highlighted rows (the grid's accessible table)."""


def wait_highlighted(page: Page, models: list[str]) -> None:
    """Wait until the first table's highlighted rows are exactly ``models``' rows."""
    page.wait_for_function(
        f"wanted => JSON.stringify(({HIGHLIGHTED})()) === JSON.stringify(wanted)",
        arg=models,
        timeout=30_000,
    )


def page_heading(text: str) -> str:
    """A selector of the page's headings with exactly ``text`` (a model's details)."""
    return f'[data-testid="stHeading"] h3:has-text("{text}")'


DETAILS_TOP = f"""() => document.getElementById("{DETAILS_ANCHOR}")?.getBoundingClientRect().top"""
"""Where the details' heading is in the window (pixels from its top; None when not drawn)."""


def wait_details_in_view(page: Page) -> None:
    """Wait until the details' heading is in the top part of the window."""
    page.wait_for_function(
        f"() => {{ const top = ({DETAILS_TOP})(); return top >= 0 && top < 200; }}", timeout=30_000
    )


def test_a_click_or_a_link_shows_the_details_where_the_reader_looks(server: str) -> None:
    """In a 1280x480 window the details start below the fold; a row's click brings them up,
    and so does a shared link on arrival."""
    with browser_page(1280, 480) as page:
        page.goto(f"{server}/?view=all")
        wait_ready(page)
        assert page.evaluate(DETAILS_TOP) > 480  # below the fold before any click
        click_row(page, 2)
        page.locator(page_heading("deepseek-ai/DeepSeek-V3")).wait_for(timeout=30_000)
        wait_ready(page)
        wait_details_in_view(page)
        page.goto(f"{server}/?view=selected&model=Qwen/Qwen3-0.6B")
        page.locator(page_heading("Qwen/Qwen3-0.6B")).wait_for(timeout=30_000)
        wait_ready(page)
        wait_details_in_view(page)


def test_back_after_a_row_click_leaves_the_row_highlighted_as_the_url_says(server: str) -> None:
    """A clicked row opens its details and stays highlighted; Back (no model in the URL) leaves
    no row highlighted and no details; Forward highlights it again; a link's model is
    highlighted on arrival."""
    model = "deepseek-ai/DeepSeek-V3"  # the table's third row (sorted by model id)
    details = page_heading(model)
    with browser_page() as page:
        page.goto(f"{server}/?view=all")
        wait_ready(page)
        wait_highlighted(page, [])
        click_row(page, 2)
        page.wait_for_url("**model=deepseek-ai%2FDeepSeek-V3**", timeout=30_000)
        page.locator(details).wait_for(timeout=30_000)
        wait_ready(page)
        wait_highlighted(page, [model])
        page.go_back()
        page.wait_for_url(lambda url: "model=" not in url, timeout=30_000)
        wait_ready(page)
        wait_highlighted(page, [])
        expect(page.locator(details)).to_have_count(0, timeout=30_000)  # no details either
        page.go_forward()
        page.wait_for_url("**model=deepseek-ai%2FDeepSeek-V3**", timeout=30_000)
        page.locator(details).wait_for(timeout=30_000)
        wait_highlighted(page, [model])
        click_row(page, 0)  # another row, after Back and Forward
        page.wait_for_url("**model=Qwen%2FQwen3-0.6B**", timeout=30_000)
        page.locator(page_heading("Qwen/Qwen3-0.6B")).wait_for(timeout=30_000)
        wait_highlighted(page, ["Qwen/Qwen3-0.6B"])
        page.goto(f"{server}/?view=all&model=meta-llama/Llama-3.2-1B")  # a link
        wait_ready(page)
        wait_highlighted(page, ["meta-llama/Llama-3.2-1B"])


def test_a_clicked_regression_opens_its_two_runs_side_by_side(server: str) -> None:
    """A click on a Regressions row shows that change's runs of the two compared stacks."""
    older = "neuronx-cc 2.27.100.0 · transformers 5.24.0"
    newer = "neuronx-cc 2.28.7631.0 · transformers 5.24.0"
    with browser_page() as page:
        page.goto(f"{server}/?view=regressions")
        wait_ready(page)
        table = page.locator('[data-testid="stDataFrame"]').first.locator("tbody tr")
        first = table.first.inner_text()
        assert "Qwen/Qwen3-1.7B" in first and "ERROR" in first
        after_run = first.split("model-support reproduce ")[1].split()[0]
        click_row(page, 0)
        before = page.locator('[data-testid="stColumn"]', has_text=f"Before: {older}")
        after = page.locator('[data-testid="stColumn"]', has_text=f"After: {newer}")
        before.wait_for(timeout=30_000)
        after.wait_for(timeout=30_000)
        wait_ready(page)
        # Each waits until the column shows it (what is drawn may lag the script's end).
        expect(after).to_contain_text("error class compile", timeout=30_000)
        expect(after).to_contain_text("exceeds SBUF")  # the newer stack's error
        expect(after).to_contain_text(f"run {after_run}")  # the clicked change's, not another's
        expect(before).to_contain_text("PASS")
        before_text, after_text = before.inner_text(), after.inner_text()
        assert "PASS" in before_text.splitlines() and "ERROR" not in before_text
        assert "ERROR" in after_text.splitlines()
        picker = page.locator('[data-testid="stSelectbox"]', has_text="side by side")
        # the clicked change
        expect(picker.locator("input")).to_have_value("Qwen/Qwen3-1.7B · text-generation")
        click_row(page, 1)  # the other regression: llava's TIMEOUT
        page.locator('[data-testid="stColumn"]', has_text="TIMEOUT").first.wait_for(timeout=30_000)
        expect(after).not_to_contain_text("exceeds SBUF", timeout=30_000)


def test_pictures_and_labels_of_task_runs_render_in_the_browser(
    task_dataset: Path, dead_hub: str
) -> None:
    """A text-to-image run's pictures (the device's beside the reference's) load as images of
    the recorded size; a classifier's labels table marks the input whose label differs."""
    import base64
    import io
    from urllib.parse import urlencode

    from PIL import Image

    store = ResultsStore(str(task_dataset))
    runs = store.matrix(columns=["model_id", "run_id", "compiler", "compiler_version"])
    runs = runs.set_index("model_id")
    pictures = store.get(str(runs.loc["local/tiny-stable-diffusion", "run_id"]))
    drawn = pictures.document.verification.images
    assert drawn is not None
    expected = [
        list(Image.open(io.BytesIO(base64.b64decode(p))).size)
        for pair in zip(drawn.device, drawn.reference, strict=True)
        for p in pair
    ]
    ARTIFACTS.mkdir(exist_ok=True)
    with serve_viewer(task_dataset, dead_hub) as url, browser_page() as page:
        page.goto(f"{url}/?view=all&model=local/tiny-stable-diffusion")
        wait_ready(page)
        page.wait_for_function(
            "n => { const images = document.querySelectorAll('[data-testid=\"stImage\"] img');"
            " return images.length === n && [...images].every(i => i.complete && i.naturalWidth); }",
            arg=len(expected),
            timeout=30_000,
        )
        sizes = page.eval_on_selector_all(
            '[data-testid="stImage"] img',
            "images => images.map(i => [i.naturalWidth, i.naturalHeight])",
        )
        assert sizes == expected  # the recorded pictures, device then reference per prompt
        page.screenshot(path=str(ARTIFACTS / "viewer-text-to-image.png"), full_page=True)
        classifier = runs.loc["local/tiny-vit-classifier"]
        stack = f"{classifier['compiler']} {classifier['compiler_version']}"
        query = urlencode({"view": "all", "compiler": stack, "model": "local/tiny-vit-classifier"})
        page.goto(f"{url}/?{query}")
        wait_ready(page)
        labels = page.locator('[data-testid="stDataFrame"]', has_text="predicted (device)")
        labels.locator("td", has_text="≠ differs").first.wait_for(state="attached", timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "viewer-classifier.png"), full_page=True)


def test_a_row_on_a_later_page_of_a_long_table_opens_its_details(
    long_dataset: Path, dead_hub: str
) -> None:
    """A table longer than a page says which of its rows are shown; a turned page's row opens
    its details and stays highlighted through Back and Forward; a link to a row on another
    page shows that page."""
    second = long_model(PAGE_ROWS + 3)  # the fourth row of the second page
    with serve_viewer(long_dataset, dead_hub) as url, browser_page() as page:
        page.goto(f"{url}/?view=all")
        wait_ready(page)
        page.get_by_text(f"rows 1–{PAGE_ROWS} of {LONG_ROWS:,}").wait_for(timeout=30_000)
        expect_rows(page, PAGE_ROWS)
        turn = page.get_by_label("Page (of 3)")
        turn.fill("2")
        turn.press("Enter")
        page.get_by_text(f"rows {PAGE_ROWS + 1}–{2 * PAGE_ROWS:,} of {LONG_ROWS:,}").wait_for(
            timeout=30_000
        )
        wait_ready(page)
        click_row(page, 3)
        page.wait_for_url(f"**model={quote(second, safe='')}**", timeout=30_000)
        page.locator(page_heading(second)).wait_for(timeout=30_000)
        wait_ready(page)
        wait_highlighted(page, [second])
        page.go_back()
        page.wait_for_url(lambda url: "model=" not in url, timeout=30_000)
        wait_ready(page)
        wait_highlighted(page, [])
        page.go_forward()
        page.locator(page_heading(second)).wait_for(timeout=30_000)
        wait_highlighted(page, [second])
        third = long_model(2 * PAGE_ROWS + 10)
        page.goto(f"{url}/?view=all&model={quote(third, safe='')}")  # a link to page 3
        wait_ready(page)
        page.get_by_text(f"rows {2 * PAGE_ROWS + 1:,}–{LONG_ROWS:,} of {LONG_ROWS:,}").wait_for(
            timeout=30_000
        )
        wait_highlighted(page, [third])
