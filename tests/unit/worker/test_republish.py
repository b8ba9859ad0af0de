"""Sending a retry never drops it: the ETA and parking fall back on each other."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Reject, Retry

from celery_outbox.exceptions import StoreError
from celery_outbox.registry import install_store
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.worker.republish import (
    RETRY_REASON_CHARS,
    RETRY_REASON_HEADER,
    retry_reason,
    schedule_retry,
)
from tests.messages import numbered
from tests.unit.worker.support import attempt_of, queued_ids

NOW = datetime.now(timezone.utc)


def retry_of(
    app: Celery, task_id: str, queue: str, exc: Exception, *, delay: timedelta, park: bool
) -> Retry:
    """``schedule_retry`` of the failed attempt ``task_id`` of ``unit.retrying``, at NOW."""
    return schedule_retry(
        app.tasks["unit.retrying"],
        attempt_of(task_id, queue),
        exc,
        delay=delay,
        park=park,
        now=NOW,
    )


def test_long_wait_is_parked(app: Celery, queue_name: str) -> None:
    store = InMemoryOutboxStore(clock=lambda: NOW)  # the database's clock parks the row
    install_store(app, store)
    retry = retry_of(
        app,
        "t1",
        queue_name,
        ValueError("card declined\nsecond line"),
        delay=timedelta(minutes=10),
        park=True,
    )
    assert isinstance(retry, Retry)
    (row,) = store.rows.values()
    assert (row.task_id, row.available_at) == ("t1", NOW + timedelta(minutes=10))
    assert row.options["headers"][RETRY_REASON_HEADER] == "builtins.ValueError: card declined"
    assert queued_ids(queue_name) == []


def test_a_parked_retry_takes_the_place_of_the_row_its_attempt_came_from(
    app: Celery, queue_name: str
) -> None:
    # The publisher of this task's row published it and has not removed it yet (the
    # worker ran the attempt first): this run is the delivery of that row's message, so
    # its parked retry supersedes the row instead of colliding with it.
    store = InMemoryOutboxStore(clock=lambda: NOW)
    install_store(app, store)
    task = app.tasks["unit.retrying"]
    store.add(numbered(task, 1, task_id="t2", now=NOW))
    retry = retry_of(app, "t2", queue_name, ValueError(), delay=timedelta(minutes=10), park=True)
    assert isinstance(retry, Retry)
    (row,) = store.rows.values()
    assert (row.task_id, row.available_at) == ("t2", NOW + timedelta(minutes=10))
    assert row.options["headers"][RETRY_REASON_HEADER] == "builtins.ValueError"
    assert queued_ids(queue_name) == []


def test_a_refused_eta_parks_in_place_of_the_row_not_yet_removed(app: Celery) -> None:
    store = InMemoryOutboxStore(clock=lambda: NOW)
    install_store(app, store)
    app.conf.broker_write_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    app.conf.outbox_publish_timeout = 0.2
    task = app.tasks["unit.retrying"]
    store.add(numbered(task, 1, task_id="t3", now=NOW))
    retry = retry_of(app, "t3", "q", ValueError(), delay=timedelta(seconds=1), park=False)
    assert isinstance(retry, Retry)
    (row,) = store.rows.values()
    assert (row.task_id, row.available_at) == ("t3", NOW + timedelta(seconds=1))


class DownStore(InMemoryOutboxStore):
    """A store whose database is down for new rows."""

    def add(self, *args: Any, **kwargs: Any) -> int | None:
        raise StoreError("database is down")


def test_a_long_wait_the_store_cannot_park_rides_on_an_eta(app: Celery, queue_name: str) -> None:
    install_store(app, DownStore())
    retry = retry_of(app, "t4", queue_name, ValueError(), delay=timedelta(minutes=10), park=True)
    assert isinstance(retry, Retry)
    assert queued_ids(queue_name) == ["t4"]


def test_neither_eta_nor_park_rejects_with_requeue(app: Celery) -> None:
    install_store(app, DownStore())
    app.conf.broker_write_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    app.conf.outbox_publish_timeout = 0.2
    with pytest.raises(Reject) as caught:
        retry_of(app, "t5", "q", ValueError(), delay=timedelta(minutes=10), park=True)
    assert caught.value.requeue is True


def test_retry_reason_names_the_type_and_cuts_the_message() -> None:
    assert retry_reason(KeyError()) == "builtins.KeyError"
    long = retry_reason(RuntimeError("x" * 1000))
    assert long.startswith("builtins.RuntimeError: xxx")
    assert len(long) == RETRY_REASON_CHARS
