"""The one row mapping (:mod:`celery_outbox.store.records`) every store uses."""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import datetime, timezone
from types import SimpleNamespace

from celery_outbox.store.records import (
    LETTER_COLUMNS,
    MESSAGE_COLUMNS,
    DeadLetterStatus,
    MessageStatus,
    NewDeadLetter,
    NewMessage,
    StoredDeadLetter,
    StoredMessage,
    letter_columns,
    message_columns,
    stored_letter,
    stored_message,
)

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)


def test_a_message_round_trips_through_its_columns_as_a_mapping_or_an_object() -> None:
    new = NewMessage(
        task_id="t",
        task_name="n",
        payload="[]",
        options={"headers": {"a": 1}},
        available_at=NOW,
        locked_until=NOW,
    )
    columns = {**message_columns(new, created_at=NOW), "id": 7}

    assert set(columns) == set(MESSAGE_COLUMNS) == {f.name for f in fields(StoredMessage)}
    assert columns["status"] == "pending"
    stored = stored_message(columns)
    assert stored == replace(StoredMessage.written(new, 7), created_at=NOW)
    assert stored.status is MessageStatus.PENDING
    assert stored_message(SimpleNamespace(**columns)) == stored


def test_a_dead_letter_round_trips_through_its_columns() -> None:
    new = NewDeadLetter(
        task_id="t",
        task_name="n",
        args=(1, 2),  # type: ignore[arg-type]
        kwargs={"k": 1},
        options={"queue": "q"},
        exception_type="builtins.ValueError",
        exception_message="boom",
        traceback="tb",
        retries=3,
        first_failed_at=NOW,
        failed_at=NOW,
    )
    columns = {**letter_columns(new), "id": 3}

    assert set(columns) == set(LETTER_COLUMNS) == {f.name for f in fields(StoredDeadLetter)}
    letter = stored_letter(columns)
    assert letter.args == [1, 2]
    assert letter.status is DeadLetterStatus.DEAD
    assert (letter.requeued_at, letter.requeued_by, letter.requeued_task_id) == (None, "", "")
    assert stored_letter(SimpleNamespace(**columns)) == letter
