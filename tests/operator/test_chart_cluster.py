"""The chart on a real cluster (EKS): rolling updates with leader election, runner egress
that S3 through Pod Identity needs, and no API token where none is needed."""

from __future__ import annotations

import copy
import ipaddress
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from chart_values import REQUIRED_CHART_VALUES

CHART = Path(__file__).resolve().parents[2] / "charts" / "model-support"
RESULTS = "s3://bucket/model-support"
REQUIRED = REQUIRED_CHART_VALUES


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    rendered = helm_python.Chart.load(str(CHART)).render(
        {**REQUIRED, **copy.deepcopy(values)}, name="ms", namespace="model-support"
    )
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def egress_allows(policy: dict[str, Any], address: str, port: int, protocol: str = "TCP") -> bool:
    """Whether a NetworkPolicy's egress rules let a pod reach ``address:port`` (ipBlock peers,
    as the API defines them: cidr minus except; a rule without ports allows every port)."""
    ip = ipaddress.ip_address(address)
    for rule in policy["spec"].get("egress") or []:
        ports = rule.get("ports")
        if ports is not None and not any(
            p.get("protocol", "TCP") == protocol and p.get("port") == port for p in ports
        ):
            continue
        for peer in rule.get("to") or []:
            block = peer.get("ipBlock")
            if block is None:
                continue
            network = ipaddress.ip_network(block["cidr"])
            if ip.version != network.version or ip not in network:
                continue
            excepted = [ipaddress.ip_network(e) for e in block.get("except") or []]
            if not any(ip.version == e.version and ip in e for e in excepted):
                return True
    return False


def test_the_operator_rolls_and_elects_a_leader() -> None:
    docs = render({"results": RESULTS, "replicas": 2})
    [deployment] = [d for d in of_kind(docs, "Deployment") if "operator" in d["metadata"]["name"]]
    kubernetes_validate.validate(deployment, "1.33", strict=True)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # The operator's account may hold the Lease in its own namespace.
    [role] = [r for r in of_kind(docs, "Role") if r["metadata"]["name"].endswith("leader-election")]
    assert role["metadata"]["namespace"] == "model-support"
    assert {"get", "create", "update", "patch"} <= set(role["rules"][0]["verbs"])
    assert role["rules"][0]["resources"] == ["leases"]
    [binding] = [
        b for b in of_kind(docs, "RoleBinding") if b["metadata"]["name"].endswith("leader-election")
    ]
    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"][0]["name"] == sa


def test_runners_reach_the_pod_identity_agent_and_nothing_new_besides() -> None:
    [policy] = of_kind(render({"results": RESULTS}), "NetworkPolicy")
    kubernetes_validate.validate(policy, "1.33", strict=True)
    assert egress_allows(policy, "169.254.170.23", 80)  # EKS Pod Identity agent, IPv4
    assert egress_allows(policy, "fd00:ec2::23", 80)  # and IPv6
    assert egress_allows(policy, "52.216.0.1", 443)  # S3, the Hub
    assert not egress_allows(policy, "169.254.169.254", 80)  # instance metadata stays shut
    assert not egress_allows(policy, "169.254.169.254", 443)
    assert not egress_allows(policy, "10.0.0.5", 80)
    assert not egress_allows(policy, "169.254.20.10", 53, "UDP")  # node-local DNS: opt in

    [local] = of_kind(
        render({"results": RESULTS, "networkPolicy": {"nodeLocalDns": {"enabled": True}}}),
        "NetworkPolicy",
    )
    assert egress_allows(local, "169.254.20.10", 53, "UDP")
    [closed] = of_kind(
        render({"results": RESULTS, "networkPolicy": {"podIdentity": {"enabled": False}}}),
        "NetworkPolicy",
    )
    assert not egress_allows(closed, "169.254.170.23", 80)


