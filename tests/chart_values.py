"""The chart values every install must give besides `results` (the chart refuses to render
without them): where tests run, and the Secret holding the delivery key."""

from __future__ import annotations

from typing import Any

REQUIRED_CHART_VALUES: dict[str, Any] = {
    "watchNamespaces": ["ml"],
    "deliveryKey": {"existingSecret": "ms-delivery-key"},
}
