"""``celery_outbox.metrics``: what a scrape yields when the store fails, registering
without a read, several databases (the in-memory store; every store: tests/contract).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from celery_outbox.exceptions import StoreError
from celery_outbox.registry import install_store
from celery_outbox.store.base import Backlog, LastSweep
from celery_outbox.testing import InMemoryOutboxStore
from tests.contract.factories import FAR_FUTURE, new_message

prometheus_client = pytest.importorskip("prometheus_client")

from celery_outbox.metrics import OutboxCollector  # noqa: E402 - after the skip

AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


class DownStore(InMemoryOutboxStore):
    def backlog(self, *, using: str | None = None, bound: int | None = None) -> Backlog:
        raise StoreError("read the outbox backlog: connection refused")


class TwoDatabases(InMemoryOutboxStore):
    """``a`` swept at ``AT``, ``b`` an hour later; each alias sees the same rows."""

    def last_sweep(self, *, using: str | None = None) -> LastSweep | None:
        at = AT if using == "a" else AT + timedelta(hours=1)
        return LastSweep(at=at, age=timedelta(0))


def app_with(store: InMemoryOutboxStore) -> Celery:
    app = Celery("metrics-unit", set_as_current=False)
    install_store(app, store)
    return app


def scrape(store: InMemoryOutboxStore, **kwargs: object) -> prometheus_client.CollectorRegistry:
    registry = prometheus_client.CollectorRegistry()
    registry.register(OutboxCollector(app_with(store), **kwargs))  # type: ignore[arg-type]
    return registry


def test_a_store_error_fails_no_scrape_and_leaves_the_store_gauges_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = scrape(DownStore())

    text = prometheus_client.generate_latest(registry).decode()

    assert registry.get_sample_value("celery_outbox_scrape_error") == 1.0
    assert "celery_outbox_pending" not in text
    assert "connection refused" in caplog.text


def test_registering_reads_nothing() -> None:
    # the default registry describes a collector when it is registered: no store read
    registry = prometheus_client.CollectorRegistry(auto_describe=True)

    registry.register(OutboxCollector(app_with(DownStore())))


def test_databases_sum_their_counts_and_the_oldest_last_sweep_is_shown() -> None:
    store = TwoDatabases()
    store.add(new_message(available_at=FAR_FUTURE))

    registry = scrape(store, aliases=["a", "b"])

    assert registry.get_sample_value("celery_outbox_parked") == 2.0
    assert registry.get_sample_value("celery_outbox_last_sweep_timestamp_seconds") == (
        AT.timestamp()
    )


class OneNeverSwept(InMemoryOutboxStore):
    def last_sweep(self, *, using: str | None = None) -> LastSweep | None:
        return LastSweep(at=AT, age=timedelta(0)) if using == "a" else None


def test_a_database_never_swept_makes_the_last_sweep_zero() -> None:
    registry = scrape(OneNeverSwept(), aliases=["a", "b"])

    assert registry.get_sample_value("celery_outbox_last_sweep_timestamp_seconds") == 0.0
