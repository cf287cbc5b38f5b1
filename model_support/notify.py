"""Telling someone: a webhook told of confirmed regressions and finished sweeps, once each.

A finding (:class:`Finding`) is one thing worth telling: a release's confirmed regressions, a
sweep that finished. It goes to one webhook in the shape its receiver reads:

* ``slack``: ``{"text": ...}``, what a Slack incoming webhook (and the many chat tools that copy
  it) accepts: the title and a short summary;
* ``github``: ``{"title": ..., "body": ..., "labels": [...]}``, what GitHub's "create an issue"
  endpoint reads (``POST /repos/OWNER/REPO/issues``): the body is the regression report, the bug
  body ``model-support regressions`` prints.

Each finding is sent once (its key is remembered once a send succeeded), retried with a growing
delay on a transport error, a 429 or a 5xx (a 4xx other than 429 is the receiver refusing the
payload: said once, not retried). What is sent is only the finding's text, with URLs' user
info and query strings removed (a presigned URL or a token in a URI never leaves); the webhook's
own URL (a Slack webhook URL is itself a secret) and the token are never logged.
"""

from __future__ import annotations

import json
import logging
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

WebhookFormat = Literal["slack", "github"]
TEXT_LIMIT = 3000
"""Characters of a Slack message's text (Slack cuts a section's text at 3,000)."""
BODY_LIMIT = 60000
"""Characters of a GitHub issue's body (GitHub refuses more than 65,536)."""

_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/\s@]+@", re.IGNORECASE)
_QUERY = re.compile(r"(?P<url>[a-z][a-z0-9+.-]*://[^\s?#`]+)\?[^\s#`]*", re.IGNORECASE)


def scrub(text: str) -> str:
    """``text`` with every URL's user info (``user:password@``) and query string (where a
    presigned URL keeps its signature) removed."""
    return _QUERY.sub(r"\g<url>", _USERINFO.sub(r"\g<scheme>", text))


class Finding(BaseModel):
    """One thing worth telling, sent once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(..., min_length=1, description="Sent once per key.")
    kind: Literal["regressions", "sweep-finished"]
    title: str
    summary: str = Field(..., description="A few lines for a chat message.")
    body: str = Field(..., description="The whole report (Markdown) for an issue.")


class DeliveryFailed(RuntimeError):
    """The webhook refused a finding or could not be reached in all attempts."""


def payload(finding: Finding, form: WebhookFormat) -> dict[str, object]:
    """What is POSTed for ``finding`` to a webhook of ``form`` (text scrubbed of secrets)."""
    if form == "github":
        return {
            "title": scrub(finding.title)[:256],
            "body": scrub(finding.body)[:BODY_LIMIT],
            "labels": ["model-support", finding.kind],
        }
    text = f"*{finding.title}*\n{finding.summary}"
    return {"text": scrub(text)[:TEXT_LIMIT]}


@dataclass
class Webhook:
    """One webhook: where (never logged), in which shape, how hard to try."""

    url: str = field(repr=False)
    form: WebhookFormat = "slack"
    token: str | None = field(default=None, repr=False)
    attempts: int = 5
    timeout_s: float = 10.0
    first_delay_s: float = 1.0
    sleep: Callable[[float], None] = time.sleep

    def send(self, finding: Finding) -> None:
        """POST ``finding``; retried on transport errors, 429 and 5xx; raises
        :class:`DeliveryFailed` when refused or never answered."""
        data = json.dumps(payload(finding, self.form)).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "model-support"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        delay = self.first_delay_s
        last = "no attempt"
        for attempt in range(1, max(1, self.attempts) + 1):
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                    answer.read()
                return
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
                if exc.code != 429 and exc.code < 500:
                    raise DeliveryFailed(
                        f"the webhook refused {finding.kind} {finding.key!r}: {last}"
                    ) from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                last = type(reason).__name__ if not isinstance(reason, str) else reason
            if attempt < self.attempts:
                log.warning(
                    "telling the webhook of %s %r failed (%s, attempt %d of %d); retrying in %g s",
                    finding.kind, finding.key, last, attempt, self.attempts, delay,
                )  # fmt: skip
                self.sleep(delay)
                delay *= 2
        raise DeliveryFailed(
            f"the webhook could not be told of {finding.kind} {finding.key!r} in "
            f"{self.attempts} attempt(s) ({last})"
        )


class Notifier:
    """Sends findings to a webhook from a thread of its own, each key once."""

    def __init__(self, webhook: Webhook | None) -> None:
        self.webhook = webhook
        self._sent: set[str] = set()
        self._queued: set[str] = set()
        self._lock = threading.Lock()
        self._queue: queue.Queue[Finding | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def tell(self, finding: Finding) -> bool:
        """Queue ``finding`` unless its key was sent or queued already; False when skipped
        (or no webhook is configured)."""
        if self.webhook is None:
            return False
        with self._lock:
            if finding.key in self._sent or finding.key in self._queued:
                return False
            self._queued.add(finding.key)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="model-support notifications", daemon=True
                )
                self._thread.start()
        self._queue.put(finding)
        return True

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until every queued finding was sent or given up (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._queued:
                    return
            time.sleep(0.02)

    def _work(self) -> None:
        while True:
            finding = self._queue.get()
            if finding is None:
                return
            assert self.webhook is not None
            try:
                self.webhook.send(finding)
            except DeliveryFailed as exc:
                log.error("%s", exc)
                with self._lock:
                    self._queued.discard(finding.key)  # a later finding may try again
                continue
            with self._lock:
                self._queued.discard(finding.key)
                self._sent.add(finding.key)
