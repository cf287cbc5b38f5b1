"""One real browser (Debian chromium via playwright) against `streamlit run` on a test dataset."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright
from viewer_support import HOSTILE_MODEL, HOSTILE_REASON, HOSTILE_TEXT, free_port

from model_support.cli.commands_viewer import viewer_command

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
READY = '[data-testid="stApp"][data-test-script-state="notRunning"]'
TABLE = '[data-testid="stDataFrame"] canvas'


@contextmanager
def serve(results: Path, hub: str) -> Iterator[str]:
    """`streamlit run` of the viewer (the CLI's command line) on a free port; yields its URL."""
    port = free_port()
    env = {**os.environ, "MODEL_SUPPORT_HUB_ENDPOINT": hub}
    process = subprocess.Popen(
        viewer_command(str(results), port, headless=True),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    output = process.stdout.read().decode() if process.stdout else ""
                    raise RuntimeError(f"streamlit did not start: {output}") from None
                time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.fixture
def server(dataset: Path, dead_hub: str) -> Iterator[str]:
    with serve(dataset, dead_hub) as url:
        yield url


@contextmanager
def browser_page() -> Iterator[Page]:
    assert Path(CHROMIUM).exists(), "install Debian chromium: apt-get install -y chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1800})
        finally:
            browser.close()


def wait_ready(page: Page) -> None:
    page.wait_for_selector(TABLE, timeout=60_000)
    page.wait_for_selector(READY, timeout=60_000)


def row_count(page: Page) -> int:
    """Rows in the first table (the grid's aria-rowcount counts the header row too)."""
    return (
        int(
            page.locator('[data-testid="stDataFrame"] [aria-rowcount]').first.get_attribute(
                "aria-rowcount"
            )
            or 0
        )
        - 1
    )


def test_page_search_details_and_screenshot(server: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with browser_page() as page:
        page.goto(f"{server}/?view=all")
        wait_ready(page)
        assert row_count(page) == 7
        search = page.get_by_label("Search models")
        search.fill("qwen")
        search.press("Enter")
        page.wait_for_function(
            "() => document.querySelector('[data-testid=\"stDataFrame\"] [aria-rowcount]')?.getAttribute('aria-rowcount') === '3'",
            timeout=30_000,
        )
        wait_ready(page)
        assert row_count(page) == 2
        assert "q=qwen" in page.url  # the state is written back into the URL
        page.goto(f"{server}/?view=all&q=qwen&model=Qwen/Qwen3-1.7B")
        wait_ready(page)
        page.get_by_text("BEGIN MODEL-SUPPORT CONFIG").first.wait_for(  # run.py's config block
            timeout=30_000
        )
        assert page.get_by_text("python3 run.py").count() >= 1
        page.get_by_text("Download run.py").first.wait_for()
        page.screenshot(path=str(ARTIFACTS / "viewer.png"), full_page=True)
    assert (ARTIFACTS / "viewer.png").stat().st_size > 10_000


def test_run_values_render_as_text_in_the_browser(hostile_dataset: Path, dead_hub: str) -> None:
    """Streamlit's own Markdown renderer shows escaped run values as exactly their text."""
    from urllib.parse import quote

    with serve(hostile_dataset, dead_hub) as url, browser_page() as page:
        page.goto(f"{url}/?view=all&model={quote(HOSTILE_MODEL, safe='')}")
        wait_ready(page)
        reason = page.get_by_text(HOSTILE_REASON, exact=True)
        reason.wait_for(timeout=30_000)
        assert page.get_by_text(HOSTILE_MODEL, exact=True).count() >= 1  # the details heading
        assert page.get_by_text(HOSTILE_TEXT, exact=True).count() == 1  # the generated text
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
        assert row_count(page) == 3  # two runs on the newer stack, one on the older
        page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "viewer-history.png"), full_page=True)
        page.goto(f"{server}/?view=regressions")
        wait_ready(page)
        assert row_count(page) == 2  # Qwen3-1.7B (ERROR compile) and llava (TIMEOUT)
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
        assert page.title().startswith("Qwen/Qwen3-1.7B")
