"""What a first-time visitor meets first: the answer of a result in one plain sentence, a list
with its counts at a glance and a one-line device note, empty states that say so, links and
commands that work elsewhere (no Hub link for a local checkpoint, no local path in a reproduce
command), and a ranking that says where it came from."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import factories
import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest
from viewer_support import FAIL_VERDICT, POSITIONS, viewer_page

from model_support.cli.commands_viewer import SERVER_OPTIONS
from model_support.rankings import RankedModel, Ranking, save_snapshot
from model_support.store import ResultsStore
from model_support.viewer import answer, details, views
from model_support.vocabulary import ExclusionReason, Result


def _unescaped(text: str) -> str:
    return text.replace("\\", "")


# ---------------------------------------------------------------------------------------------
# The answer's sentence


def test_a_fail_names_its_first_diverging_module_and_how_far_it_is_off() -> None:
    verification = {
        **json.loads(FAIL_VERDICT.model_dump_json()),
        "first_divergence": {
            "status": "found",
            "module": "model.layers.1.mlp.down_proj",
            "kind": "Linear",
            "error_ratio": 398.2,
        },
    }
    said = answer.answer({"result": "FAIL"}, verification)
    assert said.sentence == (
        "The output diverges from the float32 reference from its 2nd generated token; the first "
        "module that diverges is model.layers.1.mlp.down_proj, 398x a correct run's error."
    )
    # Where the search found it, when the record says (a decode step, the prefill).
    verification["first_divergence"] |= {"phase": "decode", "step": 18}
    assert answer.first_diverging_module(verification) == (
        "the first module that diverges is model.layers.1.mlp.down_proj (from decode step 18), "
        "398x a correct run's error"
    )


def test_a_fail_without_a_bad_token_says_which_figure_drifted() -> None:
    """A FAIL by its logits alone (every token the reference's) says which error, by how much."""
    row = {"result": "FAIL", "failed_checks": ["median"], "error_ratio": 8.6}
    said = answer.answer(row, {"parameters": {"max_error_ratio": 3.0}})
    assert said.sentence == (
        "The output drifts from the float32 reference: its median logit error is 8.6x a "
        "correct run's (bound 3x)."
    )


def test_a_pass_with_a_near_tie_explains_why_it_is_not_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    row = {"result": "PASS", "verified_exact": False, "mismatches": 1, "near_ties": 1}
    said = answer.answer(row, {"method": "tokens", "positions": POSITIONS})
    assert said.sentence.startswith("The output matches the float32 reference within its noise")
    assert "1 generated token differ" in said.sentence and "1 near tie" in said.sentence
    assert answer.unticked_exact({**row, "verified_exact": True}) is None
    # On the page, the verdict's unticked `exact` says why beside it.
    store = ResultsStore(str(tmp_path))
    verdict = {"passed": True, "exact": False, "mismatches": 1, "near_ties": 1, "bad_tokens": 0}
    store.add(factories.make_record("org/tie", document={"verification": verdict}))
    store.materialize()
    at = viewer_page(tmp_path, monkeypatch, dead_hub, view="all", model="org/tie").run()
    assert not at.exception
    assert any(c.value.startswith("`exact` is unticked: 1 generated token") for c in at.caption)


def test_a_timeout_and_an_unverified_run_answer_plainly() -> None:
    started = datetime(2026, 1, 1, tzinfo=UTC)
    stopped = datetime(2026, 1, 1, 1, tzinfo=UTC)
    row = {"result": "TIMEOUT", "started_at": started, "finished_at": stopped, "error": "past"}
    said = answer.answer(row, {})
    assert said.sentence == "It ran past its time limit and was stopped after 1 h 0 min."
    assert said.message == "past"
    assert answer.answer({"result": "UNVERIFIED"}, {}).sentence.startswith(
        "It ran to the end, but its test did not verify the output"
    )
    long = "\n".join(f"line {i}" for i in range(10))
    shown = answer.answer({"result": "ERROR", "stage": "load", "error": long}, {}).message
    assert shown is not None and shown.endswith("… (4 more lines below)")


def test_figures_that_do_not_apply_are_left_out() -> None:
    row = {
        "result": "ERROR",
        "neuron_cores": 2,
        "started_at": datetime(2026, 1, 1, tzinfo=UTC),
        "finished_at": datetime(2026, 1, 1, 0, 0, 41, tzinfo=UTC),
        "wall_time_s": None,
        "decode_tokens_per_s": float("nan"),
    }
    assert details.figures(row) == [("cores", "2"), ("time until it failed", "41.0 s")]
    assert details.figures({"result": "EXCLUDED"}) == []


# ---------------------------------------------------------------------------------------------
# The lists


def _cpu_store(root: Path) -> ResultsStore:
    """A CPU stack: a PASS, a FAIL, a model tested from a local checkpoint, and a too-large
    model, EXCLUDED before any backend was resolved ("auto")."""
    store = ResultsStore(str(root))
    store.add(factories.make_record("org/passes", neuron=False))
    store.add(factories.make_record("org/fails", Result.FAIL, neuron=False))
    store.add(
        factories.make_record("/checkpoints/tiny-llama", neuron=False, model_id="demo/tiny-llama")
    )
    excluded = factories.make_record(
        "org/huge", Result.EXCLUDED, neuron=False, exclusion=ExclusionReason.TOO_LARGE
    )
    document = excluded.document.model_copy(
        update={"backend": "auto", "compile_backend": "inductor", "stack": factories.CPU_STACK}
    )
    store.add(excluded.model_copy(update={"document": document}))
    store.materialize()
    (root / "selected.yaml").write_text(
        "".join(f"- model: {m}\n  task: text-generation\n" for m in ("org/passes", "org/fails"))
        + "- model: org/huge\n  task: text-generation\n- model: org/untested\n"
    )
    return store


@pytest.fixture
def cpu_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str) -> AppTest:
    _cpu_store(tmp_path)
    return viewer_page(tmp_path, monkeypatch, dead_hub)


