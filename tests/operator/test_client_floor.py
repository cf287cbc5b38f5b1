"""The kubernetes client floor: pyproject's, the one the operator checks at start-up, and the
API the operator calls, all present in that floor version.

``tests/data/kubernetes_client_floor.json`` lists the public methods of the API classes the
operator uses, as the floor release has them (read from its wheel, kubernetes 34.1.0 on PyPI:
``kubernetes/client/api/*_api.py``). Raising the floor means regenerating that list from the
new floor's wheel.
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
import types
from pathlib import Path

import kubernetes
import pytest

from model_support.operator.kube import CLIENT_FLOOR, REQUIRED_APIS, Kube, client_problem

ROOT = Path(__file__).resolve().parents[2]
FLOOR = json.loads((ROOT / "tests" / "data" / "kubernetes_client_floor.json").read_text())


def test_pyproject_and_the_start_up_check_name_the_same_floor() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [requirement] = [d for d in dependencies if re.match(r"kubernetes\b(?!-)", d)]
    floor = re.search(r">=([\d.]+)", requirement)
    assert floor is not None
    assert tuple(int(p) for p in floor[1].split(".")) == CLIENT_FLOOR
    assert tuple(int(p) for p in FLOOR["version"].split(".")[:2]) == CLIENT_FLOOR


def test_a_client_below_the_floor_is_refused_at_start_up_with_the_version_found() -> None:
    old = types.SimpleNamespace(
        **{name: object for name in REQUIRED_APIS if name != "ResourceV1Api"}
    )
    problem = client_problem("33.1.0", old)
    assert problem is not None
    assert "kubernetes client 33.1.0 is installed (it has no ResourceV1Api)" in problem
    assert "kubernetes>=34.1" in problem
    assert client_problem("34.1.0", kubernetes.client) is None
    assert client_problem(kubernetes.__version__, kubernetes.client) is None  # installed one


def api_calls() -> set[tuple[str, str]]:
    """(API class, method) for every call the operator's code makes on a kubernetes API object:
    ``self.X = kubernetes.client.SomeApi(...)`` then ``self.X.method(...)``."""
    calls: set[tuple[str, str]] = set()
    for path in sorted((ROOT / "operator" / "src").glob("*.py")):
        tree = ast.parse(path.read_text())
        holders: dict[str, str] = {}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr.endswith("Api")
                and isinstance(node.targets[0], ast.Attribute)
            ):
                holders[node.targets[0].attr] = node.value.func.attr
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr in holders
                and not node.attr.startswith("_")
            ):
                calls.add((holders[node.value.attr], node.attr))
    return calls


def test_every_api_call_the_operator_makes_exists_in_the_floor_version() -> None:
    calls = api_calls()
    assert ("ResourceV1Api", "create_namespaced_resource_claim_template") in calls
    assert ("CoordinationV1Api", "patch_namespaced_lease") in calls
    missing = sorted(
        f"{cls}.{method}" for cls, method in calls if method not in FLOOR["apis"].get(cls, [])
    )
    assert missing == [], (
        f"not in kubernetes {FLOOR['version']}: raise the floor (and regenerate the list)"
    )


def test_the_operator_does_not_start_on_an_older_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubernetes, "__version__", "30.1.0")
    with pytest.raises(RuntimeError, match=r"kubernetes client 30\.1\.0 is installed"):
        Kube(kubernetes.client.ApiClient())
