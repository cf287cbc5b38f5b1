"""`model-support dataset publish`: one commit per publish, through the real client, against the
Hub stand-in; then the published dataset read back the ways its users read it."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from factories import NEURON_STACK, make_record
from hub_storage import HubStorage
from hubserver import HubServer
from huggingface_hub.errors import HfHubHTTPError

from model_support.config import RunConfig
from model_support.publish import PublishError, publish
from model_support.records import RunRecord, new_run_id
from model_support.script import render_script
from model_support.store import ResultsStore
from model_support.vocabulary import Result

CLI = str(Path(sys.executable).with_name("model-support"))
REPO = "org/model-support-results"
URI = f"hf://datasets/{REPO}"
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def record(model: str, result: str, neuronx_cc: str, minutes: int = 0) -> RunRecord:
    """A Neuron run of ``model`` on compiler ``neuronx_cc``, started ``minutes`` after T0."""
    when = T0 + timedelta(minutes=minutes)
    return make_record(
        model,
        Result(result),
        stack=NEURON_STACK.model_copy(update={"neuronx_cc": neuronx_cc}),
        finished=when + timedelta(minutes=2),
        run_id=new_run_id(when),
        run_py=render_script(RunConfig(model=model)),
    )


@pytest.fixture
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    store = ResultsStore(str(root))
    store.add(record("Qwen/Qwen3-0.6B", "PASS", "2.28.7631.0"))
    store.add(record("meta-llama/Llama-3.2-1B", "FAIL", "2.28.7631.0", 5))
    store.add(record("Qwen/Qwen3-0.6B", "ERROR", "2.27.100.0", 10))
    (root / "selected.yaml").write_text("models:\n  - model: Qwen/Qwen3-0.6B\n")
    return root


@pytest.fixture
def hub() -> Iterator[HubServer]:
    with HubServer(storage=HubStorage()) as server:
        yield server


def head_files(hub: HubServer) -> dict[str, bytes]:
    assert hub.storage is not None
    repo = hub.storage.datasets[REPO]
    return repo.commits[repo.head].files


def models(parquet: bytes) -> list[str]:
    return [str(m) for m in pq.read_table(io.BytesIO(parquet)).column("model_id").to_pylist()]


def test_a_publish_is_one_commit_of_the_matrix_the_card_and_the_selected_list(
    results: Path, hub: HubServer
) -> None:
    report = publish(str(results), URI, endpoint=hub.url)
    assert hub.storage is not None and hub.storage.commit_requests == 1
    files = head_files(hub)
    assert sorted(files) == [
        "README.md",
        "data/neuronx-cc-2.27.100.0__transformers-5.24.0.parquet",
        "data/neuronx-cc-2.28.7631.0__transformers-5.24.0.parquet",
        "selected.yaml",
        "snapshot.json",
    ]
    assert json.loads(files.pop("snapshot.json"))["records"] == 3
    for path, data in files.items():
        assert data == (results / path).read_bytes()  # exactly what was materialized
    assert report.commit == hub.storage.datasets[REPO].head and report.attempts == 1
    # the Parquet files went through Xet, as on the Hub; the card and the list inline
    parquet = results / "data" / "neuronx-cc-2.28.7631.0__transformers-5.24.0.parquet"
    assert hashlib.sha256(parquet.read_bytes()).hexdigest() in hub.storage.xet.by_sha256
    # the history: the repository's initial commit, then this publish
    assert len(hub.storage.datasets[REPO].commits) == 2


def test_publishing_again_without_changes_makes_no_commit(results: Path, hub: HubServer) -> None:
    first = publish(str(results), URI, endpoint=hub.url)
    again = publish(str(results), URI, endpoint=hub.url)
    assert again.commit is None and again.head == first.commit
    assert hub.storage is not None and hub.storage.commit_requests == 1


def test_many_new_results_are_one_commit_and_stale_matrix_files_go_in_it(
    results: Path, hub: HubServer
) -> None:
    publish(str(results), URI, endpoint=hub.url)
    assert hub.storage is not None
    hub.storage.commit_files(REPO, {"data/neuronx-cc-2.20.0__transformers-4.0.parquet": b"old"})
    store = ResultsStore(str(results))
    for i in range(5):
        store.add(record(f"org/model-{i}", "PASS", "2.29.0.0", 20 + i))
    report = publish(str(results), URI, endpoint=hub.url)
    assert hub.storage.commit_requests == 2  # five results, one commit
    assert report.deleted == ["data/neuronx-cc-2.20.0__transformers-4.0.parquet"]
    assert "data/neuronx-cc-2.29.0.0__transformers-5.24.0.parquet" in head_files(hub)
    assert "data/neuronx-cc-2.20.0__transformers-4.0.parquet" not in head_files(hub)


def test_a_concurrent_commit_is_retried_from_the_new_head_without_losing_it(
    results: Path, hub: HubServer
) -> None:
    publish(str(results), URI, endpoint=hub.url)
    assert hub.storage is not None
    storage = hub.storage
    # Another publisher commits while ours is on its way: the Hub answers ours 412.
    storage.before_commit.append(lambda: storage.commit_files(REPO, {"NOTES.md": b"their change"}))
    ResultsStore(str(results)).add(record("org/new", "PASS", "2.28.7631.0", 30))
    delays: list[float] = []
    report = publish(str(results), URI, endpoint=hub.url, sleep=delays.append)
    assert report.attempts == 2 and len(delays) == 1
    files = head_files(hub)
    assert files["NOTES.md"] == b"their change"  # the other commit survives
    matrix = "data/neuronx-cc-2.28.7631.0__transformers-5.24.0.parquet"
    assert files[matrix] == (results / matrix).read_bytes()
    assert report.commit == storage.datasets[REPO].head


def test_a_retry_publishes_what_the_store_holds_by_then(results: Path, hub: HubServer) -> None:
    """A record stored while a publish waits out a conflict is in what the retry commits."""
    assert hub.storage is not None
    storage = hub.storage

    def meanwhile() -> None:
        ResultsStore(str(results)).add(record("org/meanwhile", "PASS", "2.28.7631.0", 40))
        storage.commit_files(REPO, {"NOTES.md": b"their change"})

    storage.before_commit.append(meanwhile)
    report = publish(str(results), URI, endpoint=hub.url, sleep=lambda s: None)
    assert report.attempts == 2
    matrix = "data/neuronx-cc-2.28.7631.0__transformers-5.24.0.parquet"
    assert head_files(hub)[matrix] == (results / matrix).read_bytes()
    assert "org/meanwhile" in models(head_files(hub)[matrix])
    assert json.loads(head_files(hub)["snapshot.json"])["records"] == 4


def test_an_older_snapshot_is_never_committed_over_a_newer_one(
    tmp_path: Path, hub: HubServer
) -> None:
    """A publisher whose store lags behind what the Hub holds is refused and changes nothing."""
    behind, ahead = ResultsStore(str(tmp_path / "behind")), ResultsStore(str(tmp_path / "ahead"))
    first = record("Qwen/Qwen3-0.6B", "PASS", "2.28.7631.0")
    behind.add(first)
    ahead.add(first)
    ahead.add(record("org/later", "FAIL", "2.28.7631.0", 5))  # recorded after the first
    published = publish(ahead.uri, URI, endpoint=hub.url)
    with pytest.raises(PublishError, match=r"holds a newer snapshot \(2 records"):
        publish(behind.uri, URI, endpoint=hub.url)
    assert hub.storage is not None and hub.storage.datasets[REPO].head == published.commit
    matrix = "data/neuronx-cc-2.28.7631.0__transformers-5.24.0.parquet"
    assert "org/later" in models(head_files(hub)[matrix])


def test_conflicts_that_never_end_give_up_with_the_hubs_error(
    results: Path, hub: HubServer
) -> None:
    publish(str(results), URI, endpoint=hub.url)
    assert hub.storage is not None
    storage = hub.storage
    ResultsStore(str(results)).add(record("org/new", "PASS", "2.28.7631.0", 30))

    def always_conflict() -> None:
        storage.commit_files(REPO, {"NOTES.md": os.urandom(8)})
        storage.before_commit.append(always_conflict)

    storage.before_commit.append(always_conflict)
    with pytest.raises(HfHubHTTPError) as caught:
        publish(str(results), URI, endpoint=hub.url, max_attempts=3, sleep=lambda s: None)
    assert caught.value.response.status_code == 412


def test_only_dataset_repositories_are_published_to() -> None:
    for bad in ("hf://org/name", "hf://buckets/org/name", "s3://bucket/x", "hf://datasets/org"):
        with pytest.raises(PublishError, match="hf://datasets/ORG/NAME"):
            publish("unused", bad)


READERS = textwrap.dedent(
    """
    import json, sys
    import pandas as pd
    from datasets import load_dataset
    from model_support.viewer.data import list_stack_files, read_columns

    X = "Qwen/Qwen3-0.6B"
    uri = "hf://datasets/{repo}"
    # the README's query, verbatim, on the published dataset
    rows = pd.read_parquet(uri + "/data")[lambda d: d.model_id == X][["neuronx_cc", "library", "library_version", "neuron_cores", "result"]]
    stacks = list_stack_files(uri)
    latest = [s for s in stacks if s.compiler_version == "2.28.7631.0"]
    viewer = read_columns(uri, [latest[0].path], ["model_id", "result"])
    loaded = load_dataset("{repo}", split="train")
    from streamlit.testing.v1 import AppTest
    page = AppTest.from_file(sys.argv[1], default_timeout=60)
    page.run()
    selected = page.dataframe[0].value if not page.exception else None
    page = AppTest.from_file(sys.argv[1], default_timeout=60)
    page.query_params["model"] = X
    page.run()
    one_file = load_dataset("{repo}", "neuronx-cc-2.27.100.0__transformers-5.24.0", split="train")
    print(json.dumps({{
        "pandas": sorted(zip(rows.neuronx_cc, rows.result)),
        "stacks": sorted(s.compiler_label for s in stacks),
        "viewer": sorted(zip(viewer.model_id, viewer.result)),
        "datasets": sorted(zip(loaded["model_id"], loaded["result"])),
        "config": list(one_file["result"]),
        "viewer_page": None if selected is None else sorted(zip(selected["model"], selected["result"])),
        "viewer_details": [c.value for c in page.code if "MODEL-SUPPORT CONFIG" in c.value],
        "viewer_errors": [str(e.value) for e in page.exception],
    }}))
    """
)


@pytest.mark.slow
def test_the_published_dataset_reads_with_pandas_the_viewer_and_datasets(
    results: Path, hub: HubServer, tmp_path: Path
) -> None:
    done = subprocess.run(
        [CLI, "dataset", "publish", URI, "--results", str(results)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_ENDPOINT": hub.url},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "published 5 files" in " ".join(done.stderr.split())
    script = tmp_path / "read.py"
    script.write_text(READERS.format(repo=REPO))
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home")}
    app = str(Path(__file__).resolve().parents[1] / "viewer" / "app.py")
    env["MODEL_SUPPORT_RESULTS"] = URI
    env["MODEL_SUPPORT_HUB_ENDPOINT"] = "http://127.0.0.1:9"  # rankings unreachable: not needed
    read = subprocess.run(
        [sys.executable, str(script), app],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert read.returncode == 0, read.stderr[-4000:]
    seen = json.loads(read.stdout.strip().splitlines()[-1])
    assert seen["pandas"] == [["2.27.100.0", "ERROR"], ["2.28.7631.0", "PASS"]]
    assert seen["stacks"] == ["neuronx-cc 2.27.100.0", "neuronx-cc 2.28.7631.0"]
    assert seen["viewer"] == [["Qwen/Qwen3-0.6B", "PASS"], ["meta-llama/Llama-3.2-1B", "FAIL"]]
    assert seen["datasets"] == [
        ["Qwen/Qwen3-0.6B", "ERROR"],
        ["Qwen/Qwen3-0.6B", "PASS"],
        ["meta-llama/Llama-3.2-1B", "FAIL"],
    ]
    assert seen["config"] == ["ERROR"]
    # the viewer itself on the published dataset: the selected list, then a model's details
    assert seen["viewer_errors"] == []
    assert seen["viewer_page"] == [["Qwen/Qwen3-0.6B", "PASS"]]
    [config_block] = seen["viewer_details"]  # run.py's config block
    assert '"model": "Qwen/Qwen3-0.6B"' in config_block


def test_the_publish_command_refuses_a_bad_repository_uri(results: Path) -> None:
    done = subprocess.run(
        [CLI, "dataset", "publish", "hf://org/name", "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "hf://datasets/ORG/NAME" in " ".join(done.stderr.split())


def test_a_store_path_is_a_path_not_a_pattern(tmp_path: Path, hub: HubServer) -> None:
    """`res[1]` publishes its own matrix, never the files of a folder the brackets match."""
    mine, other = tmp_path / "res[1]", tmp_path / "res1"
    ResultsStore(str(mine)).add(record("Qwen/Qwen3-0.6B", "PASS", "2.28.7631.0"))
    ResultsStore(str(other)).add_and_materialize(record("org/other", "FAIL", "2.27.100.0"))
    publish(str(mine), URI, endpoint=hub.url)
    assert sorted(p for p in head_files(hub) if p.startswith("data/")) == [
        "data/neuronx-cc-2.28.7631.0__transformers-5.24.0.parquet"
    ]


def test_a_store_that_makes_no_matrix_never_empties_the_published_dataset(
    tmp_path: Path, hub: HubServer
) -> None:
    """A store with a records folder but no matrix to publish (its records moved away) is
    refused, even over a dataset with no snapshot to compare with (one published by hand):
    committing it would delete every data file of the published dataset."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(endpoint=hub.url)
    api.create_repo(REPO, repo_type="dataset")
    data = [CommitOperationAdd("data/by-hand.parquet", b"PAR1 by hand")]
    api.create_commit(REPO, data, commit_message="by hand", repo_type="dataset")
    published = head_files(hub)
    emptied = tmp_path / "emptied"
    ResultsStore(str(emptied)).add(record("Qwen/Qwen3-0.6B", "PASS", "2.28.7631.0"))
    for moved in (emptied / "records").iterdir():
        moved.unlink()
    with pytest.raises(PublishError, match="nothing is published"):
        publish(str(emptied), URI, endpoint=hub.url)
    assert head_files(hub) == published and "data/by-hand.parquet" in published
