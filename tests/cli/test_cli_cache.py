"""`model-support cache` and `model-support run --compile-cache`, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from model_support.store import ResultsStore

CLI = str(Path(sys.executable).with_name("model-support"))
PREFIX = f"inductor-torch-{torch.__version__}"


def cli(
    args: list[str], env: dict[str, str], timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=timeout,
        check=False,
    )


def inductor_files(root: Path) -> None:
    """A few inductor cache entries (their exact bytes do not matter to the transfer)."""
    for relpath, data in {
        "fxgraph/ab/fabc123/entry1": b"graph" * 40,
        "43/c43wrapper.py": b"print('wrapper')\n",
        "locks/c43wrapper.lock": b"",
    }.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(data)


def test_cache_push_pull_ls_and_prune_through_the_command_line(tmp_path: Path) -> None:
    source, fresh, target = tmp_path / "source", tmp_path / "fresh", tmp_path / "target"
    inductor_files(source)
    pushed = cli(["cache", "push", str(target), "--json"], {"TORCHINDUCTOR_CACHE_DIR": str(source)})
    assert pushed.returncode == 0, pushed.stderr
    report = json.loads(pushed.stdout)
    assert (report["direction"], report["prefix"], report["entries"]) == ("push", PREFIX, 2)
    assert sorted(os.listdir(target)) == [PREFIX]

    pulled = cli(
        ["cache", "pull", str(target), "--report", str(tmp_path / "pull.json")],
        {"TORCHINDUCTOR_CACHE_DIR": str(fresh)},
    )
    assert pulled.returncode == 0, pulled.stderr
    assert "pulled 2 entries" in " ".join(pulled.stderr.split())
    assert json.loads((tmp_path / "pull.json").read_text())["entries"] == 2
    assert (fresh / "43" / "c43wrapper.py").read_bytes() == b"print('wrapper')\n"

    listed = cli(["cache", "ls", str(target), "--json"], {"TORCHINDUCTOR_CACHE_DIR": str(fresh)})
    assert json.loads(listed.stdout)[0] | {"truncated": []} == {
        "prefix": PREFIX,
        "installed": True,
        "entries": 2,
        "versions": 2,
        "bytes": 200 + 17,
        "unverified": 0,
        "truncated": [],
        "foreign": 0,
    }
    pruned = cli(
        ["cache", "prune", str(target), "--dry-run", "--json"],
        {"TORCHINDUCTOR_CACHE_DIR": str(fresh)},
    )
    assert json.loads(pruned.stdout)["removed"] == []


def test_cache_commands_refuse_another_compilers_prefix_and_say_why(tmp_path: Path) -> None:
    done = cli(["cache", "pull", str(tmp_path / "t" / "neuronxcc-2.27.0.0")], {})
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert "neuronx-cc 2.27.0.0" in message and f"prefix {PREFIX}" in message
    assert "Give the cache's root" in message


def test_an_unreachable_target_fails_the_command_unless_keep_going(tmp_path: Path) -> None:
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "c"),
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_MAX_ATTEMPTS": "1",
    }
    failed = cli(["cache", "pull", "s3://nowhere/cache"], env)
    assert failed.returncode == 1
    assert "could not open the compile cache at s3://nowhere/cache" in " ".join(
        failed.stderr.split()
    )
    report_file = tmp_path / "pull.json"
    kept = cli(
        ["cache", "pull", "s3://nowhere/cache", "--keep-going", "--report", str(report_file)], env
    )
    assert kept.returncode == 0
    assert json.loads(report_file.read_text())["error"].startswith("target-unavailable: ")


def test_a_stalled_store_is_given_up_at_the_deadline(tmp_path: Path) -> None:
    """A store that accepts connections and never answers (its clients would wait and retry
    for minutes): with --deadline the command gives up in time and says so, and exits at once
    (a pod's init step must not hold the node)."""
    import socket
    import time

    inductor_files(tmp_path / "c")
    with socket.socket() as stalled:
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(16)  # connections complete in the backlog; nothing is ever read
        env = {
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "c"),
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{stalled.getsockname()[1]}",
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "x",
        }
        started = time.monotonic()
        failed = cli(["cache", "push", "s3://stalled/cache", "--deadline", "2"], env, timeout=120)
        assert time.monotonic() - started < 60
        assert failed.returncode == 1
        assert "did not finish within 2 s" in " ".join(failed.stderr.split())
        report_file = tmp_path / "pull.json"
        kept = cli(
            ["cache", "pull", "s3://stalled/cache", "--keep-going", "--deadline", "2",
             "--report", str(report_file)],
            env,
            timeout=120,
        )  # fmt: skip
        assert kept.returncode == 0
        assert json.loads(report_file.read_text())["error"].startswith("deadline: ")


