"""A model's details as a user reads them: the answer on one line first, then the figures, why it
did not pass (a FAIL's checks and tokens, an ERROR's stage and traceback, an EXCLUDED model's
reason), run.py's config block with the whole file as a download, and a way to its history."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from streamlit.testing.v1 import AppTest
from viewer_support import NEW_CC, POSITIONS, TRACEBACK, viewer_page

from model_support.viewer import headline
from model_support.viewer.failures import token_table


@pytest.fixture
def page(explained_dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str) -> AppTest:
    at = viewer_page(explained_dataset, monkeypatch, dead_hub)
    at.query_params["view"] = "all"
    return at


def _open(page: AppTest, model: str, **params: str) -> AppTest:
    page.query_params.update(model=model, **params)
    page.run()
    assert not page.exception
    return page


def _markdown(page: AppTest) -> list[str]:
    return [m.value for m in page.markdown]


def _unescaped(text: str) -> str:
    return text.replace("\\", "")


def _answer(page: AppTest) -> str:
    return _unescaped(next(m for m in _markdown(page) if "-background[" in m))


def _facts(page: AppTest) -> str:
    return _unescaped(next(c.value for c in page.caption if " · " in c.value and "UTC" in c.value))


def _main_order(page: AppTest) -> list[str]:
    """The main column's elements in page order, each as ``type: text``."""
    order = []

    def walk(node: object) -> None:
        children = getattr(node, "children", None)
        if children:
            for child in children.values():
                walk(child)
            return
        value = getattr(node, "value", None) if not hasattr(node, "label") else node.label
        order.append(f"{type(node).__name__}: {value}")

    walk(page.main)
    return order


def test_the_answer_comes_first_in_one_plain_sentence(page: AppTest) -> None:
    """Under the name: the result and one sentence saying where the output leaves the
    reference; then the facts (task, stack, instance, cores, date); only then any figure."""
    _open(page, "org/fails")
    answer = _answer(page)
    assert answer == (
        ":red-background[FAIL] The output diverges from the float32 reference from its 2nd "
        "generated token."  # the first position beyond the noise (position 1, from 0)
    )
    facts = _facts(page)
    for fact in (
        f"neuronx-cc {NEW_CC}",
        "torch-neuronx 2.13.0",
        "transformers 5.24.0",
        "Trainium trn2.48xlarge, LNC 2",
        "4 cores",
        "2026-10-01 12:03 UTC",
    ):
        assert fact in facts, fact
    order = _main_order(page)
    name = order.index("Subheader: org\\/fails")
    said = next(i for i, e in enumerate(order) if "-background[FAIL]" in e)
    first_figure = next(i for i, e in enumerate(order) if e.startswith("Metric"))
    checks = next(i for i, e in enumerate(order) if "**Failed checks**" in e)
    assert name < said < first_figure < checks
    assert said == name + 1  # directly under the name
    parameters = next(m for m in page.metric if m.label == "parameters")
    assert parameters.value == "1.23 M"  # a tiny model's count is not rounded to 0


def test_a_cpu_result_is_labelled_as_cpu(page: AppTest) -> None:
    _open(page, "org/on-cpu", compiler="2.13.0")
    assert _answer(page).endswith("The output matches the float32 reference token for token.")
    facts = _facts(page)
    assert "CPU" in facts and "1 process" in facts
    assert "inductor (torch 2.13.0)" in facts
    assert "Trainium" not in facts and "neuronx-cc" not in facts


def test_run_py_shows_its_config_block_and_downloads_whole(page: AppTest) -> None:
    _open(page, "org/fails")
    codes = [c for c in page.code if "MODEL-SUPPORT CONFIG" in c.value]
    assert len(codes) == 1
    block = codes[0].value
    assert '"model": "org/fails"' in block and "def main()" not in block
    assert not codes[0].proto.show_line_numbers
    assert not any("def main()" in c.value for c in page.code)  # the runner is not printed
    (download,) = [b for b in page.get("download_button") if "run.py" in b.proto.label]
    lines = int(download.proto.label.split("(")[1].split(" ")[0].replace(",", ""))
    assert lines > 1000  # the download is the whole file, as its label says


