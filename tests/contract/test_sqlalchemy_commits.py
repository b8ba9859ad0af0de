"""The SQLAlchemy store knows which rows a commit wrote, and when it cannot know.

In the callbacks of the commit that wrote them, rows born leased need no read to show
they exist (``still_leased`` answers without a statement), unless a savepoint was rolled
back after they were written (session or Core savepoint) or a pending row was deleted in
that transaction: then it reads them back, and the rows that are gone are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, metadata
from celery_outbox.store.records import NewMessage, StoredMessage
from tests.contract.factories import NOW, new_message

GRACE = timedelta(seconds=10)


@pytest.fixture
def store(engine: Engine) -> SQLAlchemyOutboxStore:
    return SQLAlchemyOutboxStore(engine=engine)


class Publisher:
    """A publish callback asking the store, after the commit, which rows it still holds,
    and counting the statements that answer took.
    """

    def __init__(self, store: SQLAlchemyOutboxStore, engine: Engine) -> None:
        self.store, self.engine, self.statements, self.reads = store, engine, 0, -1
        self.held: list[set[int]] = []
        event.listen(engine, "before_cursor_execute", self._count)

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._count)

    def _count(self, *_: Any) -> None:
        self.statements += 1

    def __call__(self, messages: Sequence[StoredMessage]) -> None:
        before = self.statements
        self.held.append(self.store.still_leased(messages))
        self.reads = self.statements - before


def born_leased(**fields: Any) -> NewMessage:
    return replace(new_message(available_at=NOW, **fields), locked_until=NOW + GRACE)


def dispatch(store: SQLAlchemyOutboxStore, publish: Publisher, **fields: Any) -> int:
    message = born_leased(**fields)
    row_id = store.add(message, supersedes=lambda _: True)
    assert row_id is not None
    store.defer_publish(StoredMessage.written(message, row_id), publish)
    return row_id


@pytest.fixture
def publish(store: SQLAlchemyOutboxStore, engine: Engine) -> Iterator[Publisher]:
    publisher = Publisher(store, engine)
    yield publisher
    publisher.close()


def committed(
    publish: Publisher, body: Callable[[Session, Publisher], list[int]]
) -> tuple[Publisher, list[int]]:
    session = Session(publish.engine)
    with session, session.begin(), publish.store.bind_session(session):
        kept = body(session, publish)
    return publish, kept


def test_rows_of_a_clean_commit_are_known_without_a_read(
    store: SQLAlchemyOutboxStore, publish: Publisher
) -> None:
    publish, kept = committed(publish, lambda _, p: [dispatch(store, p) for _ in range(3)])

    assert publish.held == [set(kept)]
    assert publish.reads == 0
    # Outside that commit's callbacks the same question is a read.
    before = publish.statements
    rows = [StoredMessage.written(born_leased(), row_id) for row_id in kept]
    assert store.still_leased(rows) == set(kept)
    assert publish.statements > before


def test_a_session_savepoint_rolled_back_after_a_row_makes_the_commit_read(
    store: SQLAlchemyOutboxStore, publish: Publisher
) -> None:
    def body(session: Session, publish: Publisher) -> list[int]:
        kept = [dispatch(store, publish)]
        savepoint = session.begin_nested()
        dispatch(store, publish)
        savepoint.rollback()
        return kept

    publish, kept = committed(publish, body)

    assert publish.held == [set(kept)]
    assert publish.reads == 1


def test_a_core_savepoint_rolled_back_on_the_sessions_connection_is_seen_too(
    store: SQLAlchemyOutboxStore, publish: Publisher
) -> None:
    def body(session: Session, publish: Publisher) -> list[int]:
        kept = [dispatch(store, publish)]
        savepoint = session.connection().begin_nested()
        dispatch(store, publish)
        savepoint.rollback()
        return kept

    publish, kept = committed(publish, body)

    assert publish.held == [set(kept)]
    assert publish.reads == 1


def test_a_savepoint_rolled_back_by_hand_written_sql_is_seen_too(
    store: SQLAlchemyOutboxStore, publish: Publisher
) -> None:
    def body(session: Session, publish: Publisher) -> list[int]:
        kept = [dispatch(store, publish)]
        session.execute(text("SAVEPOINT by_hand"))
        dispatch(store, publish)
        session.execute(text("  rollback TO SAVEPOINT by_hand"))
        return kept

    publish, kept = committed(publish, body)

    assert publish.held == [set(kept)]
    assert publish.reads == 1


def test_a_savepoint_rolled_back_before_the_first_row_changes_nothing(
    store: SQLAlchemyOutboxStore, publish: Publisher
) -> None:
    def body(session: Session, publish: Publisher) -> list[int]:
        session.begin_nested().rollback()
        released = session.begin_nested()
        rows = [dispatch(store, publish)]
        released.commit()
        return [*rows, dispatch(store, publish)]

    publish, kept = committed(publish, body)

    assert publish.held == [set(kept)]
    assert publish.reads == 0


def test_a_row_superseded_in_its_own_transaction_is_left_out(
    store: SQLAlchemyOutboxStore, publish: Publisher
) -> None:
    def body(session: Session, publish: Publisher) -> list[int]:
        dispatch(store, publish, task_id="reused")
        return [dispatch(store, publish, task_id="reused")]

    publish, kept = committed(publish, body)

    assert publish.held == [set(kept)]
    assert publish.reads == 1


@pytest.mark.postgres
def test_a_session_on_an_engine_the_store_does_not_watch_reads(
    sa_postgresql_engine: Engine,
) -> None:
    store = SQLAlchemyOutboxStore(engine=sa_postgresql_engine)
    other = create_engine(sa_postgresql_engine.url)
    publish = Publisher(store, sa_postgresql_engine)  # the store reads on its own engine
    try:
        with Session(other) as session, session.begin(), store.bind_session(session):
            kept = [dispatch(store, publish)]
        assert publish.held == [set(kept)]
        assert publish.reads == 1
    finally:
        publish.close()
        other.dispose()
        with sa_postgresql_engine.begin() as conn:
            conn.execute(metadata.tables[store.tables.outbox.name].delete())
