"""The viewer with the tasks beyond text generation: their Hub rankings (Trending, Downloads)
beside our results, and the details of an embeddings, classification or text-to-image verdict."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from hubserver import HubServer, Repo
from PIL import Image
from streamlit.testing.v1 import AppTest
from viewer_support import START, make_record

from model_support.records import MetricStatistics, Pictures, RunRecord, Verification
from model_support.store import ResultsStore
from model_support.viewer import output, queries
from model_support.vocabulary import Result, Task

APP = str(Path(__file__).resolve().parents[2] / "viewer" / "app.py")

EMBEDDING_VERDICT = Verification(
    passed=True,
    method="embeddings",
    failed_checks=[],
    error_ratio=0.87,
    peak_ratio=0.9,
    mismatches=0,
    near_ties=0,
    bad_tokens=0,
    metrics=[
        MetricStatistics(
            check="cosine",
            what="angle to the reference embedding (radians)",
            items=8,
            median_device=0.0068,
            median_baseline=0.0078,
            median_ratio=0.87,
            median_bound=3.0,
            peak_device=0.008,
            peak_baseline=0.0089,
            peak_ratio=0.9,
            peak_bound=4.0,
        )
    ],
    items=[{"item": i, "cosine": 0.99997, "ranking_swaps": 0} for i in range(8)],
)


def _task_record(model: str, task: Task, verification: Verification, text: list[str]) -> RunRecord:
    record = make_record(model, task.value, "PASS", "2.28.7631.0", START + timedelta(days=2))
    document = record.document.model_copy(update={"verification": verification, "text": text})
    return record.model_copy(update={"document": document})


@pytest.fixture
def results(tmp_path: Path) -> Path:
    store = ResultsStore(str(tmp_path))
    store.add(_task_record("org/embedder", Task.SENTENCE_SIMILARITY, EMBEDDING_VERDICT, []))
    classifier = EMBEDDING_VERDICT.model_copy(
        update={"method": "classification", "metrics": [], "items": []}
    )
    store.add(_task_record("org/classifier", Task.TEXT_CLASSIFICATION, classifier, ["prose"]))
    store.materialize()
    return tmp_path


@pytest.fixture
def task_hub() -> Iterator[str]:
    repos = [
        Repo("org/embedder", pipeline_tag="sentence-similarity", downloads=500, trending_score=9),
        Repo("org/other-embedder", pipeline_tag="sentence-similarity", downloads=900),
        Repo("org/sd", pipeline_tag="text-to-image", library_name="diffusers", downloads=70),
        Repo("org/whisper", pipeline_tag="automatic-speech-recognition", downloads=60),
    ]
    with HubServer(repos) as server:
        yield server.url


def _page(results: Path, monkeypatch: pytest.MonkeyPatch, **params: str) -> AppTest:
    monkeypatch.setenv("MODEL_SUPPORT_RESULTS", str(results))
    page = AppTest.from_file(APP, default_timeout=60)
    page.query_params.update(params)
    page.run()
    assert not page.exception, page.exception
    return page


def test_rankings_cover_every_task_with_our_results(
    results: Path, task_hub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_SUPPORT_HUB_ENDPOINT", task_hub)
    page = _page(results, monkeypatch, view="downloads")
    headers = [h.value.replace("\\", "") for h in page.subheader]  # shown literally: escaped
    assert headers == [t.value for t in Task]  # one ranking per task, in the vocabulary's order
    ranked = ["sentence-similarity", "automatic-speech-recognition", "text-to-image"]
    # A task the Hub ranks no model of says so (no empty table).
    unranked = [
        c.value.replace("\\", "") for c in page.caption if c.value.startswith("The Hub ranks no")
    ]
    assert unranked == [
        f"The Hub ranks no {t.value} models." for t in Task if t.value not in ranked
    ]
    tables = {h: page.dataframe[i].value for i, h in enumerate(h for h in headers if h in ranked)}
    similarity = tables["sentence-similarity"].set_index("model")
    assert list(similarity.index) == ["org/other-embedder", "org/embedder"]  # by downloads
    assert similarity.loc["org/embedder", "result"] == Result.PASS.value
    assert similarity.loc["org/other-embedder", "result"] == queries.UNTESTED
    assert list(tables["text-to-image"]["model"]) == ["org/sd"]
    assert list(tables["automatic-speech-recognition"]["model"]) == ["org/whisper"]


def test_an_unreachable_hub_is_probed_once_for_all_tasks(
    results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from model_support import rankings

    probes: list[str] = []
    real = rankings.fetch_ranking

    def counted(task: str, *args: object, **kwargs: object) -> rankings.Ranking:
        probes.append(task)
        return real(task, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rankings, "fetch_ranking", counted)
    monkeypatch.setenv("MODEL_SUPPORT_HUB_ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    page = _page(results, monkeypatch, view="trending")
    assert probes == ["text-generation"]
    (warning,) = [w.value for w in page.warning]
    assert all(t.value in warning.replace("\\", "") for t in Task)  # escaped Markdown


def test_details_of_an_embeddings_verdict_show_its_measures(
    results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = _page(results, monkeypatch, view="all", model="org/embedder")
    frames = [d.value for d in page.dataframe]
    measures = next(f for f in frames if "measure" in f.columns)
    assert list(measures["measure"]) == ["cosine"]
    assert measures.loc[0, "median ratio"] == pytest.approx(0.87)
    assert any("ranking_swaps" in f.columns for f in frames)  # per-sentence figures
    assert any("embeddings" in c.value for c in page.caption)


def test_details_of_a_classifier_name_its_prediction(
    results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = _page(results, monkeypatch, view="all", model="org/classifier")
    # What the pod printed is its claim, and the page says so.
    assert "**Predicted class per input** (as the run reported it)" in [
        m.value for m in page.markdown
    ]
    assert "prose" in [t.value for t in page.text]


def test_verdict_measures_are_empty_for_a_text_verdict() -> None:
    assert queries.verdict_measures(
        json.loads(Verification(error_ratio=1.0).model_dump_json())
    ).empty
    assert queries.output_label("text-generation") == "Generated text"


def _record(results: Path, model_id: str) -> RunRecord:
    store = ResultsStore(str(results))
    (run_id,) = (
        store.matrix(columns=["model_id", "run_id"]).set_index("model_id").loc[[model_id], "run_id"]
    )
    return store.get(str(run_id))


def _details(results: Path, monkeypatch: pytest.MonkeyPatch, record: RunRecord) -> AppTest:
    """The details of ``record`` on its own stack (a faulty compile backend is a stack of its
    own)."""
    from model_support.viewer.data import list_stack_files

    (stack,) = {
        f.compiler_label
        for f in list_stack_files(str(results))
        if f.compiler_label.split()[0] == record.document.compile_backend
    }
    return _page(results, monkeypatch, view="all", model=record.model_id, compiler=stack)


@pytest.mark.slow
def test_a_classifier_shows_its_label_per_input_beside_the_references(
    task_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.py records each input's predicted label and the float32 reference's; the details
    show them side by side with the inputs, marking where they differ (a real FAIL)."""
    model = "local/tiny-vit-classifier"
    record = _record(task_dataset, model)
    assert record.document.result == Result.FAIL
    items = record.document.verification.items
    differing = [i for i in items if i["label"] != i["reference_label"]]
    assert len(differing) == 1  # the negated row, and only it, predicts another label
    page = _details(task_dataset, monkeypatch, record)
    labels = next(d.value for d in page.dataframe if "predicted (device)" in d.value.columns)
    assert list(labels["input"]) == record.document.prompts  # the test images by name
    assert list(labels["predicted (device)"]) == record.document.text
    assert list(labels["reference"]) == [i["reference_label"] for i in items]
    marked = labels[labels["device vs reference"] == output.DIFFERS]
    assert list(marked["predicted (device)"]) == [i["label"] for i in differing]
    assert list(marked["reference"]) == [i["reference_label"] for i in differing]
    assert set(labels["device vs reference"]) == {output.SAME, output.DIFFERS}
    captions = [c.value for c in page.caption]
    assert f"{len(differing)} of {len(items)} inputs" in " ".join(captions)
    # A classifier's FAIL shows no text-generation token table.
    assert "**The float32 reference prefers**" not in [m.value for m in page.markdown]


