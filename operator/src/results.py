"""Reading what a finished runner Job left: the result document to record, and where it came
from, or :class:`~model_support.operator.outcome.Unavailable` while nothing can be read yet.

A runner pod runs code the project does not control, so what it wrote is its claim about its
own attempt: what Kubernetes says of the Job (its deadline, an OOM kill, a runner that never
started) stands over any document (:func:`~model_support.operator.outcome.job_outcome_stands`).
"""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from model_support.config import RunConfig
from model_support.operator.kube import Kube
from model_support.operator.manifests import TestRef
from model_support.operator.outcome import (
    INFRA_RESULTS,
    DocumentSource,
    Reading,
    Unavailable,
    job_outcome_stands,
)
from model_support.operator.resource import RUNNER_CONTAINER
from model_support.operator.settings import OperatorSettings
from model_support.operator.status import MESSAGE_LIMIT
from model_support.records import ResultDocument, failure_document, parse_result_line
from model_support.runner_pod import RUNNER_MESSAGE_PREFIX
from model_support.vocabulary import ErrorClass, Result


def is_document(data: object) -> bool:
    """Whether ``data`` (what a pod delivered) is a valid result document."""
    if not isinstance(data, bytes):
        return False
    try:
        ResultDocument.model_validate_json(data)
    except ValidationError:
        return False
    return True


def _delivered_result(delivered: object) -> str | None:
    """The result a delivery claimed (for saying it was overruled), if it is a document."""
    if not isinstance(delivered, bytes):
        return None
    try:
        return ResultDocument.model_validate_json(delivered).result.value
    except ValidationError:
        return None


def _short(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first[:MESSAGE_LIMIT]


class ResultReader:
    """Reads a finished attempt's result document: delivered, else from the runner's log,
    else from its termination message; else one the operator writes for the Job's outcome."""

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
        problems: list[str] = []
        if job_outcome_stands(reading):
            result, infra_class = INFRA_RESULTS[reading.state]
            said = _delivered_result(delivered)
            overruled = (
                f" (the runner's delivery said {said}, which Kubernetes contradicts)"
                if said
                else ""
            )
            return (
                failure_document(
                    config, result, error_class=infra_class, error=reading.message + overruled
                ),
                DocumentSource.OPERATOR,
            )
        if isinstance(delivered, Unavailable):
            return delivered
        if delivered is not None:
            try:
                return ResultDocument.model_validate_json(delivered), DocumentSource.DELIVERY
            except ValidationError as exc:
                problems.append(f"the delivered document is malformed: {_short(str(exc))}")
        if reading.state in INFRA_RESULTS:
            result, infra_class = INFRA_RESULTS[reading.state]
            return (
                failure_document(config, result, error_class=infra_class, error=reading.message),
                DocumentSource.OPERATOR,
            )
        texts: list[tuple[DocumentSource, str | None]] = []
        if reading.pod_name:
            try:
                text = self.kube.pod_log(
                    ref.namespace, reading.pod_name, RUNNER_CONTAINER, self.settings.log_tail_lines
                )
            except ApiException as exc:
                return Unavailable(f"the runner's log could not be read: {exc.status} {exc.reason}")
            texts.append((DocumentSource.LOG, text))
        texts.append((DocumentSource.TERMINATION_MESSAGE, reading.termination_message))
        for source, text in texts:
            if not text:
                continue
            try:
                document = parse_result_line(text)
            except (ValueError, ValidationError) as exc:
                problems.append(
                    f"the result line in the {source.value} is malformed: {_short(str(exc))}"
                )
                continue
            if document is not None:
                return document, source
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
            # Not even the runner's own message: the runner itself did not run as it should.
            error_class = ErrorClass.INFRASTRUCTURE
            error = (
                f"{reading.message} and the runner left no result document and no message of "
                "its own (is model_support installed in the runner image?)"
                + (f"; {'; '.join(problems)}" if problems else "")
                + f". Termination message:\n{message or '(none)'}"
            )
        return (
            failure_document(config, Result.ERROR, error_class=error_class, error=error),
            DocumentSource.OPERATOR,
        )


__all__ = ["ResultReader", "is_document"]
