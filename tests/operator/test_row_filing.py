"""A row is filed under what ran, not under what its pod says: the backend is the test's
profile's, the instance type the node's the pod was placed on, and every other stack field the
image does not declare is labelled as the pod's report (in the record, the dataset's labels and
the viewer)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from k8s_harness import Harness
from test_operator_lifecycle import SPEC, document_for, start

from model_support.dataset import matrix_key
from model_support.operator.settings import RunnerStack
from model_support.records import Stack
from model_support.store import ResultsStore
from model_support.vocabulary import ErrorClass, Result

CPU_SPEC = {**SPEC, "profile": "cpu", "cores": 1}


@pytest.fixture
def h(harness: Harness) -> Harness:
    harness.settings.results_volume_claim = "model-support-results"  # runners deliver
    harness.settings.runner_stack = RunnerStack(neuronx_cc="2.28.7631.0", transformers="5.24.0")
    return harness


async def _recorded(h: Harness, spec: dict[str, Any], **document: Any) -> Any:
    _, job = await start(h, spec=spec)
    pod = await h.start_pod(job)
    await h.deliver(job, document_for(Result.PASS, **document).model_dump_json().encode())
    await h.end_pod(job, pod, exit_code=0, log=None)
    await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    [record] = ResultsStore(str(h.results)).records()
    return record


async def test_a_pod_claiming_another_backend_is_an_error_not_a_row_of_that_backend(
    h: Harness,
) -> None:
    """A CPU-profile test whose pod says it ran on neuron was a PASS filed under the declared
    neuronx-cc; now it is an ERROR saying so, and the row's backend is the profile's."""
    record = await _recorded(h, CPU_SPEC, backend="neuron", compile_backend="neuron")
    document = record.document
    assert (document.result, document.error_class) == (Result.ERROR, ErrorClass.INFRASTRUCTURE)
    assert "backend is 'neuron', and the test's profile runs on 'cpu'" in (document.error or "")
    assert document.backend == "cpu"


async def test_a_document_without_a_backend_gets_the_profiles(h: Harness) -> None:
    record = await _recorded(h, CPU_SPEC)
    assert record.document.result == Result.PASS and record.document.backend == "cpu"


async def test_the_instance_type_is_one_the_pod_could_be_placed_on(h: Harness) -> None:
    # SPEC runs on trn2: its pod's node affinity admits only trn2 instance types.
    record = await _recorded(h, SPEC, backend="neuron", stack=Stack(instance_type="trn1.32xlarge"))
    assert record.document.result == Result.ERROR
    error = record.document.error or ""
    assert "instance_type is 'trn1.32xlarge', and the pod could only be placed on a " in error
    assert "'trn2.48xlarge'" in error and "'trn2.3xlarge'" in error


async def test_fields_only_the_pod_reported_are_labelled_so(h: Harness) -> None:
    """A test that names its instance type leaves the scheduler one choice: the record says it,
    whatever the pod said; the fields neither the image nor the node vouch for are labelled."""
    stack = Stack(
        python="3.11.9",
        torch="2.13.0",
        neuronx_cc="2.28.7631.0",
        transformers="5.24.0",
        os="Linux",
        device_name="NeuronDevice",
    )
    spec = {**SPEC, "instanceType": "trn2.48xlarge"}
    record = await _recorded(h, spec, backend="neuron", stack=stack)
    assert record.document.result == Result.PASS
    # Checked: the image's declared versions, and the node's instance type (filled in).
    assert record.document.stack.instance_type == "trn2.48xlarge"
    assert record.labels["stack_reported"] == "device_name,os,python,torch"
    key = matrix_key(record)
    assert (key.compiler_version, key.library_version) == ("2.28.7631.0", "5.24.0")
    # The dataset carries it in its labels column.
    store = ResultsStore(str(h.results))
    store.materialize()
    [frame] = [store.matrix()]
    labels = json.loads(frame.set_index("run_id").loc[record.run_id, "labels"])
    assert labels["stack_reported"] == "device_name,os,python,torch"


async def test_an_instance_type_among_several_allowed_is_kept_as_the_pod_s_report(
    h: Harness,
) -> None:
    """A one-core trn2 pod may land on any trn2 type: the pod's claim of one of them is kept,
    checked only to be among them, and labelled as its report."""
    stack = Stack(neuronx_cc="2.28.7631.0", transformers="5.24.0", instance_type="trn2.3xlarge")
    record = await _recorded(h, SPEC, backend="neuron", stack=stack)
    assert record.document.result == Result.PASS
    assert record.document.stack.instance_type == "trn2.3xlarge"
    assert "instance_type" in record.labels["stack_reported"].split(",")
