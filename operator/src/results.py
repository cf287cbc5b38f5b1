"""Reading what a finished runner Job left: the result document to record, and where it came
from, or :class:`~model_support.operator.outcome.Unavailable` while nothing can be read yet.

The policy is the one every run follows (:func:`model_support.runpath.document_for_run`); what
is the operator's own is the end it reads them with, a Job's (:class:`JobEnd`), and the places,
in order of trust: the attempt's delivery, what Kubernetes says of a Job that ended for the
cluster's reasons, the runner's log, its termination message. A runner pod runs code the project
does not control, so what it wrote is its claim about its own attempt: what Kubernetes says of
the Job (its deadline, an OOM kill, a runner that never started) stands over any document
(:func:`~model_support.operator.outcome.job_outcome_stands`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from model_support.config import RunConfig
from model_support.operator.kube import Kube
from model_support.operator.lifecycle import first_line
from model_support.operator.manifests import TestRef
from model_support.operator.outcome import (
    INFRA_RESULTS,
    DocumentSource,
    Reading,
    job_outcome_stands,
)
from model_support.operator.resource import RUNNER_CONTAINER
from model_support.operator.settings import OperatorSettings
from model_support.records import ResultDocument, failure_document, parse_result_line
from model_support.runner_pod import RUNNER_MESSAGE_PREFIX
from model_support.runpath import Found, Malformed, Unavailable, document_for_run
from model_support.vocabulary import ErrorClass, Result


def is_document(data: object) -> bool:
    """Whether ``data`` (what a pod delivered) is a valid result document."""
    return isinstance(_delivered(data), ResultDocument)


def _delivered(data: object) -> Found:
    """What a delivery holds (bytes, None for nothing, Unavailable when it cannot be read)."""
    if isinstance(data, Unavailable):
        return data
    if not isinstance(data, bytes):
        return None
    try:
        return ResultDocument.model_validate_json(data)
    except ValidationError as exc:
        return Malformed("delivered document", first_line(str(exc)))


def _result_line(text: str | None, source: DocumentSource) -> Found:
    """The document of the marked result line in ``text`` (a log, a termination message)."""
    if not text:
        return None
    try:
        return parse_result_line(text)
    except (ValueError, ValidationError) as exc:
        return Malformed(f"result line in the {source.value}", first_line(str(exc)))


@dataclass(frozen=True)
class JobEnd:
    """A runner Job's end as Kubernetes reports it (:func:`~.outcome.read_job`)."""

    reading: Reading
    claimed: str | None = None
    """The result the attempt's delivery claimed (said when Kubernetes overrules it)."""

    def standing(self, config: RunConfig) -> ResultDocument | None:
        """The Job's deadline, an OOM-killed runner, a runner that never started."""
        if not job_outcome_stands(self.reading):
            return None
        result, infra_class = INFRA_RESULTS[self.reading.state]
        overruled = (
            f" (the runner's delivery said {self.claimed}, which Kubernetes contradicts)"
            if self.claimed
            else ""
        )
        return failure_document(
            config, result, error_class=infra_class, error=self.reading.message + overruled
        )

    def verdict(self, config: RunConfig) -> Found:
        """What Kubernetes says of a Job that ended for the cluster's reasons (a lost node, an
        eviction for local storage ...), read after the delivery and before the pod's log."""
        if self.reading.state not in INFRA_RESULTS:
            return None
        result, infra_class = INFRA_RESULTS[self.reading.state]
        return failure_document(config, result, error_class=infra_class, error=self.reading.message)

    def without_document(
        self, config: RunConfig, malformed: list[Malformed]
    ) -> ResultDocument | Unavailable:
        """No valid document: the pod gone, nothing can be told yet; else the runner's own
        message says why run.py left none (ERROR/runtime), or not even that came
        (ERROR/infrastructure: the runner itself did not run as it should)."""
        reading = self.reading
        problems = [f"the {m.where} is malformed: {m.problem}" for m in malformed]
        if reading.pod_name is None:
            return Unavailable(
                "the runner pod is gone and no result document was delivered"
                + (f" ({'; '.join(problems)})" if problems else "")
            )
        message = reading.termination_message or ""
        if message.startswith(RUNNER_MESSAGE_PREFIX):
            # The runner ran and says why run.py left no document (e.g. killed by SIGKILL
            # without the container being OOMKilled).
            error_class, error = ErrorClass.RUNTIME, f"{reading.message}: {message}"
        else:
            error_class = ErrorClass.INFRASTRUCTURE
            error = (
                f"{reading.message} and the runner left no result document and no message of "
                "its own (is model_support installed in the runner image?)"
                + (f"; {'; '.join(problems)}" if problems else "")
                + f". Termination message:\n{message or '(none)'}"
            )
        return failure_document(config, Result.ERROR, error_class=error_class, error=error)


class ResultReader:
    """Reads a finished attempt's result document, and where it came from."""

    def __init__(self, settings: OperatorSettings, kube: Kube) -> None:
        self.settings = settings
        self.kube = kube

    def document(
        self,
        ref: TestRef,
        reading: Reading,
        config: RunConfig,
        delivered: bytes | Unavailable | None,
    ) -> tuple[ResultDocument, DocumentSource] | Unavailable:
        """The document of the attempt ``reading`` describes, and where it came from."""
        said = _delivered(delivered)
        end = JobEnd(reading, said.result.value if isinstance(said, ResultDocument) else None)

        def log() -> Found:
            if reading.pod_name is None:
                return None
            try:
                text = self.kube.pod_log(
                    ref.namespace,
                    reading.pod_name,
                    RUNNER_CONTAINER,
                    self.settings.log_tail_lines,
                    self.settings.log_tail_bytes,
                )
            except ApiException as exc:
                return Unavailable(f"the runner's log could not be read: {exc.status} {exc.reason}")
            return _result_line(text, DocumentSource.LOG)

        places: list[tuple[DocumentSource, Callable[[], Found]]] = [
            (DocumentSource.DELIVERY, lambda: said),
            (DocumentSource.OPERATOR, lambda: end.verdict(config)),
            (DocumentSource.LOG, log),
            (
                DocumentSource.TERMINATION_MESSAGE,
                lambda: _result_line(
                    reading.termination_message, DocumentSource.TERMINATION_MESSAGE
                ),
            ),
        ]
        found = document_for_run(config, places, end, ended_by=DocumentSource.OPERATOR)
        assert found is not None  # the operator reads last: a Job's end always tells
        return found


__all__ = ["JobEnd", "ResultReader", "is_document"]
