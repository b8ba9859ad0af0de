"""Carrying out a decision: the next attempt is sent with ``retry()``'s arguments and
options, and a retry that cannot be sent is a dead letter naming why, never a lost task.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Retry
from kombu import Connection, Queue

from celery_outbox.dispatch.envelope import decode_body
from celery_outbox.registry import install_store
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.worker.outcomes import after_failure
from tests.unit.worker.support import attempt_of, queued_ids


def test_a_retry_with_new_arguments_parks_a_row_carrying_them(app: Celery, queue_name: str) -> None:
    store = InMemoryOutboxStore()
    install_store(app, store)
    retry = after_failure(
        app.tasks["unit.retrying"],
        attempt_of("t9", queue_name),
        ValueError(),
        explicit=True,
        rng=random.Random(),
        countdown=600,  # past outbox_park_after: parked
        args=(7,),
    )
    assert isinstance(retry, Retry)
    (row,) = store.rows.values()
    args, kwargs, _ = decode_body(row.payload, row.options, accept=None, max_bytes=None)
    assert (row.task_id, args, kwargs) == ("t9", [7], {})
    assert queued_ids(queue_name) == []


def test_a_retry_with_options_is_sent_with_them(app: Celery, queue_name: str) -> None:
    install_store(app, InMemoryOutboxStore())
    other = f"{queue_name}-other"
    retry = after_failure(
        app.tasks["unit.retrying"],
        attempt_of("t10", queue_name),
        ValueError(),
        explicit=True,
        rng=random.Random(),
        countdown=1,
        kwargs={"n": 3},
        overrides={"queue": other},
    )
    assert isinstance(retry, Retry)
    assert queued_ids(queue_name) == []
    with Connection("memory://") as conn:
        message = Queue(other)(conn.default_channel).get(no_ack=True)
    assert message is not None
    assert (message.headers["id"], message.headers["retries"]) == ("t10", 1)
    assert message.decode()[:2] == [[3], {}]  # n=3 takes the place of the given n=1, as in Celery


def test_a_retry_argument_it_cannot_send_is_a_dead_letter_naming_it(
    app: Celery, queue_name: str
) -> None:
    store = InMemoryOutboxStore()
    install_store(app, store)
    error = ValueError("boom")
    assert (
        after_failure(
            app.tasks["unit.retrying"],
            attempt_of("t11", queue_name),
            error,
            explicit=True,
            rng=random.Random(),
            args="not a list",
        )
        is error
    )
    (letter,) = store.letters.values()
    assert letter.exception_type == "celery_outbox.exceptions.OutboxConfigError"
    assert "args='not a list'" in letter.exception_message
    assert letter.args == [1]  # the arguments the failed attempt ran with


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"args": (object(),)}, "object"),  # the next message cannot be serialised
        ({"overrides": {"expires": "someday"}}, "expires='someday'"),
    ],
)
def test_a_retry_that_cannot_be_built_is_a_dead_letter_not_a_lost_task(
    app: Celery, queue_name: str, arguments: dict[str, Any], named: str
) -> None:
    store = InMemoryOutboxStore()
    install_store(app, store)
    error = ValueError("boom")
    task = app.tasks["unit.retrying"]
    outcome = after_failure(
        task, attempt_of("t12", queue_name), error, explicit=True, rng=random.Random(), **arguments
    )
    assert outcome is error
    (letter,) = store.letters.values()
    assert letter.exception_type == "celery_outbox.exceptions.OutboxConfigError"
    assert named in letter.exception_message
    assert queued_ids(queue_name) == []


def test_a_retry_at_an_instant_is_parked_due_at_that_instant_on_the_databases_clock(
    app: Celery, queue_name: str
) -> None:
    # The database's clock a minute behind this worker's: an eta read on the worker's
    # clock would come due a minute early (DESIGN.md: every due time on the database's).
    database_now = datetime.now(timezone.utc) - timedelta(minutes=1)
    store = InMemoryOutboxStore(clock=lambda: database_now)
    install_store(app, store)
    at = database_now + timedelta(minutes=10)

    retry = after_failure(
        app.tasks["unit.retrying"],
        attempt_of("t11", queue_name),
        ValueError(),
        explicit=True,
        rng=random.Random(),
        eta=at,
    )

    assert isinstance(retry, Retry)
    (row,) = store.rows.values()
    assert row.available_at == at
    assert queued_ids(queue_name) == []
