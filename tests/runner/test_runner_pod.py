"""The runner container's entry point (model_support.runner_pod), run as a pod runs it.

A stand-in run.py (the real config block, scripted behaviour) plays each way a run can end; the
runner's process, its delivery to a real store (a local path, and S3 through moto's server),
its termination message and its exit status are checked as the operator will read them.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from model_support.config import RunConfig
from model_support.delivery import DeliveryArea, slot_for
from model_support.operator.manifests import DELIVERY_URL_ENV
from model_support.records import RESULT_MARKER, ResultDocument, Verification, parse_result_line
from model_support.runner_pod import compact_document
from model_support.script import (
    BEGIN,
    END,
    RUN_CONFIG_ENV,
    RUN_SHA256_ENV,
    config_block,
    program,
    render_script,
)
from model_support.vocabulary import ErrorClass, Result

CONFIG = RunConfig(model="org/tiny", cores=1, dtype="float32")

# run.py stand-in: the real config block, then whatever FAKE_MODE says.
FAKE_RUN_PY = f"""import json, os, signal, sys, time
{BEGIN}
CONFIG_JSON = "{{}}"
{END}
config = json.loads(CONFIG_JSON)
mode = os.environ["FAKE_MODE"]
doc = {{"model": config["model"], "task": config["task"], "dtype": config["dtype"],
        "cores": config["cores"], "result": "PASS", "tokens": [[1, 2, 3]],
        "packages": ["torch==2.13.0"]}}
print("loading", flush=True)
if mode == "pass":
    text = json.dumps(doc)
    with open(config["result_path"], "w") as f:
        f.write(text)
    print("MODEL_SUPPORT_RESULT " + text, flush=True)
    for i in range(1000):  # e.g. a chatty upload after the result
        print(f"uploading chunk {{i}}")
    sys.exit(0)
if mode == "exit3":
    print("Traceback: boom", flush=True)
    sys.exit(3)
if mode == "exit143":
    sys.exit(143)
if mode == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "sleep":
    print("compiling", flush=True)
    time.sleep(60)
if mode == "malformed":
    with open(config["result_path"], "w") as f:
        f.write(json.dumps({{"model": config["model"]}}))
    sys.exit(0)
if mode == "steal":  # code under test looking for the runner's upload URL
    doc["text"] = [os.environ.get("MODEL_SUPPORT_DELIVERY_URL") or ""]
    with open(config["result_path"], "w") as f:
        f.write(json.dumps(doc))
    sys.exit(0)
"""


SLOT = slot_for("op-run-1", b"the operator's key, not the pod's")
"""The run's delivery slot: what the operator prepares and reads, the only thing the pod gets."""


def delivered_to(store: str | Path) -> bytes | None:
    """What the runner delivered, read as the operator reads it."""
    return DeliveryArea(str(store)).get(SLOT)


