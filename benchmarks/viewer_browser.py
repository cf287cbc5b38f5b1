"""The viewer in a real browser: what a visitor waits for, on the demo's results and on a
100,000-row store.

Run: python benchmarks/viewer_browser.py [--demo-results DIR] [--rows 100000] [--repeat 5]
[--neighbours 1].
Starts the viewer as `model-support viewer` does (`streamlit run` through viewer/serve.py, which
reads the page's data before the server listens: that start is timed too), headless, and drives
Debian's chromium through Playwright, as tests/viewer/test_browser.py does
(tests/viewer/browser_support.py). Per store it times:

- first page: from the navigation to ``?view=all`` to the results table drawn and the script
  done (the first visit after the server started, in a browser already running, runs the
  page's script for the first time; later visits find the server warm);
- a row click: from pressing a row's marker to that model's details drawn to their end, their
  heading scrolled into the window (1280x800, where the details start below the fold), the
  script done and every element painted (none still Streamlit's grey placeholder, which it
  draws while an element's code loads in the browser);
- a view switch: from pressing a view in the sidebar (All results -> Selected -> Trending ->
  Downloads -> Regressions) to its heading drawn and the script done;

for the first visitor after the server started and ``--repeat`` new visitors (a new browser
context each: nothing of the site cached, as anyone's first visit), then ``--repeat`` returning
visitors (a new session in a browser that has the site's files cached: Streamlit serves its
JavaScript as immutable). Each figure is read by the page's own clock (``performance.now()``
from the navigation's start or the press, to the first DOM change at which the awaited state
holds), which is what the visitor waits for; the driver's clock is printed below it (Playwright's
waits, its round trips to the browser on the same cores included).

Beside the viewer, benchmarks/viewer_floor_app.py (a bare Streamlit page with the same widgets
and a table of the same shape) is timed the same way: Streamlit's own floor on this machine.
Served as the viewer is (its server module and Streamlit options), it is what no change to the
viewer's page can go under, and each of its new visitors is followed by one of the viewer's
first page: paired moments apart, their difference is what the viewer's page adds to the floor,
which the machine's drift between separate measurements hides; served by ``streamlit run``'s
defaults, it shows what the server's settings are worth.

The demo's results are those `model-support demo` writes (built into a temporary directory
unless ``--demo-results`` names them). The 100,000-row store is benchmarks/viewer_scale.py's
matrix with benchmarks/history_scale.py's history of 100,000 runs (for Regressions) and a
curated list of 50 of its models (for Selected). The Hub is tests/hubserver.py's stand-in,
ranking 200 of the store's models, so Trending and Downloads show a ranking (no network).

The machine is not left idle: ``--neighbours`` CPU-heavy processes (default 1, each
``python3 -c "while True: pass"``) run beside the benchmark from its start to its end, as a
viewer shares its host with other work; the load average is printed with them running.

``--demo-results DIR`` is copied first, and the copy is served: the stand-in Hub's rankings,
which the viewer stores with the dataset it serves, never reach the user's results.

Targets: first page < 2 s, row click -> details < 1 s, view switch < 1 s; each figure is
printed as the median, best and worst visit, with the median's ratio to the target and how many
visits were within it, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # the Hub stand-in (hubserver.py)
sys.path.insert(0, str(HERE.parent / "tests" / "viewer"))  # the viewer's server (serve_viewer)
import history_scale  # noqa: E402  (its history builder)
import viewer_scale  # noqa: E402  (its 100k-row matrix builder)
from browser_support import PAINTED, READY, TABLE, click_row, launch_chromium  # noqa: E402
from hubserver import HubServer, Repo  # noqa: E402
from playwright.sync_api import Browser, BrowserContext, Page, ViewportSize, sync_playwright  # noqa: E402
from viewer_support import serve_streamlit, serve_viewer  # noqa: E402

from model_support.cli.commands_viewer import viewer_command  # noqa: E402
from model_support.viewer.scroll import DETAILS_ANCHOR  # noqa: E402

TARGETS_S = {"first page": 2.0, "details": 1.0, "view switch": 1.0}
SWITCHES = ("Selected", "Trending", "Downloads", "Regressions")
TIMEOUT_MS = 120_000


def build_large(root: Path, rows: int) -> list[str]:
    """viewer_scale's matrix of ``rows`` rows, history_scale's history of as many runs, and a
    curated list of 50 of the matrix's models; returns the first 200 model ids (the Hub's)."""
    viewer_scale.build(root, rows)
    models = max(rows // 22, 1)  # history_scale's proportions: 20 stacks and re-runs
    history_scale.build(root, models=models, stacks=20, reruns=rows - models * 20)
    ids = [f"org{i % 500}/model-{i}" for i in range(min(rows, 200))]
    (root / "selected.yaml").write_text(
        "".join(f"- model: {m}\n  task: text-generation\n" for m in ids[:50])
    )
    return ids


def demo_models(root: Path) -> list[tuple[str, str]]:
    """The (model id, task) pairs of a store's matrix."""
    from model_support.store import ResultsStore

    frame = ResultsStore(str(root)).matrix(columns=["model_id", "task"]).drop_duplicates()
    return [(str(m), str(t)) for m, t in zip(frame["model_id"], frame["task"], strict=True)]


