"""End to end: the operator's Job runs for real here, as a kubelet would run it.

The stand-in kubelet takes the Job kmock holds, lays out its volumes (the ConfigMap's run.py at
/work/run.py, emptyDirs as temp directories), runs the container's command with the Job's env on
CPU against a tiny local checkpoint, and writes pod status, log and Job condition back.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from k8s_harness import CMS_URL, Harness

from model_support.operator.manifests import WORKDIR
from model_support.store import ResultsStore
from model_support.vocabulary import Result


async def kubelet_run(h: Harness, job: dict[str, Any], root: Path) -> tuple[int, str, str | None]:
    """Run the Job's runner container here; returns its exit status, output and termination
    message."""
    pod_spec = job["spec"]["template"]["spec"]
    [runner] = pod_spec["containers"]
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    paths: dict[str, Path] = {}
    for mount in runner["volumeMounts"]:
        local = root / mount["name"]
        source = volumes[mount["name"]]
        if "persistentVolumeClaim" in source:
            paths[mount["mountPath"]] = Path(mount["mountPath"])  # a shared volume: the host's
        elif "configMap" in source:
            cm = await h.get(f"{CMS_URL}/{source['configMap']['name']}")
            assert cm is not None, "the Job mounts a ConfigMap that does not exist"
            local.mkdir(parents=True, exist_ok=True)
            (local / mount["subPath"]).write_text(cm["data"][mount["subPath"]])
            paths[mount["mountPath"]] = local / mount["subPath"]
        else:
            local.mkdir(parents=True, exist_ok=True)
            paths[mount["mountPath"]] = local
    workdir = paths[runner["workingDir"]]
    os.link(paths[f"{WORKDIR}/run.py"], workdir / "run.py")

    def local_path(value: str) -> str:
        for mount_path, local in sorted(paths.items(), key=lambda kv: -len(kv[0])):
            if value == mount_path or value.startswith(mount_path + "/"):
                return str(local) + value[len(mount_path) :]
        return value

    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "OMP_NUM_THREADS", "LANG")}
    for var in runner["env"]:
        assert "value" in var, f"this stand-in resolves no valueFrom ({var['name']})"
        env[var["name"]] = local_path(var["value"])
    env["HF_HUB_OFFLINE"] = "1"  # a local checkpoint: nothing to fetch
    command = [
        sys.executable if runner["command"][0] == "python3" else runner["command"][0],
        *runner["command"][1:],
    ]
    # The kubelet's termination message file, as this stand-in's own file.
    termination = root / "termination-log"
    if "--termination-log" in command:
        command[command.index("--termination-log") + 1] = str(termination)
    proc = await asyncio.create_subprocess_exec(
        *command,
        cwd=workdir,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), timeout=240)
    assert proc.returncode is not None
    message = termination.read_text() if termination.exists() else None
    return proc.returncode, output.decode(), message


@pytest.mark.slow
async def test_runner_job_runs_run_py_and_the_record_holds_it(
    harness: Harness, tiny_llama_path: Path, tmp_path: Path
) -> None:
    h = harness
    h.settings.results_volume_claim = "results"  # the store is on a volume the pod mounts
    await h.start_operator()
    spec = {
        "model": str(tiny_llama_path),
        "profile": "cpu",
        "cores": 1,
        "dtype": "float32",
        "maxNewTokens": 8,
        "compileBackend": "aot_eager",
    }
    await h.create_test("tiny-llama", spec)
    [job] = await h.wait_job()
    pod = await h.start_pod(job)
    await h.run_pod(pod)

    exit_code, log, message = await kubelet_run(h, job, tmp_path / "pod")
    # The node is gone with the log: the runner delivered its document to the store anyway.
    await h.end_pod(job, pod, exit_code=exit_code, log=None, termination_message=message)

    status = await h.wait_status(
        "tiny-llama", lambda s: s.get("phase") == "Completed", "Completed", timeout=30
    )
    assert status["result"] == "PASS", (
        f"run.py said {status.get('result')}: {status.get('message')}\n{log[-3000:]}"
    )
    assert exit_code == 0 and status["wallTimeSeconds"] > 0

    [record] = list(ResultsStore(str(h.results)).records())
    assert record.labels["document_source"] == "delivery"
    assert message is not None and message.startswith("MODEL_SUPPORT_RESULT ")  # the fallback
    cm = await h.get(
        f"{CMS_URL}/{job['spec']['template']['spec']['volumes'][1]['configMap']['name']}"
    )
    assert cm is not None
    assert record.run_py == cm["data"]["run.py"]  # the dataset row holds exactly what ran
    assert record.document.result == Result.PASS and record.run_id == status["runId"]
    assert record.document.model == str(tiny_llama_path) and len(record.document.tokens[0]) == 8

    # The operator keeps the matrix current: the dataset row carries the same run.py.
    rows = await _matrix_rows(ResultsStore(str(h.results)))
    assert rows[["run_id", "result", "neuron_cores"]].values.tolist() == [
        [status["runId"], "PASS", 1]
    ]
    assert rows.iloc[0]["run_py"] == cm["data"]["run.py"]


async def _matrix_rows(store: ResultsStore, timeout: float = 30.0) -> pd.DataFrame:
    deadline = asyncio.get_running_loop().time() + timeout
    while not store.matrix_files():
        assert asyncio.get_running_loop().time() < deadline, (
            "the operator never materialized the matrix"
        )
        await asyncio.sleep(0.2)
    return store.matrix()
