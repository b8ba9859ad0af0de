"""The rows an atomic step published are deleted off the step's path (SQLAlchemy on
PostgreSQL, a real Redis broker): the step's commit publishes its successor and hands the
row's fenced ``DELETE`` to a thread of the process, which deletes it soon after; a delete
that fails leaves the row leased for the sweeper and never raises into the step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import datetime

import pytest

pytest.importorskip("sqlalchemy")

from celery import Celery
from sqlalchemy import Engine, event, select

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.relay.relay import relay_for
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.state import reset
from celery_outbox.store.published import PublishedRows, deferring
from celery_outbox.store.records import Claim, StoredMessage
from tests.brokers import delete_queue, take_task_ids
from tests.contract.factories import LEASE, NOW, new_message
from tests.worker import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def body(n: int) -> None:
    """A task body."""


@pytest.fixture
def app(pg_engine: Engine, redis_url: str, queue_name: str) -> Iterator[Celery]:
    app = Celery("published-rows", broker=redis_url, set_as_current=False)
    app.conf.task_default_queue = queue_name
    app.task(base=OutboxTask, name="pr.next", shared=False)(body)
    install_store(app, SQLAlchemyOutboxStore(engine=pg_engine))
    yield app
    reset(app)
    app.close()
    delete_queue(redis_url, queue_name)


def outbox_ids(store: SQLAlchemyOutboxStore) -> list[str]:
    c = store.tables.outbox.c
    with store.engine.connect() as conn:
        return list(conn.execute(select(c.task_id)).scalars())


def test_a_step_publishes_its_successor_and_a_thread_deletes_the_row(
    app: Celery, pg_engine: Engine, redis_url: str, queue_name: str
) -> None:
    store = relay_for(app).store
    assert isinstance(store, SQLAlchemyOutboxStore)
    deletes: list[int | None] = []

    def record(conn: object, cursor: object, statement: str, *_: object) -> None:
        if statement.lstrip().upper().startswith("DELETE FROM CELERY_OUTBOX_MESSAGE"):
            deletes.append(threading.get_ident())

    event.listen(pg_engine, "before_cursor_execute", record)
    try:
        with store.complete_once("step-1", "step", now=store.now()):
            app.tasks["pr.next"].apply_async((1,), task_id="next-step")
        assert threading.get_ident() not in deletes  # the step never waited for it
        wait_for(lambda: outbox_ids(store) == [], timeout=10, what="the row's delete")
    finally:
        event.remove(pg_engine, "before_cursor_execute", record)
    assert deletes
    assert threading.get_ident() not in deletes
    assert take_task_ids(redis_url, queue_name) == ["next-step"]


def test_rows_of_steps_committed_together_are_deleted_with_one_statement() -> None:
    calls: list[tuple[list[int], list[datetime]]] = []
    lease = datetime(2026, 1, 1, tzinfo=None)
    rows = PublishedRows(lambda ids, leases: calls.append((list(ids), list(leases))))
    rows.defer([1, 2], {1: lease, 2: lease})
    rows.defer([3], {3: lease})
    wait_for(lambda: sum(len(ids) for ids, _ in calls) == 3, timeout=5, what="the deletes")
    assert calls == [([1, 2, 3], [lease])]


def test_a_failed_delete_is_logged_and_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    def fail(ids: object, leases: object) -> None:
        raise RuntimeError("database gone")

    rows = PublishedRows(fail, flush_after=3600)  # the thread waits: flush by hand
    rows.defer([7], {7: datetime(2026, 1, 1)})
    with caplog.at_level(logging.WARNING, logger="celery_outbox.store.published"):
        rows.flush()
    assert "1 published row(s) could not be deleted" in caplog.text
    rows.flush()  # nothing left: the sweeper has them once their lease ends
    assert caplog.text.count("could not be deleted") == 1


def test_only_a_deferring_commit_on_postgresql_hands_its_deletes_over() -> None:
    calls: list[list[int]] = []
    rows = PublishedRows(lambda ids, leases: calls.append(list(ids)), flush_after=3600)
    claim = Claim(messages=(StoredMessage.written(new_message(), 1),), lease_until=NOW + LEASE)
    assert not rows.took(claim, [1], dialect="postgresql")  # not inside deferring()
    with deferring():
        assert not rows.took(claim, [1], dialect="sqlite")  # its writers lock each other
        assert rows.took(claim, [1], dialect="postgresql")
    rows.flush()
    assert calls == [[1]]
