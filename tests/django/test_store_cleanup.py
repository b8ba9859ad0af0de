"""The on-commit publisher's removal of published rows runs off the caller's thread
(PostgreSQL), and nowhere else: the sweeper, publish-now and a caller inside a
transaction remove them in their own statement, as before."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

from celery_outbox.exceptions import StoreError
from celery_outbox.records import Claim, MessageStatus, StoredMessage
from django_outbox.models import OutboxMessage
from django_outbox.store import cleanup, commits
from tests.contract.factories import new_message
from tests.django.helpers import postgres_only

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "other"]),
    postgres_only,
]


class Remover:
    """An on-commit publish callback that 'publishes' the rows and removes them, as the
    relay does, counting the statements the removal ran on the caller's connection."""

    def __init__(self, store: Any, *, keep: bool = False, using: str = "default") -> None:
        self.store, self.keep, self.using = store, keep, using
        self.statements: list[int] = []

    def __call__(self, messages: Sequence[StoredMessage]) -> None:
        claim = Claim(messages=tuple(messages), lease_until=max(lease(m) for m in messages))
        with CaptureQueriesContext(connections[self.using]) as queries:
            self.store.mark_published(
                claim, [m.id for m in messages], now=now(), keep=self.keep, using=self.using
            )
        self.statements.append(len(queries))


def now() -> datetime:
    return datetime.now(timezone.utc)


def lease(message: StoredMessage) -> datetime:
    assert message.locked_until is not None
    return message.locked_until


def dispatch(store: Any, publish: Any, *, using: str = "default") -> int:
    message = replace(new_message(available_at=now()), locked_until=now() + timedelta(hours=1))
    row_id = store.add(message, using=using)
    assert row_id is not None
    store.defer_publish(StoredMessage.written(message, row_id), publish, using=using)
    return row_id


def rows(using: str = "default") -> dict[int, str]:
    """Committed rows and their status, read on another thread (another connection)."""
    found: dict[int, str] = {}

    def read() -> None:
        try:
            found.update(OutboxMessage.objects.using(using).values_list("id", "status"))
        finally:
            connections.close_all()

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    return found


@pytest.fixture(autouse=True)
def flushed() -> Iterator[None]:
    yield
    assert cleanup.flush(10)


def test_the_on_commit_removal_runs_no_statement_on_the_callers_connection(store: Any) -> None:
    remover = Remover(store)
    with transaction.atomic():
        written = [dispatch(store, remover) for _ in range(3)]
    assert remover.statements == [0]
    assert cleanup.flush(10)
    assert not set(rows()) & set(written)


def test_outside_a_transaction_the_removal_also_leaves_the_callers_thread(store: Any) -> None:
    remover = Remover(store)
    written = dispatch(store, remover)
    assert remover.statements == [0]
    assert cleanup.flush(10)
    assert written not in rows()


def test_kept_rows_are_marked_published_off_the_callers_thread(store: Any) -> None:
    remover = Remover(store, keep=True)
    with transaction.atomic():
        written = dispatch(store, remover)
    assert remover.statements == [0]
    assert cleanup.flush(10)
    assert rows()[written] == MessageStatus.PUBLISHED.value


def test_each_database_is_cleaned_on_its_own_connection(store: Any) -> None:
    on_default, on_other = Remover(store), Remover(store, using="other")
    with transaction.atomic(using="default"), transaction.atomic(using="other"):
        first = dispatch(store, on_default)
        second = dispatch(store, on_other, using="other")
    assert on_default.statements == on_other.statements == [0]
    assert cleanup.flush(10)
    assert first not in rows()
    assert second not in rows("other")


def test_a_sweep_or_publish_now_removes_its_rows_itself(store: Any) -> None:
    written = store.add(new_message(available_at=now() - timedelta(seconds=1)))
    claim = store.claim([written], now=now(), lease_until=now() + timedelta(minutes=1))
    with CaptureQueriesContext(connections["default"]) as queries:
        assert store.mark_published(claim, [written], now=now(), keep=False) == 1
    assert len(queries) == 1
    assert written not in rows()


def test_inside_a_transaction_the_publisher_removes_its_rows_in_it(store: Any) -> None:
    # As under captureOnCommitCallbacks(execute=True): another connection could not see them.
    written = store.add(new_message(available_at=now() - timedelta(seconds=1)))
    claim = store.claim([written], now=now(), lease_until=now() + timedelta(minutes=1))
    with transaction.atomic(), commits.after_commit("default"):
        with CaptureQueriesContext(connections["default"]) as queries:
            store.mark_published(claim, [written], now=now(), keep=False)
        assert len(queries) == 1
    assert written not in rows()


def test_too_many_waiting_removals_make_the_caller_remove_its_rows(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cleanup, "MAX_WAITING", 0)
    remover = Remover(store)
    with transaction.atomic():
        written = dispatch(store, remover)
    assert remover.statements == [1]
    assert written not in rows()


