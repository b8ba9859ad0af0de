"""Batched inserts (``transaction_token``, ``add_many``): one statement for a batch, the same
rows and ids as one ``add`` per message, all or nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from celery_outbox.exceptions import StoreError
from tests.contract.factories import new_message, rolled_back
from tests.contract.harness import DjangoHarness, Harness, MemoryHarness, SQLAlchemyHarness


@contextmanager
def outbox_inserts(h: Harness) -> Iterator[list[str]]:
    """The ``INSERT`` statements into the outbox table run inside the block."""
    seen: list[str] = []
    if isinstance(h, DjangoHarness):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as captured:
            yield seen
        seen += [q["sql"] for q in captured.captured_queries]
    elif isinstance(h, SQLAlchemyHarness):
        from sqlalchemy import event

        def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
            seen.append(statement)

        event.listen(h.engine, "before_cursor_execute", before)
        try:
            yield seen
        finally:
            event.remove(h.engine, "before_cursor_execute", before)
    else:
        yield seen
    seen[:] = [s for s in seen if s.lstrip().upper().startswith("INSERT") and "outbox" in s]


def one_statement(h: Harness) -> bool:
    """Whether this store writes a batch in one statement (not the memory store, MySQL)."""
    if isinstance(h, MemoryHarness):
        return False
    if isinstance(h, SQLAlchemyHarness):
        return bool(h.engine.dialect.name in ("postgresql", "sqlite"))
    from django.db import connection

    return bool(connection.vendor in ("postgresql", "sqlite"))


def test_a_batch_of_100_is_one_insert_with_the_ids_one_add_each_would_get(harness: Harness) -> None:
    h = harness
    messages = [new_message() for _ in range(100)]
    with h.transaction(), outbox_inserts(h) as inserts:
        ids = h.store.add_many(messages)
    if one_statement(h):
        assert len(inserts) == 1, inserts
    assert all(isinstance(i, int) for i in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == 100
    stored = {row.id: row for row in h.rows()}
    for row_id, message in zip(ids, messages, strict=True):
        row = stored[row_id]
        assert (row.task_id, row.task_name, row.payload) == (
            message.task_id,
            message.task_name,
            message.payload,
        )
        assert dict(row.options) == dict(message.options)
        assert (row.available_at, row.locked_until) == (message.available_at, None)


def test_pending_and_repeated_task_ids_get_none_as_with_add(harness: Harness) -> None:
    h = harness
    pending = h.store.add(new_message(task_id="pending"))
    batch = [
        new_message(task_id="new"),
        new_message(task_id="pending"),
        new_message(task_id="new"),
        new_message(task_id="other"),
    ]
    with h.transaction():
        ids = h.store.add_many(batch)
    assert ids[1] is None
    assert ids[2] is None
    assert isinstance(ids[0], int)
    assert isinstance(ids[3], int)
    rows = {(row.task_id, row.id) for row in h.rows()}
    assert rows == {("pending", pending), ("new", ids[0]), ("other", ids[3])}
    first_new = next(row for row in h.rows() if row.task_id == "new")
    assert first_new.payload == batch[0].payload  # the first dispatch of an id wins


def test_a_rolled_back_batch_leaves_nothing(harness: Harness) -> None:
    h = harness
    with rolled_back(h.transaction):
        assert None not in h.store.add_many([new_message() for _ in range(10)])
    assert h.rows() == []


def test_a_failed_batch_writes_no_row(harness: Harness) -> None:
    h = harness
    if isinstance(h, MemoryHarness):
        pytest.skip("the memory store has no NOT NULL columns")
    good = [new_message() for _ in range(5)]
    bad = dataclasses.replace(new_message(), task_name=None)  # type: ignore[arg-type]
    with pytest.raises(StoreError), h.transaction():
        h.store.add_many([*good, bad])
    assert h.rows() == []


def test_transaction_tokens_tell_transactions_and_savepoints_apart(harness: Harness) -> None:
    h = harness
    assert h.store.transaction_token() is None
    with h.transaction():
        outer = h.store.transaction_token()
        assert outer is not None
        assert h.store.transaction_token() == outer
        with h.savepoint():
            inner = h.store.transaction_token()
            assert inner is not None
            assert inner != outer
        assert h.store.transaction_token() == outer
    assert h.store.transaction_token() is None