def start_runner(
    workdir: Path,
    mode: str,
    store: str | None,
    *extra: str,
    env: dict[str, str | None] | None = None,
    prefix: tuple[str, ...] = (),
    pod_aws: dict[str, str | None] | None = None,
) -> subprocess.Popen[str]:
    """The runner as the operator starts it: given its slot only, a folder mounted from the
    results volume (local stores) or an upload URL signed for one key (s3://), never the
    store's credentials. ``pod_aws``: the pod's own AWS settings (e.g. Pod Identity's), which
    its compile cache transfers use; None values are left out."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "run.py").write_text(render_script(CONFIG, template=FAKE_RUN_PY))
    argv = [*prefix, sys.executable, "-m", "model_support.runner_pod", "--run-id", "op-run-1"]
    # None: not in the pod's environment
    pod_env = {
        k: v for k, v in {**os.environ, **(env or {}), "FAKE_MODE": mode}.items() if v is not None
    }
    if store is not None and "://" not in store:
        argv += ["--deliver-to", DeliveryArea(store).prepare(SLOT)]
    elif store is not None:
        pod_env[DELIVERY_URL_ENV] = DeliveryArea(store).upload_url(SLOT, 600)
        argv += ["--deliver-url-env", DELIVERY_URL_ENV]
        for name in [k for k in pod_env if k.startswith("AWS_")]:
            del pod_env[name]  # no store credentials in the pod
    pod_env.update({k: v for k, v in (pod_aws or {}).items() if v is not None})
    argv += ["--termination-log", str(workdir / "termination-log"), *extra]
    return subprocess.Popen(
        argv,
        cwd=workdir,
        env=pod_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_runner(
    workdir: Path,
    mode: str,
    store: str | None,
    *extra: str,
    env: dict[str, str | None] | None = None,
    prefix: tuple[str, ...] = (),
    pod_aws: dict[str, str | None] | None = None,
) -> tuple[int, str]:
    proc = start_runner(workdir, mode, store, *extra, env=env, prefix=prefix, pod_aws=pod_aws)
    output, _ = proc.communicate(timeout=120)
    return proc.returncode, output


def termination_message(workdir: Path) -> str:
    return (workdir / "termination-log").read_text()


def test_the_result_is_delivered_and_noise_after_it_does_not_matter(tmp_path: Path) -> None:
    store = tmp_path / "results"
    code, output = run_runner(tmp_path / "pod", "pass", str(store))
    assert code == 0, output
    delivered = delivered_to(store)
    assert delivered is not None
    document = ResultDocument.model_validate_json(delivered)
    assert document.result == Result.PASS and document.tokens == [[1, 2, 3]]
    # 1,000 lines after the result would have pushed it out of a 400-line log tail; the
    # runner prints the document again as the last line, and keeps a compact copy in the
    # termination message.
    assert output.rstrip("\n").splitlines()[-1].startswith(RESULT_MARKER)
    assert parse_result_line(output) == document
    compact = parse_result_line(termination_message(tmp_path / "pod"))
    assert compact is not None and compact.result == Result.PASS
    assert compact.tokens == [] and compact.packages == []  # the large parts are left out


def test_a_run_py_that_dies_without_a_document_gets_one_saying_why(tmp_path: Path) -> None:
    store = tmp_path / "results"
    code, _ = run_runner(tmp_path / "pod", "exit3", str(store))
    assert code == 3  # run.py's own status
    delivered = delivered_to(store)
    assert delivered is not None
    document = ResultDocument.model_validate_json(delivered)
    assert (document.result, document.error_class) == (Result.ERROR, ErrorClass.RUNTIME)
    assert "exited with status 3" in (document.error or "")
    assert "Traceback: boom" in (document.error or "")  # the output tail
    assert document.model == CONFIG.model  # identity from run.py's config block


def test_a_malformed_result_file_is_not_passed_on(tmp_path: Path) -> None:
    store = tmp_path / "results"
    code, _ = run_runner(tmp_path / "pod", "malformed", str(store))
    assert code == 1
    delivered = delivered_to(store)
    assert delivered is not None
    document = ResultDocument.model_validate_json(delivered)
    assert document.result == Result.ERROR and "malformed" in (document.error or "")


def test_sigkill_delivers_nothing_the_container_status_decides(tmp_path: Path) -> None:
    """SIGKILL is usually the OOM killer: only the container's OOMKilled reason can say so."""
    store = tmp_path / "results"
    code, _ = run_runner(tmp_path / "pod", "sigkill", str(store))
    assert code == 137
    assert delivered_to(store) is None
    message = termination_message(tmp_path / "pod")
    assert message.startswith("model-support runner:") and "SIGKILL" in message


def test_sigterm_stops_run_py_and_delivers_nothing(tmp_path: Path) -> None:
    """A disruption or the Job's deadline: the Job and the operator handle it, not a document."""
    store = tmp_path / "results"
    proc = start_runner(tmp_path / "pod", "sleep", str(store))
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:  # wait until run.py is really running
        if "compiling" in line or time.monotonic() > deadline:
            break
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert time.monotonic() - started < 30  # passed on at once, not after run.py's sleep
    assert proc.returncode == 143
    assert delivered_to(store) is None
    assert "stopped by a signal" in termination_message(tmp_path / "pod")


def test_run_py_past_the_timeout_is_stopped_and_recorded_as_timeout(tmp_path: Path) -> None:
    """The test's timeout counts from run.py's start, inside the runner (not the Job's deadline,
    which also counts time waiting for a node and pulling images)."""
    store = tmp_path / "results"
    started = time.monotonic()
    code, output = run_runner(tmp_path / "pod", "sleep", str(store), "--timeout", "2")
    assert time.monotonic() - started < 30, output  # stopped at its timeout, not after 60 s
    assert code == 124  # not 143: the Job's pod failure policy ignores that one
    delivered = delivered_to(store)
    assert delivered is not None, output
    document = ResultDocument.model_validate_json(delivered)
    assert document.result == Result.TIMEOUT
    assert "timeout of 2 s" in (document.error or "") and "compiling" in (document.error or "")


