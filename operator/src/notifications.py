"""What the operator tells its webhook: a sweep that finished, a sweep's regressions, and a
release's confirmed regressions (:mod:`model_support.notify` sends them, once each).

The webhook's URL and token come from the environment (the chart fills them from Secrets):
never from the settings, which are written into the Deployment in clear.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any

from model_support.notify import Finding, Notifier, Webhook

if TYPE_CHECKING:
    from model_support.history import ReleaseReport
    from model_support.operator.settings import OperatorSettings
    from model_support.operator.sweep_status import SweepStatus
    from model_support.store import ResultsStore

URL_ENV = "MODEL_SUPPORT_NOTIFY_URL"
TOKEN_ENV = "MODEL_SUPPORT_NOTIFY_TOKEN"

_notifier = Notifier(None)


def configure(settings: OperatorSettings) -> Notifier:
    """The operator's notifier: a webhook when $MODEL_SUPPORT_NOTIFY_URL is set, else none."""
    global _notifier
    url = os.environ.get(URL_ENV)
    webhook = (
        Webhook(
            url=url,
            form=settings.notify_format,
            token=os.environ.get(TOKEN_ENV) or None,
            attempts=settings.notify_attempts,
        )
        if url
        else None
    )
    _notifier = Notifier(webhook)
    return _notifier


def notifier() -> Notifier:
    """The notifier :func:`configure` made (one that tells no one before)."""
    return _notifier


def _sweep_name(body: dict[str, Any]) -> str:
    meta = body["metadata"]
    return f"{meta.get('namespace')}/{meta['name']}"


def sweep_finished(body: dict[str, Any], status: SweepStatus) -> Finding:
    """A sweep whose run key finished: its counts and what it cost."""
    counts = status.counts
    cost = f"${status.cost.usd:,.2f}" if status.cost.usd is not None else "not priced"
    summary = (
        f"{counts.done} of {counts.models} models tested: {counts.passed} PASS, {counts.failed} "
        f"FAIL, {counts.errored} ERROR, {counts.timedOut} TIMEOUT, {counts.excluded} EXCLUDED; "
        f"{counts.regressions} regression(s), {counts.fixes} fix(es) against the previous run; "
        f"{status.cost.coreHours:,.2f} core-hours ({cost})"
    )
    return Finding(
        key=f"sweep/{body['metadata']['uid']}/{status.runKey}/{status.observedGeneration}/done",
        kind="sweep-finished",
        title=f"Sweep {_sweep_name(body)} finished",
        summary=summary,
        body=f"# Sweep {_sweep_name(body)} finished\n\n{summary}.\n\n{status.message or ''}\n",
    )


def sweep_regressions(body: dict[str, Any], status: SweepStatus) -> Finding:
    """A sweep's confirmed regressions against its previous run key, by model, with the runs
    that agree on each (the flaky models are said, not counted)."""
    lines = [
        f"- `{r.model}`: {r.before} -> {r.after} in {len(r.runs)} run(s): {', '.join(r.runs)}"
        for r in status.regressions
    ]
    more = status.counts.regressions - len(status.regressions)
    if more > 0:
        lines.append(f"- and {more} more (kubectl describe mss)")
    against = status.baseline.runKey if status.baseline is not None else "the previous run"
    title = f"Sweep {_sweep_name(body)}: {status.counts.regressions} regression(s)"
    return Finding(
        key=f"sweep/{body['metadata']['uid']}/{status.runKey}/regressions",
        kind="regressions",
        title=title,
        summary="\n".join(lines[:20]),
        body=f"# {title}\n\nAgainst run {against}:\n\n"
        + "\n".join(lines)
        + "\n"
        + "".join(
            f"\nFlaky (runs disagree; not a regression): `{f.model}` {', '.join(f.results)}\n"
            for f in status.flaky
        ),
    )


def release_regressions(release: ReleaseReport, store: ResultsStore) -> Finding:
    """A release's confirmed regressions: the release report with each regression's evidence
    (the bug body), keyed by the release and the set of models, so a new regression of the
    same release is told again and the same set never twice."""
    from model_support.evidence import attach_changes, shareable_uri
    from model_support.history import render_release_markdown

    uri = shareable_uri(store)
    attach_changes(release.regressions, store, uri)
    models = sorted(f"{c.model} · {c.task} · {c.kind}" for c in release.regressions)
    digest = hashlib.sha256("\n".join(models).encode()).hexdigest()[:16]
    summary = "\n".join(
        f"- `{c.model}` ({c.task}): {c.before} -> {c.after}; {c.reproduce}"
        for c in release.regressions[:10]
    )
    return Finding(
        key=f"release/{release.stack}/{digest}",
        kind="regressions",
        title=f"{release.stack}: {len(release.regressions)} confirmed regression(s)",
        summary=summary,
        body=render_release_markdown(release, uri),
    )
