"""Sending a retry never drops it: the ETA and parking fall back on each other. A message
put back while its store fails is put back ``outbox_store_requeues`` times at most, then
held on its holding queue (issue 43).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore, Reject, Retry
from kombu import Queue as KombuQueue

from celery_outbox.exceptions import StoreError
from celery_outbox.registry import install_store
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.worker.attempt import (
    HELD_HEADER,
    PENDING_LETTER_HEADER,
    REQUEUES_HEADER,
    Attempt,
    attempt_from_request,
)
from celery_outbox.worker.republish import (
    RETRY_REASON_CHARS,
    RETRY_REASON_HEADER,
    holding_queue,
    requeue_later,
    retry_reason,
    schedule_retry,
)
from tests.messages import numbered
from tests.unit.worker.support import TASK, attempt_of, queued, queued_ids

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


def put_back(app: Celery, attempt: Attempt, **kwargs: Any) -> None:
    """``requeue_later`` of ``attempt``, its store down; the delivery is acknowledged."""
    with pytest.raises(Ignore):
        requeue_later(app.tasks[TASK], attempt, StoreError("database is down"), **kwargs)


def test_put_backs_count_up_to_outbox_store_requeues(
    app: Celery, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    app.conf.outbox_store_requeues = 2
    put_back(app, replace(attempt_of("t6", queue_name), requeues=1))
    (headers,) = queued(queue_name)
    assert headers[REQUEUES_HEADER] == 2
    assert "[t6] put back until" in caplog.text
    assert "(put-back 2 of 2)" in caplog.text
    assert queued(holding_queue({"queue": queue_name}, default="x")) == []


def test_past_outbox_store_requeues_the_message_is_held_with_an_error(
    app: Celery, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    app.conf.outbox_store_requeues = 2
    letter = {"exception_type": "builtins.ValueError", "exception_message": "boom"}
    attempt = replace(attempt_of("t7", queue_name), requeues=2, retries=1)
    put_back(app, attempt, letter=letter)
    assert queued_ids(queue_name) == []  # not put back again
    (headers,) = queued(f"{queue_name}.outbox_held")
    assert headers["id"] == "t7"
    assert headers["retries"] == 1
    assert headers["eta"] is None
    assert json.loads(headers[HELD_HEADER]) == attempt.routing()
    assert json.loads(headers[PENDING_LETTER_HEADER]) == letter  # its dead letter waits
    assert headers.get(REQUEUES_HEADER) is None  # a fresh count once it is sent on
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    text = record.getMessage()
    assert "[t7] was put back 2 times while its store failed" in text
    assert "last error: StoreError('database is down')" in text
    assert f"held on queue '{queue_name}.outbox_held'" in text
    assert "the task will not run again" in text


def test_a_hold_celery_cannot_route_is_a_put_back(
    app: Celery, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    app.conf.outbox_store_requeues = 1
    app.conf.task_create_missing_queues = False  # the holding queue cannot be routed to
    app.conf.task_queues = [KombuQueue(queue_name)]
    put_back(app, replace(attempt_of("t8", queue_name), requeues=1))
    (headers,) = queued(queue_name)
    assert headers[REQUEUES_HEADER] == 2
    assert "task_create_missing_queues is off" in caplog.text


def test_a_hold_the_broker_refuses_is_rejected_with_requeue(app: Celery) -> None:
    app.conf.outbox_store_requeues = 1
    app.conf.broker_write_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    app.conf.outbox_publish_timeout = 0.2
    with pytest.raises(Reject) as caught:
        requeue_later(app.tasks[TASK], replace(attempt_of("t9", "q"), requeues=1), StoreError())
    assert caught.value.requeue is True


def test_a_held_message_delivered_from_its_holding_queue_is_sent_on_from_where_it_came(
    app: Celery, queue_name: str
) -> None:
    task = app.tasks[TASK]
    held = f"{queue_name}.outbox_held"
    home = {"queue": queue_name, "exchange": None, "routing_key": None, "priority": None}
    task.push_request(
        id="t9",
        args=(1,),
        delivery_info={"exchange": "", "routing_key": held},
        **{HELD_HEADER: json.dumps(home)},
    )
    try:
        attempt = attempt_from_request(task, task.request)
    finally:
        task.pop_request()
    assert attempt.routing() == home  # its dead letter is requeued there
    assert attempt.options["queue"] == queue_name
    put_back(app, attempt)  # the store still fails: put back at home, counting afresh
    (headers,) = queued(queue_name)
    assert headers[REQUEUES_HEADER] == 1
    assert queued(held) == []


def test_the_holding_queue_is_named_after_the_queue_the_message_came_from() -> None:
    assert holding_queue({"queue": "mail"}, default="celery") == "mail.outbox_held"
    assert holding_queue({"exchange": "x", "routing_key": "x.mail"}, default="c") == (
        "x.mail.outbox_held"
    )
    assert holding_queue({}, default="celery") == "celery.outbox_held"
    assert holding_queue({"queue": "mail.outbox_held"}, default="c") == "mail.outbox_held"
