"""What only the SQLAlchemy store has: session binding, SKIP LOCKED, types, errors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")

from sqlalchemy import Engine, MetaData, String, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

from celery_outbox.exceptions import StoreError
from celery_outbox.sqlalchemy import (
    PENDING_TASK_INDEX,
    SQLAlchemyOutboxStore,
    define_tables,
    metadata,
    outbox_table,
)
from celery_outbox.store.records import MessageStatus
from tests.contract.factories import FAR_FUTURE, LEASE, NOW, Calls, new_message, written


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "contract_order"
    id: Mapped[int] = mapped_column(primary_key=True)
    note: Mapped[str] = mapped_column(String(50))


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    made: Engine = request.getfixturevalue(f"sa_{request.param}_engine")
    Base.metadata.create_all(made)
    yield made
    with made.begin() as conn:
        for table in (*metadata.sorted_tables, *Base.metadata.sorted_tables):
            conn.execute(table.delete())


@pytest.fixture
def store(engine: Engine) -> SQLAlchemyOutboxStore:
    return SQLAlchemyOutboxStore(engine=engine)


def pending(store: SQLAlchemyOutboxStore) -> int:
    return store.count_by_status()[MessageStatus.PENDING]


def test_rows_join_the_session_transaction_with_the_orm_objects(
    store: SQLAlchemyOutboxStore, engine: Engine
) -> None:
    publish = Calls()
    with Session(engine) as session, store.bind_session(session):
        session.add(Order(id=1, note="first"))
        session.flush()
        row_id = store.add(new_message())
        assert row_id is not None
        store.defer_publish(written(row_id), publish)
        session.add(Order(id=2, note="second"))
        session.flush()  # a flush's internal subtransaction must not disturb the batch
        assert pending(store) == 0  # not committed yet: other connections do not see it
        session.commit()
        assert publish.calls == [((row_id,),)]

        # The same session, a new transaction (autobegun by add): a new batch.
        second = store.add(new_message())
        assert second is not None
        store.defer_publish(written(second), publish)
        session.rollback()
    assert publish.calls == [((row_id,),)]
    assert pending(store) == 1


def test_a_scoped_session_in_a_transaction_receives_dispatches(engine: Engine) -> None:
    scoped = scoped_session(sessionmaker(engine))
    store = SQLAlchemyOutboxStore(engine=engine, scoped_session=scoped)
    calls = Calls()
    assert store.current_session() is None  # no session yet: commit at once

    scoped.add(Order(id=3, note="x"))
    scoped.flush()
    assert store.current_session() is scoped()
    store.add(new_message())
    store.on_commit(lambda: calls("committed"))
    assert (pending(store), calls.calls) == (0, [])
    scoped.commit()

    assert (pending(store), calls.calls) == (1, [("committed",)])
    assert store.current_session() is None  # between transactions: at once again
    scoped.remove()


def test_a_bound_session_wins_over_the_scoped_one(engine: Engine) -> None:
    scoped = scoped_session(sessionmaker(engine))
    store = SQLAlchemyOutboxStore(engine=engine, scoped_session=scoped)
    scoped.execute(select(1))
    with Session(engine) as other, store.bind_session(other):
        assert store.current_session() is other
        with store.bind_session(scoped()):
            assert store.current_session() is scoped()
        assert store.current_session() is other
    scoped.remove()


def test_bindings_are_per_thread(store: SQLAlchemyOutboxStore, engine: Engine) -> None:
    seen: list[Any] = []
    with Session(engine) as session, store.bind_session(session):
        thread = threading.Thread(target=lambda: seen.append(store.current_session()))
        thread.start()
        thread.join()
    assert seen == [None]


def test_a_savepoint_rolled_back_by_an_error_drops_its_callbacks(
    store: SQLAlchemyOutboxStore, engine: Engine
) -> None:
    calls = Calls()
    with Session(engine) as session, session.begin(), store.bind_session(session):
        store.on_commit(lambda: calls("kept"))

        def fail_in_a_savepoint() -> None:
            with session.begin_nested():
                store.on_commit(lambda: calls("dropped"))
                store.add(new_message())
                raise ZeroDivisionError

        with pytest.raises(ZeroDivisionError):
            fail_in_a_savepoint()
    assert calls.calls == [("kept",)]
    assert pending(store) == 0


def test_datetimes_come_back_aware_utc_to_the_microsecond(store: SQLAlchemyOutboxStore) -> None:
    due = datetime(2031, 6, 1, 14, 0, 0, 654321, tzinfo=timezone(timedelta(hours=2)))
    store.add(new_message(available_at=due))

    (row,) = store.claim_due(
        now=due, created_before=FAR_FUTURE, limit=5, lease_until=NOW + LEASE
    ).messages
    assert row.available_at == due
    assert row.available_at.tzinfo == timezone.utc
    assert row.locked_until == NOW + LEASE


def test_naive_datetimes_are_refused_at_the_boundary(store: SQLAlchemyOutboxStore) -> None:
    with pytest.raises(ValueError, match=r"now=.* is naive"):
        store.claim_due(
            now=NOW.replace(tzinfo=None), created_before=FAR_FUTURE, limit=1, lease_until=NOW
        )


def test_driver_errors_are_store_errors_with_the_cause(engine: Engine) -> None:
    other = define_tables(MetaData())  # never created: every statement fails
    store = SQLAlchemyOutboxStore(
        engine=engine,
        tables=other._replace(
            outbox=other.outbox.to_metadata(MetaData(), name="celery_outbox_missing")
        ),
    )

    with pytest.raises(StoreError, match="could not add an outbox row") as caught:
        store.add(new_message())
    assert caught.value.__cause__ is not None


def test_define_tables_puts_the_tables_on_your_metadata(engine: Engine) -> None:
    mine = MetaData()
    tables = define_tables(mine)
    assert {t.name for t in tables} <= set(mine.tables)
    indexes = {i["name"]: i for i in inspect(engine).get_indexes(outbox_table.name)}
    assert indexes[PENDING_TASK_INDEX]["unique"]
    # MySQL/MariaDB have no partial indexes: the key is over a generated column.
    partial = engine.dialect.name in ("postgresql", "sqlite")
    column = "task_id" if partial else "pending_task_id"
    assert indexes[PENDING_TASK_INDEX]["column_names"] == [column]
    assert {"celery_outbox_due_idx", "celery_outbox_task_id_idx"} <= set(indexes)


def test_claim_due_skips_rows_another_transaction_has_locked(engine: Engine) -> None:
    if engine.dialect.name == "sqlite":
        pytest.skip("SQLite has no row locks: one writer at a time")
    store = SQLAlchemyOutboxStore(engine=engine)
    first, second = store.add(new_message()), store.add(new_message())
    with engine.connect() as locker, locker.begin():
        locker.execute(
            select(outbox_table.c.id).where(outbox_table.c.id == first).with_for_update()
        )
        claim = store.claim_due(
            now=NOW, created_before=FAR_FUTURE, limit=10, lease_until=NOW + LEASE
        )  # would block without SKIP LOCKED
    assert [m.id for m in claim.messages] == [second]


def test_the_url_driver_does_not_matter_to_the_tables(engine: Engine) -> None:
    url = make_url(str(engine.url))
    assert url.get_backend_name() in ("sqlite", "postgresql", "mysql")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1


def test_import_of_the_core_does_not_import_sqlalchemy() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['sqlalchemy'] = None; import celery_outbox; "
        "import celery_outbox.testing"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
