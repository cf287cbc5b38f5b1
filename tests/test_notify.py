"""Notifications against a local receiver: a Slack-compatible message or a GitHub issue, sent
once per finding, retried while the receiver fails, never carrying a secret; and the
operator's findings (a release's confirmed regressions, a finished sweep) as sent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from factories import CPU_STACK, T0, make_record

from model_support.cli.commands_demo import NEWER_RELEASE, OLDER_RELEASE
from model_support.notify import DeliveryFailed, Finding, Notifier, Webhook, scrub
from model_support.operator import metrics, notifications
from model_support.operator.settings import OperatorSettings
from model_support.operator.sweep_status import SweepCost, SweepCounts, SweepStatus
from model_support.store import ResultsStore
from model_support.vocabulary import Result


class Receiver:
    """A webhook receiver on 127.0.0.1: answers ``failures`` requests with ``status``, then
    200; keeps every request it got (path, headers, JSON body)."""

    def __init__(self, failures: int = 0, status: int = 503) -> None:
        self.failures, self.status = failures, status
        self.requests: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                receiver.requests.append(
                    {"path": self.path, "headers": dict(self.headers),
                     "body": json.loads(self.rfile.read(length))}
                )  # fmt: skip
                failing = len(receiver.requests) <= receiver.failures
                self.send_response(receiver.status if failing else 200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


FINDING = Finding(
    key="release/x/1",
    kind="regressions",
    title="neuronx-cc 2.28: 1 confirmed regression(s)",
    summary="- `org/m`: PASS -> FAIL; model-support reproduce r1 --results "
    "https://user:hunter2@example.org/store?X-Amz-Signature=abc123",
    body="# the report\nhttps://user:hunter2@example.org/store?X-Amz-Signature=abc123 s3://b/r\n",
)


def _no_wait(_: float) -> None:
    return


def test_a_finding_is_retried_until_the_receiver_answers_and_sent_once() -> None:
    with Receiver(failures=2) as receiver:
        notifier = Notifier(Webhook(url=receiver.url, attempts=5, sleep=_no_wait))
        assert notifier.tell(FINDING)
        assert not notifier.tell(FINDING)  # queued already: once per finding
        notifier.flush()
        assert not notifier.tell(FINDING)  # sent: never again
        notifier.flush()
    assert len(receiver.requests) == 3  # two 503s, then delivered
    (text,) = {json.dumps(r["body"]) for r in receiver.requests}
    body = receiver.requests[-1]["body"]
    assert set(body) == {"text"} and body["text"].startswith("*neuronx-cc 2.28: 1 confirmed")
    # No secret leaves: the URL's password and its presigned query are gone.
    assert "hunter2" not in text and "Signature" not in text and "abc123" not in text
    assert "https://example.org/store" in text


def test_an_issue_for_github_carries_the_report_and_the_token_only_in_its_header() -> None:
    with Receiver() as receiver:
        Webhook(url=receiver.url, form="github", token="ghp_secret", sleep=_no_wait).send(FINDING)
    (request,) = receiver.requests
    assert request["headers"]["Authorization"] == "Bearer ghp_secret"
    assert request["body"]["title"] == FINDING.title
    assert request["body"]["body"] == scrub(FINDING.body)
    assert request["body"]["labels"] == ["model-support", "regressions"]
    assert "ghp_secret" not in json.dumps(request["body"])


def test_a_refusal_is_not_retried_and_an_unreachable_hook_is_given_up() -> None:
    with Receiver(failures=10, status=400) as receiver:
        with pytest.raises(DeliveryFailed, match="refused regressions 'release/x/1': HTTP 400"):
            Webhook(url=receiver.url, sleep=_no_wait).send(FINDING)
        assert len(receiver.requests) == 1
    waited: list[float] = []
    gone = Webhook(url="http://127.0.0.1:9/hook", attempts=3, sleep=waited.append)
    with pytest.raises(DeliveryFailed, match="in 3 attempt"):
        gone.send(FINDING)
    assert waited == [1.0, 2.0]  # a growing delay between attempts


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with Receiver() as running:
        monkeypatch.setenv(notifications.URL_ENV, running.url)
        monkeypatch.setenv(notifications.TOKEN_ENV, "t0ken")
        yield running


def test_the_operator_tells_a_releases_confirmed_regressions_as_an_issue_body(
    receiver: Receiver, tmp_path: Path
) -> None:
    store = ResultsStore(tmp_path / "results")
    runs = [
        ("demo/tiny-llama", OLDER_RELEASE, Result.PASS, 0),
        *(("demo/tiny-llama", NEWER_RELEASE, Result.FAIL, hour) for hour in (1, 2, 3)),
    ]
    for model, backend, result, hour in runs:
        store.add(
            make_record(
                model, result, neuron=False, stack=CPU_STACK, finished=T0 + timedelta(hours=hour),
                document={"compile_backend": backend}, model_id=model,
            )
        )  # fmt: skip
    store.materialize()
    settings = OperatorSettings(results_uri=str(tmp_path / "results"), notify_format="github")
    notifier = notifications.configure(settings)
    releases = metrics.observe_releases(store)
    (newest,) = [r for r in releases if r.regressions]
    for _ in range(2):  # the materializer sees the same regression again: told once
        notifier.tell(notifications.release_regressions(newest, store))
    notifier.flush()
    (request,) = receiver.requests
    issue = request["body"]
    assert (
        issue["title"].endswith(": 1 confirmed regression(s)") and NEWER_RELEASE in issue["title"]
    )
    assert "## Regressions (confirmed)" in issue["body"]
    assert "`demo/tiny-llama` (text-generation): PASS -> FAIL" in issue["body"]
    assert f"--results {store.root}" in issue["body"]
    assert (
        "t0ken" not in json.dumps(issue) and request["headers"]["Authorization"] == "Bearer t0ken"
    )


def test_the_operator_tells_a_finished_sweep() -> None:
    body = {"metadata": {"name": "nightly", "namespace": "ml", "uid": "u-1"}}
    status = SweepStatus(
        runKey="k1",
        observedGeneration=2,
        counts=SweepCounts(models=3, done=3, passed=2, failed=1, regressions=1),
        cost=SweepCost(coreHours=1.5, usd=0.9),
        message="3 of 3 models tested",
    )
    finished = notifications.sweep_finished(body, status)
    assert finished.key == "sweep/u-1/k1/2/done" and finished.title == "Sweep ml/nightly finished"
    assert finished.summary.startswith("3 of 3 models tested: 2 PASS, 1 FAIL")
    assert "1 regression(s)" in finished.summary and "($0.90)" in finished.summary
