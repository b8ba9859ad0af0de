"""Writing a dead letter: a store that is down puts the message back, one that refuses
the letter as data gets it minimal, and the task never runs again for it. A letter is
bounded before it is written, and what the worker logs of it too (issue 43).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore, Reject
from kombu import Connection, Queue

from celery_outbox import NoStoreConfigured, StoreDataError, StoreError
from celery_outbox.dead_letters import ARGUMENTS_KEY, ORIGINAL_KEY, is_incomplete
from celery_outbox.long_text import LOG_LINE_CHARS, LOG_TRACE_CHARS
from celery_outbox.registry import install_store
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.worker.letters import write_dead_letter
from celery_outbox.worker.policy import Outcome
from tests.unit.worker.support import attempt_of, queued_ids, queued_messages

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


def test_arguments_over_the_payload_limit_are_left_out_of_the_letter(
    app: Celery, queue_name: str
) -> None:
    app.conf.outbox_max_payload_bytes = 100_000
    store = InMemoryOutboxStore()
    install_store(app, store)
    attempt = replace(attempt_of("t8", queue_name), args=("y" * 200_000,), kwargs={"n": 1})
    letter_id = write_dead_letter(
        app.tasks["unit.retrying"], attempt, ValueError("boom"), outcome=Outcome.EXHAUSTED, now=NOW
    )
    assert letter_id is not None
    stored = store.get_dead_letter(letter_id)
    assert stored is not None
    assert (stored.args, stored.kwargs, stored.exception_message) == ([], {}, "boom")
    assert is_incomplete(stored.options)  # never requeued without its arguments
    original = stored.options[ORIGINAL_KEY]
    assert "above outbox_max_payload_bytes=100,000" in original["incomplete"]
    assert original[ARGUMENTS_KEY].startswith('[["yyy')
    assert '"n": 1}] [celery-outbox cut' in original[ARGUMENTS_KEY]
    assert queued_ids(queue_name) == []


def write_while_handling(app: Celery, attempt: Any, exc: Exception) -> int | None:
    """``write_dead_letter`` while ``exc`` is being handled, as the worker calls it."""
    try:
        raise exc
    except Exception as handled:
        return write_dead_letter(
            app.tasks["unit.retrying"], attempt, handled, outcome=Outcome.EXHAUSTED, now=NOW
        )


def test_a_huge_failure_with_the_store_down_logs_bounded_lines(
    app: Celery, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The worker logs the store's error while handling the task's own, which Python chains
    # into the traceback: 9 MB on every put-back before.
    install_store(app, BrokenStore())
    attempt = replace(attempt_of("t9", queue_name), args=("z" * 100_000,))
    with pytest.raises(Ignore):
        write_while_handling(app, attempt, ValueError("x" * 9_000_000))
    handler = caplog.handler
    lines = "\n".join(handler.format(record) for record in caplog.records)
    assert "could not write the dead letter" in lines
    assert "put back until" in lines
    assert len(lines) < 2 * (LOG_TRACE_CHARS + LOG_LINE_CHARS)
    assert max(len(line) for line in lines.splitlines()) < LOG_LINE_CHARS + 200
    (message,) = queued_messages(queue_name)  # the letter it carries is bounded too
    assert len(message.headers["outbox_pending_letter"]) < 20_000
