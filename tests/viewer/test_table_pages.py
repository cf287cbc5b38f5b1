"""A table longer than a page: the page's rows with their place in the whole, every row
reachable (page turns, a sort of all rows, search over all rows), and a linked or picked model's
row turned to and highlighted."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest
from viewer_support import LONG_ROWS, long_model, viewer_page

from model_support.viewer import table_pages

PAGE = table_pages.PAGE_ROWS


def _run(page: AppTest) -> AppTest:
    page.run()
    assert not page.exception
    return page


def _captions(page: AppTest) -> list[str]:
    return [c.value for c in page.caption]


def _highlighted(page: AppTest) -> list[int]:
    return list(page.session_state["table-all"]["selection"]["rows"])


@pytest.fixture
def page(long_dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str) -> AppTest:
    return viewer_page(long_dataset, monkeypatch, dead_hub, view="all")


def test_a_long_table_shows_its_first_page_and_which_rows_those_are(page: AppTest) -> None:
    _run(page)
    rows = page.dataframe[0].value
    assert list(rows["model"]) == [long_model(i) for i in range(PAGE)]
    assert f"rows 1–{PAGE} of {LONG_ROWS:,}" in _captions(page)
    pages = page.number_input(key="table-all-page")
    assert pages.value == 1 and pages.label == "Page (of 3)"


def test_every_page_is_reachable_and_the_last_one_is_shorter(page: AppTest) -> None:
    _run(page)
    page.number_input(key="table-all-page").set_value(2)
    _run(page)
    assert list(page.dataframe[0].value["model"]) == [long_model(i) for i in range(PAGE, 2 * PAGE)]
    assert f"rows {PAGE + 1}–{2 * PAGE:,} of {LONG_ROWS:,}" in _captions(page)
    page.number_input(key="table-all-page").set_value(3)
    _run(page)
    assert list(page.dataframe[0].value["model"]) == [
        long_model(i) for i in range(2 * PAGE, LONG_ROWS)
    ]
    assert f"rows {2 * PAGE + 1:,}–{LONG_ROWS:,} of {LONG_ROWS:,}" in _captions(page)


def test_a_link_to_a_model_on_a_later_page_turns_to_it_and_highlights_its_row(
    page: AppTest,
) -> None:
    wanted = 2 * PAGE + 100
    page.query_params["model"] = long_model(wanted)
    _run(page)
    assert page.number_input(key="table-all-page").value == 3
    assert page.dataframe[0].value["model"].iloc[_highlighted(page)[0]] == long_model(wanted)
    assert _highlighted(page) == [100]
    assert long_model(wanted) in [h.value.replace("\\", "") for h in page.subheader]  # details
    # Turning the page keeps the model's details; its row is highlighted only on its page.
    page.number_input(key="table-all-page").set_value(1)
    _run(page)
    assert _highlighted(page) == [] and page.selectbox(key="model").value == long_model(wanted)
    # Picking another model turns to that model's page.
    page.selectbox(key="model").select(long_model(PAGE + 7))
    _run(page)
    assert page.number_input(key="table-all-page").value == 2
    assert _highlighted(page) == [7]


def test_the_sort_orders_all_rows_and_starts_again_at_the_first_page(page: AppTest) -> None:
    _run(page)
    page.number_input(key="table-all-page").set_value(3)
    _run(page)
    page.selectbox(key="table-all-sort").select("wall time (s)")
    page.toggle(key="table-all-descending").set_value(True)
    _run(page)
    assert page.number_input(key="table-all-page").value == 1
    top = page.dataframe[0].value
    slowest = [long_model(i) for i in range(LONG_ROWS) if i % 97 == 96]  # 96 s: the most
    assert list(top["model"][: len(slowest)]) == slowest  # from every page, in model order
    assert (top["wall time (s)"][len(slowest) :] < 96).all()


def test_search_covers_every_page_and_a_short_result_is_one_page(page: AppTest) -> None:
    page.query_params["q"] = "-12"
    _run(page)
    models = list(page.dataframe[0].value["model"])
    assert models == [long_model(i) for i in range(1200, LONG_ROWS)]  # all on the last page
    said = [m.value for m in page.markdown if "results**" in m.value]
    assert said and said[0].startswith(f"**{len(models)} results** of {len(models)} models")
    assert not page.number_input  # one page: no page controls


def test_page_arithmetic() -> None:
    assert [table_pages.page_count(n, 500) for n in (0, 1, 500, 501, 100_000)] == [1, 1, 1, 2, 200]
    assert table_pages.rows_caption(0, 7, 7) == "7 rows"
    assert table_pages.rows_caption(0, 1, 1) == "1 row"
    assert table_pages.rows_caption(500, 1000, 100_000) == "rows 501–1,000 of 100,000"
    models = pd.Series([long_model(i) for i in range(PAGE)] + ["twice", "twice"] * PAGE)
    assert table_pages.turned_page(models, "twice", 1) == 2  # its first row's page
    assert table_pages.turned_page(models, "twice", 3) == 3  # it has a row on this page too
    assert table_pages.turned_page(models, "absent", 2) is None
    assert table_pages.turned_page(models, None, 2) is None


def test_a_click_or_a_page_turn_does_not_rebuild_the_table(
    page: AppTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table is built once per stack and filter: a rerun for a model's details or another
    page reuses it, and another search builds the searched one."""
    from model_support.viewer import queries

    built: list[int] = []
    build = queries.results_table
    monkeypatch.setattr(
        queries, "results_table", lambda frame: built.append(len(frame)) or build(frame)
    )
    _run(page)
    page.selectbox(key="model").select(long_model(3))
    _run(page)
    page.number_input(key="table-all-page").set_value(2)
    _run(page)
    assert built == [LONG_ROWS]
    page.text_input(key="q").input("-000")
    _run(page)
    assert built == [LONG_ROWS, 10]
