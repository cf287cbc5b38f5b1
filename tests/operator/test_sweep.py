"""`model-support sweep`: a Hub ranking (through the real client) becomes valid test resources."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import yaml
from hubserver import HubServer, Repo
from typer.testing import CliRunner

from model_support.cli import app
from model_support.operator.spec import parse_spec
from model_support.operator.sweep import LABEL_SWEEP, resource_name

CRD = Path(__file__).resolve().parents[2] / "crds" / "modelsupporttests.yaml"
runner = CliRunner()


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    repos = [
        Repo("meta-llama/Llama-3.2-1B", downloads=900, gated="manual"),
        Repo("Qwen/Qwen3-0.6B", downloads=800),
        Repo("Qwen/Qwen3-0.6b", downloads=700),  # differs only in case
        Repo("org/vision", downloads=990, pipeline_tag="image-text-to-text"),
    ]
    with HubServer(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def test_a_sweep_is_one_valid_resource_per_ranked_model(hub: HubServer, tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "sweep",
            "nightly",
            "--sort",
            "downloads",
            "--limit",
            "10",
            "--namespace",
            "tests",
            "--token-secret",
            "hf",
            "--queue",
            "trainium",
        ],
    )
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    # Text-generation only, by downloads, in rank order.
    assert [d["spec"]["model"] for d in docs] == [
        "meta-llama/Llama-3.2-1B",
        "Qwen/Qwen3-0.6B",
        "Qwen/Qwen3-0.6b",
    ]
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    names = set()
    for rank, doc in enumerate(docs, start=1):
        jsonschema.Draft4Validator(schema).validate(doc)
        parse_spec(doc["spec"])
        assert doc["kind"] == "ModelSupportTest" and doc["metadata"]["namespace"] == "tests"
        assert doc["metadata"]["labels"][LABEL_SWEEP] == "nightly"
        assert doc["metadata"]["annotations"]["modelsupport.dev/rank"] == str(rank)
        assert (
            doc["spec"]["hubTokenSecret"] == {"name": "hf"}
            and doc["spec"]["queueName"] == "trainium"
        )
        names.add(doc["metadata"]["name"])
    assert len(names) == 3  # ids differing only in case get distinct names


def test_resource_names_are_dns_labels_and_stable() -> None:
    long_id = "some-organisation/" + "a-very-long-model-name-" * 5
    for model_id in ("Qwen/Qwen3-0.6B", long_id, "x/---"):
        name = resource_name(model_id)
        assert len(name) <= 63 and name == resource_name(model_id)
        assert name[0].isalnum() and name[-1].isalnum() and name == name.lower()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sweep", "Bad_Name"], "must be a DNS label"),
        (["sweep", "ok", "--sort", "likes"], "use one of trending_score, downloads"),
        (["sweep", "ok", "--profile", "trn9"], "spec.profile"),
    ],
)
def test_bad_sweep_options_are_refused(hub: HubServer, args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_an_unreachable_hub_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    result = runner.invoke(app, ["sweep", "nightly"])
    assert result.exit_code == 2
    assert "could not be reached" in " ".join(result.output.split())
