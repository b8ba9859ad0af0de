"""A commit's published rows are deleted off the request's path (PostgreSQL, a real broker).

The on-commit publish hands the rows' fenced ``DELETE`` to a thread of the process
(:mod:`django_outbox.store.transactions`), which deletes the rows of the next commits with
one statement on a connection of its own, and closes that connection once idle. The
request's own connection runs no ``DELETE`` after its COMMIT.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from celery_outbox.store.published import FLUSH_AFTER, IDLE_AFTER
from django_outbox.models import OutboxMessage
from django_outbox.store import transactions as published
from tests.brokers import take_task_ids
from tests.django.conftest import World
from tests.django.helpers import postgres_only
from tests.worker import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]


@pytest.fixture
def flusher_pids(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The backend of each delete the thread runs (read on its connection, then deleted)."""
    pids: list[int] = []
    delete_leased = published.delete_leased

    def recording(ids: Any, leases: Any, *, alias: str) -> int:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pids.append(int(cursor.fetchone()[0]))
        return delete_leased(ids, leases, alias=alias)

    monkeypatch.setattr(published, "delete_leased", recording)
    return pids


def connected(pid: int) -> bool:
    """Whether backend ``pid`` is still connected."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        (count,) = cursor.fetchone()
    return bool(count)


def test_the_request_runs_no_delete_and_a_thread_deletes_the_row_soon(world: World) -> None:
    published.settle()
    with CaptureQueriesContext(connection) as queries:
        with transaction.atomic():
            result = world.record.delay(1)
        after_commit = len(queries)
    statements = [q["sql"].split()[0] for q in queries.captured_queries]
    assert "DELETE" not in statements, statements
    assert after_commit == len(queries)  # the publish after COMMIT ran no statement here
    started = time.monotonic()
    wait_for(
        lambda: not OutboxMessage.objects.filter(task_id=result.id).exists(),
        timeout=5,
        what="the thread to delete the published row",
    )
    assert time.monotonic() - started < FLUSH_AFTER + 2.0


def test_rows_of_commits_close_together_go_in_one_statement(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    published.settle()
    calls: list[int] = []
    delete_leased = published.delete_leased

    def counting(ids: Any, leases: Any, *, alias: str) -> int:
        calls.append(len(ids))
        return delete_leased(ids, leases, alias=alias)

    monkeypatch.setattr(published, "delete_leased", counting)
    ids = []
    for n in range(5):
        with transaction.atomic():
            ids.append(world.record.delay(n).id)
    assert published.settle()
    assert not OutboxMessage.objects.filter(task_id__in=ids).exists()
    assert sum(calls) == 5
    assert len(calls) < 5, calls  # five commits within FLUSH_AFTER of each other


def test_the_thread_closes_its_connection_when_idle_and_settle_at_once(
    world: World, flusher_pids: list[int]
) -> None:
    published.settle()
    with transaction.atomic():
        world.record.delay(1)
    wait_for(lambda: not OutboxMessage.objects.exists(), timeout=5, what="the delete")
    (pid,) = flusher_pids
    assert pid != connection.cursor().connection.info.backend_pid
    assert connected(pid)  # the thread's connection, kept while busy
    wait_for(
        lambda: not connected(pid),
        timeout=IDLE_AFTER + 5,
        what="the idle thread to close its connection",
    )
    with transaction.atomic():
        world.record.delay(2)
    assert published.settle()
    assert not OutboxMessage.objects.exists()
    assert len(flusher_pids) == 2
    # Closed by settle() (its backend leaves pg_stat_activity a moment later).
    wait_for(lambda: not connected(flusher_pids[1]), timeout=5, what="the closed connection")


def test_a_delete_whose_connection_died_is_done_again_on_a_new_one(
    world: World, flusher_pids: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    published.settle()
    with transaction.atomic():
        world.record.delay(1)
    wait_for(lambda: not OutboxMessage.objects.exists(), timeout=5, what="the first delete")
    # The thread's connection dies under it (a restart, a proxy's idle timeout).
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [flusher_pids[0]])
    wait_for(lambda: not connected(flusher_pids[0]), timeout=5, what="the terminated backend")
    with caplog.at_level(logging.INFO, logger="django_outbox.store.transactions"):
        with transaction.atomic():
            world.record.delay(2)
        assert published.settle()
    assert not OutboxMessage.objects.exists()  # no duplicate for the sweeper to send
    assert "again on a new connection" in caplog.text
    assert flusher_pids[-1] != flusher_pids[0]  # a new connection


@pytest.fixture
def dying_deletes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every delete the thread runs finds its connection terminated (a database that
    keeps restarting): a real connection error, each time.
    """
    delete_leased = published.delete_leased

    def on_a_dead_connection(ids: Any, leases: Any, *, alias: str) -> int:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (pid,) = cursor.fetchone()
        with connection.cursor() as cursor:  # the test's own connection ends the thread's
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        wait_for(lambda: not connected(pid), timeout=5, what="the terminated backend")
        return delete_leased(ids, leases, alias=alias)

    monkeypatch.setattr(published, "delete_leased", on_a_dead_connection)


