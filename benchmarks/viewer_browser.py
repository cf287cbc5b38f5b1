"""The viewer in a real browser: what a visitor waits for, on the demo's results and on a
100,000-row store.

Run: python benchmarks/viewer_browser.py [--demo-results DIR] [--rows 100000] [--repeat 5].
Starts the viewer as `model-support viewer` does (`streamlit run` through viewer/serve.py, which
reads the page's data before the server listens: that start is timed too), headless, and drives
Debian's chromium through Playwright, as tests/viewer/test_browser.py does
(tests/viewer/browser_support.py). Per store, each of ``--repeat`` visits opens a new browser
context (a new Streamlit session) and times:

- first page: from navigating to ``?view=all`` to the results table drawn and the script done
  (the first visit after the server started runs the page's script for the first time; later
  visits find everything warm), and of that the page shell: Streamlit's frontend loaded (its
  JavaScript, the same for any store) before the script's first output arrives;
- a row click: from ticking a row of the table to that model's details drawn;
- a view switch: from clicking a view in the sidebar (All results -> Selected -> Trending ->
  Downloads -> Regressions) to its heading drawn and the script done.

The demo's results are those `model-support demo` writes (built into a temporary directory
unless ``--demo-results`` names them). The 100,000-row store is benchmarks/viewer_scale.py's
matrix with benchmarks/history_scale.py's history of 100,000 runs (for Regressions) and a
curated list of 50 of its models (for Selected). The Hub is tests/hubserver.py's stand-in,
ranking 200 of the store's models, so Trending and Downloads show a ranking (no network).

Targets: first page < 2 s, row click -> details < 1 s, view switch < 1 s; each figure is
printed with its ratio to the target, for the median and the best visit, with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # the Hub stand-in (hubserver.py)
sys.path.insert(0, str(HERE.parent / "tests" / "viewer"))  # the viewer's server (serve_viewer)
import history_scale  # noqa: E402  (its history builder)
import viewer_scale  # noqa: E402  (its 100k-row matrix builder)
from browser_support import READY, TABLE, click_row, launch_chromium  # noqa: E402
from hubserver import HubServer, Repo  # noqa: E402
from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402
from viewer_support import serve_viewer  # noqa: E402

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


def wait_view(page: Page, label: str) -> None:
    page.locator(f'[data-testid="stHeading"] h2:has-text("{label}")').wait_for(timeout=TIMEOUT_MS)
    page.wait_for_selector(READY, timeout=TIMEOUT_MS)


def visit(browser: Browser, url: str, row: int) -> dict[str, float]:
    """One visitor in a new session: the first page, a row click, the view switches (s)."""
    timings: dict[str, float] = {}
    context = browser.new_context(viewport={"width": 1400, "height": 1800})
    try:
        page = context.new_page()
        start = time.perf_counter()
        page.goto(f"{url}/?view=all")
        page.wait_for_selector('[data-testid="stApp"]', state="attached", timeout=TIMEOUT_MS)
        timings["page shell"] = time.perf_counter() - start
        page.wait_for_selector(TABLE, timeout=TIMEOUT_MS)
        page.wait_for_selector(READY, timeout=TIMEOUT_MS)
        timings["first page"] = time.perf_counter() - start
        model = page.locator(
            f'[data-testid="stDataFrame"] tbody tr[aria-rowindex="{row + 2}"] td'
        ).first.inner_text()
        start = time.perf_counter()
        click_row(page, row)
        page.locator(f'[data-testid="stHeading"] h3:has-text("{model}")').wait_for(
            timeout=TIMEOUT_MS
        )
        page.wait_for_selector(READY, timeout=TIMEOUT_MS)
        timings["details"] = time.perf_counter() - start
        for label in SWITCHES:
            start = time.perf_counter()
            page.locator('[data-testid="stSidebar"] [data-testid="stRadio"] label').filter(
                has_text=label
            ).first.click()
            wait_view(page, label)
            timings[f"switch to {label}"] = time.perf_counter() - start
    finally:
        context.close()
    return timings


def line(label: str, seconds: list[float], target: str | None) -> str:
    median, best = statistics.median(seconds), min(seconds)
    text = f"  {label:<36} median {median:6.2f} s   best {best:6.2f} s"
    if target is not None:
        limit = TARGETS_S[target]
        verdict = "ok" if median <= limit else "OVER"
        text += f"   {median / limit:4.2f}x (best {best / limit:4.2f}x) of < {limit:g} s: {verdict}"
    return text


def measure(name: str, root: Path, hub: str, repeat: int) -> None:
    print(f"{name}: load average before {viewer_scale.load()}", flush=True)
    start = time.perf_counter()
    with serve_viewer(root, hub, start_timeout_s=120) as url, sync_playwright() as p:
        print(f"  server start, to healthy (reads ahead)  {time.perf_counter() - start:6.2f} s")
        browser = launch_chromium(p)
        try:
            visits = [visit(browser, url, row=1 + i % 5) for i in range(repeat + 1)]
        finally:
            browser.close()
    cold, warm = visits[0], visits[1:]
    print(line("first page, first visit (cold)", [cold["first page"]], "first page"))
    print(line("first page, later visits", [v["first page"] for v in warm], "first page"))
    print(line("  of which the page shell (frontend)", [v["page shell"] for v in warm], None))
    print(line("row click -> details", [v["details"] for v in visits], "details"))
    for label in SWITCHES:
        seconds = [v[f"switch to {label}"] for v in visits]
        print(line(f"view switch -> {label}", seconds, "view switch"))
    print(f"{name}: load average after {viewer_scale.load()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--demo-results", type=Path, default=None)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5, help="Visits after the first one.")
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} CPUs; targets: "
        + ", ".join(f"{k} < {v:g} s" for k, v in TARGETS_S.items())
    )
    with tempfile.TemporaryDirectory() as tmp:
        demo = args.demo_results
        if demo is None:
            demo = Path(tmp) / "demo"
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
        large = Path(tmp) / "large"
        start = time.perf_counter()
        ids = build_large(large, args.rows)
        print(f"built the {args.rows:,}-row store in {time.perf_counter() - start:.0f} s")
        with HubServer(hub_repos([(m, "text-generation") for m in ids])) as hub:
            measure(f"{args.rows:,}-row store", large, hub.url, args.repeat)


if __name__ == "__main__":
    main()
