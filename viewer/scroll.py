"""Bringing a model's details into view: a row clicked in a long list, the picker, Back or a
shared link show the details where the reader is looking, not below the fold of the page."""

from __future__ import annotations

import streamlit as st

DETAILS_ANCHOR = "model-details"
"""The id of the details' heading (``st.header(..., anchor=DETAILS_ANCHOR)``)."""

_SHOWN_KEY = "details-scrolled-to"
_COUNT_KEY = "details-scrolls"

# A constant script (no value of a run in it): the count only makes each scroll's element new,
# so the browser runs it again for the next model.
_SCRIPT = """<script>
/* scroll {count} */
document.getElementById("{anchor}")?.scrollIntoView({{block: "start"}});
</script>"""


def scroll_to_details(model: str | None) -> bool:
    """Scroll the page to the details' heading when the page's model is another than at the
    last run of this session (a row's tick, the picker, Back or Forward, a shared link); never
    for the same model, which the reader may have scrolled away from, or for none. Returns
    whether it scrolled."""
    previous = st.session_state.get(_SHOWN_KEY)
    st.session_state[_SHOWN_KEY] = model
    if not model or model == previous:
        return False
    count = st.session_state[_COUNT_KEY] = int(st.session_state.get(_COUNT_KEY, 0)) + 1
    st.html(_SCRIPT.format(count=count, anchor=DETAILS_ANCHOR), unsafe_allow_javascript=True)
    return True
