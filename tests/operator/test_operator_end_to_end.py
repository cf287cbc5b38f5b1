"""End to end: the operator's Job runs for real here, as a kubelet would run it.

The stand-in kubelet takes the Job kmock holds, lays out its volumes (the program ConfigMap's
head and tail in a folder, emptyDirs as temp directories), runs the container's command with the
Job's env on CPU against a tiny local checkpoint (the runner writes run.py from the program and
the config block in its env), and writes pod status, log and Job condition back.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from k8s_harness import CMS_URL, JOBS_URL, Harness

from model_support.compile_cache import SigningKey
from model_support.operator.resource import LABEL_TEST
from model_support.store import ResultsStore
from model_support.vocabulary import Result


async def kubelet_run(h: Harness, job: dict[str, Any], root: Path) -> tuple[int, str, str | None]:
    """Run the Job's init containers in order, then its runner container, here; returns the
    runner's exit status (or the failed init step's), the pod's output and the termination
    message."""
    pod_spec = job["spec"]["template"]["spec"]
    [runner] = pod_spec["containers"]
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    output = ""
    for container in [*pod_spec.get("initContainers", []), runner]:
        code, text, message = await _run_container(h, container, volumes, root)
        output += text
        if code != 0 and container is not runner:
            return code, output, None  # restartPolicy Never: a failed init step fails the pod
    return code, output, message


async def _run_container(
    h: Harness, container: dict[str, Any], volumes: dict[str, Any], root: Path
) -> tuple[int, str, str | None]:
    paths: dict[str, Path] = {}
    for mount in container["volumeMounts"]:
        local = root / mount["name"]  # one folder per volume, shared by the pod's containers
        source = volumes[mount["name"]]
        if "persistentVolumeClaim" in source:
            # A shared volume: where the operator has it mounted (the host's), or its subPath.
            claims = {
                h.settings.results_volume_claim: h.settings.results_uri,
                h.settings.compile_cache_volume_claim: h.settings.compile_cache_volume_path,
            }
            volume_root = Path(claims[source["persistentVolumeClaim"]["claimName"]])
            paths[mount["mountPath"]] = volume_root / mount.get("subPath", "")
        elif "configMap" in source:
            url = f"{CMS_URL}/{source['configMap']['name']}"
            # The program ConfigMap is made before the Job; the kubelet would retry the mount.
            cm = await h.wait_for(lambda u=url: h.get(u), what="the Job's ConfigMap", timeout=30)
            # Its items as files in a folder, read-only as the kubelet projects them.
            local.mkdir(parents=True, exist_ok=True)
            items = source["configMap"].get("items") or [{"key": k, "path": k} for k in cm["data"]]
            for item in items:
                (local / item["path"]).write_text(cm["data"][item["key"]], encoding="utf-8")
                (local / item["path"]).chmod(0o444)
            paths[mount["mountPath"]] = local / mount.get("subPath", "")
        else:
            local.mkdir(parents=True, exist_ok=True)
            paths[mount["mountPath"]] = local

    def local_path(value: str) -> str:
        for mount_path, local in sorted(paths.items(), key=lambda kv: -len(kv[0])):
            if value == mount_path or value.startswith(mount_path + "/"):
                return str(local) + value[len(mount_path) :]
        return value

    workdir = Path(local_path(container["workingDir"]))

    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "OMP_NUM_THREADS", "LANG")}
    for var in container.get("env", []):
        field = (var.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        if field == "spec.nodeName":
            env[var["name"]] = "stand-in-node"
            continue
        assert "value" in var, f"this stand-in resolves no valueFrom ({var['name']})"
        env[var["name"]] = local_path(var["value"])
    env["HF_HUB_OFFLINE"] = "1"  # a local checkpoint: nothing to fetch
    programs = {"python3": sys.executable, "model-support": str(Path(sys.executable).parent / "model-support")}  # fmt: skip
    # Paths under the container's mounts are where this stand-in laid those volumes out.
    command = [programs.get(container["command"][0], container["command"][0])]
    command += [local_path(arg) for arg in container["command"][1:]]
    # The kubelet's termination message file, as this stand-in's own file.
    termination = root / f"termination-log-{container['name']}"
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
    # The runner wrote run.py itself, from the program ConfigMap and its config block.
    run_py = await h.run_py_of(job)
    assert (tmp_path / "pod" / "work" / "run.py").read_text(encoding="utf-8") == run_py
    assert record.run_py == run_py  # the dataset row holds exactly what ran
    assert record.document.result == Result.PASS and record.run_id == status["runId"]
    assert record.document.model == str(tiny_llama_path) and len(record.document.tokens[0]) == 8

    # The operator keeps the matrix current: the dataset row carries the same run.py.
    rows = await _matrix_rows(ResultsStore(str(h.results)))
    assert rows[["run_id", "result", "neuron_cores"]].values.tolist() == [
        [status["runId"], "PASS", 1]
    ]
    assert rows.iloc[0]["run_py"] == run_py


async def _matrix_rows(store: ResultsStore, timeout: float = 30.0) -> pd.DataFrame:
    deadline = asyncio.get_running_loop().time() + timeout
    while not store.matrix_files():
        assert asyncio.get_running_loop().time() < deadline, (
            "the operator never materialized the matrix"
        )
        await asyncio.sleep(0.2)
    return store.matrix()


# ------------------------------------------------------------------------- the compile cache

CPU_SPEC = {
    "profile": "cpu",
    "cores": 1,
    "dtype": "float32",
    "maxNewTokens": 4,
    "compileBackend": "aot_eager",
}


def _seed_cache(target: str, tmp_path: Path, key: Any = None) -> int:
    """Push three complete inductor entries (as torch lays them out) to ``target`` (signed
    with ``key``: a trusted pusher's)."""
    from model_support.compile_cache import installed_compiler_cache, push

    local = tmp_path / "seeded-inductor"
    for relpath, data in (
        ("fxgraph/kn/fkn2btr2vnbnjr5wfq/xo7xmdndgb7o7ptcpgy", b"fx-graph-pickle" * 100),
        ("aotautograd/ayfajmyv6brtctsdvjm3/ncgjjajt5kodryvx", b"aot-entry" * 50),
        ("43/c43daxhgfnuvzfpo76ohnavy.py", b"# wrapper\nprint('hi')\n"),
    ):
        (local / relpath).parent.mkdir(parents=True, exist_ok=True)
        (local / relpath).write_bytes(data)
    compiler = installed_compiler_cache("cpu", environ={"TORCHINDUCTOR_CACHE_DIR": str(local)})
    report = push(target, compiler=compiler, signing_key=key)
    assert report.error is None and report.entries == 3
    return report.entries


async def _run_cached_test(
    h: Harness, name: str, cache: dict[str, str], model: Path, root: Path
) -> tuple[dict[str, Any], Any, str]:
    """One test through the operator, its Job run by the stand-in kubelet (init pull, run.py,
    push); returns its final status, its record and the pod's output."""
    await h.create_test(name, {"model": str(model), **CPU_SPEC, "compileCache": cache})

    async def own_job() -> list[dict[str, Any]] | None:
        jobs = await h.items(JOBS_URL)
        return [j for j in jobs if j["metadata"]["labels"][LABEL_TEST] == name] or None

    [job] = await h.wait_for(own_job, what=f"the Job of {name}")
    init = job["spec"]["template"]["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["compile-cache-pull"]
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    exit_code, log, message = await kubelet_run(h, job, root)
    await h.end_pod(job, pod, exit_code=exit_code, log=None, termination_message=message)
    status = await h.wait_status(
        name, lambda s: s.get("phase") == "Completed", "Completed", timeout=30
    )
    assert status["result"] == "PASS", f"{status.get('message')}\n{log[-3000:]}"
    [record] = [r for r in ResultsStore(str(h.results)).records() if r.run_id == status["runId"]]
    assert record.labels["document_source"] == "delivery"
    return status, record, log


@pytest.mark.slow
async def test_the_job_pulls_and_pushes_a_cache_on_its_volume_and_records_the_figures(
    harness: Harness, tiny_llama_path: Path, tmp_path: Path
) -> None:
    h = harness
    h.settings.results_volume_claim = "results"
    volume = tmp_path / "compile-caches"  # the cache PVC, as the stand-in mounts it
    h.settings.compile_cache_volume_claim = "compile-caches"
    h.settings.compile_cache_volume_path = str(volume)
    # A shared cache its readers trust by its pusher's signature; the namespace's own cache.
    key = SigningKey.generate()
    h.settings.compile_cache_trusted_keys = [key.public_key()]
    shared, team = f"{volume}/shared", f"{volume}/default"
    # Both are folders of the volume a pod may mount: its namespace's, and a shared one.
    h.settings.compile_cache_push_targets = [f"{volume}/{{namespace}}", shared]
    entries = _seed_cache(shared, tmp_path, key)
    await h.start_operator()

    status, record, log = await _run_cached_test(
        h, "cached", {"source": shared, "target": team}, tiny_llama_path, tmp_path / "pod"
    )
    cache = record.document.compile_cache
    assert cache is not None and cache.pull is not None and cache.push is not None, log[-3000:]
    assert (cache.pull.entries, cache.pull.error) == (entries, None)
    # Pulled entries are local entries too: the push leaves the team's cache holding them.
    assert (cache.push.entries, cache.push.error) == (entries, None)
    assert cache.target == team and cache.prefix.startswith("inductor-torch-")
    assert len(list((Path(team) / cache.prefix).rglob("*@*"))) == entries

    rows = await _matrix_rows(ResultsStore(str(h.results)))
    row = rows.set_index("run_id").loc[status["runId"]]
    assert (row["compile_cache_pulled_entries"], row["compile_cache_pushed_entries"]) == (3, 3)
    assert row["compile_cache_target"] == team and pd.isna(row["compile_cache_error"])


@pytest.fixture
def s3_cache(monkeypatch: pytest.MonkeyPatch) -> Any:
    """An S3 bucket on moto's server (the real S3 protocol, through s3fs); yields the env a
    pod needs to reach it."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().mkdir("neff-team")
    try:
        yield env
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()


@pytest.mark.slow
async def test_the_job_pulls_and_pushes_an_s3_cache_and_a_failed_pull_changes_nothing(
    harness: Harness, tiny_llama_path: Path, tmp_path: Path, s3_cache: dict[str, str]
) -> None:
    h = harness
    h.settings.results_volume_claim = "results"
    # The store's endpoint and credentials reach the pull step and the runner alike.
    h.settings.runner_env = [{"name": k, "value": v} for k, v in s3_cache.items()]
    # The namespace's own prefix: its tests push there, and (each namespace's IAM role may
    # write its own prefix only) pull their own entries unsigned.
    h.settings.compile_cache_push_targets = ["s3://neff-team/{namespace}"]
    h.settings.compile_cache_namespaces_isolated = True
    target = "s3://neff-team/default"
    entries = _seed_cache(target, tmp_path)
    await h.start_operator()

    status, record, log = await _run_cached_test(
        h, "warm", {"source": target, "target": target}, tiny_llama_path, tmp_path / "warm"
    )
    cache = record.document.compile_cache
    assert cache is not None and cache.pull is not None and cache.push is not None, log[-3000:]
    assert (cache.pull.entries, cache.pull.error, cache.target) == (entries, None, target)
    assert (cache.push.entries, cache.push.error) == (0, None)  # nothing new: nothing moved

    # A source bucket that does not exist: the pull fails, the test runs and passes anyway,
    # and the failure is recorded beside its result.
    status, record, log = await _run_cached_test(
        h,
        "no-bucket",
        {"source": "s3://no-such-bucket/neff", "target": target},
        tiny_llama_path,
        tmp_path / "cold",
    )
    cache = record.document.compile_cache
    assert cache is not None and cache.pull is not None and cache.push is not None
    assert (cache.pull.error or "").startswith("target-unavailable:"), cache.pull
    assert cache.pull.entries == 0 and cache.push.error is None
    assert status["result"] == "PASS" and record.document.result == Result.PASS
