"""One tenant's pod cannot stall another's recording through its delivery slot or its log.

A runner pod writes its own attempt's slot (a folder of the results volume, or one S3 key
through a signed URL) and its own log: whatever it leaves there, the operator removes the slot
in bounded time without failing, cleans a slot written again after the run was recorded, and
reads a bounded number of bytes of the log.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest
from k8s_harness import Harness
from test_operator_lifecycle import SPEC, document_for, start

from model_support.delivery import (
    REMOVAL_BUDGET,
    REMOVED_DIR,
    DeliveryArea,
    deliver_to_folder,
    deliver_to_url,
)
from model_support.operator.recording import sweep_deliveries
from model_support.operator.spec import parse_spec
from model_support.records import RESULT_MARKER, ResultDocument, record_from_document
from model_support.runner_pod import compact_document
from model_support.store import ResultsStore
from model_support.vocabulary import Result

SLOT = "run-1." + "a" * 32


def _deep_tree(folder: Path, depth: int) -> None:
    """A chain of ``depth`` nested folders, made one level at a time relative to the last (a
    removal that recursed per level would need as deep a stack)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)


def poison(slot: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a hostile runner pod can leave in its slot folder."""
    (slot / ".x.tmp").mkdir()  # a folder named like a temporary file of a stopped delivery
    (slot / ".x.tmp" / "inside").write_bytes(b"x")
    (slot / "to-a-file").symlink_to(outside / "precious")
    (slot / "to-a-folder").symlink_to(outside)
    os.mkfifo(slot / "fifo")
    monkeypatch.chdir(slot)  # a socket path is short: bound relative to the slot
    server = socket.socket(socket.AF_UNIX)
    server.bind("socket")
    server.close()
    _deep_tree(slot, 900)
    many = slot / "many"
    many.mkdir()
    for index in range(12_000):
        (many / str(index)).touch()


def test_removing_a_slot_never_fails_and_never_takes_unbounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "precious").write_text("the operator's own file")
    area = DeliveryArea(tmp_path / "results")
    slot = Path(area.prepare(SLOT))
    deliver_to_folder(slot, b"{}")
    poison(slot, outside, monkeypatch)

    area.remove(SLOT)  # used to raise IsADirectoryError on .x.tmp
    assert not slot.exists() and area.slots() == []
    # Emptied a bounded amount per call, never through a link.
    rounds = 0
    while area.purge():
        rounds += 1
        assert rounds < 100
    assert rounds >= 12_000 // REMOVAL_BUDGET  # many files: more than one call's worth
    assert list((tmp_path / "results" / "deliveries" / REMOVED_DIR).iterdir()) == []
    assert (outside / "precious").read_text() == "the operator's own file"


def test_a_slot_written_after_its_run_was_recorded_is_swept(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results")
    document = ResultDocument(model="org/model", task="text-generation", result=Result.PASS)
    store.add(record_from_document(document, "print(1)\n", run_id="op-recorded"))
    area = DeliveryArea(store.uri)
    key_recorded, key_running = "op-recorded." + "b" * 32, "op-running." + "c" * 32
    for slot in (key_recorded, key_running):
        deliver_to_folder(area.prepare(slot), b"{}")  # the first written again: a late write
    assert sweep_deliveries([store]) == 1
    assert area.slots() == [key_running]  # a run in flight keeps its slot


async def test_a_poisoned_slot_leaves_its_test_recorded_and_completed(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slot removal after recording used to raise on a folder named ``.x.tmp``: the test
    stayed Pending with its record stored, and every watchdog round stopped on its Job."""
    h = harness
    h.settings.results_volume_claim = "model-support-results"
    _, job = await start(h)
    await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    pod = await h.start_pod(job)
    where = Path(await h.deliver(job, document_for(Result.PASS).model_dump_json().encode()))
    (where.parent / ".x.tmp").mkdir()
    (where.parent / ".x.tmp" / "half").write_bytes(b"{")
    (where.parent / "up").symlink_to(h.results)
    await h.end_pod(job, pod, exit_code=0, log=None)
    done = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert done["result"] == "PASS"
    assert not where.parent.exists() and (h.results / "records").is_dir()


async def test_an_s3_upload_url_lasts_as_long_as_its_job_and_a_replay_is_swept(
    harness: Harness, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    for key, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    bucket = f"results-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(bucket)
    h.settings.results_uri = f"s3://{bucket}/model-support"
    _, job = await start(h)
    await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    url = await _upload_url(h, job)
    expires = int(urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["X-Amz-Expires"][0])
    # The test's timeout, the queue and pull budget, the delivery, and the margin: not 7 days.
    timeout = parse_spec(SPEC).timeoutSeconds
    budget = h.settings.deadline_budget_s or 0
    assert expires == timeout + budget + 300 + h.settings.delivery_url_margin_s < 7 * 24 * 3600

    pod = await h.start_pod(job)
    await h.deliver(job, document_for(Result.PASS).model_dump_json().encode())
    await h.end_pod(job, pod, exit_code=0, log=None)
    await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    area = DeliveryArea(h.settings.results_uri)
    assert area.slots() == []
    # The pod kept its URL and writes again after the record: the next sweep removes it.
    deliver_to_url(url, b'{"result": "PASS", "replayed": true}')
    assert len(area.slots()) == 1
    store = ResultsStore(h.settings.results_uri)
    assert sweep_deliveries([store]) == 1
    assert area.slots() == []


async def _upload_url(h: Harness, job: dict[str, Any]) -> str:
    container = job["spec"]["template"]["spec"]["containers"][0]
    [env] = [e for e in container["env"] if e["name"] == "MODEL_SUPPORT_DELIVERY_URL"]
    name = env["valueFrom"]["secretKeyRef"]["name"]
    secret = await h.get(f"/api/v1/namespaces/default/secrets/{name}")
    assert secret is not None
    return base64.b64decode(secret["data"]["url"]).decode()


async def test_the_log_fallback_reads_a_bounded_number_of_bytes(harness: Harness) -> None:
    """No delivery: the operator reads the log's last lines, but never more than
    ``log_tail_bytes`` of them, however long a pod makes its lines; a result line cut off
    that way is read from the termination message."""
    h = harness
    h.settings.log_tail_bytes = 64 * 2**10
    _, job = await start(h)
    await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    pod = await h.start_pod(job)
    document = document_for(Result.PASS)
    log = ("x" * 8192 + "\n") * 200 + RESULT_MARKER + document.model_dump_json() + "\n"
    await h.end_pod(job, pod, exit_code=0, log=log, termination_message=compact_document(document))
    done = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert done["result"] == "PASS"
    [record] = ResultsStore(str(h.results)).records()
    assert record.labels["document_source"] == "termination-message"
    reads = [r for r in h.requests() if re.search(r"/pods/[^/]+/log$", str(r.url.path))]
    assert reads and all(r.params.get("limitBytes") == str(64 * 2**10) for r in reads)
