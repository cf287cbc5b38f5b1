"""The chart's PrometheusRule example: off by default, and when on, alerting on metrics the
operator really exports, with Prometheus' own templates kept for Prometheus; prices as a
chart setting reach the operator."""

from __future__ import annotations

import copy
from typing import Any

import helm_python
import pytest
from prometheus_client import REGISTRY
from test_operator_manifests import CHART, chart_settings, render_chart

import model_support.operator.metrics  # noqa: F401  (registers the operator's metrics)
from model_support.operator.settings import settings_from_values

BASE: dict[str, Any] = {
    "results": "s3://bucket/results",
    "watchNamespaces": ["ml"],
    "deliveryKey": {"existingSecret": "ms-delivery-key"},
}


def exported() -> set[str]:
    return {sample.name for family in REGISTRY.collect() for sample in family.samples} | {
        family.name for family in REGISTRY.collect()
    }


def test_the_prometheus_rule_is_off_by_default_and_alerts_on_exported_metrics() -> None:
    assert not [d for d in render_chart(BASE) if d["kind"] == "PrometheusRule"]
    values = {**BASE, "prometheusRule": {"enabled": True, "labels": {"release": "prom"}}}
    report = helm_python.lint(str(CHART), copy.deepcopy(values), strict=True)
    assert report["errors"] == []
    (rule,) = [d for d in render_chart(values) if d["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prom"
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    new = alerts["ModelSupportNewRegression"]
    assert new["expr"] == "delta(model_support_sweep_regressions[30m]) > 0"
    assert "{{ $labels.namespace }}/{{ $labels.sweep }}" in new["annotations"]["summary"]
    names = exported()
    for alert in alerts.values():
        metric = alert["expr"].split("(", 1)[1].split("[", 1)[0]
        assert metric in names, f"{alert['alert']} alerts on {metric}, which is not exported"
    # With metrics off there is nothing to alert on.
    off = {**values, "metrics": {"enabled": False}}
    assert not [d for d in render_chart(off) if d["kind"] == "PrometheusRule"]


def test_instance_prices_are_a_chart_setting_and_a_bad_table_is_refused() -> None:
    prices = {
        "region": "us-west-2",
        "prices": [
            {"instance_type": "trn1.32xlarge", "region": "us-west-2", "usd_per_hour": 14.0,
             "cores": 32, "source": "our contract", "as_of": "2026-11-01"},
        ],
    }  # fmt: skip
    values = {**BASE, "settings": {"instancePrices": prices}}
    settings = chart_settings(render_chart(values))
    assert settings == settings_from_values(values)
    assert settings.prices().core_hour_usd("trn1.32xlarge") == pytest.approx(14.0 / 32)
    with pytest.raises(ValueError, match=r"settings\.instancePrices: prices"):
        settings_from_values({**BASE, "settings": {"instancePrices": {"prices": 3}}})