def test_large_json_is_collapsed(page: AppTest) -> None:
    _open(page, "org/fails")
    verification = next(j for j in page.json if '"positions"' in j.value)
    assert verification.proto.expanded is False


def test_details_lead_to_the_models_history(page: AppTest) -> None:
    _open(page, "org/fails")
    assert not any("It has results with" in m for m in _markdown(page))
    page.button(key="open-history").click().run()
    assert not page.exception
    assert page.radio(key="view").value == "History"
    assert page.selectbox(key="history-model").value == "org/fails"
    assert page.query_params["view"] == "history"


def test_a_model_on_another_stack_links_to_its_history(page: AppTest) -> None:
    _open(page, "org/older")
    assert any("has no result" in i.value for i in page.info)
    button = page.button(key="open-history")
    assert "1 result on other stacks" in button.label
    button.click().run()
    assert page.radio(key="view").value == "History"
    assert page.selectbox(key="history-model").value == "org/older"


def test_a_fail_shows_its_checks_with_figures_and_bounds_and_its_tokens(page: AppTest) -> None:
    _open(page, "org/fails")
    said = _unescaped(next(m for m in _markdown(page) if m.startswith("**Failed checks**")))
    assert "`tokens`: tokens beyond the noise 1 (bound 0)" in said
    assert "`median`: median logit error / the baseline's 8.6 (bound 3)" in said
    checks = next(d.value for d in page.dataframe if "bound" in d.value.columns)
    assert list(checks["check"]) == ["tokens", "median"]
    assert checks.set_index("check").loc["median", "value"] == 8.6
    assert checks["meaning"].str.len().min() > 20  # each check in words
    tokens = next(d.value for d in page.dataframe if "reference prefers" in d.value.columns)
    assert list(tokens["generated"]) == ["4242", "9"] and list(tokens["reference prefers"]) == [
        "17",
        "10",
    ]
    assert any("as token ids" in c.value for c in page.caption)
    assert "def fibonacci(n): return n" in [t.value for t in page.text]  # the generated text


def test_the_token_table_shows_decoded_tokens_where_the_record_has_them() -> None:
    decoded = [{**POSITIONS[1], "token_text": " banana", "reference_text": " return"}]
    table = token_table({"positions": decoded})
    assert (table.loc[0, "generated"], table.loc[0, "reference prefers"]) == (" banana", " return")


def test_an_error_answers_with_its_stage_time_and_message(page: AppTest) -> None:
    """An ERROR's answer is the stage, its time until it failed and the compiler's own message,
    before any figure; no tile is drawn for a figure it never got to, and its time is the time
    until it failed, not a wall time."""
    _open(page, "org/errors")
    assert _answer(page) == (
        ":orange-background[ERROR] The compile stage failed after 3 min 0 s; the compiler said:"
    )
    order = _main_order(page)
    said = next(i for i, e in enumerate(order) if "-background[ERROR]" in e)
    assert order[said + 1] == "Code: neuronx-cc failed: SBUF overflow"  # the message, as code
    figures = {m.label: m.value for m in page.metric}
    assert figures == {"cores": "1", "time until it failed": "3 min 0 s", "parameters": "1 B"}
    said = _unescaped(next(m for m in _markdown(page) if m.startswith("**Error class**")))
    assert "`compile`: Compiling the forward failed" in said
    assert "reason `compiler-error`: The compile stack failed" in said  # not the model's graph
    assert any(c.value == TRACEBACK for c in page.code)
    assert not any("Cut at its top" in c.value for c in page.caption)  # a whole traceback


