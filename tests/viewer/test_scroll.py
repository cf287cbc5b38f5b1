"""A click on a row, the picker or a shared link brings the model's details into view, once per
model: a rerun for the same model leaves the reader's scroll alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from viewer_support import viewer_page

from model_support.viewer.scroll import DETAILS_ANCHOR


@pytest.fixture
def page(explained_dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str) -> AppTest:
    return viewer_page(explained_dataset, monkeypatch, dead_hub)


def scrolls(page: AppTest) -> int:
    """The scripts of this run that scroll to the details' heading."""
    assert not page.exception
    bodies = [element.proto.body for element in page.get("html")]
    return sum(f'getElementById("{DETAILS_ANCHOR}")' in body for body in bodies)


def test_a_shared_link_lands_on_the_details_and_a_rerun_stays_put(page: AppTest) -> None:
    page.query_params.update(view="all", model="org/fails")
    page.run()
    assert scrolls(page) == 1
    page.run()  # the same model (a page turned, a sort): the reader may have scrolled away
    assert scrolls(page) == 0
    page.selectbox(key="model").select("org/passes").run()  # another model: its details
    assert scrolls(page) == 1
    page.selectbox(key="model").set_value(None).run()  # none: nothing to bring into view
    assert scrolls(page) == 0


def test_views_with_their_own_content_first_do_not_scroll_away_from_it(page: AppTest) -> None:
    page.query_params.update(view="history", model="org/fails")
    page.run()
    assert scrolls(page) == 0
