"""`model-support render`: exactly what the operator creates for a test, read from files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import torch
import yaml
from hubserver import HubServer
from k8s_harness import CMS_URL, JOBS_URL, Harness
from safetensors.torch import save_file
from typer.testing import CliRunner

from model_support.cli import app
from model_support.operator.resource import run_id_for
from model_support.operator.settings import settings_from_values
from model_support.script import read_config

TEST_UID = "3f1c9a2e-5b7d-4c1e-9a0f-2d6b8e4c7a11"


def manifest(name: str, spec: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if uid:
        meta["uid"] = uid
    return {
        "apiVersion": "modelsupport.dev/v1alpha1",
        "kind": "ModelSupportTest",
        "metadata": meta,
        "spec": spec,
    }


def render(tmp_path: Path, tests: list[dict[str, Any]], values: dict[str, Any] | None):
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump_all(tests))
    args = ["render", "-f", str(test_file)]
    if values is not None:
        values_file = tmp_path / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        args += ["--values", str(values_file)]
    result = CliRunner().invoke(app, args)
    documents = (
        [d for d in yaml.safe_load_all(result.stdout) if d] if result.exit_code in (0, 3) else []
    )
    return result, documents


def chart_values(h: Harness, **extra: Any) -> dict[str, Any]:
    """Helm values equivalent to the harness's settings (what render is given)."""
    return {
        "results": str(h.results),
        "watchNamespaces": list(h.settings.namespaces),
        "runnerImage": h.settings.runner_image,
        "settings": {"hubEndpoint": h.settings.hub_endpoint},
        **extra,
    }