def hub_repos(models: list[tuple[str, str]]) -> list[Repo]:
    """A ranking of ``models``: downloads and trending score falling in the given order."""
    return [
        Repo(model, pipeline_tag=task, downloads=10_000 - i, trending_score=1_000 - i)
        for i, (model, task) in enumerate(models)
    ]


PAGE_CLOCK = (
    """
window.__benchmark = {start: 0, done: null, until: () => (
  document.querySelector(TABLE) !== null && document.querySelector(READY) !== null
  && PAINTED)};
document.addEventListener('pointerdown', () => {
  window.__benchmark.start = performance.now();
  window.__benchmark.done = null;
}, true);
new MutationObserver(() => {
  const b = window.__benchmark;
  if (b.done === null && b.until !== null && b.until()) b.done = performance.now();
}).observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
""".replace("TABLE", json.dumps(TABLE))
    .replace("READY", json.dumps(READY))
    .replace("PAINTED", PAINTED)
)
"""The page's own clock (installed in every page before its scripts): ``start`` is the
navigation's start (0) or the last pointer press, ``done`` the first DOM change after it at
which ``until()`` holds (at first: a table drawn, the script done and nothing left a grey
placeholder). What the visitor waits
for, without the driver's round trips to the browser (which on 2 busy cores add 0.2-0.4 s to
every wait the driver sees)."""


def page_clock_until(page: Page, condition: str) -> None:
    """From now on the page's clock stops when the JavaScript ``condition`` holds."""
    page.evaluate(
        f"() => {{ window.__benchmark.done = null; window.__benchmark.until = () => ({condition}); }}"
    )


def page_clock(page: Page) -> float:
    """Seconds from the clock's start to its stop, by the page's clock."""
    elapsed = page.evaluate(
        "() => window.__benchmark.done === null ? null"
        " : window.__benchmark.done - window.__benchmark.start"
    )
    assert elapsed is not None, "the page's clock did not stop"
    return float(elapsed) / 1000


def _present(selector: str) -> str:
    return f"document.querySelector({json.dumps(selector)}) !== null"


def _heading(level: str, text: str) -> str:
    return (
        f"Array.from(document.querySelectorAll('[data-testid=\"stHeading\"] {level}'))"
        f".some(h => h.innerText.includes({json.dumps(text)}))"
    )


def wait_view(page: Page, label: str) -> None:
    page.locator(
        f'[data-testid="stMain"] [data-testid="stHeading"] h2:has-text("{label}")'
    ).wait_for(timeout=TIMEOUT_MS)
    page.wait_for_selector(READY, timeout=TIMEOUT_MS)
    page.wait_for_function(PAINTED, timeout=TIMEOUT_MS)


@dataclass
class Visit:
    """One visit's figures (s; ``page:`` keys by the page's clock, the others by the
    driver's) and the shape of its first page's table."""

    timings: dict[str, float]
    table_shape: tuple[int, int]
    """Rows and columns, as the grid counts them."""


DETAILS_DRAWN = (
    "Array.from(document.querySelectorAll('[data-testid=\"stExpander\"] summary'))"
    ".some(s => s.innerText.trim().endsWith('\\nRun'))"
)
"""A model's details drawn to their end (the last of them: the Run expander)."""
DETAILS_IN_VIEW = (
    f"(top => top >= 0 && top < window.innerHeight)"
    f"(document.getElementById({json.dumps(DETAILS_ANCHOR)})?.getBoundingClientRect().top ?? -1)"
)
"""The details' heading in the window (the page scrolled to it: below the table, the details
start under the fold of a 1280x800 window)."""
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
"""A laptop's window: the details start below the fold, the lists scroll sideways."""