def test_a_run_py_that_exits_143_itself_is_not_taken_for_a_stopped_pod(tmp_path: Path) -> None:
    store = tmp_path / "results"
    code, _ = run_runner(tmp_path / "pod", "exit143", str(store))
    assert code == 1  # 143 is kept for a pod asked to stop (ignored by the Job, replaced)
    delivered = delivered_to(store)
    assert delivered is not None
    document = ResultDocument.model_validate_json(delivered)
    assert document.result == Result.ERROR and "status 143" in (document.error or "")


AS_POD_USER = ("unshare", "--user", "--map-user=1000", "--map-group=1000")
"""Run as uid/gid 1000 (the runner pod's user) in a user namespace: no root privileges over
files, so a device file this user may not open is refused as on a node."""


@pytest.mark.parametrize("mode", [0o060, None], ids=["not-accessible", "missing"])
def test_a_node_whose_neuron_devices_the_pod_cannot_open_is_infrastructure(
    tmp_path: Path, mode: int | None
) -> None:
    devices = tmp_path / "dev"
    devices.mkdir()
    if mode is not None:  # root-owned, group-only: like 0660 root:neuron for a user not in it
        (devices / "neuron0").touch()
        (devices / "neuron0").chmod(mode)
    store = tmp_path / "results"
    code, output = run_runner(
        tmp_path / "pod", "pass", str(store), "--neuron-devices", str(devices / "neuron*"),
        env={"NODE_NAME": "ip-10-0-3-7.ec2.internal"}, prefix=AS_POD_USER,
    )  # fmt: skip
    assert code == 1, output
    assert "loading" not in output  # checked before anything else: run.py never started
    delivered = delivered_to(store)
    assert delivered is not None, output
    document = ResultDocument.model_validate_json(delivered)
    assert (document.result, document.error_class) == (Result.ERROR, ErrorClass.INFRASTRUCTURE)
    error = document.error or ""
    assert "ip-10-0-3-7.ec2.internal" in error
    if mode is not None:
        assert "uid 1000" in error and "device_ownership_from_security_context" in error
        assert "runnerSupplementalGroups" in error
    else:
        assert "no Neuron device" in error


def test_a_pod_that_can_open_its_neuron_devices_runs(tmp_path: Path) -> None:
    devices = tmp_path / "dev"
    devices.mkdir()
    (devices / "neuron0").touch()
    (devices / "neuron0").chmod(0o600)  # the pod's user owns it (in its user namespace)
    code, output = run_runner(
        tmp_path / "pod", "pass", str(tmp_path / "results"),
        "--neuron-devices", str(devices / "neuron*"), prefix=AS_POD_USER,
    )  # fmt: skip
    assert code == 0, output


def _seed_inductor_cache(root: Path) -> int:
    """Three complete inductor cache entries, as torch lays them out; returns their count."""
    for relpath, data in (
        ("fxgraph/kn/fkn2btr2vnbnjr5wfq/xo7xmdndgb7o7ptcpgy", b"fx-graph-pickle" * 100),
        ("aotautograd/ayfajmyv6brtctsdvjm3/ncgjjajt5kodryvx", b"aot-entry" * 50),
        ("43/c43daxhgfnuvzfpo76ohnavy.py", b"# wrapper\nprint('hi')\n"),
    ):
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(data)
    return 3


