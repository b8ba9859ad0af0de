"""``await task.adelay()`` with the SQLAlchemy store bound to an ``AsyncSession``.

On real databases through their async drivers (SQLite with aiosqlite, PostgreSQL with
asyncpg, MariaDB with aiomysql) and a real Redis: the row is written in the session's
transaction, published after ``await session.commit()`` off the event loop, nothing on a
rollback or a rolled-back savepoint. A session of another database is a clear error; a sync
``delay()`` with an ``AsyncSession`` bound names ``adelay``; a group dispatches through
:func:`~celery_outbox.dispatch.asynchronous.adispatch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")
pytest.importorskip("aiosqlite")

from celery import Celery, group
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from celery_outbox import OutboxTask
from celery_outbox.dispatch.asynchronous import adispatch
from celery_outbox.exceptions import OutboxConfigError, OutboxError
from celery_outbox.registry import install_store
from celery_outbox.relay.relay import relay_for
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, metadata, outbox_table
from celery_outbox.sqlalchemy.asynchronous import wait_for_publishes
from tests import services
from tests.brokers import delete_queue, new_queue_name, take_task_ids

pytestmark = pytest.mark.redis

business = MetaData()
orders = Table(
    "async_order",
    business,
    Column("id", Integer, primary_key=True),
    Column("note", String(50), nullable=False),
)

#: The async driver and the sync one of each database, from one URL.
DRIVERS = {
    "sqlite": ("sqlite+aiosqlite", "sqlite+pysqlite"),
    "postgresql": ("postgresql+asyncpg", "postgresql+psycopg"),
    "mysql": ("mysql+aiomysql", "mysql+pymysql"),
}


@dataclass
class World:
    app: Celery
    store: SQLAlchemyOutboxStore
    engine: AsyncEngine
    broker: str
    queue: str

    def run(self, coro: Any) -> Any:
        return asyncio.run(coro)

    def published(self) -> list[str]:
        """The task ids on the queue once the commits' publishes have run."""
        wait_for_publishes(timeout=30)
        return take_task_ids(self.broker, self.queue)

    def pending(self) -> int:
        with self.store.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(outbox_table)).scalar_one())

    def orders(self) -> int:
        with self.store.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(orders)).scalar_one())


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def database_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """A fresh database's URL (no driver named) per kind."""
    if request.param == "sqlite":
        return sqlite_url
    if request.param == "mysql":
        pytest.importorskip("aiomysql")
    fixture = {"postgresql": "postgres_database_url", "mysql": "mysql_database_url"}
    return str(request.getfixturevalue(fixture[request.param]))


@pytest.fixture
def world(database_url: str, redis_url: str) -> Iterator[World]:
    url = make_url(database_url)
    async_driver, sync_driver = DRIVERS[url.get_backend_name()]
    sync_engine = create_engine(url.set(drivername=sync_driver))
    metadata.create_all(sync_engine)
    business.create_all(sync_engine)
    async_engine = create_async_engine(url.set(drivername=async_driver))
    queue = new_queue_name()
    app = Celery("async_sa", broker=redis_url, set_as_current=False)
    app.conf.update(task_default_queue=queue, outbox_publish_grace=30.0)
    store = SQLAlchemyOutboxStore(engine=sync_engine)
    install_store(app, store)
    yield World(app, store, async_engine, redis_url, queue)
    relay_for(app).close()
    asyncio.run(async_engine.dispose())
    sync_engine.dispose()
    delete_queue(redis_url, queue)


def echo(n: int) -> int:
    """The task's body (never run here: the tests read the queue)."""
    return n


def record(app: Celery) -> Any:
    return app.task(base=OutboxTask, name="async_sa.record", shared=False)(echo)


def test_a_commit_publishes_the_row_written_in_the_session(world: World) -> None:
    task = record(world.app)
    loop_threads: set[int] = set()

    async def request() -> str:
        loop_threads.add(threading.get_ident())
        async with AsyncSession(world.engine) as session, session.begin():
            with world.store.bind_session(session):
                await session.execute(orders.insert().values(id=1, note="a"))
                result = await task.adelay(1)
                assert world.pending() == 0 or world.store.engine.dialect.name == "sqlite"
        return str(result.id)

    task_id = world.run(request())
    assert world.published() == [task_id]
    assert world.orders() == 1
    assert world.pending() == 0