def test_a_delete_that_fails_twice_is_logged_and_leaves_the_row_leased_for_the_sweeper(
    world: World, dying_deletes: None, caplog: pytest.LogCaptureFixture
) -> None:
    published.settle()
    with caplog.at_level(logging.WARNING, logger="celery_outbox.store.published"):
        with transaction.atomic():
            second = world.record.delay(2).id
        wait_for(lambda: "could not be deleted" in caplog.text, timeout=10, what="the failure")
    row = OutboxMessage.objects.get(task_id=second)
    assert row.status == "pending"
    assert row.locked_until is not None  # the sweeper's once its lease ends


def test_a_task_id_dispatched_again_while_its_published_row_waits_is_a_new_call(
    world: World, broker_url: str
) -> None:
    published.settle()
    task_id = f"again-{world.queue}"
    world.record.apply_async((1,), task_id=task_id)  # published; its row's DELETE waits
    # Not swallowed by the idempotency key: that row's message was sent already.
    world.record.apply_async((2,), task_id=task_id)
    assert published.settle()
    assert take_task_ids(broker_url, world.queue) == [task_id, task_id]
    assert not OutboxMessage.objects.exists()


def leased_rows(*leases: Any) -> list[OutboxMessage]:
    """A pending row per lease in ``leases``, leased until it."""
    from celery_outbox.clock import utcnow

    return [
        OutboxMessage.objects.create(
            task_id=f"lease-{n}",
            task_name="shop.ship",
            payload="[[], {}, {}]",
            options={},
            status="pending",
            available_at=utcnow(),
            locked_until=lease,
        )
        for n, lease in enumerate(leases)
    ]


def test_a_claims_delete_binds_one_lease_and_spares_a_row_leased_again(world: World) -> None:
    # A sweep's batch shares its claim's lease: one lease bound, the ids as one array.
    from celery_outbox.clock import utcnow

    lease, again = utcnow() + timedelta(seconds=60), utcnow() + timedelta(seconds=90)
    rows = leased_rows(lease, lease, lease, again)  # the last was claimed again since
    with CaptureQueriesContext(connection) as queries:
        deleted = published.delete_published([(r.id, lease) for r in rows], alias="default")
    assert deleted == 3
    assert list(OutboxMessage.objects.values_list("id", flat=True)) == [rows[3].id]
    (statement,) = [q["sql"] for q in queries.captured_queries if "DELETE" in q["sql"]]
    assert "unnest" not in statement
    assert "locked_until = '" in statement


def test_rows_of_several_leases_are_deleted_each_under_its_own(world: World) -> None:
    from celery_outbox.clock import utcnow

    first, second = utcnow() + timedelta(seconds=60), utcnow() + timedelta(seconds=90)
    rows = leased_rows(first, second, second)
    pairs = [(rows[0].id, first), (rows[1].id, second), (rows[2].id, first)]  # the last: stale
    with CaptureQueriesContext(connection) as queries:
        assert published.delete_published(pairs, alias="default") == 2
    assert list(OutboxMessage.objects.values_list("id", flat=True)) == [rows[2].id]
    assert any("unnest" in q["sql"] for q in queries.captured_queries)
