"""Writing a dead letter: a store that is down puts the message back, one that refuses
the letter as data gets it minimal, and the task never runs again for it."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore, Reject
from kombu import Connection, Queue

from celery_outbox import NoStoreConfigured, StoreDataError, StoreError
from celery_outbox.escaping import is_incomplete
from celery_outbox.registry import install_store
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.worker.letters import write_dead_letter
from celery_outbox.worker.policy import Outcome
from tests.unit.worker.support import attempt_of, queued_ids

NOW = datetime.now(timezone.utc)


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
