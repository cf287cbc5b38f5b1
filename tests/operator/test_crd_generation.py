"""The CRDs are generated from the operator's models: the committed files are that output, the
API server's schema and the operator refuse the same specs, and the core limits are the
hardware table's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from test_operator_manifests import cel_violations

from model_support import hardware
from model_support.operator import crd
from model_support.operator.spec import LNC_VALUES, PROFILES, SpecError, parse_spec
from model_support.operator.sweep_spec import parse_sweep

ROOT = Path(__file__).resolve().parents[2]


def _schema(document: dict[str, Any]) -> jsonschema.Validator:
    # OpenAPI v3.0 schemas are JSON Schema draft 4 (boolean exclusiveMinimum included).
    return jsonschema.Draft4Validator(document["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def _test_body(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "modelsupport.dev/v1alpha1", "kind": "ModelSupportTest",
            "metadata": {"name": "x"}, "spec": spec}  # fmt: skip


def test_the_committed_crds_are_what_the_models_generate() -> None:
    stale = [
        str(path.relative_to(ROOT))
        for path, text in crd.files(ROOT).items()
        if not path.exists() or path.read_text() != text
    ]
    assert stale == [], f"{stale}: run `python -m model_support.operator.crd` and commit them"


def test_check_mode_names_each_stale_file_and_writing_fixes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert crd.main(["--root", str(tmp_path), "--check"]) == 1
    missing = capsys.readouterr().out
    assert missing.count("differs from its models") == 6
    assert not (tmp_path / "crds").exists()  # --check writes nothing

    assert crd.main(["--root", str(tmp_path)]) == 0
    assert crd.main(["--root", str(tmp_path), "--check"]) == 0
    chart_copy = tmp_path / "charts" / "model-support" / "crds" / "modelsupportsweeps.yaml"
    assert chart_copy.read_text() == (ROOT / "crds" / "modelsupportsweeps.yaml").read_text()

    capsys.readouterr()
    chart_copy.write_text(chart_copy.read_text().replace("maxItems: 16", "maxItems: 17"))
    assert crd.main(["--root", str(tmp_path), "--check"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "charts/model-support/crds/modelsupportsweeps.yaml: differs from its models"
    ]


def _limits() -> list[tuple[str, int | None, int]]:
    """(profile, lnc, the cores of one instance) for every Neuron profile, from hardware.py."""
    cases = []
    for name, profile in PROFILES.items():
        if not profile.neuron:
            continue
        for lnc in hardware.LNC_CHOICES.get(name, (None,)):
            cases.append((name, lnc, hardware.get_profile(name, lnc).cores_per_instance))
    return cases


@pytest.mark.parametrize(("profile", "lnc", "limit"), _limits())
def test_core_limits_are_the_hardware_tables(profile: str, lnc: int | None, limit: int) -> None:
    """A test, and a sweep's template, may use every core of one instance and no more: the
    API server (schema and CEL rules) and the operator both say so, with hardware.py's figure."""
    tests = crd.crd_for_tests()
    sweeps = crd.crd_for_sweeps()
    for cores, admitted in ((limit, True), (limit + 1, False)):
        spec: dict[str, Any] = {"model": "a/b", "profile": profile, "cores": cores,
                                "parallelism": "tensor"}  # fmt: skip
        if lnc is not None:
            spec["lnc"] = lnc
        api = _schema(tests).is_valid(_test_body(spec)) and not cel_violations(tests, spec)
        assert api is admitted, (spec, cel_violations(tests, spec))
        if admitted:
            parse_spec(spec)
        else:
            with pytest.raises(SpecError, match=rf"cores.*\b{limit}\b"):
                parse_spec(spec)

        template = {k: v for k, v in spec.items() if k not in ("model", "profile")}
        sweep = {"source": {"hub": {}}, "stack": {"profile": profile}, "template": template}
        body = {"apiVersion": "modelsupport.dev/v1alpha1", "kind": "ModelSupportSweep",
                "metadata": {"name": "s"}, "spec": sweep}  # fmt: skip
        sweep_api = _schema(sweeps).is_valid(body) and not cel_violations(sweeps, sweep)
        assert sweep_api is admitted, cel_violations(sweeps, sweep)
        if admitted:
            parse_sweep(sweep)
        else:
            with pytest.raises(SpecError, match=rf"cores.*\b{limit}\b"):
                parse_sweep(sweep)


def test_lnc_values_are_the_hardware_tables() -> None:
    tests = crd.crd_for_tests()
    field = tests["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["lnc"]
    assert (
        field["enum"]
        == list(LNC_VALUES)
        == sorted({lnc for kind, lnc in hardware.PROFILES if lnc is not None})
    )
    assert f"Default {hardware.DEFAULT_LNC['trn2']}." in field["description"]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"instanceType": "Trn2 48xlarge"}, "instanceType"),
        ({"hubTokenSecret": {"name": "Not_A_Secret"}}, "hubTokenSecret"),
        ({"hubTokenSecret": {"name": "hf", "key": "a key"}}, "hubTokenSecret"),
        (
            {"scheduling": {"nodeSelector": {f"k{i}": "v" for i in range(21)}}},
            "scheduling.nodeSelector",
        ),
        ({"scheduling": {"nodeSelector": {"pool": "v" * 64}}}, "scheduling.nodeSelector"),
        ({"scheduling": {"tolerations": [{"key": "k" * 317}]}}, "scheduling.tolerations"),
        ({"scheduling": {"schedulerName": "-my-scheduler"}}, "scheduling.schedulerName"),
        ({"prompts": [""]}, "prompts"),
        ({"prompts": ["p" * 4097]}, "prompts"),
        ({"lnc": 3, "profile": "trn2"}, "lnc"),
    ],
)
def test_the_api_server_and_the_operator_refuse_the_same_fields(
    spec: dict[str, Any], field: str
) -> None:
    """Constraints the CRD once held alone are the operator's too: a spec an emulated API
    server (no schema) lets through is still refused, naming the field."""
    spec = {"model": "a/b", **spec}
    errors = list(_schema(crd.crd_for_tests()).iter_errors(_test_body(spec)))
    where = field.replace(".", "/")
    assert any(where in "/".join(map(str, e.absolute_path)) for e in errors), errors
    with pytest.raises(SpecError, match=f"spec.{field}"):
        parse_spec(spec)


def test_the_generated_yaml_reads_back_as_the_definition() -> None:
    for plural, build in (
        ("modelsupporttests", crd.crd_for_tests),
        ("modelsupportsweeps", crd.crd_for_sweeps),
        ("modelsupportbisects", crd.crd_for_bisects),
    ):
        text = crd.render(plural)
        assert text.startswith("# ") and "do not edit" in text.split("apiVersion:")[0]
        assert yaml.safe_load(text) == build()