def strip_server_fields(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {
        k: v
        for k, v in obj["metadata"].items()
        if k not in ("resourceVersion", "creationTimestamp", "uid", "generation", "managedFields")
    }
    return {**{k: v for k, v in obj.items() if k not in ("metadata", "status")}, "metadata": meta}


async def test_render_prints_what_the_operator_creates(
    harness: Harness, operator_hub: HubServer, tmp_path: Path
) -> None:
    h = harness
    values = chart_values(
        h, runner={"schedulerName": "neuron-scheduler"}, settings={
            "hubEndpoint": h.settings.hub_endpoint, "minHostMemoryGiB": 24,
        },
    )  # fmt: skip
    # The operator, run with the settings those values make.
    h.settings = settings_from_values(values).model_copy(
        update={
            "api_server": h.settings.api_server,
            "namespaces": ["default"],
            "all_namespaces": False,
            "metrics_port": None,
            "watchdog_interval_s": 0.2,
        }
    )
    spec = {"model": "Qwen/Qwen3-0.6B", "cores": 2, "parallelism": "tensor", "maxNewTokens": 64}
    await h.start_operator()
    await h.create_test("qwen", dict(spec), uid=TEST_UID)
    [job] = await h.wait_job()
    configmaps = await h.wait_for(lambda: h.items(CMS_URL), what="the ConfigMap")

    result, documents = render(tmp_path, [manifest("qwen", spec, uid=TEST_UID)], values)
    assert result.exit_code == 0, result.output
    rendered_cm, rendered_job = documents
    assert rendered_job == strip_server_fields(job)
    # The namespace's program, as created; with the Job's config block it is the run.py that
    # runs, and that names the commit main has on the Hub, not a floating branch.
    assert rendered_cm == strip_server_fields(configmaps[0])
    runner = rendered_job["spec"]["template"]["spec"]["containers"][0]
    block = next(e["value"] for e in runner["env"] if e["name"] == "MODEL_SUPPORT_RUN_CONFIG")
    run_py = rendered_cm["data"]["head"] + block + rendered_cm["data"]["tail"]
    assert read_config(run_py).revision == operator_hub.repos["Qwen/Qwen3-0.6B"].sha("main")
    # Two tests of a namespace share its program: shown once.
    _, two = render(tmp_path, [manifest("a", spec), manifest("b", spec)], values)
    assert [d["kind"] for d in two] == ["ConfigMap", "Job", "Job"]
    kubernetes_validate.validate(rendered_job, "1.33", strict=True)
    pod = rendered_job["spec"]["template"]["spec"]
    assert pod["schedulerName"] == "neuron-scheduler"  # from the values: two cores
    assert pod["containers"][0]["resources"]["limits"]["memory"] == "26Gi"  # 24 + 2 x shm
    assert len(await h.items(JOBS_URL)) == 1


def test_render_shows_the_status_a_test_would_get_instead(tmp_path: Path) -> None:
    checkpoint = tmp_path / "custom-model"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        json.dumps(
            {
                "model_type": "my-custom",
                "architectures": ["MyCustomForCausalLM"],
                "auto_map": {"AutoModelForCausalLM": "modeling_custom.MyCustomForCausalLM"},
            }
        )
    )
    save_file({"w": torch.zeros(4, 4)}, str(checkpoint / "model.safetensors"))
    custom_uid = "5e0c2a1b-7d4f-4e8a-9c3b-1f2e3d4c5b6a"
    tests = [
        manifest("custom", {"model": str(checkpoint)}, uid=custom_uid),
        manifest("bad", {"model": "a/b", "cores": 4}),
        manifest("elsewhere", {"model": "a/b", "cores": 1, "results": "s3://other/x"}),
        manifest("off-cache", {"model": "a/b", "cores": 1, "compileCache": {"source": "/etc/n"}}),
        manifest("off-models", {"model": "/etc", "cores": 1}),
    ]
    values = {
        "results": "s3://bucket/ms",
        "watchNamespaces": ["default"],
        "settings": {
            "modelVolumePaths": [str(tmp_path)],
            "compileCacheVolumeClaim": "caches",
            "compileCacheVolumePath": "/caches",
        },
    }
    result, documents = render(tmp_path, tests, values)
    assert result.exit_code == 3, result.output  # some would get no Job
    statuses = {d["metadata"]["name"]: d["status"] for d in documents}
    assert statuses["custom"]["result"] == "EXCLUDED"
    assert statuses["custom"]["exclusionReason"] == "remote-code-required"
    # The status the operator's lifecycle writes, the run it records included (attempt 0:
    # no Job ran).
    assert statuses["custom"]["phase"] == "Completed"
    assert statuses["custom"]["runId"] == run_id_for(custom_uid, 1, 0)
    assert statuses["bad"]["phase"] == "Invalid" and "parallelism" in statuses["bad"]["message"]
    assert "outside the stores" in statuses["elsewhere"]["message"]
    # What the operator refuses for paths off its volumes, render refuses the same way.
    assert statuses["off-cache"]["phase"] == "Invalid"
    assert "not on the compile cache volume" in statuses["off-cache"]["message"]
    assert statuses["off-models"]["phase"] == "Invalid"
    assert "not on a model volume" in statuses["off-models"]["message"]


def test_render_refuses_bad_values_by_name(tmp_path: Path) -> None:
    tests = [manifest("t", {"model": "a/b", "cores": 1})]
    result, _ = render(
        tmp_path,
        tests,
        {"results": "s3://b/x", "watchNamespaces": ["ml"], "settings": {"cpuPerCores": 3}},
    )
    assert result.exit_code == 2 and "cpuPerCores" in result.output
    result, _ = render(tmp_path, tests, {"watchNamespaces": ["ml"]})
    assert result.exit_code == 2 and "`results` is required" in result.output
    result, _ = render(tmp_path, tests, {"results": "s3://b/x"})  # as the chart refuses it
    assert result.exit_code == 2 and "watchNamespaces is required" in result.output
    (tmp_path / "empty.yaml").write_text("kind: ConfigMap\n")
    result = CliRunner().invoke(app, ["render", "-f", str(tmp_path / "empty.yaml")])
    assert result.exit_code == 2 and "holds no ModelSupportTest" in result.output
