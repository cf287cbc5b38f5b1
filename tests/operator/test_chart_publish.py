"""The chart's optional publish CronJob: rendered, validated, least privilege."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from chart_values import REQUIRED_CHART_VALUES

CHART = Path(__file__).resolve().parents[2] / "charts" / "model-support"
PUBLISH = {
    "enabled": True,
    "repository": "hf://datasets/org/model-support-results",
    "tokenSecret": {"name": "hub-write-token", "key": "token"},
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    rendered = helm_python.Chart.load(str(CHART)).render(
        {**REQUIRED, **copy.deepcopy(values)}, name="ms", namespace="model-support"
    )
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]


RESULTS = "s3://bucket/model-support"
REQUIRED = REQUIRED_CHART_VALUES


def test_no_cronjob_unless_asked_for() -> None:
    assert not [d for d in render({"results": RESULTS}) if d["kind"] == "CronJob"]


def test_the_publish_cronjob_commits_the_dataset_on_a_schedule() -> None:
    values = {"results": RESULTS, "publish": PUBLISH}
    report = helm_python.lint(str(CHART), copy.deepcopy(values), strict=True)
    assert report["errors"] == []
    (cron,) = [d for d in render(values) if d["kind"] == "CronJob"]
    kubernetes_validate.validate(cron, "1.33", strict=True)
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == [
        "dataset",
        "publish",
        "hf://datasets/org/model-support-results",
        "--results=s3://bucket/model-support",
    ]
    token = next(e for e in container["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hub-write-token", "key": "token"}
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("repository", ["", "hf://org/name", "s3://bucket/x"])
def test_a_publish_without_a_dataset_repository_is_refused_at_render(repository: str) -> None:
    with pytest.raises(Exception, match="hf://datasets/ORG/NAME"):
        render({"results": RESULTS, "publish": {**PUBLISH, "repository": repository}})
