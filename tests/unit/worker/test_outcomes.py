"""Carrying out a decision never drops the task: the ETA and parking fall back on each
other, and a dead letter the store cannot take puts the message back or is kept minimal."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore, Reject, Retry
from kombu import Connection, Queue

from celery_outbox import NoStoreConfigured, OutboxTask, StoreDataError, StoreError
from celery_outbox.envelope import build_message, decode_body
from celery_outbox.escaping import is_incomplete
from celery_outbox.registry import install_store
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.worker.attempt import Attempt
from celery_outbox.worker.letters import write_dead_letter
from celery_outbox.worker.outcomes import after_failure
from celery_outbox.worker.policy import Outcome
from celery_outbox.worker.republish import schedule_retry

NOW = datetime.now(timezone.utc)


def attempt_of(task_id: str, queue: str) -> Attempt:
    """The first attempt of ``unit.retrying`` with ``task_id``, delivered from ``queue``."""
    return Attempt(
        task_name="unit.retrying",
        task_id=task_id,
        args=(1,),
        delivery_info={"exchange": "", "routing_key": queue, "priority": None},
        options={"queue": queue},
    )


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("failures-unit", broker="memory://", set_as_current=False)
    app.conf.update(task_default_queue=queue_name, outbox_park_after=30.0)
    app.task(base=OutboxTask, name="unit.retrying", shared=False)(lambda_free)
    yield app
    app.close()


def lambda_free(n: int) -> int:
    """A task body."""
    return n


def queued_ids(queue_name: str) -> list[str]:
    with Connection("memory://") as conn:
        queue = Queue(queue_name)(conn.default_channel)
        ids = []
        while (message := queue.get(no_ack=True)) is not None:
            ids.append(message.headers["id"])
        return ids


def test_long_wait_is_parked(app: Celery, queue_name: str) -> None:
    store = InMemoryOutboxStore()
    install_store(app, store)
    retry = schedule_retry(
        app.tasks["unit.retrying"],
        attempt_of("t1", queue_name),
        ValueError(),
        delay=timedelta(minutes=10),
        park=True,
        now=NOW,
    )
    assert isinstance(retry, Retry)
    (row,) = store.rows.values()
    assert (row.task_id, row.available_at) == ("t1", NOW + timedelta(minutes=10))
    assert queued_ids(queue_name) == []


def test_park_colliding_with_the_row_being_published_rides_on_an_eta(
    app: Celery, queue_name: str
) -> None:
    # The sweeper published this task's row and has not removed it yet: parking the
    # retry collides with it, and the retry must not be dropped.
    store = InMemoryOutboxStore()
    install_store(app, store)
    task = app.tasks["unit.retrying"]
    store.add(
        build_message(
            task,
            (1,),
            {},
            task_id="t2",
            options={},
            now=NOW,
            park_after=timedelta(seconds=30),
            max_bytes=None,
        )
    )
    retry = schedule_retry(
        task,
        attempt_of("t2", queue_name),
        ValueError(),
        delay=timedelta(minutes=10),
        park=True,
        now=NOW,
    )
    assert isinstance(retry, Retry)
    assert queued_ids(queue_name) == ["t2"]


def test_neither_eta_nor_park_rejects_with_requeue(app: Celery) -> None:
    store = InMemoryOutboxStore()
    install_store(app, store)
    app.conf.broker_write_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    app.conf.outbox_publish_timeout = 0.2
    task = app.tasks["unit.retrying"]
    store.add(
        build_message(
            task,
            (1,),
            {},
            task_id="t3",
            options={},
            now=NOW,
            park_after=timedelta(seconds=30),
            max_bytes=None,
        )
    )
    with pytest.raises(Reject) as caught:
        schedule_retry(
            task,
            attempt_of("t3", "q"),
            ValueError(),
            delay=timedelta(minutes=10),
            park=True,
            now=NOW,
        )
    assert caught.value.requeue is True


class BrokenStore(InMemoryOutboxStore):
    """A store whose database is down for dead letters."""

    def add_dead_letter(self, letter: Any, *, using: str | None = None) -> int:
        raise StoreError("database is down")


def test_unwritable_dead_letter_puts_the_message_back_with_a_delay(
    app: Celery, queue_name: str
) -> None:
    install_store(app, BrokenStore())
    with pytest.raises(Ignore):  # this delivery is acknowledged: a delayed copy is queued
        write_dead_letter(
            app.tasks["unit.retrying"],
            attempt_of("t4", queue_name),
            ValueError("boom"),
            outcome=Outcome.EXHAUSTED,
            now=NOW,
        )
    with Connection("memory://") as conn:
        message = Queue(queue_name)(conn.default_channel).get(no_ack=True)
    assert message is not None
    assert message.headers["id"] == "t4"
    assert message.headers["outbox_requeues"] == 1
    assert datetime.fromisoformat(message.headers["eta"]) > NOW
    assert message.headers["retries"] == 0  # a put-back is not a retry


def test_put_back_with_the_broker_down_too_is_rejected_with_requeue(app: Celery) -> None:
    install_store(app, BrokenStore())
    app.conf.broker_write_url = "redis://127.0.0.1:1/0"
    app.conf.outbox_publish_timeout = 0.2
    with pytest.raises(Reject) as caught:
        write_dead_letter(
            app.tasks["unit.retrying"],
            attempt_of("t5", "q"),
            ValueError("boom"),
            outcome=Outcome.EXHAUSTED,
            now=NOW,
        )
    assert caught.value.requeue is True


class PickyStore(InMemoryOutboxStore):
    """A store that refuses, as data, letters with arguments (or every letter)."""

    def __init__(self, *, refuse_all: bool = False, error: Exception | None = None) -> None:
        super().__init__()
        self.refuse_all = refuse_all
        self.error = error or StoreDataError("value too long")

    def add_dead_letter(self, letter: Any, *, using: str | None = None) -> int:
        if self.refuse_all or letter.args:
            raise self.error
        return super().add_dead_letter(letter, using=using)


@pytest.mark.parametrize(
    "error", [StoreDataError("too long"), UnicodeEncodeError("x", "", 0, 1, "")]
)
def test_a_refused_dead_letter_is_stored_minimal_not_put_back(
    app: Celery, queue_name: str, error: Exception
) -> None:
    store = PickyStore(error=error)
    install_store(app, store)
    letter_id = write_dead_letter(
        app.tasks["unit.retrying"],
        attempt_of("t6", queue_name),
        ValueError("boom"),
        outcome=Outcome.EXHAUSTED,
        now=NOW,
    )
    assert letter_id is not None
    stored = store.get_dead_letter(letter_id)
    assert stored is not None
    assert (stored.task_id, stored.args, stored.exception_type) == ("t6", [], "builtins.ValueError")
    assert "could not be stored whole" in stored.exception_message
    assert is_incomplete(stored.options)
    assert queued_ids(queue_name) == []  # not put back: the task does not run again


def test_a_letter_refused_even_minimal_is_logged_and_never_put_back(
    app: Celery, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    install_store(app, PickyStore(refuse_all=True))
    letter_id = write_dead_letter(
        app.tasks["unit.retrying"],
        attempt_of("t7", queue_name),
        ValueError("boom"),
        outcome=Outcome.EXHAUSTED,
        now=NOW,
    )
    assert letter_id is None
    assert "t7" in caplog.text
    assert "has no dead letter" in caplog.text
    assert queued_ids(queue_name) == []


def test_no_store_while_writing_a_dead_letter_puts_the_message_back(
    app: Celery, queue_name: str
) -> None:
    install_store(app, PickyStore(refuse_all=True, error=NoStoreConfigured()))
    with pytest.raises(Ignore):  # a configuration gap is not a refused value: nothing dropped
        write_dead_letter(
            app.tasks["unit.retrying"],
            attempt_of("t8", queue_name),
            ValueError("boom"),
            outcome=Outcome.EXHAUSTED,
            now=NOW,
        )
    assert queued_ids(queue_name) == ["t8"]


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