def test_a_published_row_waiting_for_its_removal_is_no_sweepers(store: Any) -> None:
    # The gap between publish and removal: the row's birth lease keeps sweepers off it.
    held: list[Sequence[StoredMessage]] = []
    with transaction.atomic():
        written = dispatch(store, held.append)
    later = now() + timedelta(minutes=5)
    claim = store.claim_due(now=later, created_before=later, limit=10, lease_until=later)
    assert written not in [m.id for m in claim.messages]


def test_a_failing_removal_is_retried_once_then_logged_and_later_ones_still_run(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[int, ...]] = []

    def failing(claim: Claim, ids: tuple[int, ...], **_: Any) -> int:
        calls.append(ids)
        raise StoreError("database gone")

    claim = Claim(messages=(), lease_until=now())
    doomed = cleanup.Removal(
        claim=claim, ids=(1,), now=now(), keep=False, alias="default", mark=failing
    )
    assert cleanup.submit(doomed)
    assert cleanup.flush(10)
    assert calls == [(1,), (1,)]
    assert "removing 1 published row(s) failed" in caplog.text
    remover = Remover(store)
    with transaction.atomic():
        written = dispatch(store, remover)
    assert cleanup.flush(10)
    assert written not in rows()


def test_removals_that_waited_together_are_one_per_database_keep_and_store() -> None:
    def mark(*_: Any, **__: Any) -> None: ...

    def other_mark(*_: Any, **__: Any) -> None: ...

    def message(row_id: int, until: datetime) -> StoredMessage:
        return StoredMessage.written(replace(new_message(), locked_until=until), row_id)

    t0 = now()
    first = Claim(messages=(message(1, t0), message(2, t0)), lease_until=t0)
    second = Claim(messages=(message(3, t0 + timedelta(seconds=1)),), lease_until=t0)

    def removal(claim: Claim, ids: tuple[int, ...], **fields: Any) -> cleanup.Removal:
        given: dict[str, Any] = {"now": t0, "keep": False, "alias": "default", "mark": mark}
        return cleanup.Removal(claim=claim, ids=ids, **{**given, **fields})

    done = cleanup.merged(
        [
            removal(first, (1,)),
            removal(second, (3,), now=t0 + timedelta(seconds=2)),
            removal(first, (2,), alias="other"),
            removal(first, (2,), keep=True),
            removal(first, (2,), mark=other_mark),
        ]
    )

    assert len(done) == 4
    merged = done[0]
    assert merged.ids == (1, 3)
    # Each row keeps its own lease (its fence), and only the rows named are removed.
    assert [(m.id, m.locked_until) for m in merged.claim.messages] == [
        (1, t0),
        (3, t0 + timedelta(seconds=1)),
    ]
    assert merged.now == t0 + timedelta(seconds=2)
    assert [r.ids for r in done[1:]] == [(2,), (2,), (2,)]


def test_a_forked_child_starts_with_no_removals_of_its_parent() -> None:
    parent = cleanup._cleanup
    pid = os.fork()
    if pid == 0:  # the child: a new, empty cleanup
        os._exit(0 if cleanup._cleanup is not parent and cleanup.flush(0) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_removals_waiting_while_the_thread_works_run_as_one(store: Any) -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[tuple[int, ...]] = []

    def slow(claim: Claim, ids: tuple[int, ...], **_: Any) -> None:
        started.set()
        release.wait(10)

    def record(claim: Claim, ids: tuple[int, ...], **fields: Any) -> object:
        calls.append(ids)
        return store._mark(claim, ids, **fields)

    empty = Claim(messages=(), lease_until=now())
    busy = cleanup.Removal(claim=empty, ids=(), now=now(), keep=False, alias="default", mark=slow)
    assert cleanup.submit(busy)
    assert started.wait(10)
    written = []
    for _ in range(2):
        held: list[Sequence[StoredMessage]] = []
        with transaction.atomic():
            written.append(dispatch(store, held.append))
        claim = Claim(messages=tuple(held[0]), lease_until=now())
        removal = cleanup.Removal(
            claim=claim, ids=(written[-1],), now=now(), keep=False, alias="default", mark=record
        )
        assert cleanup.submit(removal)
    release.set()
    assert cleanup.flush(10)
    assert calls == [tuple(written)]
    assert not set(rows()) & set(written)


def backends() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        (count,) = cursor.fetchone()
    return int(count)


def test_closing_waits_for_the_removals_and_closes_the_threads_connections(store: Any) -> None:
    assert cleanup.close(10)
    before = backends()
    remover = Remover(store)
    with transaction.atomic():
        written = dispatch(store, remover)
    assert cleanup.flush(10)
    assert backends() == before + 1  # the thread's own connection
    assert cleanup.close(10)
    assert written not in rows()
    assert backends() == before
    with transaction.atomic():
        again = dispatch(store, remover)  # a closed thread connection opens again
    assert cleanup.flush(10)
    assert again not in rows()
