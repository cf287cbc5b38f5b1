"""`model-support operator` as users start it: a process, kubeconfig, liveness and metrics."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from k8s_harness import Harness

CLI = str(Path(sys.executable).with_name("model-support"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


async def _poll(url: str, timeout: float = 30.0) -> tuple[int, str]:
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
    live_port, metrics_port = _free_port(), _free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    # Settings as the Helm chart passes them: one JSON object, camelCase keys.
    env["MODEL_SUPPORT_SETTINGS"] = json.dumps(
        {"runnerImage": "registry.example/runner:1", "hubEndpoint": harness.settings.hub_endpoint}
    )
    proc = subprocess.Popen(
        [
            CLI,
            "operator",
            "--all-namespaces",
            "--results",
            str(tmp_path / "results"),
            "--liveness",
            f"http://127.0.0.1:{live_port}/healthz",
            "--metrics-port",
            str(metrics_port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        status, _ = await _poll(f"http://127.0.0.1:{live_port}/healthz")
        assert status == 200
        await harness.create_test(
            "qwen", {"model": "Qwen/Qwen3-0.6B", "profile": "trn2", "cores": 1}
        )
        [job] = await harness.wait_job()
        assert (
            job["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/runner:1"
        )
        status, metrics = await _poll(f"http://127.0.0.1:{metrics_port}/metrics")
        assert status == 200 and "model_support_tests_total" in metrics
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            # Off the loop: kmock serves on it, and the stopping operator may still call it.
            output, _ = await asyncio.to_thread(proc.communicate, timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            pytest.fail(f"the operator did not stop on SIGINT:\n{output[-3000:]}")
    assert proc.returncode in (0, -signal.SIGINT, 130), output[-3000:]
