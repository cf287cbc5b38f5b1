"""The test cluster's Job controller rules against upstream's own cases.

The table below is kubernetes/kubernetes ``pkg/controller/job/pod_failure_policy_test.go``
(``TestMatchPodFailurePolicy``), case by case, plus the Job-level accounting of
``job_controller.go`` that every stand-in in the tests applies (:mod:`job_controller`).
"""

from __future__ import annotations

from typing import Any

import pytest
from job_controller import (
    COUNT,
    FAIL_INDEX,
    FAIL_JOB,
    IGNORE,
    account_failed_pod,
    match_pod_failure_policy,
)


def exit_rule(action: str, operator: str, values: list[int], container: str | None = None):
    codes: dict[str, Any] = {"operator": operator, "values": values}
    if container is not None:
        codes["containerName"] = container
    return {"action": action, "onExitCodes": codes}


def condition_rule(action: str, kind: str = "DisruptionTarget", status: str = "True"):
    return {"action": action, "onPodConditions": [{"type": kind, "status": status}]}


def ended(name: str | None, code: int | None) -> dict[str, Any]:
    status: dict[str, Any] = {} if name is None else {"name": name}
    if code is not None:
        status["state"] = {"terminated": {"exitCode": code}}
    return status


def pod(
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    conditions: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Failed"}
    if containers is not None:
        status["containerStatuses"] = containers
    if init is not None:
        status["initContainerStatuses"] = init
    if conditions is not None:
        status["conditions"] = [{"type": t, "status": s} for t, s in conditions]
    return {"metadata": {"namespace": "default", "name": "mypod"}, "status": status}


MAIN = "main-container"
DISRUPTED = [("DisruptionTarget", "True")]

# name: (rules or None for no policy, pod, wanted message, wanted counted, wanted action)
UPSTREAM_CASES: dict[
    str, tuple[list[dict[str, Any]] | None, dict[str, Any], str | None, bool, str | None]
] = {
    "unknown action for rule matching by exit codes - skip rule with unknown action": (
        [exit_rule("UnknownAction", "In", [1, 2]), exit_rule(FAIL_JOB, "In", [2, 3])],
        pod([ended(MAIN, 2)]),
        "Container main-container for pod default/mypod failed with exit code 2 matching "
        "FailJob rule at index 1",
        True,
        FAIL_JOB,
    ),
    "unknown action for rule matching by pod conditions - skip rule with unknown action": (
        [condition_rule("UnkonwnAction"), condition_rule(IGNORE)],
        pod(conditions=DISRUPTED),
        None,
        False,
        IGNORE,
    ),
    "unknown operator - rule with unknown action is skipped for onExitCodes": (
        [exit_rule(IGNORE, "UnknownOperator", [1, 2]), exit_rule(FAIL_JOB, "In", [2, 3])],
        pod([ended(MAIN, 2)]),
        "Container main-container for pod default/mypod failed with exit code 2 matching "
        "FailJob rule at index 1",
        True,
        FAIL_JOB,
    ),
    "no policy rules": (None, pod([ended(None, 2)]), None, True, None),
    "ignore rule matched for exit codes": (
        [exit_rule(IGNORE, "In", [1, 2, 3])],
        pod([ended(None, 2)]),
        None,
        False,
        IGNORE,
    ),
    "ignore rule matched on negative exit codes - needed for Windows support": (
        [exit_rule(IGNORE, "In", [-1073741676, -1073741510])],
        pod([ended(None, -1073741510)]),
        None,
        False,
        IGNORE,
    ),
    "FailJob rule matched for exit codes": (
        [exit_rule(FAIL_JOB, "In", [1, 2, 3])],
        pod([ended(MAIN, 2)]),
        "Container main-container for pod default/mypod failed with exit code 2 matching "
        "FailJob rule at index 0",
        True,
        FAIL_JOB,
    ),
    "successful containers are skipped by the rules": (
        [exit_rule(FAIL_JOB, "NotIn", [111])],
        pod([ended(MAIN, 111), ended("suppport-container", 0)], init=[ended("init-container", 0)]),
        None,
        True,
        None,
    ),
    "FailIndex rule matched for exit codes": (
        [exit_rule(FAIL_INDEX, "In", [1, 2, 3])],
        pod([ended(None, 2)]),
        None,
        True,
        FAIL_INDEX,
    ),
    "pod failure policy with NotIn operator and value 0": (
        [exit_rule(FAIL_JOB, "NotIn", [0])],
        pod([ended(MAIN, 1), ended("suppport-container", 0)]),
        "Container main-container for pod default/mypod failed with exit code 1 matching "
        "FailJob rule at index 0",
        True,
        FAIL_JOB,
    ),
    "second jobfail rule matched for exit codes": (
        [exit_rule(COUNT, "In", [1, 2, 3]), exit_rule(FAIL_JOB, "In", [4, 5, 6])],
        pod([ended(MAIN, 6)]),
        "Container main-container for pod default/mypod failed with exit code 6 matching "
        "FailJob rule at index 1",
        True,
        FAIL_JOB,
    ),
    "count rule matched for exit codes": (
        [exit_rule(COUNT, "In", [1, 2, 3])],
        pod([ended("foo", None), ended("bar", 2)]),
        None,
        True,
        COUNT,
    ),
    "FailIndex rule matched for pod conditions": (
        [condition_rule(FAIL_INDEX)],
        pod(conditions=DISRUPTED),
        None,
        True,
        FAIL_INDEX,
    ),
    "ignore rule matched for pod conditions": (
        [condition_rule(IGNORE)],
        pod(conditions=DISRUPTED),
        None,
        False,
        IGNORE,
    ),
    "ignore rule matches by the status=False": (
        [condition_rule(IGNORE, status="False")],
        pod(conditions=[("DisruptionTarget", "False")]),
        None,
        False,
        IGNORE,
    ),
    "ignore rule matches by the status=Unknown": (
        [condition_rule(IGNORE, status="Unknown")],
        pod(conditions=[("DisruptionTarget", "Unknown")]),
        None,
        False,
        IGNORE,
    ),
    "ignore rule does not match when status for pattern is False, but actual True": (
        [condition_rule(IGNORE, status="False")],
        pod(conditions=DISRUPTED),
        None,
        True,
        None,
    ),
    "ignore rule does not match when status for pattern is True, but actual False": (
        [condition_rule(IGNORE)],
        pod(conditions=[("DisruptionTarget", "False")]),
        None,
        True,
        None,
    ),
    "job fail rule matched for pod conditions": (
        [condition_rule(FAIL_JOB)],
        pod(conditions=DISRUPTED),
        "Pod default/mypod has condition DisruptionTarget matching FailJob rule at index 0",
        True,
        FAIL_JOB,
    ),
    "count rule matched for pod conditions": (
        [condition_rule(COUNT)],
        pod(conditions=DISRUPTED),
        None,
        True,
        COUNT,
    ),
    "no rule matched": (
        [
            exit_rule(COUNT, "NotIn", [8]),
            exit_rule(IGNORE, "In", [1, 2, 3]),
            exit_rule(FAIL_JOB, "NotIn", [5, 6, 7]),
            condition_rule(COUNT, kind="ResourceLimitExceeded"),
            condition_rule(IGNORE),
        ],
        pod([ended(None, 32)]),
        None,
        True,
        COUNT,
    ),
}


@pytest.mark.parametrize("name", list(UPSTREAM_CASES))
def test_the_stand_in_matches_upstreams_own_cases(name: str) -> None:
    rules, failed_pod, message, counted, action = UPSTREAM_CASES[name]
    policy = None if rules is None else {"rules": rules}
    match = match_pod_failure_policy(policy, failed_pod)
    assert (match.message, match.counts, match.action) == (message, counted, action)


# The cases the issue names, which the test cluster did not model before: a rule without
# containerName matches an init container; the containers are looked at before the init
# containers; a pod deleted before any container ran has no exit code.


def test_a_rule_without_a_container_name_matches_an_init_container() -> None:
    failed = pod([{"name": "runner", "state": {"waiting": {"reason": "PodInitializing"}}}],
                 init=[ended("extra-packages", 137)])  # fmt: skip
    match = match_pod_failure_policy({"rules": [exit_rule(FAIL_JOB, "NotIn", [0])]}, failed)
    assert match.action == FAIL_JOB
    assert match.message is not None and "Container extra-packages" in match.message
    # ... and one naming the runner does not.
    named = {"rules": [exit_rule(FAIL_JOB, "NotIn", [0], container="runner")]}
    assert match_pod_failure_policy(named, failed).action is None


def test_containers_are_looked_at_before_init_containers() -> None:
    failed = pod([ended("runner", 3)], init=[ended("pull", 7)])
    match = match_pod_failure_policy({"rules": [exit_rule(FAIL_JOB, "NotIn", [0])]}, failed)
    assert match.message is not None and "Container runner" in match.message


def test_a_pod_deleted_before_any_container_ran_matches_no_exit_code_rule() -> None:
    waiting = {"name": "runner", "state": {"waiting": {"reason": "ContainerCreating"}}}
    failed = pod([waiting], init=[])
    rules = {"rules": [exit_rule(FAIL_JOB, "NotIn", [0]), exit_rule(IGNORE, "In", [143])]}
    assert match_pod_failure_policy(rules, failed).action is None


def job(rules: list[dict[str, Any]], backoff_limit: int, failed: int = 0) -> dict[str, Any]:
    return {
        "spec": {"backoffLimit": backoff_limit, "podFailurePolicy": {"rules": rules}},
        "status": {"failed": failed},
    }


def test_a_failure_no_rule_matches_counts_against_the_backoff_limit() -> None:
    rules = [exit_rule(FAIL_JOB, "NotIn", [0], container="runner")]
    rejected = pod()  # a kubelet admission failure: no container ever ran
    first = account_failed_pod(job(rules, 1), rejected, tracked=True)
    assert (first.action, first.failed, first.ends) == (COUNT, 1, None)
    second = account_failed_pod(job(rules, 1, failed=1), rejected, tracked=True)
    assert second.ends is not None and second.ends[0] == "BackoffLimitExceeded"
    assert account_failed_pod(job(rules, 0), rejected, tracked=True).ends is not None


def test_a_suspended_jobs_pods_are_not_counted_but_a_fail_job_rule_still_fails_it() -> None:
    rules = [exit_rule(FAIL_JOB, "NotIn", [0])]
    killed_in_init = pod(init=[ended("extra-packages", 137)])
    decision = account_failed_pod(job(rules, 0), killed_in_init, tracked=False)
    assert decision.ends is not None and decision.ends[0] == "PodFailurePolicy"
    no_exit_code = pod()
    untouched = account_failed_pod(job(rules, 0), no_exit_code, tracked=False)
    assert (untouched.ends, untouched.failed) == (None, 0)


def test_only_failed_pods_are_failures() -> None:
    running = pod()
    running["status"]["phase"] = "Running"
    with pytest.raises(ValueError, match="phase Failed"):
        account_failed_pod(job([], 0), running, tracked=True)
