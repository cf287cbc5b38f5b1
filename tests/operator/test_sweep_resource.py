"""The ModelSupportSweep CRD and the pure rules of a sweep (names, run key, specs, status),
checked against the real schemas and the CRD's CEL rules (run by cel-python)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from test_operator_manifests import cel_violations, validate

from model_support.operator.settings import OperatorSettings
from model_support.operator.spec import DNS_LABEL_PATTERN, SpecError, parse_spec
from model_support.operator.sweep_confirmation import INVALID, Judged, Run, judge
from model_support.operator.sweep_manifests import (
    build_child,
    child_name,
    rerun_name,
    rerun_patch,
)
from model_support.operator.sweep_spec import (
    OWNED_FIELDS,
    SweepModel,
    parse_sweep,
    run_key,
    source_key,
)
from model_support.operator.sweep_status import (
    RankingState,
    SweepBaseline,
    SweepCost,
    SweepCounts,
    SweepFlaky,
    SweepRegression,
    SweepStatus,
    sweep_conditions,
)
from model_support.vocabulary import Task

ROOT = Path(__file__).resolve().parents[2]
SWEEP_CRD = ROOT / "crds" / "modelsupportsweeps.yaml"
TEST_CRD = ROOT / "crds" / "modelsupporttests.yaml"
SETTINGS = OperatorSettings(results_uri="/tmp/r", runner_image="registry.example/runner:1")


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return dict(yaml.safe_load(SWEEP_CRD.read_text()))


@pytest.fixture(scope="module")
def schema(crd: dict[str, Any]) -> jsonschema.Validator:
    return jsonschema.Draft4Validator(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def body(spec: dict[str, Any], name: str = "nightly") -> dict[str, Any]:
    return {
        "apiVersion": "modelsupport.dev/v1alpha1",
        "kind": "ModelSupportSweep",
        "metadata": {"name": name, "namespace": "ml", "uid": "u-1"},
        "spec": spec,
    }


HUB = {"source": {"hub": {"sort": "trending", "limit": 200, "library": "transformers"}}}


def test_the_sweep_crd_is_valid(crd: dict[str, Any]) -> None:
    validate(crd)
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["names"]["kind"] == "ModelSupportSweep"
    assert crd["spec"]["names"]["shortNames"] == ["mss"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if "priority" not in c]
    assert columns == [
        "Source", "Models", "Done", "Pass", "Fail", "Error", "Excluded", "Regressions", "Age",
    ]  # fmt: skip


@pytest.mark.parametrize("task", [t.value for t in Task])
def test_a_sweep_takes_every_task_a_test_takes(
    crd: dict[str, Any], schema: jsonschema.Validator, task: str
) -> None:
    """A listed model's task and a Hub ranking's task: the API server accepts every task family
    the operator tests, as the test CRD does (a narrower enum refused whole sweeps)."""
    for spec in (
        {"source": {"hub": {"task": task}}},
        {"source": {"models": [{"model": "a/b", "task": task}]}},
    ):
        schema.validate(body(spec))
        assert cel_violations(crd, spec) == []
        parse_sweep(spec)


def test_the_template_is_the_test_spec_less_what_the_sweep_sets(crd: dict[str, Any]) -> None:
    """One schema for a test's fields: the sweep's template may not drift from the test CRD."""
    test_spec = yaml.safe_load(TEST_CRD.read_text())["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"
    ]["properties"]["spec"]
    sweep_spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    template = sweep_spec["properties"]["template"]["properties"]
    assert template == {k: v for k, v in test_spec["properties"].items() if k not in OWNED_FIELDS}
    assert set(test_spec["properties"]) >= OWNED_FIELDS


@pytest.mark.parametrize(
    "spec",
    [
        HUB,
        {"source": {"models": [{"model": "Qwen/Qwen3-0.6B"}, {"model": "a/b", "revision": "v1"}]}},
        {"source": {"selected": {}}, "stack": {"profile": "cpu"}, "epoch": 20261130},
        {
            **HUB,
            "stack": {"image": "reg.example/r:2.28", "compilerVersion": "2.28.1"},
            "template": {"cores": 4, "parallelism": "tensor", "hubTokenSecret": {"name": "hf"}},
            "concurrency": {"maxRunning": 16, "queueName": "trainium"},
        },
    ],
)
def test_valid_sweeps_pass_schema_cel_and_operator(
    crd: dict[str, Any], schema: jsonschema.Validator, spec: dict[str, Any]
) -> None:
    schema.validate(body(spec))
    assert cel_violations(crd, spec) == []
    parse_sweep(spec)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"source": {**HUB["source"], "models": [{"model": "a/b"}]}}, "exactly one source"),
        ({"source": {}}, "exactly one source"),
        ({**HUB, "stack": {"profile": "trn1"}, "template": {"lnc": 1}}, "lnc"),
        (
            {
                **HUB,
                "stack": {"profile": "inf2"},
                "template": {"cores": 30, "parallelism": "tensor"},
            },
            "24",
        ),
        ({**HUB, "template": {"cores": 4}}, "parallelism"),
    ],
)
def test_cel_rules_and_the_operator_refuse_the_same_sweeps(
    crd: dict[str, Any], spec: dict[str, Any], message: str
) -> None:
    assert any(message in m for m in cel_violations(crd, spec)), cel_violations(crd, spec)
    with pytest.raises(SpecError, match=message):
        parse_sweep(spec)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"source": {"hub": {"sort": "stars"}}}, "sort"),
        ({"source": {"hub": {"limit": 1001}}}, "limit"),
        ({"source": {"hub": {"library": "Not A Library"}}}, "library"),
        ({**HUB, "concurrency": {"maxRunning": 0}}, "maxRunning"),
        ({**HUB, "epoch": -1}, "epoch"),
        ({"source": {"models": [{"model": "org/x; rm -rf /"}]}}, "model"),
    ],
)
def test_bad_fields_are_refused_by_schema_and_operator(
    schema: jsonschema.Validator, spec: dict[str, Any], field: str
) -> None:
    errors = list(schema.iter_errors(body(spec)))
    assert any(field in "/".join(str(p) for p in e.absolute_path) for e in errors), errors
    with pytest.raises(SpecError, match=field):
        parse_sweep(spec)


def test_a_long_sweep_name_is_refused_by_cel(crd: dict[str, Any]) -> None:
    import celpy

    [rule] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    env = celpy.Environment()
    program = env.program(env.compile(rule["rule"]))
    for name, ok in (("s" * 40, True), ("s" * 41, False)):
        activation = {"self": celpy.json_to_cel({"metadata": {"name": name}})}
        assert bool(program.evaluate(activation)) is ok
    # The longest name leaves room for a readable slug of any model in a 63-character name.
    name = child_name("s" * 40, "some-org/" + "m" * 100)
    assert len(name) == 63 and name.startswith("s" * 40 + "-some-org-")


def test_the_template_may_not_set_what_the_sweep_sets() -> None:
    for owned in sorted(OWNED_FIELDS):
        with pytest.raises(SpecError, match=f"spec.template sets {owned}"):
            parse_sweep({**HUB, "template": {owned: "x"}})


def test_children_are_valid_tests_named_per_sweep_and_model(schema: jsonschema.Validator) -> None:
    test_schema = jsonschema.Draft4Validator(
        yaml.safe_load(TEST_CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    )
    spec = parse_sweep(
        {
            **HUB,
            "stack": {"profile": "trn2"},
            "template": {"maxNewTokens": 16},
            "concurrency": {"queueName": "trainium"},
            "epoch": 3,
        }
    )
    entry = SweepModel(model="Qwen/Qwen3-0.6B", revision="v2")
    key = run_key(spec, SETTINGS)
    child = build_child(body({}), spec, entry, key, SETTINGS)
    test_schema.validate(child)
    validate_spec = parse_spec(child["spec"])
    assert validate_spec.epoch == 3 and validate_spec.queueName == "trainium"
    assert child["spec"]["image"] == SETTINGS.runner_image and child["spec"]["revision"] == "v2"
    meta = child["metadata"]
    assert meta["name"] == child_name("nightly", "Qwen/Qwen3-0.6B")
    assert meta["ownerReferences"] == [
        {"apiVersion": "modelsupport.dev/v1alpha1", "kind": "ModelSupportSweep",
         "name": "nightly", "uid": "u-1", "controller": True, "blockOwnerDeletion": True}
    ]  # fmt: skip
    # Another sweep, or a model differing only in case, never shares the name.
    assert child_name("weekly", "Qwen/Qwen3-0.6B") != meta["name"]
    assert child_name("nightly", "qwen/qwen3-0.6b") != meta["name"]


def test_the_run_key_follows_the_epoch_and_the_stack_only() -> None:
    base = parse_sweep(HUB)
    key = run_key(base, SETTINGS)
    same = [
        {**HUB, "template": {"maxNewTokens": 8}},
        {**HUB, "concurrency": {"maxRunning": 2}},
        {"source": {"hub": {"sort": "downloads"}}},  # another ranking, same stack
    ]
    for spec in same:
        assert run_key(parse_sweep(spec), SETTINGS) == key
    other = [
        {**HUB, "epoch": 1},
        {**HUB, "stack": {"image": "reg.example/r:2"}},
        {**HUB, "stack": {"profile": "trn1"}},
        {**HUB, "stack": {"compilerVersion": "2.29"}},
    ]
    keys = {run_key(parse_sweep(spec), SETTINGS) for spec in other}
    assert len(keys) == len(other) and key not in keys
    # The operator's default image is part of a stack that names none: upgrading it re-tests.
    upgraded = SETTINGS.model_copy(update={"runner_image": "registry.example/runner:2"})
    assert run_key(base, upgraded) != key
    # refreshSeconds does not make a new ranking source; the limit does.
    refreshed = {"source": {"hub": {**HUB["source"]["hub"], "refreshSeconds": 600}}}  # type: ignore[dict-item]
    assert source_key(parse_sweep(refreshed), key) == source_key(base, key)
    longer = {"source": {"hub": {**HUB["source"]["hub"], "limit": 300}}}  # type: ignore[dict-item]
    assert source_key(parse_sweep(longer), key) != source_key(base, key)


def test_a_rerun_patch_replaces_the_spec_and_the_run_key() -> None:
    spec = parse_sweep({**HUB, "epoch": 2, "template": {"maxNewTokens": 8}})
    patch = rerun_patch(
        spec, SweepModel(model="a/b"), "k2", SETTINGS, {"model", "task", "cores", "epoch"}
    )
    assert patch["metadata"]["annotations"] == {"modelsupport.dev/sweep-run": "k2"}
    assert patch["spec"]["cores"] is None  # a field the template dropped is removed
    assert patch["spec"]["epoch"] == 2 and patch["spec"]["maxNewTokens"] == 8


def test_the_status_the_operator_writes_fits_the_crd(crd: dict[str, Any]) -> None:
    status_schema = jsonschema.Draft4Validator(
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"],
        format_checker=jsonschema.FormatChecker(),
    )
    conditions = sweep_conditions(None, "testing", 2, "3 of 10 models tested")
    status = SweepStatus(
        observedGeneration=2,
        runKey="abc",
        epoch=0,
        source="hub:trending/text-generation/top10",
        lastRankedAt="2026-11-30T20:00:00Z",
        ranking=RankingState(
            source="hub:trending/text-generation/top10",
            sourceKey="s",
            fetchedAt="2026-11-30T20:00:00Z",
            models=[SweepModel(model="a/b")],
            snapshot="/r/rankings/snapshots/x.json",
        ),
        counts=SweepCounts(
            models=10, done=3, passed=2, failed=1, running=2, queued=5, regressions=1, fixes=0
        ),
        baseline=SweepBaseline(runKey="old", results={"a/b": "PASS"}),
        regressions=[SweepRegression(model="a/b", before="PASS", after="FAIL", runs=["r1"])],
        flaky=[SweepFlaky(model="c/d", before="PASS", results=["FAIL", "PASS"], runs=["x", "y"])],
        regressionsReported="abc",
        cost=SweepCost(coreHours=1.5, usd=0.9, unpriced=1),
        message="3 of 10 models tested",
        conditions=conditions,  # type: ignore[arg-type]
    )
    status_schema.validate(status.patch())
    assert SweepStatus.read(status.patch()) == status
    # kstatus: testing is Ready=False, Reconciling=True; done is Ready=True; invalid is Stalled.
    states = {c["type"]: c["status"] for c in conditions}
    assert states == {"Ready": "False", "Progressing": "True", "Reconciling": "True",
                      "Stalled": "False"}  # fmt: skip
    done = {c["type"]: c["status"] for c in sweep_conditions(conditions, "done", 2, "all done")}
    assert done["Ready"] == "True" and done["Reconciling"] == "False"
    invalid = sweep_conditions(conditions, "invalid", 3, "bad spec")
    assert {c["type"]: c["status"] for c in invalid}["Stalled"] == "True"
    # A status with a part that no longer parses is read without it (rewritten from state).
    broken = {**status.patch(), "ranking": {"models": "not a list"}}
    assert SweepStatus.read(broken).ranking is None


def test_a_worse_result_counts_when_every_rerun_agrees_and_is_flaky_when_one_does_not() -> None:
    baseline = SweepBaseline(
        runKey="old", results=dict.fromkeys(("a/a", "b/b", "c/c", "d/d"), "PASS")
    )
    fail = Run(done=True, result="FAIL", run_id="first")
    first = {"a/a": fail, "b/b": fail, "c/c": fail, "d/d": Run(True, "PASS", "p")}
    reruns = {
        "a/a": [Run(True, "FAIL", "a1"), Run(True, "FAIL", "a2")],  # both agree
        "b/b": [Run(False, None, None), Run(True, "PASS", "b2")],  # one disagrees: flaky now
        "c/c": [Run(True, "FAIL", "c1"), None],  # the second not made yet
    }
    judged = judge(baseline, first, reruns, 2)
    assert judged.regressions == [
        SweepRegression(model="a/a", before="PASS", after="FAIL", runs=["first", "a1", "a2"])
    ]
    assert judged.flaky == [
        SweepFlaky(model="b/b", before="PASS", results=["FAIL", "PASS"], runs=["first", "b2"])
    ]
    assert judged.confirming == ["c/c"] and judged.missing == {"c/c": [2]}
    # A re-run that could not run (Invalid) does not repeat the result either.
    invalid = judge(baseline, {"c/c": fail}, {"c/c": [Run(True, INVALID, None), None]}, 2)
    assert [f.results for f in invalid.flaky] == [["FAIL", "Invalid"]]
    # No re-runs asked for: one run decides; no baseline: nothing to compare.
    assert [r.model for r in judge(baseline, first, {}, 0).regressions] == ["a/a", "b/b", "c/c"]
    assert judge(None, first, reruns, 2) == Judged()


def test_reruns_are_named_after_their_test_and_never_as_another_models_test() -> None:
    longest = "org/" + "m" * 120
    for model in ("Qwen/Qwen3-0.6B", longest):
        first = child_name("n" * 40, model)
        names = [rerun_name("n" * 40, model, n) for n in (1, 2, 20)]
        assert all(len(n) <= 63 and re.fullmatch(DNS_LABEL_PATTERN, n) for n in names)
        assert len(set(names)) == 3 and first not in names
        assert all(n.endswith(f"-r{k}") for n, k in zip(names, (1, 2, 20), strict=True))
        assert all(first.rsplit("-", 1)[1] in n for n in names)  # the model's digest
    spec = parse_sweep(HUB)
    rerun = build_child(body({}), spec, SweepModel(model="a/b"), "k", SETTINGS, rerun=1)
    first_test = build_child(body({}), spec, SweepModel(model="a/b"), "k", SETTINGS)
    assert rerun["spec"] == first_test["spec"]
    assert rerun["metadata"]["name"] == rerun_name("nightly", "a/b", 1)
    assert rerun["metadata"]["annotations"]["modelsupport.dev/confirms"] == child_name(
        "nightly", "a/b"
    )
