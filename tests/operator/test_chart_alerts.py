"""The chart's PrometheusRule example: off by default, and when on, alerting on metrics the
operator really exports, with Prometheus' own templates kept for Prometheus; prices as a
chart setting reach the operator."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from chart_values import REQUIRED_CHART_VALUES
from factories import CPU_STACK, T0, make_record
from prometheus_client import REGISTRY
from test_operator_manifests import CHART, chart_settings, render_chart

import model_support.operator.metrics  # noqa: F401  (registers the operator's metrics)
from model_support.cli.commands_demo import NEWER_RELEASE, OLDER_RELEASE
from model_support.operator import metrics
from model_support.operator.settings import settings_from_values
from model_support.store import ResultsStore
from model_support.vocabulary import Result

BASE: dict[str, Any] = {"results": "s3://bucket/results", **REQUIRED_CHART_VALUES}


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
    sweep = alerts["ModelSupportSweepRegressed"]
    assert sweep["expr"] == "max_over_time(model_support_sweep_regressions[30m]) > 0"
    assert "{{ $labels.namespace }}/{{ $labels.sweep }}" in sweep["annotations"]["summary"]
    names = exported()
    for alert in alerts.values():
        for metric in re.findall(r"model_support_\w+", alert["expr"]):
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


def _demo_like_store(root: Path) -> ResultsStore:
    """The demo's two releases of the faulty compiler: tiny-llama PASS, then FAIL three times
    (a regression the default policy confirms), the MoE ERROR then PASS (a fix)."""
    store = ResultsStore(root)
    runs = [
        ("demo/tiny-llama", OLDER_RELEASE, Result.PASS, 0),
        ("demo/tiny-qwen3-moe", OLDER_RELEASE, Result.ERROR, 0),
        *(("demo/tiny-llama", NEWER_RELEASE, Result.FAIL, hour) for hour in (1, 2, 3)),
        ("demo/tiny-qwen3-moe", NEWER_RELEASE, Result.PASS, 1),
    ]
    for model, backend, result, hour in runs:
        store.add(
            make_record(
                model, result, neuron=False, stack=CPU_STACK, finished=T0 + timedelta(hours=hour),
                document={"compile_backend": backend}, model_id=model,
            )
        )  # fmt: skip
    store.materialize()
    return store


def _promtool() -> str:
    found = shutil.which("promtool")
    assert found, (
        "promtool is needed to test the chart's alerts: install it with Prometheus (Debian: "
        "apt-get install prometheus; the README's test command does)"
    )
    return found


def test_the_alerts_fire_on_the_demos_regression_and_a_returning_sweep_count(
    tmp_path: Path,
) -> None:
    """promtool evaluates the rendered rules over series as the operator exports them: the
    demo's new release (a new series) alerts on its confirmed regression, and a sweep's count
    that resets and returns within the window is never missed."""
    store = _demo_like_store(tmp_path / "results")
    metrics.observe_stacks(store)
    metrics.observe_releases(store)  # as the operator's materializer does after observe_stacks
    labels = {"compiler": NEWER_RELEASE, "compiler_version": CPU_STACK.torch,
              "library": "transformers", "library_version": CPU_STACK.transformers}  # fmt: skip
    assert metrics.RELEASE_REGRESSIONS.labels(*labels.values())._value.get() == 1
    values = {**BASE, "prometheusRule": {"enabled": True}}
    (rule,) = [d for d in render_chart(values) if d["kind"] == "PrometheusRule"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    series = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    older = series.replace(NEWER_RELEASE, OLDER_RELEASE)
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # The older release has been exported for an hour; the newer one's series
                    # appears at 30 minutes, already with its confirmed regression.
                    {"series": f"model_support_release_regressions{older}", "values": "0x60"},
                    {"series": f"model_support_release_regressions{series}", "values": "_x30 1x30"},
                    # A sweep with 2 regressions for 40 minutes, reset by a new run key, and
                    # back at 2 five minutes later.
                    {"series": 'model_support_sweep_regressions{namespace="ml",sweep="nightly"}',
                     "values": "2x40 0x4 2x15"},
                ],
                "alert_rule_test": [
                    {"eval_time": "20m", "alertname": "ModelSupportReleaseRegressed", "exp_alerts": []},
                    {
                        "eval_time": "31m",
                        "alertname": "ModelSupportReleaseRegressed",
                        "exp_alerts": [{"exp_labels": {**labels, "severity": "warning"},
                                        "exp_annotations": _annotations(rule, "ModelSupportReleaseRegressed", labels, "1")}],
                    },
                    {
                        "eval_time": "50m",
                        "alertname": "ModelSupportSweepRegressed",
                        "exp_alerts": [{"exp_labels": {"namespace": "ml", "sweep": "nightly", "severity": "warning"},
                                        "exp_annotations": _annotations(rule, "ModelSupportSweepRegressed", {"namespace": "ml", "sweep": "nightly"}, "2")}],
                    },
                ],
            }
        ],
    }  # fmt: skip
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    checked = subprocess.run(
        [_promtool(), "test", "rules", "alerts_test.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _annotations(
    rule: dict[str, Any], alert: str, labels: dict[str, str], value: str
) -> dict[str, str]:
    """An alert's annotations as Prometheus fills them in (its $labels and $value)."""
    (found,) = [r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == alert]
    filled = {}
    for key, text in found["annotations"].items():
        text = text.replace("{{ $value }}", value)
        for name, label in labels.items():
            text = text.replace("{{ $labels." + name + " }}", label)
        filled[key] = text
    return filled


def test_the_notification_webhook_comes_from_a_secret_and_its_shape_from_the_values() -> None:
    values = {
        **BASE,
        "notifications": {
            "webhookSecret": {"name": "release-hook", "key": "url"},
            "tokenSecret": {"name": "gh", "key": "token"},
            "format": "github",
            "attempts": 3,
        },
    }
    docs = render_chart(values)
    settings = chart_settings(docs)
    assert settings == settings_from_values(values)
    assert (settings.notify_format, settings.notify_attempts) == ("github", 3)
    deployment = next(
        d for d in docs if d["kind"] == "Deployment" and "viewer" not in d["metadata"]["name"]
    )
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MODEL_SUPPORT_NOTIFY_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "release-hook", "key": "url"}
    }
    assert env["MODEL_SUPPORT_NOTIFY_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "gh"
    # The URL itself is never in the settings the Deployment carries in clear.
    assert "release-hook" not in env["MODEL_SUPPORT_SETTINGS"]["value"]
    plain = render_chart(BASE)
    deployment = next(
        d for d in plain if d["kind"] == "Deployment" and "viewer" not in d["metadata"]["name"]
    )
    names = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "MODEL_SUPPORT_NOTIFY_URL" not in names  # off until a Secret is named
