"""`model-support sweep`: a Hub ranking (through the real client) becomes valid test resources."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hubserver import HubServer, Repo
from test_operator_manifests import cel_violations
from typer.testing import CliRunner

from model_support.cli import app
from model_support.operator.resource import ANNOTATION_MODEL, LABEL_SWEEP
from model_support.operator.spec import parse_spec
from model_support.operator.sweep_manifests import child_name

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
    # Text-generation only (the top 3 by downloads), sorted by name, not by rank.
    assert sorted(d["spec"]["model"] for d in docs) == [
        "Qwen/Qwen3-0.6B",
        "Qwen/Qwen3-0.6b",
        "meta-llama/Llama-3.2-1B",
    ]
    names = [d["metadata"]["name"] for d in docs]
    assert names == sorted(names) and len(set(names)) == 3  # case-only differences stay apart
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for doc in docs:
        jsonschema.Draft4Validator(schema).validate(doc)
        parse_spec(doc["spec"])
        meta = doc["metadata"]
        assert doc["kind"] == "ModelSupportTest" and meta["namespace"] == "tests"
        assert meta["labels"][LABEL_SWEEP] == "nightly"
        # The sweep and the profile are in the name; nothing volatile (no rank) is annotated;
        # Argo CD and Flux are told not to prune a test whose model left the ranking.
        assert meta["name"] == child_name("nightly", doc["spec"]["model"], "trn2")
        assert meta["name"].startswith("nightly-trn2-")
        assert meta["annotations"] == {
            ANNOTATION_MODEL: doc["spec"]["model"],
            "argocd.argoproj.io/sync-options": "Prune=false",
            "kustomize.toolkit.fluxcd.io/prune": "disabled",
        }
        assert (
            doc["spec"]["hubTokenSecret"] == {"name": "hf"}
            and doc["spec"]["queueName"] == "trainium"
        )


def test_sweeps_and_profiles_never_share_a_resource_and_a_reranking_is_a_small_diff(
    hub: HubServer,
) -> None:
    def generate(*args: str) -> str:
        result = runner.invoke(app, ["sweep", *args, "--sort", "downloads", "--limit", "2"])
        assert result.exit_code == 0, result.output
        return result.stdout

    def names(text: str) -> set[str]:
        return {d["metadata"]["name"] for d in yaml.safe_load_all(text)}

    nightly = generate("nightly")
    assert names(nightly).isdisjoint(names(generate("weekly")))
    assert names(nightly).isdisjoint(names(generate("nightly", "--profile", "trn1")))
    # Re-ranked (same top 2, other order): the same bytes. A new entrant: only its document
    # is added and the leaver's removed; the model that stayed is unchanged.
    hub.repos["Qwen/Qwen3-0.6B"].downloads = 950
    assert generate("nightly") == nightly
    hub.repos["Qwen/Qwen3-0.6b"].downloads = 999
    after = list(yaml.safe_load_all(generate("nightly")))
    before = list(yaml.safe_load_all(nightly))
    kept = [d for d in before if d["spec"]["model"] == "Qwen/Qwen3-0.6B"]
    assert kept and kept[0] in after
    assert {d["spec"]["model"] for d in after} == {"Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6b"}


def test_resource_names_are_dns_labels_and_stable() -> None:
    long_id = "some-organisation/" + "a-very-long-model-name-" * 5
    for model_id in ("Qwen/Qwen3-0.6B", long_id, "x/---"):
        for sweep, profile in (("nightly", "trn2"), ("s" * 40, "inf2"), ("s", None)):
            name = child_name(sweep, model_id, profile)
            assert len(name) <= 63 and name == child_name(sweep, model_id, profile)
            assert name[0].isalnum() and name[-1].isalnum() and name == name.lower()
            assert name.startswith(f"{sweep}-{profile}-" if profile else f"{sweep}-")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sweep", "Bad_Name"], "must be a DNS label"),
        (["sweep", "ok", "--sort", "stars"], "use one of trending_score, downloads, likes"),
        (["sweep", "s" * 41], "use at most 40"),
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


REFUSED = {
    "org/_leading-underscore": "spec.model: String should match pattern",
    "org/" + "m" * 200: "spec.model: String should have at most 200 characters",
}
"""Hub ids the CRD refuses (its model pattern, its length), as a ranking can bring them."""


def api_refusals(doc: dict[str, Any]) -> list[str]:
    """What the API server says of a test: its schema's errors, then its CEL rules' messages."""
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    errors = [e.message for e in jsonschema.Draft4Validator(schema).iter_errors(doc)]
    return errors + cel_violations(yaml.safe_load(CRD.read_text()), doc["spec"])


def test_a_model_the_crd_refuses_is_skipped_by_name_and_the_rest_is_written(
    hub: HubServer, tmp_path: Path
) -> None:
    for i, model in enumerate(REFUSED):
        hub.add(Repo(model, downloads=2000 + i))  # ranked first: nothing after may be blocked
    output = tmp_path / "nightly.yaml"
    result = runner.invoke(app, ["sweep", "nightly", "--limit", "10", "-o", str(output)])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(output.read_text()))
    assert sorted(d["spec"]["model"] for d in docs) == [
        "Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6b", "meta-llama/Llama-3.2-1B",
    ]  # fmt: skip
    for doc in docs:
        assert api_refusals(doc) == []
    said = "".join(result.stderr.split())  # rich wraps a long id anywhere
    for model, reason in REFUSED.items():
        line = f"skipped {model}: the API server would refuse its test ({reason}"
        assert "".join(line.split()) in said
        # The API server refuses it indeed: what the generated test would have been.
        refused = {**docs[0], "spec": {**docs[0]["spec"], "model": model}}
        assert api_refusals(refused) != []
    assert "wrote3testsofsweep'nightly'" in said and "(2model(s)skipped)" in said


def test_a_ranked_path_is_skipped_with_why_and_never_becomes_a_test() -> None:
    """A Hub (or a stand-in at HF_ENDPOINT) ranking an absolute path would have the operator
    size its own files: a ranking names Hub models, so the path is skipped and reported."""
    from datetime import UTC, datetime

    from model_support.operator.sweep import SweepOptions, sweep_manifests
    from model_support.rankings import RankedModel, Ranking

    ranked = ["/etc", "/proc/self", "Qwen/Qwen3-0.6B"]
    ranking = Ranking(
        task="text-generation",
        sort="downloads",
        endpoint="http://hub.example",
        fetched_at=datetime.now(UTC),
        models=[RankedModel(rank=i + 1, model_id=m) for i, m in enumerate(ranked)],
    )
    flat = sweep_manifests(ranking, SweepOptions(name="nightly"))
    assert [m["spec"]["model"] for m in flat.manifests] == ["Qwen/Qwen3-0.6B"]
    assert [s.model for s in flat.skipped] == ["/etc", "/proc/self"]
    assert all("is a path, not a Hub model id" in s.reason for s in flat.skipped)
