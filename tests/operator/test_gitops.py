"""The GitOps folder: example sweeps valid for the CRD, its CEL rules and the operator;
Argo CD and Flux manifests pointing at what exists; the Argo CD health checks (Lua) run by a
real Lua 5.1 interpreter (lupa) on statuses the operator's own code builds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from test_operator_manifests import cel_violations, render_chart

from model_support.operator.bisect_status import bisect_conditions
from model_support.operator.status import Phase, kstatus_conditions
from model_support.operator.sweep_spec import parse_sweep
from model_support.operator.sweep_status import sweep_conditions

ROOT = Path(__file__).resolve().parents[2]
GITOPS = ROOT / "gitops"
SWEEP_CRD = yaml.safe_load((ROOT / "crds" / "modelsupportsweeps.yaml").read_text())


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_example_sweeps_are_valid_and_all_applied() -> None:
    schema = jsonschema.Draft4Validator(
        SWEEP_CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    )
    files = sorted(p.name for p in (GITOPS / "sweeps").glob("*.yaml"))
    kustomization = yaml.safe_load((GITOPS / "sweeps" / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [f for f in files if f != "kustomization.yaml"]
    for name in kustomization["resources"]:
        [sweep] = docs(GITOPS / "sweeps" / name)
        assert sweep["kind"] == "ModelSupportSweep"
        schema.validate(sweep)
        assert cel_violations(SWEEP_CRD, sweep["spec"]) == []
        assert len(sweep["metadata"]["name"]) <= 40
        parse_sweep(sweep["spec"])


def test_argo_cd_and_flux_apply_folders_that_exist() -> None:
    apps = docs(GITOPS / "argocd" / "application.yaml")
    assert [a["kind"] for a in apps] == ["Application", "Application"]
    for app in apps:
        assert app["apiVersion"] == "argoproj.io/v1alpha1"
        assert (ROOT / app["spec"]["source"]["path"]).is_dir()
        assert "ServerSideApply=true" in app["spec"]["syncPolicy"]["syncOptions"]
    chart, sweeps = apps
    waves = [int(a["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"]) for a in apps]
    assert waves[0] < waves[1]  # the CRDs and the operator before the sweeps
    assert (ROOT / chart["spec"]["source"]["path"] / "Chart.yaml").is_file()
    values = chart["spec"]["source"]["helm"]["valuesObject"]
    assert values["results"]  # the chart needs it
    # Argo CD renders the chart as `helm template` does: the values are enough, and the
    # namespace the sweeps are applied to is one the operator watches.
    rendered = render_chart(values)
    assert any(d["kind"] == "Deployment" for d in rendered)
    sweep_namespaces = {
        d["metadata"]["namespace"] for path in (GITOPS / "sweeps").glob("*.yaml")
        for d in docs(path) if d.get("kind") == "ModelSupportSweep"
    }  # fmt: skip
    assert sweep_namespaces <= set(values["watchNamespaces"])
    assert sweeps["spec"]["source"]["path"] == "gitops/sweeps"
    # A first sync that comes before the sweep CRD exists converges instead of failing.
    assert "SkipDryRunOnMissingResource=true" in sweeps["spec"]["syncPolicy"]["syncOptions"]
    for app in apps:
        retry = app["spec"]["syncPolicy"]["retry"]
        assert retry["limit"] >= 5 and retry["backoff"]["factor"] >= 2
    repo, kustomization = docs(GITOPS / "flux" / "kustomization.yaml")
    assert repo["kind"] == "GitRepository" and kustomization["kind"] == "Kustomization"
    assert kustomization["apiVersion"] == "kustomize.toolkit.fluxcd.io/v1"
    assert (ROOT / kustomization["spec"]["path"]).resolve() == (GITOPS / "sweeps").resolve()
    assert kustomization["spec"]["sourceRef"] == {"kind": "GitRepository", "name": "model-support"}
    assert kustomization["spec"]["prune"] is True and kustomization["spec"]["wait"] is False


# ------------------------------------------------------------------------- Argo CD health (Lua)


@pytest.fixture(scope="module")
def health() -> dict[str, str]:
    [cm] = docs(GITOPS / "argocd" / "argocd-cm-health.yaml")
    prefix = "resource.customizations.health.modelsupport.dev_"
    return {
        key.removeprefix(prefix): script
        for key, script in cm["data"].items()
        if key.startswith(prefix)
    }


def run_check(script: str, obj: dict[str, Any]) -> dict[str, str]:
    """Run a health check as Argo CD does: ``obj`` global, the chunk returns ``hs``."""
    from lupa.lua51 import LuaRuntime  # Argo CD's gopher-lua implements Lua 5.1

    lua = LuaRuntime()
    lua.globals().obj = lua.table_from(obj, recursive=True)
    hs = lua.execute(script)
    return {"status": str(hs.status), "message": str(hs.message)}


def resource(kind: str, status: dict[str, Any] | None, generation: int = 1) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "modelsupport.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "generation": generation},
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_health_checks_exist_for_every_kind(health: dict[str, str]) -> None:
    """Every kind the operator defines (crds/) has Argo CD's health check."""
    kinds = [
        yaml.safe_load(path.read_text())["spec"]["names"]["kind"]
        for path in sorted((ROOT / "crds").glob("*.yaml"))
    ]
    assert len(kinds) == 3 and sorted(health) == sorted(kinds)


