"""The ORM store's sweeping half on real PostgreSQL: claims, fencing, failures, resets."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

from celery_outbox.store.records import MessageStatus
from django_outbox.models import OutboxMessage
from tests.django.helpers import later, postgres_only

pytestmark = pytest.mark.django_db(transaction=True)

PENDING, PUBLISHED, FAILED = (s.value for s in MessageStatus)


def statuses() -> dict[str, str]:
    """Task id -> status of every row."""
    return dict(OutboxMessage.objects.values_list("task_id", "status"))


def test_claim_leases_pending_due_rows_only(store: Any, message: Any, now: datetime) -> None:
    due = store.add(message("due"))
    future = store.add(message("future", available_at=later(now, 60)))
    failed = store.add(message("failed"))
    OutboxMessage.objects.filter(pk=failed).update(status=FAILED)
    claim = store.claim([due, future, failed, 10**9], now=now, lease_until=later(now, 30))
    assert [m.id for m in claim.messages] == [due]
    assert claim.messages[0].locked_until == later(now, 30)
    assert OutboxMessage.objects.get(pk=due).locked_until == later(now, 30)
    # Leased: nobody else gets it until the lease ends.
    assert store.claim([due], now=now, lease_until=later(now, 30)).messages == ()
    assert len(store.claim([due], now=later(now, 31), lease_until=later(now, 90)).messages) == 1


@pytest.mark.parametrize("count", [1, 100])
def test_claim_statements_do_not_grow_with_the_number_of_rows(
    store: Any, message: Any, now: datetime, count: int
) -> None:
    ids = [store.add(message(f"t{n}")) for n in range(count)]
    with CaptureQueriesContext(connections["default"]) as queries:
        claim = store.claim(ids, now=now, lease_until=later(now, 30))
    assert len(claim.messages) == count
    # PostgreSQL: one WITH claim AS (SELECT ... FOR UPDATE SKIP LOCKED) UPDATE ... RETURNING.
    # Elsewhere: lock ids and sizes, load the rows the byte budget keeps, lease them.
    one = connections["default"].vendor == "postgresql"
    expected = ["WITH"] if one else ["BEGIN", "SELECT", "SELECT", "UPDATE", "COMMIT"]
    assert [q["sql"].split()[0] for q in queries] == expected


def test_claim_due_respects_grace_limit_and_order(store: Any, message: Any, now: datetime) -> None:
    for name, seconds in [("b", -20), ("a", -30), ("c", -10), ("fresh", -1)]:
        row_id = store.add(message(name, available_at=later(now, seconds)))
        OutboxMessage.objects.filter(pk=row_id).update(created_at=later(now, seconds))
    claim = store.claim_due(
        now=now, created_before=later(now, -5), limit=2, lease_until=later(now, 30)
    )
    assert [m.task_id for m in claim.messages] == ["a", "b"]
    rest = store.claim_due(
        now=now, created_before=later(now, -5), limit=10, lease_until=later(now, 30)
    )
    assert [m.task_id for m in rest.messages] == ["c"]


@postgres_only
def test_claim_due_skips_rows_another_transaction_locked(
    store: Any, message: Any, now: datetime
) -> None:
    ids = [store.add(message(f"t{n}", available_at=later(now, -n - 1))) for n in range(3)]
    locked, release = threading.Event(), threading.Event()

    def hold_first_row() -> None:
        try:
            with transaction.atomic():
                list(OutboxMessage.objects.select_for_update().filter(pk=ids[2]))
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_first_row)
    holder.start()
    try:
        assert locked.wait(10)
        claim = store.claim_due(
            now=now, created_before=later(now, 1), limit=10, lease_until=later(now, 30)
        )
    finally:
        release.set()
        holder.join()
    assert sorted(m.id for m in claim.messages) == sorted(ids[:2])


def test_mark_published_deletes_only_rows_still_leased_by_the_claim(
    store: Any, message: Any, now: datetime
) -> None:
    ids = [store.add(message(f"t{n}")) for n in range(3)]
    claim = store.claim(ids, now=now, lease_until=later(now, 30))
    # Row 0's lease expired and another publisher took it.
    OutboxMessage.objects.filter(pk=ids[0]).update(locked_until=later(now, 99))
    with CaptureQueriesContext(connections["default"]) as queries:
        assert store.mark_published(claim, ids, now=now, keep=False) == 2
    assert len(queries) == 1
    assert list(OutboxMessage.objects.values_list("id", flat=True)) == [ids[0]]


@postgres_only
@pytest.mark.parametrize("count", [1, 3])
def test_deleting_published_rows_commits_asynchronously_for_that_statement_only(
    store: Any, message: Any, now: datetime, count: int
) -> None:
    ids = [store.add(message(f"t{n}")) for n in range(count)]
    claim = store.claim(ids, now=now, lease_until=later(now, 30))
    connection = connections["default"]
    with CaptureQueriesContext(connection) as queries:
        assert store.mark_published(claim, ids, now=now, keep=False) == count
    (delete,) = [q["sql"] for q in queries]
    assert "set_config('synchronous_commit', 'off', true)" in delete
    assert not OutboxMessage.objects.filter(pk__in=ids).exists()
    # Transaction-local: the caller's next transaction commits durably.
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone() == ("on",)
    # Inside a caller's transaction the delete is part of it, and so is its commit.
    again = [store.add(message(f"u{n}")) for n in range(count)]
    claim = store.claim(again, now=now, lease_until=later(now, 30))
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        assert store.mark_published(claim, again, now=now, keep=False) == count
    assert [q["sql"] for q in queries if "set_config" in q["sql"]] == []


def test_mark_published_with_keep_marks_rows(store: Any, message: Any, now: datetime) -> None:
    row_id = store.add(message("kept"))
    claim = store.claim([row_id], now=now, lease_until=later(now, 30))
    assert store.mark_published(claim, [row_id], now=now, keep=True) == 1
    row = OutboxMessage.objects.get(pk=row_id)
    assert (row.status, row.published_at, row.locked_until) == (PUBLISHED, now, None)
    # No longer pending: the task id may be dispatched again.
    assert store.add(message("kept")) is not None


def test_record_failure_counts_attempts_in_one_update(
    store: Any, message: Any, now: datetime
) -> None:
    ids = [store.add(message("fresh")), store.add(message("tired"))]
    OutboxMessage.objects.filter(pk=ids[1]).update(attempts=2)  # counted on, not decided on
    claim = store.claim(ids, now=now, lease_until=later(now, 30))
    with CaptureQueriesContext(connections["default"]) as queries:
        changed = store.record_failure(claim, ids, error="boom", retry_at=later(now, 5))
    assert (changed, len(queries)) == (2, 1)
    rows = {r.task_id: r for r in OutboxMessage.objects.all()}
    assert (rows["fresh"].status, rows["fresh"].attempts) == (PENDING, 1)
    assert rows["fresh"].available_at == later(now, 5)
    assert (rows["fresh"].locked_until, rows["fresh"].last_error) == (None, "boom")
    assert (rows["tired"].status, rows["tired"].attempts) == (PENDING, 3)


def test_record_failure_without_retry_fails_rows_and_is_fenced(
    store: Any, message: Any, now: datetime
) -> None:
    ids = [store.add(message("a")), store.add(message("b"))]
    claim = store.claim(ids, now=now, lease_until=later(now, 30))
    OutboxMessage.objects.filter(pk=ids[1]).update(locked_until=None)
    assert store.record_failure(claim, ids, error="bad", retry_at=None) == 1
    assert statuses() == {"a": FAILED, "b": PENDING}


def test_reset_gives_failed_rows_a_fresh_budget(store: Any, message: Any, now: datetime) -> None:
    failed = store.add(message("failed"))
    OutboxMessage.objects.filter(pk=failed).update(
        status=FAILED, attempts=20, available_at=later(now, -60)
    )
    leased = store.add(message("leased", available_at=later(now, 60)))
    OutboxMessage.objects.filter(pk=leased).update(locked_until=later(now, 30))
    published = store.add(message("published"))
    OutboxMessage.objects.filter(pk=published).update(status=PUBLISHED)
    assert store.reset([failed, leased, published], now=now) == 2
    rows = {r.task_id: r for r in OutboxMessage.objects.all()}
    assert (rows["failed"].status, rows["failed"].attempts) == (PENDING, 0)
    assert rows["failed"].available_at == now
    assert (rows["leased"].available_at, rows["leased"].locked_until) == (now, None)
    assert rows["published"].status == PUBLISHED


def test_reset_leaves_a_failed_row_whose_task_id_is_pending_again(
    store: Any, message: Any, now: datetime
) -> None:
    old = store.add(message("same"))
    OutboxMessage.objects.filter(pk=old).update(status=FAILED)
    older = store.add(message("twice"))
    OutboxMessage.objects.filter(pk=older).update(status=FAILED)
    newer = store.add(message("twice"))
    OutboxMessage.objects.filter(pk=newer).update(status=FAILED)
    store.add(message("same"))  # pending again
    assert store.reset([old, older, newer], now=now) == 1
    assert OutboxMessage.objects.get(pk=old).status == FAILED
    assert OutboxMessage.objects.get(pk=older).status == PENDING
    assert OutboxMessage.objects.get(pk=newer).status == FAILED


def test_counts_oldest_and_purge(store: Any, message: Any, now: datetime) -> None:
    assert store.oldest_pending() is None
    ids = [store.add(message(f"t{n}")) for n in range(4)]
    OutboxMessage.objects.filter(pk__in=ids[:3]).update(
        status=PUBLISHED, created_at=later(now, -3600)
    )
    assert store.count_by_status() == {
        MessageStatus.PENDING: 1,
        MessageStatus.PUBLISHED: 3,
        MessageStatus.FAILED: 0,
    }
    assert store.oldest_pending() == OutboxMessage.objects.get(pk=ids[3]).created_at
    purged = store.purge(statuses=[MessageStatus.PUBLISHED], older_than=later(now, -60), limit=2)
    assert purged == 2
    assert store.count_by_status()[MessageStatus.PUBLISHED] == 1