@pytest.mark.parametrize("component", ["viewer", "publish"])
def test_the_viewer_and_the_publisher_have_accounts_of_their_own_without_a_token(
    component: str,
) -> None:
    values: dict[str, Any] = {"results": RESULTS}
    if component == "viewer":
        values["viewer"] = {"enabled": True, "serviceAccount": {"annotations": {"a": "b"}}}
    else:
        values["publish"] = {
            "enabled": True,
            "repository": "hf://datasets/org/results",
            "tokenSecret": {"name": "hub", "key": "token"},
            "serviceAccount": {"annotations": {"a": "b"}},
        }
    docs = render(values)
    operator_sa = next(
        d["spec"]["template"]["spec"]["serviceAccountName"]
        for d in of_kind(docs, "Deployment")
        if "operator" in d["metadata"]["name"]
    )
    if component == "viewer":
        [workload] = [d for d in of_kind(docs, "Deployment") if "viewer" in d["metadata"]["name"]]
        pod = workload["spec"]["template"]["spec"]
    else:
        [workload] = of_kind(docs, "CronJob")
        pod = workload["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    kubernetes_validate.validate(workload, "1.33", strict=True)
    assert pod["serviceAccountName"] != operator_sa  # not the cluster-wide operator's account
    assert pod["automountServiceAccountToken"] is False
    [account] = [
        s
        for s in of_kind(docs, "ServiceAccount")
        if s["metadata"]["name"] == pod["serviceAccountName"]
    ]
    assert account["automountServiceAccountToken"] is False
    assert account["metadata"]["annotations"] == {"a": "b"}
    bound = {
        subject["name"]
        for kind in ("RoleBinding", "ClusterRoleBinding")
        for binding in of_kind(docs, kind)
        for subject in binding["subjects"]
    }
    assert pod["serviceAccountName"] not in bound  # no rights in the API at all


def operator_env(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    [deployment] = [d for d in of_kind(docs, "Deployment") if "operator" in d["metadata"]["name"]]
    return {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_the_delivery_key_is_the_same_in_every_render_and_every_replica() -> None:
    """helm template and Argo CD render without a cluster (`lookup` finds nothing): a key the
    chart drew would change on every render. It is the user's Secret, named; or the value
    given, rendered into the chart's Secret the same way every time."""
    named = [render({"results": RESULTS, "replicas": 2}) for _ in range(2)]
    for docs in named:
        key = operator_env(docs)["MODEL_SUPPORT_DELIVERY_KEY"]["valueFrom"]["secretKeyRef"]
        assert key == {"name": "ms-delivery-key", "key": "key"}  # not optional: required
        assert of_kind(docs, "Secret") == []
    given = {"results": RESULTS, "deliveryKey": {"existingSecret": "", "value": "v" * 40}}
    first, second = (of_kind(render(given), "Secret") for _ in range(2))
    assert first == second and len(first) == 1


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ({"existingSecret": ""}, "deliveryKey is required"),
        ({"existingSecret": "", "value": "short"}, "at least 32"),
        ({"existingSecret": "a", "value": "v" * 40}, "not both"),
    ],
)
def test_a_missing_or_weak_delivery_key_is_refused_saying_what_to_do(
    key: dict[str, Any], why: str
) -> None:
    with pytest.raises(helm_python.errors.HelmRenderError, match=why):
        render({"results": RESULTS, "deliveryKey": key})


def test_the_viewer_gets_read_only_credentials_of_its_own_not_the_operators() -> None:
    docs = render(
        {
            "results": RESULTS,
            "env": [{"name": "STORE_WRITE_KEY", "value": "operator-only"}],
            "envFrom": [{"secretRef": {"name": "results-store-read-write"}}],
            "viewer": {
                "enabled": True,
                "env": [{"name": "AWS_REGION", "value": "us-west-2"}],
                "envFrom": [{"secretRef": {"name": "results-store-read-only"}}],
            },
        }
    )
    [viewer] = [d for d in of_kind(docs, "Deployment") if "viewer" in d["metadata"]["name"]]
    kubernetes_validate.validate(viewer, "1.33", strict=True)
    [container] = viewer["spec"]["template"]["spec"]["containers"]
    assert "STORE_WRITE_KEY" not in {e["name"] for e in container["env"]}
    assert {"name": "AWS_REGION", "value": "us-west-2"} in container["env"]
    assert container["envFrom"] == [{"secretRef": {"name": "results-store-read-only"}}]
    assert "STORE_WRITE_KEY" in operator_env(docs)  # the operator keeps its own


def test_no_watched_namespaces_is_refused_and_watching_all_is_said_explicitly() -> None:
    """An empty list used to mean every namespace: a ClusterRole creating Jobs, Secrets and
    ConfigMaps in kube-system too, and the runner NetworkPolicy only in the release's own."""
    with pytest.raises(helm_python.errors.HelmRenderError, match="watchNamespaces is required"):
        render({"results": RESULTS, "watchNamespaces": []})
    with pytest.raises(helm_python.errors.HelmRenderError, match=r"networkPolicy\.namespaces"):
        render({"results": RESULTS, "watchNamespaces": [], "watchAllNamespaces": True})
    every = render(
        {
            "results": RESULTS,
            "watchNamespaces": [],
            "watchAllNamespaces": True,
            "networkPolicy": {"namespaces": ["ml", "research"]},
        }
    )
    roles = [r for r in of_kind(every, "ClusterRole") if r["metadata"]["name"] == "ms-operator"]
    assert len(roles) == 1  # chosen explicitly
    assert sorted(p["metadata"]["namespace"] for p in of_kind(every, "NetworkPolicy")) == [
        "ml", "research",
    ]  # fmt: skip


def test_the_runner_policy_is_in_every_watched_namespace_and_the_rights_only_there() -> None:
    docs = render(
        {
            "results": RESULTS,
            "watchNamespaces": ["ml", "research"],
            "networkPolicy": {"namespaces": ["shared-runners"]},
        }
    )
    assert sorted(p["metadata"]["namespace"] for p in of_kind(docs, "NetworkPolicy")) == [
        "ml", "research", "shared-runners",
    ]  # fmt: skip
    writers = {
        r["metadata"].get("namespace")
        for r in of_kind(docs, "Role") + of_kind(docs, "ClusterRole")
        if any("jobs" in rule["resources"] for rule in r["rules"])
    }
    assert writers == {"ml", "research"}  # no ClusterRole creates Jobs anywhere else


def test_runners_reach_https_over_ipv6_too_but_not_instance_metadata() -> None:
    [policy, *_] = of_kind(render({"results": RESULTS}), "NetworkPolicy")
    kubernetes_validate.validate(policy, "1.33", strict=True)
    assert egress_allows(policy, "2600:1f18:4e5c::1", 443)  # S3 / the Hub over IPv6
    assert egress_allows(policy, "52.216.1.1", 443)
    assert not egress_allows(policy, "fd00:ec2::254", 443)  # IMDS, IPv6
    assert not egress_allows(policy, "169.254.169.254", 443)  # IMDS, IPv4
