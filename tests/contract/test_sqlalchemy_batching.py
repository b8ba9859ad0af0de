"""Batched dispatch through the SQLAlchemy store, on SQLite and PostgreSQL: a ``group(...)``
of ``OutboxTask`` signatures in a bound session writes its rows with one ``INSERT``, in
member order, in the session's transaction; the broker gets every message on commit.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")

from celery import Celery, group
from sqlalchemy import Engine, event, select, text
from sqlalchemy.orm import Session

from celery_outbox import BatchWriteError, OutboxTask, StoreError, batched_dispatch
from celery_outbox.registry import install_store
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, outbox_table
from celery_outbox.state import reset
from tests.unit.worker.support import queued_ids


def body(*args: Any) -> None:
    """A task body."""


@pytest.fixture
def app(engine: Engine, queue_name: str) -> Iterator[Celery]:
    app = Celery("sa-batching", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = queue_name
    app.task(base=OutboxTask, name="sab.t", shared=False)(body)
    install_store(app, SQLAlchemyOutboxStore(engine=engine))
    yield app
    reset(app)
    app.close()


def outbox_inserts(engine: Engine) -> tuple[list[str], Any]:
    seen: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO CELERY_OUTBOX_MESSAGE"):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", before)
    return seen, lambda: event.remove(engine, "before_cursor_execute", before)


def task_ids(session: Session) -> list[str]:
    table = outbox_table
    return list(session.execute(select(table.c.task_id).order_by(table.c.id)).scalars())


def test_a_group_of_100_is_one_insert_and_every_message_is_sent_on_commit(
    app: Celery, engine: Engine, queue_name: str
) -> None:
    t = app.tasks["sab.t"]
    seen, stop = outbox_inserts(engine)
    try:
        with Session(engine) as session, session.begin(), _bind(app, session):
            result = group([t.s(n) for n in range(100)]).apply_async()
            ids = [child.id for child in result.results]
            assert task_ids(session) == ids  # in member order
    finally:
        stop()
    assert len(seen) == 1, seen
    assert sorted(queued_ids(queue_name)) == sorted(ids)


def test_a_rolled_back_batch_leaves_nothing(app: Celery, engine: Engine, queue_name: str) -> None:
    t = app.tasks["sab.t"]
    with Session(engine) as session:
        with session.begin(), _bind(app, session), batched_dispatch(app=app):
            kept = [t.delay(n).id for n in range(10)]
        session.begin()
        with _bind(app, session):
            with batched_dispatch(app=app):
                t.delay(99)
            assert len(task_ids(session)) == 1
        session.rollback()
        assert task_ids(session) == []
    assert sorted(queued_ids(queue_name)) == sorted(kept)


def test_a_batch_whose_connection_died_raises_a_store_error_as_one_dispatch_does(
    app: Celery, engine: Engine, queue_name: str
) -> None:
    """A caller that catches ``StoreError`` around its transaction (an outage) catches a
    failed batch too: ``BatchWriteError`` is a ``StoreError`` naming the tasks.
    """
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite has no server connection to end")
    t = app.tasks["sab.t"]

    def dispatch_then_lose_the_connection(session: Session) -> None:
        with session.begin(), _bind(app, session), batched_dispatch(app=app):
            for n in range(3):
                t.apply_async((n,), task_id=f"gone-{n}")
            pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
            with engine.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

    with Session(engine) as session, pytest.raises(StoreError) as raised:
        dispatch_then_lose_the_connection(session)
    assert isinstance(raised.value, BatchWriteError)
    assert "sab.t[gone-0]" in str(raised.value)
    assert queued_ids(queue_name) == []


def _bind(app: Celery, session: Session) -> Any:
    from celery_outbox.registry import store_for

    store = store_for(app)
    assert isinstance(store, SQLAlchemyOutboxStore)
    return store.bind_session(session)
