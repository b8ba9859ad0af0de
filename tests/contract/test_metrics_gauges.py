"""The outbox gauges (``celery_outbox.metrics.OutboxCollector``) on every store.

Each test scrapes a registry holding only the collector, as Prometheus would.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from celery_outbox.registry import install_store
from celery_outbox.store.records import DeadLetterStatus
from tests.contract.factories import FAR_FUTURE, NOW, new_dead_letter, new_message
from tests.contract.harness import Harness

prometheus_client = pytest.importorskip("prometheus_client")

from celery_outbox.metrics import OutboxCollector  # noqa: E402 - after the skip

HOUR = timedelta(hours=1)
SLACK = timedelta(seconds=30)


def wall() -> datetime:
    return datetime.now(timezone.utc)


def scrape(store: object, **kwargs: object) -> prometheus_client.CollectorRegistry:
    app = Celery("metrics-gauges", set_as_current=False)
    install_store(app, store)  # type: ignore[arg-type]
    registry = prometheus_client.CollectorRegistry()
    registry.register(OutboxCollector(app, **kwargs))  # type: ignore[arg-type]
    return registry


def value(registry: prometheus_client.CollectorRegistry, name: str, **labels: str) -> float | None:
    found: float | None = registry.get_sample_value(name, labels)
    return found


def test_dead_letters_are_counted_by_status(harness: Harness) -> None:
    ids = [harness.store.add_dead_letter(new_dead_letter()) for _ in range(4)]
    harness.store.discard_dead_letter(ids[0])
    harness.store.requeue_dead_letter(ids[1], new_message(), by="ops", now=NOW)

    assert dict(harness.store.count_dead_letters()) == {
        DeadLetterStatus.DEAD: 2,
        DeadLetterStatus.REQUEUED: 1,
        DeadLetterStatus.DISCARDED: 1,
        DeadLetterStatus.COMPLETED: 0,
    }


def test_an_empty_outbox_scrapes_zeros(harness: Harness) -> None:
    registry = scrape(harness.store)

    for name in ("pending", "parked", "failed", "oldest_pending_age_seconds", "scrape_error"):
        assert value(registry, f"celery_outbox_{name}") == 0.0, name
    assert value(registry, "celery_outbox_dead_letters", status="dead") == 0.0
    assert value(registry, "celery_outbox_workflows", status="running") == 0.0
    assert value(registry, "celery_outbox_last_sweep_timestamp_seconds") == 0.0


def test_the_gauges_read_the_backlog_letters_and_sweep(harness: Harness) -> None:
    store = harness.store
    store.add(new_message(available_at=wall() - HOUR))
    store.add(new_message(available_at=wall() - timedelta(minutes=1)))
    store.add(new_message(available_at=FAR_FUTURE))
    failed = store.add(new_message(available_at=wall() - 2 * HOUR))
    assert failed is not None
    claim = store.claim([failed], now=wall(), lease_until=wall() + HOUR)
    store.record_failure(claim, [failed], error="broker down", retry_at=None)
    store.add_dead_letter(new_dead_letter())
    store.discard_dead_letter(store.add_dead_letter(new_dead_letter()))
    store.add_workflow_steps("root-1", name="order", steps=2, now=NOW)
    assert store.record_sweep(every=timedelta(seconds=1))
    swept = store.last_sweep()
    assert swept is not None

    registry = scrape(store)

    assert value(registry, "celery_outbox_pending") == 2.0
    assert value(registry, "celery_outbox_parked") == 1.0
    assert value(registry, "celery_outbox_failed") == 1.0
    age = value(registry, "celery_outbox_oldest_pending_age_seconds")
    assert age is not None
    assert (HOUR - SLACK).total_seconds() < age < (HOUR + SLACK).total_seconds()
    assert value(registry, "celery_outbox_dead_letters", status="dead") == 1.0
    assert value(registry, "celery_outbox_dead_letters", status="discarded") == 1.0
    assert value(registry, "celery_outbox_dead_letters", status="requeued") == 0.0
    running = 1.0 if store.keeps_workflows() else 0.0
    assert value(registry, "celery_outbox_workflows", status="running") == running
    assert value(registry, "celery_outbox_last_sweep_timestamp_seconds") == pytest.approx(
        swept.at.timestamp()
    )
    assert value(registry, "celery_outbox_scrape_error") == 0.0