@pytest.mark.slow
def test_run_records_the_cache_beside_a_result_a_broken_cache_does_not_change(
    tiny_llama_path: Path, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # the cache's store is down
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_MAX_ATTEMPTS": "1",
    }
    args = [
        "run",
        str(tiny_llama_path),
        "--cores",
        "1",
        "--compile-backend",
        "aot_eager",
        "--dtype",
        "float32",
    ]
    done = cli(
        [*args, "--results", str(results), "--compile-cache", "s3://nowhere/cache", "--json"], env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["result"] == "PASS"
    cache = summary["compile_cache"]
    assert (cache["target"], cache["prefix"]) == ("s3://nowhere/cache", PREFIX)
    assert cache["pull"]["error"].startswith("target-unavailable") and cache["push"]["error"]
    (record,) = ResultsStore(results).records()
    assert record.document.compile_cache is not None
    # stored before the push (a push never costs the result): the pull beside the result
    assert record.document.compile_cache.model_dump() == cache | {"push": None}
    row = pd.read_parquet(results / "data").iloc[0]
    assert row.result == "PASS"
    assert row.compile_cache_error.startswith("pull: target-unavailable")

    wrong = cli(
        [*args, "--results", str(results), "--compile-cache", str(tmp_path / "neuronxcc-2.0.0")],
        env,
    )
    assert wrong.returncode == 2 and "neuronx-cc 2.0.0" in " ".join(wrong.stderr.split())
    assert len(list(ResultsStore(results).records())) == 1  # refused before anything ran


@pytest.mark.slow
def test_a_second_machine_pulls_the_first_ones_inductor_cache_and_compiles_from_it(
    tiny_llama_path: Path, tmp_path: Path
) -> None:
    """Cold on one machine (fresh cache), then warm on another (another fresh cache) through
    the shared target: the second run's graphs come from the cache."""
    target, results = tmp_path / "target", tmp_path / "results"
    args = [
        "run",
        str(tiny_llama_path),
        "--cores",
        "1",
        "--compile-backend",
        "inductor",
        "--dtype",
        "float32",
    ]
    args += ["--results", str(results), "--compile-cache", str(target), "--json"]
    cold = cli(args, {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "machine-1")})
    assert cold.returncode == 0, cold.stderr[-3000:]
    first = json.loads(cold.stdout.strip().splitlines()[-1])["compile_cache"]
    assert first["pull"]["entries"] == 0 and first["push"]["entries"] > 0

    warm = cli(args, {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "machine-2")})
    assert warm.returncode == 0, warm.stderr[-3000:]
    second = json.loads(warm.stdout.strip().splitlines()[-1])["compile_cache"]
    assert second["pull"]["entries"] == first["push"]["entries"]
    assert second["pull"]["skipped"] == 0 and second["push"]["entries"] == 0

    rows = pd.read_parquet(results / "data")
    assert len(rows) == 1  # the latest run of the model
    row = rows.iloc[0]
    assert row.compile_cache_pulled_entries == second["pull"]["entries"]
    assert row.compile_cache_hits > 0 and row.compile_cache_misses == 0
    assert bool(row.compile_cache_hit)
    assert row.compile_cache_prefix == PREFIX and row.compile_cache_target == str(target)


class UploadStaller:
    """A TCP proxy in front of an S3 server that forwards every request but holds each upload
    (PUT) forever, unanswered: a store that stalls while a push writes."""

    def __init__(self, upstream: str) -> None:
        import socket
        import threading

        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.put_seen = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: object) -> None:
        import socket
        import threading

        assert isinstance(client, socket.socket)
        upstream = socket.create_connection(self.upstream)

        def answer() -> None:
            while data := upstream.recv(65536):
                client.sendall(data)

        threading.Thread(target=answer, daemon=True).start()
        while data := client.recv(65536):
            if data.startswith(b"PUT "):
                self.put_seen.set()
                return  # held: never forwarded, never answered
            upstream.sendall(data)

    def close(self) -> None:
        self.listener.close()


@pytest.mark.slow
def test_a_run_whose_push_stalls_and_is_stopped_keeps_its_recorded_result(
    tiny_llama_path: Path, tmp_path: Path, s3_endpoint: str
) -> None:
    """The record is saved before the push: stopping a stalled push (SIGTERM) loses nothing."""
    import signal

    import boto3

    credentials = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    env = {**credentials, "AWS_DEFAULT_REGION": "us-east-1"}
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", **{
        k.lower(): v for k, v in credentials.items()
    }).create_bucket(Bucket="stalls-on-upload")  # fmt: skip
    inductor_files(tmp_path / "inductor")  # entries the push will upload
    staller = UploadStaller(s3_endpoint)
    env |= {"AWS_ENDPOINT_URL": staller.url, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    results = tmp_path / "results"
    args = ["run", str(tiny_llama_path), "--cores", "1", "--compile-backend", "aot_eager"]
    args += ["--dtype", "float32", "--results", str(results)]
    args += ["--compile-cache", "s3://stalls-on-upload/cache"]
    try:
        process = subprocess.Popen(
            [CLI, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        try:
            assert staller.put_seen.wait(600), "the push never started"
            process.send_signal(signal.SIGTERM)
            stdout, stderr = process.communicate(timeout=120)
        finally:
            process.kill()
    finally:
        staller.close()
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    message = " ".join((stdout + stderr).split())
    assert "push was given up; the result was recorded before it" in message
    (record,) = ResultsStore(results).records()
    assert record.document.result == "PASS"
    assert record.document.compile_cache is not None
    assert record.document.compile_cache.pull is not None
    assert record.document.compile_cache.pull.error is None
    assert pd.read_parquet(results / "data").iloc[0].result == "PASS"
