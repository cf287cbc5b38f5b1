"""The Job controller's rules for a failed pod, as upstream Kubernetes applies them (test code).

Every stand-in of the Job controller in the tests (``k8s_harness.Harness``, the Docker node of
``tests/containers/kubelet.py``) decides through :func:`account_failed_pod`, so the test cluster
is as strict as a real one. The rules, from kubernetes/kubernetes:

* ``pkg/controller/job/pod_failure_policy.go`` (``matchPodFailurePolicy``): the rules are
  evaluated in order and the first that matches decides. An ``onExitCodes`` rule looks at the
  containers' terminated states, the containers first and then the init containers; a
  ``containerName`` left out matches any container, init containers included; an exit code 0
  never matches (``In`` or ``NotIn``); a container that has not terminated has no exit code to
  match, so a pod deleted before any container ran matches no ``onExitCodes`` rule. An
  ``onPodConditions`` pattern matches a condition of the same type and status (the API server
  defaults a pattern's status to ``True``). A rule with an unknown action is skipped. No match:
  the failure counts against ``backoffLimit``.
* ``pkg/controller/job/job_controller.go``: with a ``podFailurePolicy`` only pods in phase
  ``Failed`` are failures (``isPodFailed`` with ``onlyReplaceFailedPods``); ``FailJob`` fails
  the Job (reason ``PodFailurePolicy``, with the rule's message) whatever the pod's tracking
  (``getFailJobMessage`` looks at every failed pod of the Job); counted failures fail the Job
  once ``status.failed > backoffLimit`` (reason ``BackoffLimitExceeded``). A Job suspended (a
  Kueue preemption) has its active pods' tracking finalizer removed before they are deleted
  (``deleteJobPods``), so they are never counted, but a FailJob rule that matches their
  terminal status still fails the Job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IGNORE, FAIL_JOB, COUNT, FAIL_INDEX = "Ignore", "FailJob", "Count", "FailIndex"
_ACTIONS = (IGNORE, FAIL_JOB, COUNT, FAIL_INDEX)


@dataclass(frozen=True)
class PolicyMatch:
    """What ``matchPodFailurePolicy`` returns for a failed pod."""

    action: str | None
    """The matching rule's action; None when no rule matched (the default handling)."""
    counts: bool
    """Whether the failure counts against ``backoffLimit`` (False only for Ignore)."""
    message: str | None = None
    """The Job's failure message, for a FailJob rule."""


def _terminated(status: dict[str, Any]) -> dict[str, Any] | None:
    return ((status.get("state") or {}).get("terminated")) or None


def _exit_codes_match(code: int, requirement: dict[str, Any]) -> bool:
    values = [int(v) for v in requirement.get("values") or []]
    operator = requirement.get("operator")
    if operator == "In":
        return code in values
    if operator == "NotIn":
        return code not in values
    return False  # an unknown operator matches nothing


def _matching_container(
    statuses: list[dict[str, Any]], requirement: dict[str, Any]
) -> dict[str, Any] | None:
    for status in statuses:
        terminated = _terminated(status)
        if terminated is None or terminated.get("exitCode") is None:
            continue  # still running or never started: no exit code to match
        name = requirement.get("containerName")
        if name is not None and name != status.get("name"):
            continue
        code = int(terminated["exitCode"])
        if code != 0 and _exit_codes_match(code, requirement):
            return status
    return None


def match_pod_failure_policy(policy: dict[str, Any] | None, pod: dict[str, Any]) -> PolicyMatch:
    """``matchPodFailurePolicy`` (pod_failure_policy.go) for a failed ``pod``."""
    if policy is None:
        return PolicyMatch(None, True)
    status = pod.get("status") or {}
    meta = pod.get("metadata") or {}
    where = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
    for index, rule in enumerate(policy.get("rules") or []):
        action = rule.get("action")
        if action not in _ACTIONS:
            continue  # a rule with an unknown action is skipped
        message: str | None = None
        if rule.get("onExitCodes") is not None:
            requirement = rule["onExitCodes"]
            found = _matching_container(
                status.get("containerStatuses") or [], requirement
            ) or _matching_container(status.get("initContainerStatuses") or [], requirement)
            if found is None:
                continue
            code = (_terminated(found) or {}).get("exitCode")
            message = (
                f"Container {found.get('name')} for pod {where} failed with exit code {code} "
                f"matching {action} rule at index {index}"
            )
        elif rule.get("onPodConditions") is not None:
            condition = next(
                (
                    c
                    for c in status.get("conditions") or []
                    for p in rule["onPodConditions"]
                    if c.get("type") == p.get("type") and c.get("status") == p.get("status", "True")
                ),
                None,
            )
            if condition is None:
                continue
            message = (
                f"Pod {where} has condition {condition['type']} matching {action} rule at "
                f"index {index}"
            )
        else:
            continue
        if action == IGNORE:
            return PolicyMatch(IGNORE, False)
        if action == FAIL_JOB:
            return PolicyMatch(FAIL_JOB, True, message)
        return PolicyMatch(action, True)
    return PolicyMatch(None, True)


@dataclass(frozen=True)
class JobDecision:
    """What the Job controller does with a Job after one of its pods failed."""

    match: PolicyMatch
    failed: int
    """The Job's ``status.failed`` afterwards."""
    ends: tuple[str, str] | None
    """``(reason, message)`` of the Job's Failed condition when the Job fails; None: it stays
    active (the controller starts a replacement pod, after a backoff when counted)."""

    @property
    def action(self) -> str:
        """The action taken: the rule's, or Count when no rule matched."""
        return self.match.action or COUNT


def account_failed_pod(job: dict[str, Any], pod: dict[str, Any], *, tracked: bool) -> JobDecision:
    """What the Job controller does when ``pod`` of ``job`` reached phase Failed.

    ``tracked``: the pod still carries the Job's tracking finalizer; False for pods the Job
    controller itself deleted for a suspension (never counted, see the module).
    """
    if (pod.get("status") or {}).get("phase") != "Failed":
        raise ValueError(
            "with a podFailurePolicy the Job controller acts only on pods in phase Failed "
            f"(isPodFailed), this one is {(pod.get('status') or {}).get('phase')!r}"
        )
    spec = job.get("spec") or {}
    failed = int((job.get("status") or {}).get("failed") or 0)
    match = match_pod_failure_policy(spec.get("podFailurePolicy"), pod)
    if match.action == FAIL_JOB:
        assert match.message is not None
        return JobDecision(match, failed + int(tracked), ("PodFailurePolicy", match.message))
    if not tracked or not match.counts:
        return JobDecision(match, failed, None)
    failed += 1
    if failed > int(spec.get("backoffLimit", 6)):
        return JobDecision(
            match, failed, ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        )
    return JobDecision(match, failed, None)