def test_selected_says_its_counts_at_a_glance_and_where_it_ran_in_one_line(
    cpu_page: AppTest,
) -> None:
    cpu_page.run()
    assert not cpu_page.exception
    (counts,) = [m.value for m in cpu_page.markdown if "curated list" in m.value]
    assert counts.endswith(
        "**4 models** :green-badge[PASS 1] :red-badge[FAIL 1] :orange-badge[ERROR 0] "
        ":gray-badge[EXCLUDED 1] :gray-badge[not tested 1]"
    )
    notes = [c.value for c in cpu_page.caption if "Trainium" in c.value]
    # One line, naming only where the runs ran (not the EXCLUDED row's unresolved "auto").
    assert notes == [
        "Ran on CPU, not Trainium: whether each model runs unmodified through torch.compile; "
        "the times and memory are not Trainium's."
    ]
    assert not cpu_page.info  # no box pushes the list down


def test_a_model_tested_from_a_local_checkpoint_gets_no_hub_link(cpu_page: AppTest) -> None:
    cpu_page.query_params["view"] = "all"
    cpu_page.run()
    links = cpu_page.dataframe[0].value.set_index("model")["Hub"]
    assert links["org/passes"].endswith("/org/passes")
    assert pd.isna(links["demo/tiny-llama"])  # "demo" is no organisation on the Hub


def test_a_search_that_matches_nothing_says_so_and_clears(cpu_page: AppTest) -> None:
    cpu_page.query_params.update(view="all", q="no-such-model")
    cpu_page.run()
    assert not cpu_page.dataframe  # no empty table stub
    assert [i.value for i in cpu_page.info] == ["No model in this view matches `no-such-model`."]
    assert not [h for h in cpu_page.header if h.value == "Model details"]
    cpu_page.button(key="clear-search").click().run()
    assert cpu_page.text_input(key="q").value == ""
    assert len(cpu_page.dataframe[0].value) == 4
    assert "q" not in cpu_page.query_params


def test_triage_counts_a_single_failure_in_the_singular(cpu_page: AppTest) -> None:
    cpu_page.query_params["view"] = "triage"
    cpu_page.run()
    assert any(c.value == "1 group of 1 failure" for c in cpu_page.caption)


def test_an_empty_store_draws_no_table_stubs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    for view in ("selected", "all", "triage"):
        at = viewer_page(tmp_path, monkeypatch, dead_hub, view=view).run()
        assert not at.exception
        assert not at.dataframe and not at.get("selectbox")[4:]  # the sidebar's pickers only
        assert any("No results yet" in i.value for i in at.info)


def test_no_failures_draws_no_table_stub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    store = ResultsStore(str(tmp_path))
    store.add(factories.make_record("org/passes"))
    store.materialize()
    at = viewer_page(tmp_path, monkeypatch, dead_hub, view="triage").run()
    assert [s.value for s in at.success] == ["No failures on this stack."]
    assert not at.dataframe


# ---------------------------------------------------------------------------------------------
# Commands and rankings that hold elsewhere


def test_a_reproduce_command_names_a_reachable_store_or_says_what_to_replace() -> None:
    assert details.results_argument("s3://bucket/results") == ("s3://bucket/results", None)
    assert details.results_argument("hf://datasets/org/results")[1] is None
    for local in ("/home/me/results", "results", "file:///srv/results"):
        name, replace = details.results_argument(local)
        assert name == "RESULTS" and replace is not None and local not in replace


