"""Streamlit's own floor for the viewer's first page: a bare page with the same widgets (the
sidebar's view radio, version and task selectboxes, search box; the model picker under the
table) and one table of the same shape, none of the viewer's code or data.

benchmarks/viewer_browser.py serves it with ``streamlit run`` and times its first page as it
times the viewer's: the difference is what the viewer's own page adds. FLOOR_ROWS and
FLOOR_COLUMNS give the table's shape (the viewer's first page's, as its grid counts them),
its rows selectable as the viewer's are.
"""

from __future__ import annotations

import os

import pandas as pd
import streamlit as st

VIEWS = ["Selected", "Trending", "Downloads", "All results", "Triage", "Compare", "Charts"]
VIEWS += ["History", "Regressions"]
ROWS = int(os.environ.get("FLOOR_ROWS", "11"))
COLUMNS = int(os.environ.get("FLOOR_COLUMNS", "7"))

st.set_page_config(page_title="floor", layout="wide")
st.title("Does it run on Trainium?")
with st.sidebar:
    st.header("Browse")
    st.radio("View", VIEWS, index=3, key="view")
    st.selectbox("Compiler version", ["2.28.0", "2.27.0"], key="compiler")
    st.selectbox("Library version", ["5.24.0", "5.23.0"], key="library")
    st.text_input("Search models", key="q")
    st.selectbox("Task", ["all tasks", "text-generation"], key="task")
st.header("All results")
models = [f"org{i % 500}/model-{i}" for i in range(ROWS)]
st.dataframe(
    pd.DataFrame({"model": models} | {f"column {c}": ["PASS"] * ROWS for c in range(1, COLUMNS)}),
    hide_index=True,
    on_select="rerun",
    selection_mode="single-row",
)
st.divider()
st.header("Model details")
st.selectbox("Model", models, index=None, key="model")
