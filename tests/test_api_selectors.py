"""The test cluster's label and field selectors (tests/api_selectors.py) against the cases of
k8s.io/apimachinery's ``pkg/labels/selector_test.go`` and ``pkg/fields/selector_test.go``."""

from __future__ import annotations

import pytest
from api_selectors import SelectorError, field_selector, label_selector, selects

LABELS = {"x": "a", "y": "b", "n": "3"}

LABEL_CASES = [
    # selector, labels, matches
    ("", {}, True),
    ("", LABELS, True),
    ("x=a", LABELS, True),
    ("x==a", LABELS, True),
    ("x=b", LABELS, False),
    ("x=a,y=b", LABELS, True),
    ("x=a,y=c", LABELS, False),
    ("x=a, y=b", LABELS, True),  # whitespace around requirements
    ("x!=a", LABELS, False),
    ("x!=b", LABELS, True),
    ("z!=a", LABELS, True),  # != matches an object without the key
    ("x", LABELS, True),
    ("z", LABELS, False),
    ("!z", LABELS, True),
    ("!x", LABELS, False),
    ("x in (a,c)", LABELS, True),
    ("x in (c,d)", LABELS, False),
    ("z in (a)", LABELS, False),
    ("x notin (c,d)", LABELS, True),
    ("x notin (a,d)", LABELS, False),
    ("z notin (a)", LABELS, True),  # notin matches an object without the key
    ("x in (a,c),y notin (c),!z", LABELS, True),
    ("n>2", LABELS, True),
    ("n>3", LABELS, False),
    ("n<4", LABELS, True),
    ("x>1", LABELS, False),  # not a number: never greater
    ("z<1", LABELS, False),  # absent: never less
    ("x=", {"x": ""}, True),  # an empty value is a value
]


@pytest.mark.parametrize(("selector", "labels", "matches"), LABEL_CASES)
def test_label_selectors_select_as_the_api_server_does(
    selector: str, labels: dict[str, str], matches: bool
) -> None:
    assert label_selector(selector)(labels) is matches


@pytest.mark.parametrize("selector", ["x=(a)", "x in a", "n>b", "x=a,,=b"])
def test_a_label_selector_the_api_server_cannot_parse_is_refused(selector: str) -> None:
    with pytest.raises(SelectorError):
        label_selector(selector)


POD = {
    "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "runner"}},
    "status": {"phase": "Running"},
}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("metadata.name=p", True),
        ("metadata.name==p", True),
        ("metadata.name=q", False),
        ("metadata.name!=q", True),
        ("status.phase=Running,metadata.namespace=ns", True),
        ("status.phase=Failed", False),
        ("spec.nodeName=", True),  # an unset field is the empty string
    ],
)
def test_field_selectors_select_on_the_fields_a_resource_declares(
    selector: str, matches: bool
) -> None:
    assert field_selector(selector, "pods")(POD) is matches


def test_a_field_a_resource_does_not_declare_is_refused() -> None:
    with pytest.raises(SelectorError, match="field label not supported"):
        field_selector("status.phase=Running", "configmaps")
    assert field_selector("metadata.name=p", "configmaps")(POD)


def test_a_list_selects_by_labels_and_fields_together() -> None:
    params = {"labelSelector": "app=runner", "fieldSelector": "status.phase=Running"}
    assert selects(params, "pods")(POD)
    assert not selects({**params, "labelSelector": "app!=runner"}, "pods")(POD)
    assert not selects({**params, "fieldSelector": "status.phase!=Running"}, "pods")(POD)
