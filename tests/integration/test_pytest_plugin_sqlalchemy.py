"""The pytest plugin's ``outbox`` fixture with the SQLAlchemy store on real PostgreSQL:
the session's commits and rollbacks (savepoints too) decide what is kept, and ``drain()``
runs the committed rows, or publishes them to a real broker.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from celery_outbox import OutboxTask, install_store
from celery_outbox.pytest_plugin import outbox
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.sqlalchemy import metadata as outbox_metadata
from celery_outbox.sqlalchemy.tables import default_tables
from celery_outbox.state import reset
from celery_outbox.testing.recorder import DispatchState, OutboxRecorder
from tests.brokers import take_task_ids

__all__ = ["outbox"]  # the plugin's fixture, as a user gets it

GREET = "plugin_sa.greet"
greeted: list[str] = []
StoreAndApp = tuple[SQLAlchemyOutboxStore, Celery]


def greet(name: str) -> None:
    greeted.append(name)


@pytest.fixture
def engine(postgres_database_url: str) -> Iterator[Engine]:
    engine = create_engine(postgres_database_url.replace("postgresql://", "postgresql+psycopg://"))
    outbox_metadata.create_all(engine)
    yield engine
    engine.dispose()


def make_app(engine: Engine, broker: str, queue: str) -> tuple[Celery, SQLAlchemyOutboxStore]:
    app = Celery("plugin-sa", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True)
    app.task(base=OutboxTask, name=GREET, shared=False)(greet)
    store = SQLAlchemyOutboxStore(engine=engine)
    install_store(app, store)
    return app, store


@pytest.fixture
def store_and_app(
    engine: Engine, queue_name: str
) -> Iterator[tuple[SQLAlchemyOutboxStore, Celery]]:
    app, store = make_app(engine, "memory://", queue_name)
    greeted.clear()
    yield store, app
    reset(app)
    app.close()


@pytest.fixture
def outbox_celery_app(store_and_app: StoreAndApp) -> Celery:
    """The plugin's app fixture, overridden as a user's conftest.py would."""
    return store_and_app[1]


def outbox_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        table = default_tables.outbox
        return int(conn.scalar(select(func.count()).select_from(table)) or 0)


def test_the_session_decides_what_is_kept_and_drain_runs_it(
    outbox: OutboxRecorder,
    store_and_app: StoreAndApp,
    engine: Engine,
) -> None:
    store, app = store_and_app
    task = app.tasks[GREET]
    sessions = sessionmaker(engine)
    with sessions() as session, store.bind_session(session):
        task.delay("ada")
        with session.begin_nested() as savepoint:
            task.delay("savepoint")
            savepoint.rollback()
        assert outbox.dispatches[0].state is DispatchState.AWAITING_COMMIT
        session.commit()
        task.delay("bob")
        session.rollback()

    assert [d.state for d in outbox.dispatches] == [
        DispatchState.COMMITTED,
        DispatchState.ROLLED_BACK,
        DispatchState.ROLLED_BACK,
    ]
    outbox.assert_sent(task, args=["ada"])
    outbox.assert_not_sent(task, args=["bob"])
    assert outbox_rows(engine) == 1  # committed, held: not published

    outbox.drain()

    assert (greeted, outbox_rows(engine)) == (["ada"], 0)


def test_drain_publish_sends_the_committed_rows_to_a_real_broker(
    engine: Engine, broker_url: str, broker_queue: str, queue_name: str
) -> None:
    app, store = make_app(engine, broker_url, queue_name)
    greeted.clear()
    try:
        with OutboxRecorder.recording(app) as recording:
            with Session(engine) as session, store.bind_session(session):
                sent = app.tasks[GREET].delay("eve")
                session.commit()
            recording.drain(publish=True)
        assert take_task_ids(broker_url, queue_name) == [sent.id]
        assert (outbox_rows(engine), greeted) == (0, [])
    finally:
        reset(app)
        app.close()