def test_the_cache_is_pulled_before_and_pushed_after_and_recorded(tmp_path: Path) -> None:
    """The init step's report and the runner's push end up beside the result."""
    store, source, target = tmp_path / "results", tmp_path / "source", tmp_path / "target"
    seeded = tmp_path / "seeded"
    entries = _seed_inductor_cache(seeded)
    cli = str(Path(sys.executable).parent / "model-support")
    subprocess.run(
        [cli, "cache", "push", str(source), "--backend", "cpu"],
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(seeded)},
        check=True,
    )
    local = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "pod" / "inductor")}
    report = tmp_path / "pod" / ".model-support" / "pull.json"
    subprocess.run(  # the init step, as the operator's Job runs it
        [cli, "cache", "pull", str(source), "--backend", "cpu", "--keep-going",
         "--report", str(report), "--deadline", "60"],
        env={**os.environ, **local},
        check=True,
    )  # fmt: skip
    code, output = run_runner(
        tmp_path / "pod", "pass", str(store),
        "--pull-report", str(report), "--pull-source", str(source),
        "--compile-cache", str(target), "--cache-backend", "cpu",
        env=local,
    )  # fmt: skip
    assert code == 0, output
    delivered = delivered_to(store)
    assert delivered is not None
    document = ResultDocument.model_validate_json(delivered)
    assert document.result == Result.PASS and document.compile_cache is not None
    cache = document.compile_cache
    assert cache.target == str(target) and cache.prefix.startswith("inductor-torch-")
    assert cache.pull is not None and cache.push is not None
    assert (cache.pull.entries, cache.pull.error) == (entries, None)
    assert (cache.push.entries, cache.push.error) == (entries, None)  # what was pulled is kept
    assert len(list((target / cache.prefix).rglob("*@*"))) == entries
    # The log's last line and the termination message carry the same figures.
    assert parse_result_line(output) == document
    compact = parse_result_line(termination_message(tmp_path / "pod"))
    assert compact is not None and compact.compile_cache == cache


def test_a_failing_cache_push_changes_nothing_and_is_recorded(tmp_path: Path) -> None:
    """An unreachable store: the push is given up at its deadline, the result is delivered
    unchanged with the push's error beside it, and the pod does not linger after."""
    store = tmp_path / "results"
    _seed_inductor_cache(tmp_path / "inductor")
    started = time.monotonic()
    code, output = run_runner(
        tmp_path / "pod", "pass", str(store),
        "--compile-cache", "s3://unreachable-bucket/neff", "--cache-backend", "cpu",
        "--cache-deadline", "3",
        env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
             "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "testing",
             "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"},
    )  # fmt: skip
    assert code == 0, output  # run.py's status, not the cache's
    assert time.monotonic() - started < 60  # not held by the stalled client's retries
    delivered = delivered_to(store)
    assert delivered is not None
    document = ResultDocument.model_validate_json(delivered)
    assert document.result == Result.PASS and document.tokens == [[1, 2, 3]]
    assert document.compile_cache is not None and document.compile_cache.push is not None
    error = document.compile_cache.push.error or ""
    assert error.startswith(("deadline:", "target-unavailable:")), error
    assert document.compile_cache.push.entries == 0 and document.compile_cache.pull is None
    assert "FAILED" in output and output.rstrip("\n").splitlines()[-1].startswith(RESULT_MARKER)


def test_a_push_to_an_unwritable_path_and_a_missing_pull_report_are_recorded(
    tmp_path: Path,
) -> None:
    store = tmp_path / "results"
    _seed_inductor_cache(tmp_path / "inductor")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, output = run_runner(
        tmp_path / "pod", "exit3", str(store),
        "--pull-report", str(tmp_path / "never-written.json"), "--pull-source", "s3://team/x",
        "--compile-cache", str(blocker / "cache"), "--cache-backend", "cpu",
        env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},
    )  # fmt: skip
    assert code == 3, output  # run.py's own status, whatever the cache did
    delivered = delivered_to(store)
    assert delivered is not None
    document = ResultDocument.model_validate_json(delivered)
    assert (document.result, document.error_class) == (Result.ERROR, ErrorClass.RUNTIME)
    assert "exited with status 3" in (document.error or "")  # the result is run.py's
    cache = document.compile_cache
    assert cache is not None and cache.pull is not None and cache.push is not None
    assert (cache.pull.error or "").startswith("no-report:")
    assert cache.push.error and cache.push.entries == 0


def test_the_compact_document_fits_a_termination_message() -> None:
    huge = ResultDocument(
        model="org/" + "m" * 150,
        task="text-generation",
        result=Result.FAIL,
        error="x" * 20_000,
        tokens=[list(range(4096))],
        text=["word " * 5000],
        packages=[f"pkg{i}==1.0" for i in range(500)],
        verification=Verification(
            passed=False, bad_tokens=3, positions=[{"token": i} for i in range(3000)]
        ),
    )
    line = compact_document(huge)
    assert len(line.encode()) <= 4096
    compact = parse_result_line(line)
    assert compact is not None
    assert (compact.result, compact.verification.bad_tokens) == (Result.FAIL, 3)
    assert compact.model == huge.model and (compact.error or "").startswith("xxx")