@pytest.mark.slow
def test_a_passing_classifier_marks_no_difference(
    task_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = "local/tiny-bert-classifier"
    record = _record(task_dataset, model)
    page = _details(task_dataset, monkeypatch, record)
    labels = next(d.value for d in page.dataframe if "predicted (device)" in d.value.columns)
    assert list(labels["predicted (device)"]) == record.document.text
    assert list(labels["input"]) == record.document.prompts
    same = [
        output.SAME if i["label"] == i["reference_label"] else output.DIFFERS
        for i in record.document.verification.items
    ]
    assert list(labels["device vs reference"]) == same


@pytest.mark.slow
def test_a_text_to_image_run_shows_its_pictures_beside_the_references(
    task_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = "local/tiny-stable-diffusion"
    record = _record(task_dataset, model)
    pictures = record.document.verification.images
    assert pictures is not None and pictures.error is None
    prompts = record.document.prompts
    assert len(pictures.device) == len(pictures.reference) == len(prompts)
    page = _details(task_dataset, monkeypatch, record)
    assert any(m.value.startswith("**Pictures drawn**") for m in page.markdown)
    shown = [image.captions for image in page.image]
    assert shown == [["the device"], ["the float32 reference"]] * len(prompts)
    assert all(url.endswith(".png") for image in page.image for url in image.value)
    captions = [c.value.replace("\\", "") for c in page.caption]  # shown literally: escaped
    for index, prompt in enumerate(prompts):
        assert f"prompt {index + 1}: {prompt!r}" in captions


def test_only_base64_pngs_are_taken_for_pictures() -> None:
    assert output.picture(base64.b64encode(b"<svg onload=alert(1)>").decode()) is None
    assert output.picture("not base64!") is None
    assert output.picture(None) is None
    png = io.BytesIO()
    Image.new("RGB", (4, 4), (10, 20, 30)).save(png, format="PNG")
    assert output.picture(base64.b64encode(png.getvalue()).decode()) == png.getvalue()


def test_pictures_not_drawn_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ResultsStore(str(tmp_path))
    verdict = EMBEDDING_VERDICT.model_copy(
        update={
            "method": "latents",
            "images": Pictures(max_side=128, error="ValueError: latents of shape (1, 16, 64)"),
        }
    )
    store.add(_task_record("org/sd", Task.TEXT_TO_IMAGE, verdict, []))
    store.materialize()
    page = _page(tmp_path, monkeypatch, view="all", model="org/sd")
    assert "No pictures were drawn: ValueError: latents of shape (1, 16, 64)" in [
        c.value.replace("\\", "") for c in page.caption
    ]
    assert not page.image