def visit(page: Page, url: str, row: int) -> Visit:
    """One visitor in a new session: the first page, a row click, the view switches."""
    timings: dict[str, float] = {}
    start = time.perf_counter()
    page.goto(f"{url}/?view=all")
    page.wait_for_selector('[data-testid="stApp"]', state="attached", timeout=TIMEOUT_MS)
    timings["page shell"] = time.perf_counter() - start
    page.wait_for_selector(TABLE, timeout=TIMEOUT_MS)
    page.wait_for_selector(READY, timeout=TIMEOUT_MS)
    page.wait_for_function(PAINTED, timeout=TIMEOUT_MS)
    timings["first page"] = time.perf_counter() - start
    timings["page: first page"] = page_clock(page)
    shape = table_shape(page)
    model = page.locator(
        f'[data-testid="stDataFrame"] tbody tr[aria-rowindex="{row + 2}"] td'
    ).first.inner_text()
    page_clock_until(
        page,
        f"{_heading('h3', model)} && {DETAILS_DRAWN} && {DETAILS_IN_VIEW} && {_present(READY)}"
        f" && {PAINTED}",
    )
    start = time.perf_counter()
    click_row(page, row)
    page.locator(f'[data-testid="stHeading"] h3:has-text("{model}")').wait_for(timeout=TIMEOUT_MS)
    page.wait_for_function(DETAILS_DRAWN, timeout=TIMEOUT_MS)
    page.wait_for_function(DETAILS_IN_VIEW, timeout=TIMEOUT_MS)
    page.wait_for_selector(READY, timeout=TIMEOUT_MS)
    page.wait_for_function(PAINTED, timeout=TIMEOUT_MS)
    timings["details"] = time.perf_counter() - start
    timings["page: details"] = page_clock(page)
    for label in SWITCHES:
        page_clock_until(page, f"{_heading('h2', label)} && {_present(READY)} && {PAINTED}")
        start = time.perf_counter()
        page.locator('[data-testid="stSidebar"] [data-testid="stRadio"] label').filter(
            has_text=label
        ).first.click()
        wait_view(page, label)
        timings[f"switch to {label}"] = time.perf_counter() - start
        timings[f"page: switch to {label}"] = page_clock(page)
    return Visit(timings, shape)


def clocked_context(browser: Browser) -> BrowserContext:
    """A new browser context (nothing cached) whose pages run the page's clock."""
    context = browser.new_context(viewport=VIEWPORT)
    context.add_init_script(PAGE_CLOCK)
    return context


def started_browser(browser: Browser) -> None:
    """Have the just-launched browser draw a blank page in a context of its own: a visitor's
    browser is already running, and its own first page (its processes started: a few tenths of
    a second here) is not the server's first visitor's wait."""
    context = browser.new_context()
    try:
        context.new_page().goto("about:blank")
    finally:
        context.close()


def new_visitor(browser: Browser, url: str, row: int) -> Visit:
    """A visitor whose browser has nothing of the site cached (a new browser context)."""
    context = clocked_context(browser)
    try:
        return visit(context.new_page(), url, row)
    finally:
        context.close()


def returning_visitor(context: BrowserContext, url: str, row: int) -> Visit:
    """A visitor back in a new session (a new tab) whose browser kept the site's files: what
    Streamlit serves as immutable (its JavaScript) comes from the cache."""
    page = context.new_page()
    try:
        return visit(page, url, row)
    finally:
        page.close()


def line(label: str, seconds: list[float], target: str | None) -> str:
    """A figure's median, best and worst visit; against ``target``, the median's ratio to it
    and how many visits were within it (a median within it can hide a visit over it)."""
    median, best, worst = statistics.median(seconds), min(seconds), max(seconds)
    text = f"  {label:<44} median {median:6.2f} s   best {best:6.2f} s   worst {worst:6.2f} s"
    if target is not None:
        limit = TARGETS_S[target]
        verdict = "ok" if median <= limit else "OVER"
        within = sum(s <= limit for s in seconds)
        text += (
            f"   {median / limit:4.2f}x of < {limit:g} s: {verdict}, {within}/{len(seconds)} within"
        )
    return text


