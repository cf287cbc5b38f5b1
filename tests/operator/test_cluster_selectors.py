"""The test cluster selects on the server, as the API server does: a list or a watch with a
label or field selector carries only the objects it selects (kmock alone answers with every
object), and a selector the API server refuses is a 400."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
import kubernetes
import pytest
from k8s_harness import CMS_URL, NS, Harness
from kubernetes.client.exceptions import ApiException

from model_support.operator.kube import api_client


def configmap(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
    }


async def test_lists_and_watches_carry_only_what_their_selectors_select(harness: Harness) -> None:
    h = harness
    await h.create(CMS_URL, configmap("recorded", {"app": "runner", "recorded": "true"}))
    await h.create(CMS_URL, configmap("open", {"app": "runner"}))
    await h.create(CMS_URL, configmap("other", {"app": "viewer"}))
    core = kubernetes.client.CoreV1Api(api_client(h.settings.api_server))

    # The client blocks: it runs beside the loop that serves the API.
    async def names(**selectors: str) -> list[str]:
        listed = await asyncio.to_thread(core.list_namespaced_config_map, NS, **selectors)
        return sorted(item.metadata.name for item in listed.items)

    assert await names() == ["open", "other", "recorded"]
    assert await names(label_selector="app=runner") == ["open", "recorded"]
    assert await names(label_selector="app=runner,!recorded") == ["open"]
    assert await names(label_selector="app in (viewer)") == ["other"]
    assert await names(field_selector="metadata.name=open") == ["open"]
    assert await names(label_selector="app=runner", field_selector="metadata.name=other") == []

    async def watched(selector: str, during: float) -> list[str]:
        """The objects a watch (as kopf opens it) is sent in ``during`` seconds."""
        url = f"{h.settings.api_server}/api/v1/namespaces/{NS}/configmaps"
        names: list[str] = []
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, params={"watch": "true", "labelSelector": selector}) as response,
        ):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(during):
                    async for line in response.content:
                        if line.strip():
                            names.append(json.loads(line)["object"]["metadata"]["name"])
        return names

    watching = asyncio.create_task(watched("app=viewer", during=1.5))
    await asyncio.sleep(0.5)
    await h.create(CMS_URL, configmap("later", {"app": "viewer"}))
    await h.create(CMS_URL, configmap("later-runner", {"app": "runner"}))
    assert await watching == ["other", "later"]

    with pytest.raises(ApiException) as refused:
        await names(field_selector="data.key=x")
    assert refused.value.status == 400 and "field label not supported" in str(refused.value.body)
