"""Batched dispatch through the Django store: ``group(...)`` and ``batched_dispatch()`` write
their rows with one ``INSERT``, the rows a one-by-one dispatch writes, and workers run every
task. On PostgreSQL (with a real worker) and SQLite (``OUTBOX_TEST_DJANGO_DB=sqlite``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import group
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from celery_outbox import BatchWriteError, PayloadError, batched_dispatch
from celery_outbox.store.records import OUTBOX_TABLE
from django_outbox.models import OutboxMessage
from tests.django.conftest import World
from tests.django.helpers import postgres_only, rolled_back

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def outbox_inserts() -> Iterator[list[str]]:
    """The ``INSERT`` statements into the outbox table run inside the block."""
    found: list[str] = []
    with CaptureQueriesContext(connection) as captured:
        yield found
    found += [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].startswith(f'INSERT INTO "{OUTBOX_TABLE}"')
    ]


def rows() -> list[OutboxMessage]:
    return list(OutboxMessage.objects.order_by("id"))


def drain(world: World, *, expected_before: int) -> list[dict[str, Any]]:
    """Dispatch a sentinel and wait for it; return the runs before it."""
    sentinel = world.record.delay(None)
    runs = world.wait_for_runs(expected_before + 1, timeout=60)
    assert runs[-1]["task_id"] == sentinel.id, runs
    return runs[:-1]


@postgres_only
def test_a_group_of_100_is_one_insert_and_the_worker_runs_every_task(
    world: World, start_worker: Callable[..., Any]
) -> None:
    start_worker()
    with transaction.atomic(), outbox_inserts() as inserts:
        result = group([world.record.s(None) for _ in range(100)]).apply_async()
        written = rows()
    assert len(inserts) == 1, inserts
    ids = [child.id for child in result.results]
    assert [row.task_id for row in written] == ids  # in member order, ascending row ids
    runs = drain(world, expected_before=100)
    assert sorted(run["task_id"] for run in runs) == sorted(ids)
    assert not OutboxMessage.objects.exists()


def test_group_rows_are_the_rows_of_one_by_one_dispatch(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    def dispatch() -> list[tuple[Any, ...]]:
        members = [world.record.s(n).set(task_id=f"member-{n}") for n in range(20)]
        with transaction.atomic():
            group(members).apply_async(task_id="the-group")
            found = [(r.task_id, r.task_name, r.payload, r.options, r.status) for r in rows()]
            transaction.set_rollback(True)
        return found

    batched = dispatch()
    monkeypatch.setattr("celery_outbox.task.current_batch", lambda: None)  # one by one
    with outbox_inserts() as inserts:
        one_by_one = dispatch()
    assert len(inserts) == 20
    assert batched == one_by_one
    assert [row[0] for row in batched] == [f"member-{n}" for n in range(20)]


def test_a_rolled_back_group_leaves_nothing(world: World) -> None:
    with rolled_back():
        group([world.record.s(n) for n in range(10)]).apply_async()
    assert rows() == []
    with transaction.atomic():
        with rolled_back():  # a savepoint
            group([world.record.s(n) for n in range(10)]).apply_async()
        kept = world.record.delay(1)
        assert [row.task_id for row in rows()] == [kept.id]


def test_batched_dispatch_raises_at_the_call_and_writes_the_others_at_exit(world: World) -> None:
    with transaction.atomic():
        with outbox_inserts() as inserts, batched_dispatch(app=world.app):
            first = world.record.delay(1)
            with pytest.raises(PayloadError):
                world.record.delay(object())
            second = world.record.delay(2)
            assert rows() == []  # written at the block's exit
        assert len(inserts) == 1
        assert [row.task_id for row in rows()] == [first.id, second.id]


def test_a_repeated_task_id_in_a_batch_writes_one_row(world: World) -> None:
    with transaction.atomic():
        with batched_dispatch(app=world.app):
            world.record.apply_async((1,), task_id="same")
            world.record.apply_async((2,), task_id="same")
        (row,) = rows()
    assert row.task_id == "same"
    assert row.payload.startswith("[[1]")


def test_outside_a_transaction_each_dispatch_is_written_at_its_call(world: World) -> None:
    with batched_dispatch(app=world.app):
        with outbox_inserts() as inserts:
            world.record.delay(1)
        assert len(inserts) == 1  # written (and published) before delay returned
        with outbox_inserts() as inserts:
            group([world.record.s(n) for n in range(3)]).apply_async()
        assert len(inserts) == 3


def test_a_savepoint_opened_inside_the_block_is_written_at_its_call(world: World) -> None:
    with transaction.atomic():
        with batched_dispatch(app=world.app):
            outer = world.record.delay(1)
            with transaction.atomic():
                inner = world.record.delay(2)
                assert [row.task_id for row in rows()] == [inner.id]
            with rolled_back():
                world.record.delay(3)
        assert [row.task_id for row in rows()] == [inner.id, outer.id]


def dispatch_two(world: World) -> None:
    """Two dispatches in a batch of their own transaction; the second's id is ``boom``."""
    with transaction.atomic(), batched_dispatch(app=world.app):
        world.record.delay(1)
        world.record.apply_async((2,), task_id="boom")  # accepted at the call


@postgres_only
def test_a_failed_insert_at_exit_names_the_tasks_and_writes_none(world: World) -> None:
    check = (
        f"ALTER TABLE {OUTBOX_TABLE} ADD CONSTRAINT batch_test_no_boom CHECK (task_id <> 'boom')"
    )
    with connection.cursor() as cursor:
        cursor.execute(check)
    try:
        with pytest.raises(BatchWriteError, match=r"boom") as raised:
            dispatch_two(world)
        assert "2 batched dispatches" in str(raised.value)
        assert rows() == []
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {OUTBOX_TABLE} DROP CONSTRAINT batch_test_no_boom")
