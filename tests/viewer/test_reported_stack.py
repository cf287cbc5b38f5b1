"""What a row holds only on its runner pod's word is said so on the page, and data is shown as
data: the stack fields nothing checked, and a record's control characters, visibly escaped."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from viewer_support import NEW_CC, START, build_dataset, make_record, viewer_page

from model_support.records import Stack

MODEL = "Qwen/Qwen3-0.6B"


@pytest.fixture
def page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str) -> AppTest:
    store = build_dataset(tmp_path / "results")
    record = make_record(MODEL, "text-generation", "PASS", NEW_CC, START + timedelta(days=3))
    stack = Stack(
        python="3.11.9",
        torch="2.13.0",
        transformers="5.24.0",
        torch_neuronx="2.13.0",
        neuronx_cc=NEW_CC,
        instance_type="trn2.48xlarge",
        device_name="Trainium2\x1b]52;c;cm0gLXJmIC8K\x07\x1b[2J",  # a clipboard write, a clear
        os="Linux",
    )
    document = record.document.model_copy(update={"stack": stack})
    labels = {**record.labels, "stack": "declared", "stack_reported": "device_name,os,python"}
    store.add(record.model_copy(update={"document": document, "labels": labels}))
    store.materialize()
    return viewer_page(tmp_path / "results", monkeypatch, dead_hub)


def test_the_fields_a_runner_pod_alone_reported_are_said_to_be_its_word(page: AppTest) -> None:
    page.query_params.update(view="all", model=MODEL)
    page.run()
    assert not page.exception
    captions = [c.value for c in page.caption]
    [said] = [c for c in captions if "As its runner pod reported them" in c]
    assert said.replace("\\", "").endswith("device_name, os, python")
    # instance_type was checked against the node (not in the label): shown plainly.
    # The line of facts under the answer (task, stack, where it ran, cores, date).
    facts = next(c for c in captions if " · " in c and "UTC" in c)
    assert "Trainium trn2.48xlarge ·" in facts.replace("\\", "")
    assert "as its pod reported it" not in facts


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_control_characters_in_a_record_are_shown_escaped(page: AppTest) -> None:
    page.query_params.update(view="all", model=MODEL)
    page.run()
    assert not page.exception
    shown = [s for j in page.get("json") for s in _strings(json.loads(j.proto.body))]
    shown += [m.value for m in page.markdown] + [c.value for c in page.caption]
    assert not any("\x1b" in s or "\x07" in s for s in shown)  # nothing a terminal acts on
    assert any("Trainium2\\x1b]52;c;cm0gLXJmIC8K\\x07\\x1b[2J" in s for s in shown)


def test_an_instance_type_only_its_pod_reported_says_so_in_the_headline() -> None:
    from model_support.viewer import headline

    row = {"backend": "cpu", "instance_type": "m7i.large", "device_name": "Xeon"}
    assert headline.device(row) == "CPU (m7i.large, Xeon)"
    labels = json.dumps({"stack_reported": "device_name,instance_type,python"})
    assert headline.device({**row, "labels": labels}) == (
        "CPU (m7i.large as its pod reported it, Xeon as its pod reported it)"
    )