@pytest.fixture
def s3_store() -> tuple[object, str, dict[str, str]]:
    """An S3 results store on moto's server (real S3 protocol, through s3fs)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    bucket = f"results-{uuid.uuid4().hex[:12]}"  # moto's buckets outlive its servers
    s3fs.S3FileSystem().mkdir(bucket)
    try:
        yield server, f"s3://{bucket}/model-support", env
    finally:
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3fs.S3FileSystem.clear_instance_cache()


def test_run_py_does_not_inherit_the_runners_upload_url(
    tmp_path: Path, s3_store: tuple[object, str, dict[str, str]]
) -> None:
    """The upload URL is a credential for the attempt's slot: code in run.py (the model's,
    extra packages', a pulled cache's) does not find it in its environment."""
    _, uri, env = s3_store
    code, output = run_runner(tmp_path / "pod", "steal", uri, env=env)
    assert code == 0, output
    delivered = delivered_to(uri)
    assert delivered is not None
    assert ResultDocument.model_validate_json(delivered).text == [""]
    assert "X-Amz-Signature" not in output  # nor in the pod's log


def test_delivery_to_s3_survives_a_store_outage(
    tmp_path: Path, s3_store: tuple[object, str, dict[str, str]]
) -> None:
    from moto.server import ThreadedMotoServer

    server, uri, env = s3_store
    assert isinstance(server, ThreadedMotoServer)
    host, port = server.get_host_and_port()
    server.stop()  # the store is down when the run ends
    proc = start_runner(tmp_path / "pod", "pass", uri, env=env)
    time.sleep(2)
    back = ThreadedMotoServer(ip_address=host, port=port)  # same endpoint, same data
    back.start()
    try:
        output, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, output
        delivered = delivered_to(uri)
        assert delivered is not None
        assert json.loads(delivered)["result"] == "PASS"
    finally:
        back.stop()


def test_s3_with_eks_pod_identity_credentials_delivery_needs_none_the_cache_push_uses_them(
    tmp_path: Path, s3_store: tuple[object, str, dict[str, str]]
) -> None:
    """With EKS Pod Identity the pod has no keys: the SDK asks the node's agent (what the
    chart's NetworkPolicy lets runners reach) with the projected token, for the compile cache
    push to s3://; the result goes to the attempt's signed URL, which needs no credentials. A
    stand-in agent serves credentials only for that token."""
    import http.server
    import threading

    import s3fs

    _, uri, env = s3_store
    token = "pod-identity-token-123"
    (tmp_path / "token").write_text(token)
    asked: list[str] = []
    cache_bucket = f"cache-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(cache_bucket)
    entries = _seed_inductor_cache(tmp_path / "inductor")

    class Agent(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.headers.get("Authorization") or "")
            if self.headers.get("Authorization") != token:
                self.send_response(401)
                self.end_headers()
                return
            body = json.dumps(
                {
                    "AccessKeyId": "ASIAPODIDENTITY",
                    "SecretAccessKey": "pod-identity-secret",
                    "Token": "pod-identity-session",
                    "Expiration": "2099-01-01T00:00:00Z",
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    agent = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Agent)
    threading.Thread(target=agent.serve_forever, daemon=True).start()
    try:
        code, output = run_runner(
            tmp_path / "pod", "pass", uri,
            "--compile-cache", f"s3://{cache_bucket}/cache", "--cache-backend", "cpu",
            env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},
            pod_aws={
                "AWS_ENDPOINT_URL": env["AWS_ENDPOINT_URL"],
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
                "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
                "AWS_CONTAINER_CREDENTIALS_FULL_URI": f"http://127.0.0.1:{agent.server_port}/v1/credentials",
                "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(tmp_path / "token"),
            },
        )  # fmt: skip
    finally:
        agent.shutdown()
    assert code == 0, output
    assert token in asked  # the push's credentials came from the agent
    delivered = delivered_to(uri)
    assert delivered is not None, output
    document = ResultDocument.model_validate_json(delivered)
    assert document.result == Result.PASS and document.compile_cache is not None
    push = document.compile_cache.push
    assert push is not None and (push.entries, push.error) == (entries, None), output
    assert len(s3fs.S3FileSystem().find(f"{cache_bucket}/cache")) >= entries


AS_PID_1 = ("unshare", "--user", "--map-root-user", "--pid", "--fork")
"""PID 1 of a PID namespace of its own, as a container's command is: the kernel drops the
signals PID 1 has no handler for."""


def test_a_pod_stopped_while_it_delivers_keeps_run_pys_verdict(tmp_path: Path) -> None:
    """A preemption after run.py ended, while the store is unreachable: the runner (the
    container's PID 1) stops retrying within its short stopped deadline and exits with run.py's
    status, the result in its termination message; it is not killed by SIGKILL after the grace
    period (137, which the Job's policy would take for the runner's own verdict)."""
    unreachable = "http://127.0.0.1:9/slot"  # nothing listens on the discard port
    proc = start_runner(
        tmp_path / "pod", "pass", None, "--deliver-url-env", DELIVERY_URL_ENV,
        env={DELIVERY_URL_ENV: unreachable}, prefix=AS_PID_1,
    )  # fmt: skip
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:  # run.py ended and the delivery is being retried
        seen.append(line)
        if "retrying in" in line or time.monotonic() > deadline:
            break
    [pid_1] = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    stopped_at = time.monotonic()
    os.kill(int(pid_1), signal.SIGTERM)
    try:
        output, _ = proc.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        os.kill(int(pid_1), signal.SIGKILL)  # what the kubelet does after the grace period
        proc.communicate(timeout=30)
        raise AssertionError("the runner ignored SIGTERM while delivering") from None
    assert time.monotonic() - stopped_at < 30  # within the kubelet's default grace period
    assert proc.returncode == 0, "".join(seen) + output  # run.py's own status
    assert parse_result_line(termination_message(tmp_path / "pod")).result == Result.PASS


def program_pod(tmp_path: Path, *, tamper: str | None = None) -> tuple[Path, dict[str, str]]:
    """A pod as the operator makes it: the program ConfigMap's head and tail mounted, and the
    test's config block and run.py's sha256 in its environment (``tamper``: a line someone put
    into the ConfigMap's tail)."""
    rendered = render_script(CONFIG, template=FAKE_RUN_PY)
    parts = program(FAKE_RUN_PY)
    mounted = tmp_path / "program"
    mounted.mkdir()
    (mounted / "head").write_text(parts.head)
    (mounted / "tail").write_text(parts.tail + (tamper or ""))
    env = {
        RUN_CONFIG_ENV: config_block(CONFIG),
        RUN_SHA256_ENV: hashlib.sha256(rendered.encode()).hexdigest(),
    }
    return mounted, env


def test_the_runner_writes_the_run_py_the_operator_rendered_and_runs_it(tmp_path: Path) -> None:
    mounted, env = program_pod(tmp_path)
    pod = tmp_path / "pod"
    pod.mkdir()
    argv = [sys.executable, "-m", "model_support.runner_pod", "--run-id", "op-run-1"]
    argv += ["--program", str(mounted), "--termination-log", str(pod / "termination-log")]
    done = subprocess.run(
        argv,
        cwd=pod,
        env={**os.environ, **env, "FAKE_MODE": "pass"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (pod / "run.py").read_text() == render_script(CONFIG, template=FAKE_RUN_PY)
    assert "loading" in done.stdout  # run.py ran


def test_a_run_py_that_is_not_the_one_rendered_never_runs(tmp_path: Path) -> None:
    mounted, env = program_pod(tmp_path, tamper="\nprint('planted', flush=True)\n")
    store = tmp_path / "results"
    pod = tmp_path / "pod"
    pod.mkdir()
    argv = [sys.executable, "-m", "model_support.runner_pod", "--run-id", "op-run-1"]
    argv += ["--program", str(mounted), "--deliver-to", DeliveryArea(str(store)).prepare(SLOT)]
    argv += ["--termination-log", str(pod / "termination-log")]
    done = subprocess.run(
        argv, cwd=pod, env={**os.environ, **env, "FAKE_MODE": "pass"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "planted" not in output and "loading" not in output  # nothing ran
    assert not (pod / "run.py").exists()
    delivered = delivered_to(store)
    assert delivered is not None, output
    document = ResultDocument.model_validate_json(delivered)
    # Never the model's verdict: the test's own identity, and what was wrong.
    assert (document.result, document.error_class) == (Result.ERROR, ErrorClass.INFRASTRUCTURE)
    assert document.model == CONFIG.model
    assert "sha256" in (document.error or "") and "program ConfigMap" in (document.error or "")