def report(name: str, visits: list[Visit], target: str | None = None) -> None:
    """``name``'s lines: by the page's clock (judged against ``target``), then the driver's."""
    print(line(f"{name}", [v.timings[f"page: {name}"] for v in visits], target))
    print(line("  (the driver's clock)", [v.timings[name] for v in visits], None))


@contextmanager
def serve_floor(rows: int, columns: int, as_viewer: bool) -> Iterator[str]:
    """viewer_floor_app.py (a bare page, the viewer's widgets and a table of ``rows`` x
    ``columns``) on a free port, served as the viewer is (``as_viewer``: its server module and
    Streamlit options) or as ``streamlit run`` serves it by default; yields its URL once healthy.
    """
    env = {**os.environ, "FLOOR_ROWS": str(rows), "FLOOR_COLUMNS": str(columns)}
    script = HERE / "viewer_floor_app.py"
    with tempfile.TemporaryDirectory() as nothing:  # the viewer's server: nothing to read ahead

        def command(port: int) -> list[str]:
            if as_viewer:
                return viewer_command(nothing, port, headless=True, script=script)
            options = {"server.port": port, "server.headless": "true"}
            options["browser.gatherUsageStats"] = "false"
            flags = [part for key, value in options.items() for part in (f"--{key}", str(value))]
            return [sys.executable, "-m", "streamlit", "run", str(script), *flags]

        with serve_streamlit(command, env) as url:
            yield url


def first_page(page: Page, url: str) -> float:
    """A first page's time to a table drawn and the script done, by the page's clock."""
    page.goto(url)
    page.wait_for_selector(TABLE, timeout=TIMEOUT_MS)
    page.wait_for_selector(READY, timeout=TIMEOUT_MS)
    page.wait_for_function(PAINTED, timeout=TIMEOUT_MS)
    return page_clock(page)


def table_shape(page: Page) -> tuple[int, int]:
    """The rows and columns of the page's first table (the grid's counts less its header)."""
    grid = page.locator('[data-testid="stDataFrame"] [aria-rowcount]').first
    rows = int(grid.get_attribute("aria-rowcount") or 1) - 1
    columns = int(grid.get_attribute("aria-colcount") or 1)
    return rows, columns


def new_visitor_first_page(browser: Browser, url: str) -> float:
    """A new visitor's first page of ``url`` (a new browser context), by the page's clock."""
    context = clocked_context(browser)
    try:
        return first_page(context.new_page(), url)
    finally:
        context.close()


def measure_floor(browser: Browser, rows: int, columns: int, repeat: int, viewer_url: str) -> None:
    """The floor page's first page for new and returning visitors, as the viewer's is timed,
    served as the viewer is and as ``streamlit run`` serves it by default. Served as the viewer
    is, each new visitor of the floor is followed by a new visitor of the viewer's first page
    (``viewer_url``): paired visits, moments apart, give what the viewer's page adds to
    Streamlit's own floor, which the machine's drift between separate runs (0.3-0.5 s) hides."""
    print(f"  Streamlit's own floor: a bare page, the same widgets, a {rows} x {columns} table:")
    for as_viewer in (True, False):
        with serve_floor(rows, columns, as_viewer) as url:
            new, paired = [], []
            for _ in range(repeat + 1):  # the first visit after the start is left out
                new.append(new_visitor_first_page(browser, url))
                if as_viewer:
                    paired.append(new_visitor_first_page(browser, f"{viewer_url}/?view=all"))
            context = clocked_context(browser)
            back = []
            try:
                for _ in range(repeat + 1):
                    page = context.new_page()
                    back.append(first_page(page, url))
                    page.close()
            finally:
                context.close()
        print("  served as the viewer is:" if as_viewer else "  served by Streamlit's defaults:")
        print(line("first page, new visitors", new[1:], "first page"))
        print(line("first page, returning visitors", back[1:], "first page"))
        if as_viewer:
            print(line("the viewer's, a new visitor after each", paired[1:], "first page"))
            added = [viewer - floor for viewer, floor in zip(paired[1:], new[1:], strict=True)]
            print(
                f"  {'the viewer less the floor, paired visits':44s} median {statistics.median(added):+6.2f} s"
                f"   range {min(added):+.2f} to {max(added):+.2f} s"
            )


