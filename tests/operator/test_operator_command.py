"""`model-support operator` as users start it: a process, kubeconfig, liveness and metrics."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from k8s_harness import JOBS_URL, Harness
from ports import unused_port

CLI = str(Path(sys.executable).with_name("model-support"))


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


async def _poll(url: str, timeout: float = 120.0) -> tuple[int, str]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await asyncio.to_thread(_get, url)
        except OSError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.3)


async def test_operator_command_reconciles_and_serves_liveness_and_metrics(
    harness: Harness, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: kmock, cluster: {{server: "{harness.settings.api_server}"}}}}]
users: [{{name: tester, user: {{}}}}]
contexts: [{{name: kmock, context: {{cluster: kmock, user: tester}}}}]
current-context: kmock
"""
    )
    live_port, metrics_port = unused_port(), unused_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    # Settings as the Helm chart passes them: one JSON object, camelCase keys.
    env["MODEL_SUPPORT_SETTINGS"] = json.dumps(
        {"runnerImage": "registry.example/runner:1", "hubEndpoint": harness.settings.hub_endpoint}
    )
    log_path = tmp_path / "operator.log"
    # The operator is an asyncio subprocess writing to a file: waiting for it never blocks the
    # event loop that serves kmock (the operator's last requests on shutdown must get answers),
    # and no pipe can fill up and stall it while nobody reads.
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            CLI,
            "operator",
            "--all-namespaces",
            "--results",
            str(tmp_path / "results"),
            "--liveness",
            f"http://127.0.0.1:{live_port}/healthz",
            "--metrics-port",
            str(metrics_port),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        status, _ = await _poll(f"http://127.0.0.1:{live_port}/healthz")
        assert status == 200
        await harness.create_test(
            "qwen", {"model": "Qwen/Qwen3-0.6B", "profile": "trn2", "cores": 1}
        )
        # A generous deadline: the operator is a separate process, slow to start on a busy machine.
        [job] = await harness.wait_for(
            lambda: harness.items(JOBS_URL), timeout=90, what="the operator's Job"
        )
        assert (
            job["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/runner:1"
        )
        status, metrics = await _poll(f"http://127.0.0.1:{metrics_port}/metrics")
        assert status == 200 and "model_support_tests_total" in metrics
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(proc.wait(), timeout=60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            output = log_path.read_text(errors="replace")
            pytest.fail(f"the operator did not stop within 60 s of SIGINT:\n{output[-3000:]}")
    output = log_path.read_text(errors="replace")
    assert proc.returncode in (0, -signal.SIGINT, 130), output[-3000:]


def test_the_operator_reacts_to_events_only_so_kopf_keeps_no_diff_base() -> None:
    """The operator's kopf storage builds no diff-base (handlers.EventsOnlyDiffBase): right only
    while no handler is a change handler or a daemon, which read it."""
    from model_support.operator.handlers import build_registry
    from model_support.operator.settings import OperatorSettings

    settings = OperatorSettings(
        results_uri="/tmp/unused", namespaces=["default"], metrics_port=None,
        api_server="http://127.0.0.1:9",
    )  # fmt: skip
    registry = build_registry(settings)
    assert registry._changing.get_all_handlers() == []
    assert registry._spawning.get_all_handlers() == []
    assert len(registry._watching.get_all_handlers()) == 4  # tests, sweeps, bisects, Jobs