def test_a_tests_health_follows_its_phase_not_its_result(health: dict[str, str]) -> None:
    check = health["ModelSupportTest"]
    assert run_check(check, resource("ModelSupportTest", None))["status"] == "Progressing"
    running = kstatus_conditions(None, Phase.RUNNING, 1)
    status = {"phase": "Running", "observedGeneration": 1, "conditions": running}
    assert run_check(check, resource("ModelSupportTest", status))["status"] == "Progressing"
    # A FAIL is a finished test: Healthy, the result in the message.
    failed = kstatus_conditions(running, Phase.COMPLETED, 1, result="FAIL", message="verified")
    status = {"phase": "Completed", "result": "FAIL", "observedGeneration": 1, "conditions": failed}
    assert run_check(check, resource("ModelSupportTest", status)) == {
        "status": "Healthy",
        "message": "FAIL: verified",
    }
    # The same status under a newer spec (a re-run not yet seen) is not Healthy.
    assert run_check(check, resource("ModelSupportTest", status, generation=2)) == {
        "status": "Progressing",
        "message": "waiting for the operator to see generation 2",
    }
    invalid = kstatus_conditions(running, Phase.INVALID, 1, message="spec.cores: too many")
    status = {"phase": "Invalid", "observedGeneration": 1, "conditions": invalid}
    assert run_check(check, resource("ModelSupportTest", status)) == {
        "status": "Degraded",
        "message": "spec.cores: too many",
    }


def test_a_sweeps_health_is_progressing_until_every_model_is_tested(
    health: dict[str, str],
) -> None:
    check = health["ModelSupportSweep"]
    assert run_check(check, resource("ModelSupportSweep", None))["status"] == "Progressing"
    expected = {
        "ranking": "Progressing",
        "testing": "Progressing",
        "done": "Healthy",
        "invalid": "Degraded",
    }
    conditions = None
    for state, health_status in expected.items():
        conditions = sweep_conditions(conditions, state, 3, f"the sweep is {state}")  # type: ignore[arg-type]
        status = {"observedGeneration": 3, "conditions": conditions}
        assert run_check(check, resource("ModelSupportSweep", status, generation=3)) == {
            "status": health_status,
            "message": f"the sweep is {state}",
        }
    done = sweep_conditions(None, "done", 3, "200 of 200 models tested")
    status = {"observedGeneration": 3, "conditions": done}
    assert run_check(check, resource("ModelSupportSweep", status, generation=4))["status"] == (
        "Progressing"
    )


def test_sync_waves_wait_for_the_applications_health() -> None:
    """Sync waves of an app of apps wait for each Application's health, which Argo CD no
    longer assesses by itself: the check must be in argocd-cm, and must follow the child's."""
    [cm] = docs(GITOPS / "argocd" / "argocd-cm-health.yaml")
    check = cm["data"]["resource.customizations.health.argoproj.io_Application"]
    app = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": "a"}}
    assert run_check(check, app)["status"] == "Progressing"
    for state in ("Healthy", "Progressing", "Degraded"):
        status = {"health": {"status": state, "message": "m"}}
        assert run_check(check, {**app, "status": status}) == {"status": state, "message": "m"}


def test_a_bisects_health_is_progressing_until_it_names_the_first_bad_version(
    health: dict[str, str],
) -> None:
    check = health["ModelSupportBisect"]
    assert run_check(check, resource("ModelSupportBisect", None))["status"] == "Progressing"
    expected = {
        "Planning": "Progressing",
        "Bisecting": "Progressing",
        "Done": "Healthy",
        "Failed": "Degraded",
        "Invalid": "Degraded",
    }
    conditions = None
    for phase, health_status in expected.items():
        conditions = bisect_conditions(conditions, phase, 2, f"the bisect is {phase}")  # type: ignore[arg-type]
        status = {"phase": phase, "observedGeneration": 2, "conditions": conditions}
        assert run_check(check, resource("ModelSupportBisect", status, generation=2)) == {
            "status": health_status,
            "message": f"the bisect is {phase}",
        }
    # A store outage while planning is said on the bisect and is no failure: Progressing.
    retrying = bisect_conditions(None, "Planning", 2, "a results store could not be read")
    status = {"phase": "Planning", "observedGeneration": 2, "conditions": retrying}
    assert run_check(check, resource("ModelSupportBisect", status, generation=2))["status"] == (
        "Progressing"
    )
    done = bisect_conditions(None, "Done", 2, "first bad version: torch 2.13.0")
    status = {"phase": "Done", "observedGeneration": 2, "conditions": done}
    assert run_check(check, resource("ModelSupportBisect", status, generation=3))["status"] == (
        "Progressing"
    )