def measure(name: str, root: Path, hub: str, repeat: int) -> None:
    print(f"{name}: load average before {viewer_scale.load()}", flush=True)
    start = time.perf_counter()
    with serve_viewer(root, hub, start_timeout_s=120) as url, sync_playwright() as p:
        print(f"  server start, to healthy (reads ahead)  {time.perf_counter() - start:6.2f} s")
        browser = launch_chromium(p)
        try:
            started_browser(browser)
            first = new_visitor(browser, url, row=1)
            new = [new_visitor(browser, url, row=1 + i % 5) for i in range(repeat)]
            context = clocked_context(browser)
            returning_visitor(context, url, row=0)  # the browser fetches the site's files
            back = [returning_visitor(context, url, row=1 + i % 5) for i in range(repeat)]
            context.close()
            measure_floor(browser, *first.table_shape, repeat, url)
        finally:
            browser.close()
    print("  by the page's clock (from navigation or the click, to drawn and the script done);")
    print("  the driver's (Playwright's waits, its round trips to the browser included) below")
    print("  the first visitor after the server started (nothing cached):")
    report("first page", [first], "first page")
    print(f"  {repeat} new visitors (nothing cached, a new browser context each):")
    report("first page", new, "first page")
    print(
        line(
            "  of which the page shell (driver's clock)",
            [v.timings["page shell"] for v in new],
            None,
        )
    )
    report("details", [first, *new], "details")
    for label in SWITCHES:
        report(f"switch to {label}", [first, *new], "view switch")
    print(
        f"  {repeat} returning visitors (a new session, the site's files in the browser's cache):"
    )
    report("first page", back, "first page")
    report("details", back, "details")
    for label in SWITCHES:
        report(f"switch to {label}", back, "view switch")
    print(f"{name}: load average after {viewer_scale.load()}", flush=True)


@contextmanager
def busy_neighbours(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` CPU-heavy processes beside the benchmark (a busy host), stopped after it."""
    command = [sys.executable, "-c", "while True: pass"]
    neighbours = [subprocess.Popen(command) for _ in range(count)]
    try:
        yield neighbours
    finally:
        for neighbour in neighbours:
            neighbour.terminate()
            neighbour.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--demo-results",
        type=Path,
        default=None,
        help="The demo's results to serve (a copy of them: they are never written to).",
    )
    parser.add_argument(
        "--rows", type=int, default=100_000, help="The large store's rows (0: no large store)."
    )
    parser.add_argument("--repeat", type=int, default=5, help="Visits after the first one.")
    parser.add_argument(
        "--neighbours",
        type=int,
        default=1,
        help="CPU-heavy processes beside the benchmark (python3 -c 'while True: pass').",
    )
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} CPUs; targets: "
        + ", ".join(f"{k} < {v:g} s" for k, v in TARGETS_S.items())
    )
    with tempfile.TemporaryDirectory() as tmp, busy_neighbours(args.neighbours) as neighbours:
        for neighbour in neighbours:
            print(
                f"a CPU-heavy neighbour beside it: pid {neighbour.pid}, {' '.join(neighbour.args)}"
            )  # type: ignore[arg-type]
        demo = Path(tmp) / "demo"
        if args.demo_results is not None:
            shutil.copytree(args.demo_results, demo)
            print(f"serving a copy of {args.demo_results} (its rankings are written to the copy)")
        else:
            start = time.perf_counter()
            subprocess.run(
                [
                    str(Path(sys.executable).parent / "model-support"),
                    "demo",
                    "--results",
                    str(demo),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            print(f"model-support demo: {time.perf_counter() - start:.0f} s")
        models = demo_models(demo)
        with HubServer(hub_repos(models)) as hub:
            measure(f"demo results ({len(models)} models)", demo, hub.url, args.repeat)
        if args.rows <= 0:
            return
        large = Path(tmp) / "large"
        start = time.perf_counter()
        ids = build_large(large, args.rows)
        print(f"built the {args.rows:,}-row store in {time.perf_counter() - start:.0f} s")
        with HubServer(hub_repos([(m, "text-generation") for m in ids])) as hub:
            measure(f"{args.rows:,}-row store", large, hub.url, args.repeat)


if __name__ == "__main__":
    main()
