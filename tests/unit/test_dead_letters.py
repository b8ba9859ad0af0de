"""Writing and requeuing dead letters in the core (:mod:`celery_outbox.dead_letters`),
over the in-memory store and broker. Every store's side of requeue and discard is held
to the contract in ``tests/contract/test_dead_letters.py``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from kombu import Connection, Queue

from celery_outbox import ArgumentsMismatch, OutboxTask
from celery_outbox.dead_letters import (
    as_json,
    build_dead_letter,
    discard,
    escape_letter,
    exception_path,
    minimal_letter,
    requeue,
)
from celery_outbox.exceptions import OutboxError
from celery_outbox.registry import install_store
from celery_outbox.signals import dead_letter_requeued
from celery_outbox.state import reset
from celery_outbox.store.records import DeadLetterStatus, NewDeadLetter
from celery_outbox.testing import InMemoryOutboxStore

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
TASK = "unit.letters.add"


@pytest.fixture
def store() -> InMemoryOutboxStore:
    return InMemoryOutboxStore()


@pytest.fixture
def app(queue_name: str, store: InMemoryOutboxStore) -> Iterator[Celery]:
    app = Celery("letters-unit", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = queue_name

    @app.task(base=OutboxTask, name=TASK, shared=False)
    def add(a: float, b: float = 0) -> float:
        return a + b

    install_store(app, store)
    yield app
    reset(app)
    app.close()


def failed(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as raised:
        return raised


def letter(exc: BaseException | None = None, **changes: Any) -> NewDeadLetter:
    values: dict[str, Any] = {
        "task_name": TASK,
        "task_id": "t-1",
        "args": (1,),
        "kwargs": {"b": 2},
        "options": {"queue": "elsewhere", "priority": 3, "headers": {"x": 1}, "retries": 4},
        "exc": exc or failed(ValueError("boom")),
        "retries": 4,
        "first_failed_at": NOW - timedelta(minutes=5),
        "failed_at": NOW,
    }
    values.update(changes)
    return build_dead_letter(**values)


def queued(queue_name: str) -> list[Any]:
    with Connection("memory://") as conn:
        queue = Queue(queue_name)(conn.default_channel)
        got = []
        while (message := queue.get(no_ack=True)) is not None:
            got.append(message)
        return got


class Odd:
    """A value neither JSON nor Kombu can encode."""

    def __repr__(self) -> str:
        return "Odd()"

    def __str__(self) -> str:
        return "odd"


# -- building ---------------------------------------------------------------------------
def test_as_json_keeps_kombus_typed_values_and_falls_back_to_repr() -> None:
    when = dt.datetime(2030, 1, 1, 12, tzinfo=timezone.utc)
    typed = as_json([when, decimal.Decimal("1.5"), uuid.UUID(int=1), (1, 2)])

    assert typed[0]["__type__"] == "datetime"
    assert typed[1]["__type__"] == "decimal"
    assert typed[3] == [1, 2]
    assert as_json({"odd": Odd()}) == {"odd": "Odd()"}


def test_exception_path_is_the_dotted_class() -> None:
    assert exception_path(ValueError()) == "builtins.ValueError"
    assert exception_path(OutboxError()) == "celery_outbox.exceptions.OutboxError"


def test_a_dead_letter_holds_the_failure() -> None:
    built = letter()

    assert (built.args, built.kwargs, built.retries) == ([1], {"b": 2}, 4)
    assert (built.exception_type, built.exception_message) == ("builtins.ValueError", "boom")
    assert "raise exc" in built.traceback
    assert built.traceback.endswith("ValueError: boom\n")


def test_an_exception_without_a_message_gives_the_reason() -> None:
    built = letter(failed(KeyError()), reason="retries exhausted")
    assert built.exception_message == "retries exhausted"


# -- requeue and discard ---------------------------------------------------------------
def test_requeue_publishes_the_same_task_on_its_routing_only(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    letter_id = store.add_dead_letter(letter())
    sent: list[dict[str, Any]] = []

    def on_requeued(**kwargs: Any) -> None:
        sent.append(kwargs)

    dead_letter_requeued.connect(on_requeued, sender=app, weak=False)
    try:
        task_id = requeue(app, letter_id, by="ops")
    finally:
        dead_letter_requeued.disconnect(on_requeued, sender=app)

    (message,) = queued("elsewhere")  # routing kept; headers and old retries are not
    assert message.headers["id"] == task_id != "t-1"
    assert message.headers["task"] == TASK
    assert message.headers["retries"] == 0
    assert "x" not in message.headers
    assert message.properties["priority"] == 3
    assert message.decode()[:2] == [[1], {"b": 2}]
    assert [(s["letter_id"], s["task_id"], s["by"]) for s in sent] == [(letter_id, task_id, "ops")]
    stored = store.get_dead_letter(letter_id)
    assert stored is not None
    assert stored.status is DeadLetterStatus.REQUEUED


def test_requeue_restores_arguments_escaped_to_be_stored(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    escaped = escape_letter(letter(args=(float("nan"),), kwargs={}, options={}))
    letter_id = store.add_dead_letter(escaped)

    requeue(app, letter_id)

    (message,) = queued(queue_name)
    assert message.body.startswith(b"[[NaN]")


def requeue_then_fail(app: Celery, store: InMemoryOutboxStore, letter_id: int) -> None:
    with store.atomic():
        requeue(app, letter_id)
        raise RuntimeError("rollback")


def test_requeue_inside_a_rolled_back_transaction_publishes_nothing(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    letter_id = store.add_dead_letter(letter(options={}))

    with pytest.raises(RuntimeError, match="rollback"):
        requeue_then_fail(app, store, letter_id)

    assert queued(queue_name) == []
    assert store.rows == {}


def test_a_letter_of_an_unregistered_task_is_not_requeued(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    letter_id = store.add_dead_letter(letter(task_name="unit.gone"))

    with pytest.raises(OutboxError, match=r"task 'unit.gone' is not registered"):
        requeue(app, letter_id)
    assert store.rows == {}


def test_arguments_that_no_longer_fit_the_task_are_an_error_naming_the_letter(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    letter_id = store.add_dead_letter(letter(args=(1, 2, "old extra"), kwargs={}))

    with pytest.raises(
        ArgumentsMismatch,
        match=rf"dead letter {letter_id} of task '{TASK}': its arguments do not fit .*"
        r"args=\(1, 2, 'old extra'\)",
    ):
        requeue(app, letter_id)
    assert store.rows == {}
    assert store.letters[letter_id].status is DeadLetterStatus.DEAD


def test_a_letter_stored_without_its_arguments_is_not_requeued(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    minimal = minimal_letter(letter(), ValueError("refused by the database"))
    letter_id = store.add_dead_letter(minimal)

    with pytest.raises(OutboxError, match="stored without its arguments"):
        requeue(app, letter_id)
    assert store.rows == {}


def test_discard_marks_a_dead_letter_once(app: Celery, store: InMemoryOutboxStore) -> None:
    letter_id = store.add_dead_letter(letter())

    assert discard(app, letter_id) is True
    assert discard(app, letter_id) is False
    stored = store.get_dead_letter(letter_id)
    assert stored is not None
    assert stored.status is DeadLetterStatus.DISCARDED


def test_a_huge_exception_makes_a_bounded_letter_saying_what_was_cut() -> None:
    from datetime import datetime, timezone

    from celery_outbox.dead_letters import LETTER_TEXT_CHARS, build_dead_letter

    now = datetime.now(timezone.utc)
    try:
        raise ValueError("x" * 9_000_000)
    except ValueError as exc:
        letter = build_dead_letter(
            task_name="t",
            task_id="id",
            args=[],
            kwargs={},
            options={},
            exc=exc,
            retries=0,
            first_failed_at=now,
            failed_at=now,
        )
    assert len(letter.exception_message) < LETTER_TEXT_CHARS + 200
    assert "cut 8,934,464 of 9,000,000 characters" in letter.exception_message
    assert len(letter.traceback) < LETTER_TEXT_CHARS + 200
    assert letter.traceback.startswith("Traceback")