def test_a_rollback_publishes_nothing(world: World) -> None:
    task = record(world.app)

    async def request() -> None:
        async with AsyncSession(world.engine) as session:
            with world.store.bind_session(session):
                await session.execute(orders.insert().values(id=2, note="b"))
                await task.aapply_async((2,), countdown=0)
                await session.rollback()

    world.run(request())
    assert world.published() == []
    assert world.pending() == 0
    assert world.orders() == 0


def test_a_rolled_back_savepoint_drops_its_rows_only(world: World) -> None:
    task = record(world.app)

    async def request() -> tuple[str, str]:
        async with AsyncSession(world.engine) as session, session.begin():
            with world.store.bind_session(session):
                kept = await task.adelay(1)
                nested = await session.begin_nested()
                dropped = await task.adelay(2)
                await nested.rollback()
        return str(kept.id), str(dropped.id)

    kept, _ = world.run(request())
    assert world.published() == [kept]
    assert world.pending() == 0


def test_a_group_dispatches_through_adispatch(world: World) -> None:
    task = record(world.app)

    async def request() -> list[str]:
        async with AsyncSession(world.engine) as session, session.begin():
            with world.store.bind_session(session):
                result = await adispatch(world.app, group(task.s(i) for i in range(3)).apply_async)
        return [str(child.id) for child in result.results]

    ids = world.run(request())
    assert sorted(world.published()) == sorted(ids)


def test_a_sync_delay_with_an_async_session_bound_names_adelay(world: World) -> None:
    task = record(world.app)

    async def request() -> None:
        async with AsyncSession(world.engine) as session, session.begin():
            with world.store.bind_session(session):
                task.delay(1)

    with pytest.raises(OutboxError, match="adelay"):
        world.run(request())
    assert world.published() == []


def test_without_a_session_adelay_commits_at_once(world: World) -> None:
    task = record(world.app)
    result = world.run(task.adelay(5))
    assert world.published() == [result.id]


@pytest.mark.postgres
def test_a_session_of_another_database_is_refused_naming_both(
    sqlite_url: str, postgres_url: str
) -> None:
    store = SQLAlchemyOutboxStore(engine=create_engine(sqlite_url))
    other = create_async_engine(make_url(postgres_url).set(drivername="postgresql+asyncpg"))
    session = AsyncSession(other)
    with pytest.raises(OutboxConfigError) as raised, store.bind_session(session):
        pass
    message = str(raised.value)
    assert "postgresql+asyncpg" in message
    assert "outbox.sqlite3" in message
    assert services.parse_db_url(postgres_url).name in message


def test_a_commit_cancelled_loses_nothing_and_publishes_nothing_twice(world: World) -> None:
    """Commits cancelled at different points: each task whose order committed is on the
    queue once or still in the table for the sweeper (never both, never twice); a task
    whose order did not commit is nowhere.
    """
    task = record(world.app)

    async def request(n: int, yields: int) -> str:
        async with AsyncSession(world.engine) as session:
            with world.store.bind_session(session):
                result = await task.adelay(n)
                await session.execute(orders.insert().values(id=100 + n, note=str(result.id)))
                committing = asyncio.ensure_future(session.commit())
                for _ in range(yields):
                    await asyncio.sleep(0)
                committing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await committing
        return str(result.id)

    async def requests() -> list[str]:
        points = (0, 1, 2, 5, 20, 100, 1000, 5000)  # loop turns before the cancel
        return [await request(n, turns) for n, turns in enumerate(points)]

    ids = world.run(requests())
    queued = world.published()
    with world.store.engine.connect() as conn:
        committed = {str(note) for note in conn.execute(select(orders.c.note)).scalars()}
        waiting = [
            str(task_id) for task_id in conn.execute(select(outbox_table.c.task_id)).scalars()
        ]
    assert len(queued) == len(set(queued))  # nothing twice
    assert not set(queued) & set(waiting)
    assert set(queued) | set(waiting) == committed  # nothing lost, nothing uncommitted
    assert committed <= set(ids)