def test_a_cut_traceback_says_where_it_was_cut() -> None:
    from model_support.viewer.failures import traceback_cut

    assert traceback_cut(TRACEBACK) is None
    tail = "\n".join(TRACEBACK.splitlines()[1:])  # run.py kept its last lines only
    said = traceback_cut(tail)
    assert said is not None and said.startswith("Cut at its top")
    assert "last 40 lines" in said


def test_an_excluded_model_says_why_and_how_to_reproduce_it(page: AppTest) -> None:
    """An EXCLUDED model's answer is its reason and the cores it would need; its Reproduce
    gives the sizing command and what would have run (run.py, on that many cores)."""
    _open(page, "org/too-large")
    assert _answer(page) == (
        ":gray-background[EXCLUDED] Not run (too-large): does not fit the maximum number of "
        "cores for a test, even sharded; it would need 64 NeuronCores, tensor parallel."
    )
    assert not page.metric  # no figure applies to a model that never ran
    codes = [c.value for c in page.code]
    assert "model-support size org/too-large" in codes
    assert any("What would have run, on 64 cores" in m for m in _markdown(page))
    (reproduce,) = [c for c in codes if c.startswith("model-support reproduce")]
    assert "--results RESULTS -o reproduce" in reproduce and "docker run" in reproduce
    assert [b for b in page.get("download_button") if "run.py" in b.proto.label]


def test_a_malformed_json_field_does_not_hide_the_rest(
    explained_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    copy = tmp_path / "results"
    shutil.copytree(explained_dataset, copy)
    [path] = [p for p in (copy / "data").glob("*.parquet") if "2.28" in p.name]
    table = pq.read_table(path)
    column = table.column("verification_json").to_pylist()
    column = ["{not json" if v else v for v in column]
    table = table.set_column(
        table.schema.get_field_index("verification_json"), "verification_json", [column]
    )
    pq.write_table(table, path)
    at = viewer_page(copy, monkeypatch, dead_hub)
    at.query_params.update(view="all", model="org/fails")
    at.run()
    assert not at.exception
    assert any("not valid JSON" in w.value for w in at.warning)
    assert any("MODEL-SUPPORT CONFIG" in c.value for c in at.code)  # the rest is still there


def test_a_stack_its_runner_pod_reported_says_so_in_the_headline() -> None:
    """The operator labels a row whose versions are only its pod's report (no declared stack
    for the image): the answer line says whose word they are."""
    row = {
        "backend": "neuron",
        "compiler": "neuronx-cc",
        "compiler_version": "2.28.7631.0",
        "library": "transformers",
        "library_version": "5.24.0",
    }
    plain = headline.stack(row)
    assert plain == "neuronx-cc 2.28.7631.0 · transformers 5.24.0"
    assert headline.stack({**row, "labels": json.dumps({"stack": "declared"})}) == plain
    reported = headline.stack({**row, "labels": json.dumps({"stack": "reported", "image": "r:1"})})
    assert reported == f"{plain} (as its runner pod reported it)"


def test_triage_separates_a_failed_compiler_from_a_graph_that_cannot_compile_once() -> None:
    """Two compile errors whose messages read alike land in different groups when their
    reasons differ: the compiler failed, or the model's decode recompiles at every step."""
    from model_support.viewer import queries

    frame = pd.DataFrame(
        {
            "model_id": ["org/a", "org/b", "org/c"],
            "result": ["ERROR", "ERROR", "ERROR"],
            "error_class": ["compile", "compile", "compile"],
            "error_reason": ["recompiles-per-step", "recompiles-per-step", "compiler-error"],
            "error": [f"RuntimeError: failed at step {step}" for step in (12, 30, 7)],
        }
    )
    groups = queries.triage(frame).set_index("signature")
    assert groups.loc[
        "compile (recompiles-per-step): RuntimeError: failed at step <n>", "models"
    ] == ("org/a, org/b")
    assert groups.loc["compile (compiler-error): RuntimeError: failed at step <n>", "models"] == (
        "org/c"
    )
