"""The ORM store's dispatch half on real PostgreSQL: add, on_commit and defer_publish.

These tests commit for real (``transaction=True``): what matters is what happens at
COMMIT and ROLLBACK, which a test wrapped in a transaction never reaches.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest
from django.db import connections, transaction
from django.db.utils import DataError
from django.test.utils import CaptureQueriesContext

from celery_outbox.exceptions import StoreError
from celery_outbox.store.records import MessageStatus, StoredMessage
from django_outbox.models import OutboxMessage
from django_outbox.store.calls import clock_of
from tests.contract.factories import written
from tests.django.helpers import postgres_only, rolled_back

pytestmark = pytest.mark.django_db(transaction=True)
T = TypeVar("T")


class Publisher:
    """A publish callback recording each call's row ids."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, messages: Sequence[StoredMessage]) -> None:
        self.calls.append([m.id for m in messages])


def in_other_connection(work: Callable[[], T]) -> T:
    """Run ``work`` on another thread, hence another connection: it sees committed rows only."""
    result: list[T] = []

    def run() -> None:
        try:
            result.append(work())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return result[0]


def committed_task_ids() -> list[str]:
    """Task ids of the committed outbox rows."""
    return in_other_connection(
        lambda: sorted(OutboxMessage.objects.values_list("task_id", flat=True))
    )


def test_add_outside_a_transaction_commits_at_once(store: Any, message: Any) -> None:
    row_id = store.add(message("a"))
    assert isinstance(row_id, int)
    assert committed_task_ids() == ["a"]
    assert OutboxMessage.objects.get(pk=row_id).status == MessageStatus.PENDING.value


@postgres_only
def test_add_writes_in_the_callers_transaction(store: Any, message: Any) -> None:
    with transaction.atomic():
        store.add(message("a"))
        assert committed_task_ids() == []
    assert committed_task_ids() == ["a"]


def test_rollback_leaves_no_row(store: Any, message: Any) -> None:
    with rolled_back():
        store.add(message("a"))
    assert committed_task_ids() == []


def test_rolled_back_savepoint_drops_its_row(store: Any, message: Any) -> None:
    with transaction.atomic():
        store.add(message("kept"))
        with rolled_back():
            store.add(message("dropped"))
    assert committed_task_ids() == ["kept"]


def test_same_pending_task_id_writes_nothing_and_keeps_the_transaction(
    store: Any, message: Any
) -> None:
    with transaction.atomic():
        first = store.add(message("same"))
        assert store.add(message("same")) is None
        # The transaction is still usable: the duplicate did not abort it.
        assert OutboxMessage.objects.filter(task_id="same").count() == 1
        store.add(message("other"))
    assert first is not None
    assert committed_task_ids() == ["other", "same"]


def test_duplicate_check_costs_no_extra_statement(store: Any, message: Any) -> None:
    connection = connections["default"]
    clock_of("default")()  # a fresh reading of the database's clock: none inside the block
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        store.add(message("once"))
        store.add(message("once"))
    assert len(queries) == 2, queries.captured_queries  # one upsert each, no savepoint


def test_task_id_no_longer_pending_can_be_dispatched_again(store: Any, message: Any) -> None:
    first = store.add(message("again"))
    OutboxMessage.objects.filter(pk=first).update(status=MessageStatus.FAILED.value)
    second = store.add(message("again"))
    assert second is not None
    assert second != first


@postgres_only
def test_database_error_becomes_store_error_and_rolls_back(store: Any, message: Any) -> None:
    def add_then_fail() -> None:
        with transaction.atomic():
            store.add(message("ok"))
            store.add(message("x", task_name="t" * 300))  # varchar(255)

    with pytest.raises(StoreError) as caught:
        add_then_fail()
    assert isinstance(caught.value.__cause__, DataError)
    assert committed_task_ids() == []


def test_on_commit_runs_after_commit_only(store: Any) -> None:
    calls: list[str] = []
    with transaction.atomic():
        store.on_commit(lambda: calls.append("committed"))
        assert calls == []
    with rolled_back():
        store.on_commit(lambda: calls.append("rolled back"))
    with transaction.atomic(), rolled_back():
        store.on_commit(lambda: calls.append("savepoint rolled back"))
    store.on_commit(lambda: calls.append("outside"))
    assert calls == ["committed", "outside"]


def test_defer_publish_makes_one_batch_per_transaction(store: Any, message: Any) -> None:
    publish = Publisher()
    with transaction.atomic():
        ids = [store.add(message(f"t{n}")) for n in range(3)]
        for row_id in ids:
            store.defer_publish(written(row_id), publish)
        assert publish.calls == []
    assert publish.calls == [ids]


def test_defer_publish_outside_a_transaction_publishes_at_once(store: Any, message: Any) -> None:
    publish = Publisher()
    row_id = store.add(message("now"))
    store.defer_publish(written(row_id), publish)
    assert publish.calls == [[row_id]]


def test_rolled_back_transaction_does_not_swallow_the_next_ones_rows(
    store: Any, message: Any
) -> None:
    publish = Publisher()
    with rolled_back():
        store.defer_publish(written(store.add(message("lost"))), publish)
    with transaction.atomic():
        kept = store.add(message("kept"))
        store.defer_publish(written(kept), publish)
    assert publish.calls == [[kept]]


def test_batch_of_a_rolled_back_savepoint_does_not_swallow_later_rows(
    store: Any, message: Any
) -> None:
    publish = Publisher()
    with transaction.atomic():
        with rolled_back():
            store.defer_publish(written(store.add(message("lost"))), publish)
        kept = store.add(message("kept"))
        store.defer_publish(written(kept), publish)
    assert publish.calls == [[kept]]


def test_rows_of_a_rolled_back_savepoint_join_the_batch_but_cannot_be_claimed(
    store: Any, message: Any, now: Any
) -> None:
    publish = Publisher()
    with transaction.atomic():
        kept = store.add(message("kept"))
        store.defer_publish(written(kept), publish)
        with rolled_back():
            lost = store.add(message("lost"))
            store.defer_publish(written(lost), publish)
    assert publish.calls == [[kept, lost]]
    claim = store.claim(publish.calls[0], now=now, lease_until=now)
    assert [m.id for m in claim.messages] == [kept]


def test_equal_publishers_share_one_batch(store: Any, message: Any) -> None:
    publish = Publisher()
    with transaction.atomic():
        ids = [store.add(message(f"t{n}")) for n in range(2)]
        for row_id in ids:  # the core builds a new partial for every dispatch
            store.defer_publish(written(row_id), functools.partial(publish))
    assert publish.calls == [ids]


def test_a_failing_publisher_stops_no_other_callback(store: Any, message: Any) -> None:
    calls: list[str] = []

    def failing(messages: Sequence[StoredMessage]) -> None:
        raise RuntimeError("broker exploded")

    with transaction.atomic():
        store.defer_publish(written(store.add(message("a"))), failing)
        store.on_commit(lambda: calls.append("after"))
    assert calls == ["after"]


def test_each_alias_outside_its_atomic_block_publishes_at_once(store: Any, message: Any) -> None:
    # ``using`` picks the connection whose transaction counts; "default" here.
    publish = Publisher()
    with transaction.atomic(using="default"):
        row_id = store.add(message("a"), using="default")
        store.defer_publish(written(row_id), publish, using=None)
        assert publish.calls == []
    assert publish.calls == [[row_id]]
