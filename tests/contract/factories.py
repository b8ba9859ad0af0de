"""Builders of the records the contract tests write, and small helpers around them."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_outbox.store.records import NewDeadLetter, NewMessage, StoredMessage

#: A fixed "now" far from the wall clock, so due times never depend on when tests run.
#: ``created_at`` comes from the store's own clock (the wall clock), hence ``FAR_FUTURE``.
NOW = datetime(2031, 6, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
FAR_FUTURE = datetime(2100, 1, 1, tzinfo=timezone.utc)
LEASE = timedelta(seconds=60)

_counter = itertools.count()


def new_message(
    *,
    task_id: str | None = None,
    available_at: datetime = NOW,
    task_name: str = "tests.contract.task",
) -> NewMessage:
    """A message with a unique task id (unless given), due at ``available_at``."""
    n = next(_counter)
    return NewMessage(
        task_id=task_id or f"task-{uuid.uuid4()}",
        task_name=task_name,
        payload=f'[[{n}], {{"k": "vé"}}, {{}}]',
        options={
            "routing_key": "celery",
            "headers": {"retries": 0, "n": n},
            "content_type": "application/json",
            "content_encoding": "utf-8",
        },
        available_at=available_at,
    )


def new_dead_letter(**overrides: Any) -> NewDeadLetter:
    """A dead letter of a task that raised ``ValueError`` after three retries."""
    values: dict[str, Any] = {
        "task_id": f"task-{uuid.uuid4()}",
        "task_name": "tests.contract.flaky",
        "args": [1, "two", {"three": 3}],
        "kwargs": {"order_id": 7, "note": "ünïcode"},
        "options": {"queue": "default", "headers": {"x": 1}},
        "exception_type": "builtins.ValueError",
        "exception_message": "boom",
        "traceback": "Traceback (most recent call last):\n  ...\nValueError: boom\n",
        "retries": 3,
        "first_failed_at": NOW - timedelta(minutes=5),
        "failed_at": NOW,
    }
    values.update(overrides)
    return NewDeadLetter(**values)


def written(row_id: int | None, message: NewMessage | None = None) -> StoredMessage:
    """The record of a row a store wrote as ``row_id`` (for ``defer_publish``)."""
    assert row_id is not None
    return StoredMessage.written(message or new_message(), row_id)


class Rollback(Exception):
    """Raised at the end of a block to roll its transaction back."""


@contextmanager
def rolled_back(block: Callable[[], AbstractContextManager[None]]) -> Iterator[None]:
    """Run the body inside ``block()`` and roll it back at the end."""
    try:
        with block():
            yield
            raise Rollback
    except Rollback:
        pass


class Calls:
    """A callback that records every call, for on-commit tests."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(
            tuple(tuple(_ids(a)) if isinstance(a, (list, tuple)) else a for a in args)
        )


def _ids(values: Any) -> list[Any]:
    # A publisher receives stored messages: record their ids.
    return [v.id if isinstance(v, StoredMessage) else v for v in values]
