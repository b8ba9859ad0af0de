"""A broker frozen during async commits never blocks the event loop, and loses nothing.

A throwaway ``redis-server`` of this test is frozen (SIGSTOP) for 5 s in the middle of 200
``AsyncSession`` commits on PostgreSQL (asyncpg), each with an ``await task.adelay()``. A
ticker on the loop records its worst lateness: the publishes after each commit run off the
loop, so the loop keeps ticking while they wait on the frozen broker. Afterwards every task
is on the queue, by its on-commit publish or by the sweeper (at least once).

The strict figure (worst tick ≤ 50 ms) is a benchmark row (``python -m benchmarks --only
async_dispatch``); this test holds the promise with a bound a loaded CI machine keeps: the
loop is never held for a second, where a publish on the loop would hold it for the stall.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("asyncpg")

from celery import Celery
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from celery_outbox import OutboxTask
from celery_outbox.config import OutboxConfig
from celery_outbox.registry import install_store, store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, metadata, outbox_table
from celery_outbox.sqlalchemy.asynchronous import wait_for_publishes
from tests.brokers import take_task_ids
from tests.integration.sweep_support import ThrowawayRedis

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]

COMMITS = 200
STALL_SECONDS = 5.0
#: A loop held this long by a publish would show the stall; ticks are 5 ms apart.
NEVER_HELD = 1.0


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis(tmp_path)
    server.start()
    yield server
    if server.process is not None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


def echo(n: int) -> int:
    """The task's body (never run here: the test reads the queue)."""
    return n


def test_a_frozen_broker_never_holds_the_loop_and_every_task_is_published(
    redis: ThrowawayRedis, postgres_database_url: str
) -> None:
    url = make_url(postgres_database_url)
    engine = create_engine(url.set(drivername="postgresql+psycopg"))
    metadata.create_all(engine)
    async_engine = create_async_engine(url.set(drivername="postgresql+asyncpg"))
    app = Celery("async_stall", broker=redis.url, set_as_current=False)
    app.conf.update(
        task_default_queue="stall",
        outbox_publish_grace=1.0,
        outbox_publish_timeout=1.0,
        broker_connection_retry_on_startup=True,
    )
    task = app.task(base=OutboxTask, name="async_stall.echo", shared=False)(echo)
    store = SQLAlchemyOutboxStore(engine=engine)
    install_store(app, store)
    assert redis.process is not None
    pid = redis.process.pid

    async def requests() -> tuple[list[str], float]:
        worst = 0.0
        done = False

        async def ticker() -> None:
            nonlocal worst
            while not done:
                before = time.perf_counter()
                await asyncio.sleep(0.005)
                worst = max(worst, time.perf_counter() - before - 0.005)

        ticking = asyncio.create_task(ticker())
        ids = []
        for n in range(COMMITS):
            if n == COMMITS // 4:
                os.kill(pid, signal.SIGSTOP)
                threading.Timer(STALL_SECONDS, os.kill, (pid, signal.SIGCONT)).start()
            async with AsyncSession(async_engine) as session, session.begin():
                with store.bind_session(session):
                    ids.append(str((await task.adelay(n)).id))
            await asyncio.sleep(0.02)  # requests spread over the stall
        done = True
        await ticking
        await async_engine.dispose()
        return ids, worst

    try:
        started = time.monotonic()
        ids, worst = asyncio.run(requests())
        took = time.monotonic() - started
        time.sleep(max(0.0, STALL_SECONDS + 0.5 - took))  # the broker is back
        wait_for_publishes(timeout=60)
        sweeper = Sweeper(
            app=app,
            store=store_for(app),
            relay=relay_for(app),
            config=OutboxConfig.from_celery(app),
        )
        deadline = time.monotonic() + 60
        while _pending(engine) and time.monotonic() < deadline:
            time.sleep(0.5)
            sweeper.sweep()
        queued = take_task_ids(redis.url, "stall")
    finally:
        relay_for(app).close()
        engine.dispose()

    assert worst < NEVER_HELD, f"the loop was held {worst:.3f} s"
    assert set(queued) == set(ids)  # every task, at least once
    assert _pending(engine) == 0


def _pending(engine: object) -> int:
    with engine.connect() as conn:  # type: ignore[attr-defined]
        return int(conn.execute(select(func.count()).select_from(outbox_table)).scalar_one())
