"""Driving the viewer in Debian's chromium through Playwright: what the browser tests and
benchmarks/viewer_browser.py share (the browser, the page's readiness, a table's rows)."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Browser, Page, Playwright

CHROMIUM = "/usr/bin/chromium"
READY = '[data-testid="stApp"][data-test-script-state="notRunning"]'
"""The page once Streamlit's script has finished a run."""
TABLE = '[data-testid="stDataFrame"] canvas'
"""A results table, drawn."""
PAINTED = "document.querySelector('[data-testid=\"stSkeleton\"]') === null"
"""(JavaScript) Every element painted: none is still the grey placeholder Streamlit draws
while the code of an element's kind loads in the browser (on its first use in a session)."""
ROW_HEIGHT = 35
"""Streamlit's dataframe row (and header) height in pixels."""


def launch_chromium(playwright: Playwright) -> Browser:
    """Debian's chromium, headless, as a container runs it (no sandbox, GPU or /dev/shm)."""
    assert Path(CHROMIUM).exists(), "install Debian chromium: apt-get install -y chromium"
    return playwright.chromium.launch(
        executable_path=CHROMIUM,
        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
    )


def click_row(page: Page, row: int, table: int = 0) -> None:
    """Tick row ``row`` (0: the first data row) of the page's ``table``-th dataframe: its row
    marker, the checkbox left of the first column (a click on a cell selects only the cell)."""
    grid = page.locator('[data-testid="stDataFrame"]').nth(table).locator("canvas").first
    grid.scroll_into_view_if_needed()  # as a reader scrolls back up to the list
    box = grid.bounding_box()
    assert box is not None, "the table is not drawn"
    page.mouse.click(box["x"] + 16, box["y"] + ROW_HEIGHT * (row + 1) + ROW_HEIGHT // 2)