def test_a_ranking_from_another_endpoint_says_where_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    """A ranking stored by a stand-in Hub (a test's, a benchmark's) is never presented as the
    Hub's: the page names the endpoint it came from."""
    _cpu_store(tmp_path)
    stand_in = "http://127.0.0.1:9/"
    save_snapshot(
        str(tmp_path),
        Ranking(
            task="text-generation",
            sort="trending_score",
            endpoint=stand_in,
            fetched_at=datetime(2026, 11, 30, tzinfo=UTC),
            models=[RankedModel(rank=1, model_id="org/passes", trending_score=1e9)],
        ),
    )
    at = viewer_page(tmp_path, monkeypatch, dead_hub, view="trending", task="text-generation")
    at.run()
    assert not at.exception
    (said,) = [_unescaped(w.value) for w in at.warning]
    assert said.startswith("The Hub could not be reached; showing the ranking stored with")
    assert f"from `{stand_in}`, not the Hugging Face Hub (https://huggingface.co)" in said


def test_the_served_viewer_hides_streamlits_own_toolbar() -> None:
    options = dict(zip(SERVER_OPTIONS[::2], SERVER_OPTIONS[1::2], strict=True))
    assert options["--client.toolbarMode"] == "viewer"


def test_stack_names_are_shortened_apart_and_whole_in_the_pickers_help(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    long = "model_support.faults:dense_miscompiler 2.13.0+cpu"
    assert views.short_label(long, 188) == "dense_miscompiler 2.13.0+cpu"
    assert views.short_label("neuronx-cc 2.21.33363.0+82129205", 168) == (
        "neuronx-cc 2.21.33363.0+…"
    )
    assert views.short_label("neuronx-cc 2.28.7631.0", 168) == "neuronx-cc 2.28.7631.0"
    store = ResultsStore(str(tmp_path))
    document = {"backend": "cpu", "compile_backend": long.split()[0]}
    store.add(factories.make_record("org/a", neuron=False, document=document))
    store.materialize()
    at = viewer_page(tmp_path, monkeypatch, dead_hub, view="all").run()
    picker = at.selectbox(key="compiler")
    assert picker.value == "model_support.faults:dense_miscompiler 2.13.0"
    assert picker.format_func(picker.value) == "dense_miscompiler 2.13.0"
    assert _unescaped(picker.help) == "Whole name: `model_support.faults:dense_miscompiler 2.13.0`"


def test_charts_tell_two_stacks_of_one_package_apart_and_count_their_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    store = ResultsStore(str(tmp_path))
    for backend, result in (
        ("moe_crash_compiler", Result.ERROR),
        ("dense_miscompiler", Result.FAIL),
    ):
        for model in ("org/a", "org/b"):
            document = {"backend": "cpu", "compile_backend": f"model_support.faults:{backend}"}
            store.add(
                factories.make_record(
                    model,
                    result if model == "org/a" else Result.PASS,
                    neuron=False,
                    document=document,
                )
            )
    store.materialize()
    at = viewer_page(tmp_path, monkeypatch, dead_hub, view="charts").run()
    assert not at.exception
    (chart,) = at.get("vega_lite_chart")
    spec = json.loads(chart.proto.spec)
    (data,) = chart.proto.datasets
    bars = pa.ipc.open_stream(data.data.data).read_all().to_pandas()
    limit = spec["layer"][0]["encoding"]["x"]["axis"]["labelLimit"]
    assert spec["layer"][0]["encoding"]["x"]["field"] == "stack"
    # Each bar's name is whole where it fits its band, and fits the axis (never cut to the
    # package's prefix both share).
    assert sorted(bars["stack"]) == [
        "model_support.faults:dense_miscompiler 2.13.0",
        "model_support.faults:moe_crash_compiler 2.13.0",
    ]
    assert all(views.text_px(name) <= limit for name in bars["stack"])
    assert spec["layer"][1]["encoding"]["text"]["field"] == "runs"
    assert list(bars["runs"]) == ["1 of 2 runs passed", "1 of 2 runs passed"]  # on each bar
    assert views.short_label("model_support.faults:moe_crash_compiler 2.13.0", 170) == (
        "moe_crash_compiler 2.13.0"
    )
    # The History chart's legend likewise, the library kept.
    assert views.short_stack_label(
        "model_support.faults:moe_crash_compiler 2.13.0+cpu · transformers 5.24.0", 340
    ) == ("moe_crash_compiler 2.13.0+cpu · transformers 5.24.0")
