"""The cluster the container tests run against: kmock, the Docker node stand-in, moto's S3,
and the operator as the rendered Helm chart's Deployment describes it."""

from __future__ import annotations

import asyncio
import base64
import uuid
from dataclasses import dataclass, field
from typing import Any

import s3fs
import yaml
from container_images import REPO, Images
from k8s_harness import NS, Harness
from kubelet import Node, Pod
from ports import unused_port

from model_support.records import RunRecord
from model_support.store import ResultsStore

CHART = REPO / "charts" / "model-support"
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "model-support-test",
    "AWS_SECRET_ACCESS_KEY": "model-support-test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


TINY_LLAMA_REPO = "test-org/tiny-llama"


DELIVERY_KEY_SECRET = "ms-delivery-key"
"""The Secret holding the operator's delivery key (the chart's deliveryKey.existingSecret)."""


@dataclass
class S3:
    """moto's S3 server on 127.0.0.1; every test gets a bucket of its own."""

    endpoint: str

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, **S3_CREDENTIALS}

    @property
    def storage_options(self) -> dict[str, Any]:
        return {
            "key": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "secret": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"endpoint_url": self.endpoint},
        }

    def new_bucket(self) -> str:
        bucket = f"model-support-{uuid.uuid4().hex[:12]}"
        s3fs.S3FileSystem(**self.storage_options, skip_instance_cache=True).mkdir(bucket)
        return bucket


@dataclass
class Cluster:
    """kmock, the Docker node stand-in, a results bucket, and the chart's operator on demand."""

    h: Harness
    node: Node
    images: Images
    s3: S3
    results: str
    operator_pods: list[Pod] = field(default_factory=list)
    deployment: dict[str, Any] | None = None

    def store(self) -> ResultsStore:
        return ResultsStore(self.results, storage_options=self.s3.storage_options)

    async def records(self) -> list[RunRecord]:
        """Every record in the bucket (read in a thread: never block the loop serving kmock)."""
        store = ResultsStore(
            self.results, storage_options={**self.s3.storage_options, "skip_instance_cache": True}
        )
        return await asyncio.to_thread(lambda: list(store.records()))

    def render_chart(self, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The chart rendered with helm-python-sdk for this cluster's images and bucket."""
        import helm_python

        repository, _, tag = self.images.operator.partition(":")
        chart_values = {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "runnerImage": self.images.runner,
            "results": self.results,
            "watchNamespaces": [NS],
            # The delivery key's Secret, which start_operator creates as the chart's user does.
            "deliveryKey": {"existingSecret": DELIVERY_KEY_SECRET},
            # Host network: ports of their own, so tests and workers never collide.
            "liveness": {"port": unused_port()},
            "metrics": {"enabled": True, "port": unused_port()},
            **(values or {}),
        }
        rendered = helm_python.Chart.load(str(CHART)).render(
            chart_values, name="ms", namespace="model-support"
        )
        return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]

    async def start_operator(self, values: dict[str, Any] | None = None) -> Pod:
        """The operator pod, exactly as the chart's Deployment describes it; waits for its watches."""
        if self.deployment is None:
            docs = self.render_chart(values)
            # The delivery key Secret the chart's user creates (deliveryKey.existingSecret).
            secret_url = f"/api/v1/namespaces/{NS}/secrets/{DELIVERY_KEY_SECRET}"
            if await self.h.get(secret_url) is None:
                key = base64.b64encode(uuid.uuid4().hex.encode() * 2).decode()
                await self.h.create(
                    f"/api/v1/namespaces/{NS}/secrets",
                    {"apiVersion": "v1", "kind": "Secret",
                     "metadata": {"name": DELIVERY_KEY_SECRET}, "data": {"key": key}},
                )  # fmt: skip
            self.deployment = next(d for d in docs if d["kind"] == "Deployment")
            self.deployment["metadata"]["uid"] = str(uuid.uuid4())
        before = self.h._watches()
        pod = self.node.new_pod(self.deployment["spec"]["template"], owner=self.deployment)
        self.node.start_pod(pod)
        self.operator_pods.append(pod)

        def watching() -> bool:
            tests, jobs = self.h._watches()
            assert not pod.done.is_set(), (
                f"the operator pod ended:\n{pod.log_text('operator')[-4000:]}"
            )
            return tests > before[0] and jobs > before[1]

        await self.node.wait_for(watching, timeout=180, what="the operator container's watches")
        return pod

    async def create_test(self, name: str, spec: dict[str, Any]) -> None:
        await self.h.create_test(name, spec)

    async def wait_completed(self, name: str, timeout: float = 420) -> dict[str, Any]:
        """The test's status once Completed (failing early if the operator pod or the node died)."""

        async def completed() -> dict[str, Any] | None:
            for pod in self.operator_pods[-1:]:
                assert not pod.done.is_set(), (
                    f"the operator pod ended:\n{pod.log_text('operator')[-4000:]}"
                )
            status = await self.h.test_status(name)
            return status if status.get("phase") == "Completed" else None

        result: dict[str, Any] = await self.node.wait_for(
            completed, timeout=timeout, what=f"test {name} to complete"
        )
        return result

    def operator_log(self) -> str:
        return "\n".join(p.log_text("operator") for p in self.operator_pods)

    async def runner_pod(self, timeout: float = 180) -> Pod:
        """The first runner pod the node started that has not ended yet."""

        def running() -> Pod | None:
            return next(
                (
                    p
                    for p in self.node.pods.values()
                    if p.labels.get("job-name") and not p.done.is_set() and "runner" in p.containers
                ),
                None,
            )

        pod: Pod = await self.node.wait_for(running, timeout=timeout, what="a running runner pod")
        return pod
