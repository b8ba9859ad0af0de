"""Every metric the code exposes is documented (docs/observability.md, "Metrics") and on
the Grafana dashboard (docs/grafana/celery-outbox.json), and the docs name no other.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from celery import Celery  # noqa: E402

from celery_outbox import metrics as metric_counters  # noqa: E402
from celery_outbox.metrics import OutboxCollector  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY_MD = ROOT / "docs" / "observability.md"
DASHBOARD = ROOT / "docs" / "grafana" / "celery-outbox.json"


def exposed() -> set[str]:
    """The names the collector and the counters expose (counters with ``_total``)."""
    names = {m.name for m in OutboxCollector(Celery(set_as_current=False)).describe()}
    for metric in vars(metric_counters).values():
        if isinstance(metric, prometheus_client.Counter):
            names.add(metric._name + "_total")
        elif isinstance(metric, prometheus_client.Histogram):
            names.add(metric._name)
    return names


def documented(markdown: str) -> set[str]:
    """The metrics of the "Every metric" table."""
    section = markdown.split("### Every metric", 1)[1].split("\n### ", 1)[0]
    return set(re.findall(r"^\| `(celery_outbox_\w+)` \|", section, flags=re.M))


def test_every_exposed_metric_is_documented_and_no_other() -> None:
    assert documented(OBSERVABILITY_MD.read_text()) == exposed()


def test_the_dashboard_is_valid_json_showing_every_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = " ".join(
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    )

    missing = {name for name in exposed() if name not in exprs}

    assert missing == set()


def test_the_docs_check_bites() -> None:
    assert documented("### Every metric\n| `celery_outbox_x` | gauge |\n") == {"celery_outbox_x"}
