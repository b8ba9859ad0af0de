"""Async dispatch: ``await task.adelay()`` in an ``AsyncSession`` transaction against plain
Celery's usual workaround (``apply_async`` in ``asyncio.to_thread``), on one async engine.

Both sides run the same async request on PostgreSQL through asyncpg: one business row and
one task per transaction. The outbox side writes its row in the session's transaction and
publishes after the commit off the loop (its time includes the INSERTs, the COMMIT and the
publish pool's work it waits for at the end of a round); the plain side publishes from a
worker thread inside the transaction. Rounds alternate the sides; the ratio is of the medians.

The loop-lag case freezes a ``redis-server`` of its own (SIGSTOP) for 5 s during 200
requests of each side, with a ticker on the loop every 5 ms: its worst lateness (the
promise: ≤ 50 ms), and each side's slowest request (the plain workaround waits on the
frozen broker inside the request; the outbox side does not).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.stats import median, ratio

#: A business table: what a real request writes besides the task.
ORDERS = "celery_outbox_bench_async_order"
#: Requests of the loop-lag case, and how long the broker is frozen among them.
LAG_REQUESTS = 200
STALL_SECONDS = 5.0
#: The promise: the loop's worst tick late by at most this (ms) while the broker is frozen.
LAG_TARGET_MS = 50.0
#: A request's interval in the loop-lag case: 200 of them span the stall.
LAG_SPACING = 0.02


def _apps(broker: str, queue: str) -> tuple[Any, Any, Any]:
    """The SQLAlchemy store of a Celery app of this benchmark, and the app's two tasks."""
    from celery import Celery
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from benchmarks.settings import POSTGRES_URL
    from celery_outbox import OutboxTask
    from celery_outbox.registry import install_store
    from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, metadata

    app = Celery("bench_async", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        outbox_publish_timeout=1.0,
    )
    engine = create_engine(make_url(POSTGRES_URL).set(drivername="postgresql+psycopg"))
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE IF NOT EXISTS {ORDERS} (id bigserial PRIMARY KEY, n int)"
        )
    store = SQLAlchemyOutboxStore(engine=engine)
    install_store(app, store)

    def noop(i: int) -> int:
        return i

    ours = app.task(base=OutboxTask, name="bench_async.outbox_noop", shared=False)(noop)
    plain = app.task(name="bench_async.plain_noop", shared=False)(noop)
    return store, ours, plain


def _async_engine() -> Any:
    from sqlalchemy.engine import make_url
    from sqlalchemy.ext.asyncio import create_async_engine

    from benchmarks.settings import POSTGRES_URL

    return create_async_engine(make_url(POSTGRES_URL).set(drivername="postgresql+asyncpg"))


def _request(
    engine: Any, store: Any, ours: Any, plain: Any, outbox: bool
) -> Callable[[int], Awaitable[None]]:
    """One request of a side: a business row and a task in one transaction."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession

    insert = text(f"INSERT INTO {ORDERS} (n) VALUES (:n)")

    async def request(i: int) -> None:
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(insert, {"n": i})
            if outbox:
                with store.bind_session(session):
                    await ours.adelay(i)
            else:
                await asyncio.to_thread(plain.apply_async, (i,))

    return request


async def _round(request: Callable[[int], Awaitable[None]], tasks: int, outbox: bool) -> float:
    from celery_outbox.sqlalchemy.asynchronous import wait_for_publishes

    started = time.perf_counter()
    for i in range(tasks):
        await request(i)
    if outbox:
        await asyncio.to_thread(wait_for_publishes, 60)  # its publishes count too
    return tasks / (time.perf_counter() - started)


def _purge(broker: str, queue: str) -> None:
    from kombu import Connection

    with Connection(broker, connect_timeout=5) as conn:
        channel = conn.default_channel
        channel.queue_declare(queue=queue, auto_delete=False)
        channel.queue_purge(queue)


def _throughput(tasks: int, rounds: int) -> dict[str, Any]:
    from benchmarks.app import BROKER_URL

    queue = f"celery-outbox-bench-async-{os.getpid()}"
    store, ours, plain = _apps(BROKER_URL, queue)

    async def measure() -> tuple[list[float], list[float]]:
        engine = _async_engine()
        sides = {side: _request(engine, store, ours, plain, side) for side in (False, True)}
        await _round(sides[False], 50, False)  # warm-up: connections, imports, caches
        await _round(sides[True], 50, True)
        plain_rates, our_rates = [], []
        for _ in range(rounds):
            plain_rates.append(await _round(sides[False], tasks, False))
            our_rates.append(await _round(sides[True], tasks, True))
            _purge(BROKER_URL, queue)
        await engine.dispose()
        return plain_rates, our_rates

    try:
        plain_rates, our_rates = asyncio.run(measure())
    finally:
        _purge(BROKER_URL, queue)
        _close(ours, store)
    return {
        "benchmark": "async dispatch",
        "case": "1/txn + write: adelay vs apply_async in to_thread (asyncpg)",
        "unit": "tasks/s",
        "tasks": tasks,
        "rounds": rounds,
        "plain": median(plain_rates),
        "ours": median(our_rates),
        "ratio": ratio(median(our_rates), median(plain_rates)),
        "target": 0.7,
        "samples": {"plain": plain_rates, "ours": our_rates},
    }


class _Redis:
    """A ``redis-server`` of this benchmark's own, on a free port (frozen on purpose)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def freeze_for(self, seconds: float) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)
        threading.Timer(seconds, os.kill, (self.process.pid, signal.SIGCONT)).start()

    def stop(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)
        self.process.kill()
        self.process.wait(timeout=10)


def _lag(outbox: bool) -> tuple[float, float]:
    """The loop's worst tick lateness and the slowest request (ms) of one side while its
    broker is frozen.
    """
    from celery_outbox.sqlalchemy.asynchronous import wait_for_publishes

    redis = _Redis()
    queue = "bench-async-lag"
    store, ours, plain = _apps(redis.url, queue)

    async def measure() -> tuple[float, float]:
        engine = _async_engine()
        request = _request(engine, store, ours, plain, outbox)
        await request(-1)  # warm-up: the connections exist before the stall
        worst_tick = 0.0
        slowest = 0.0
        done = False

        async def ticker() -> None:
            nonlocal worst_tick
            while not done:
                before = time.perf_counter()
                await asyncio.sleep(0.005)
                worst_tick = max(worst_tick, time.perf_counter() - before - 0.005)

        ticking = asyncio.create_task(ticker())
        for i in range(LAG_REQUESTS):
            if i == LAG_REQUESTS // 4:
                redis.freeze_for(STALL_SECONDS)
            started = time.perf_counter()
            await request(i)
            slowest = max(slowest, time.perf_counter() - started)
            await asyncio.sleep(LAG_SPACING)
        done = True
        await ticking
        await engine.dispose()
        return worst_tick * 1000, slowest * 1000

    try:
        return asyncio.run(measure())
    finally:
        time.sleep(STALL_SECONDS)  # the broker thaws before the publishes are waited for
        wait_for_publishes(timeout=60)
        _close(ours, store)
        redis.stop()


def _close(task: Any, store: Any) -> None:
    from celery_outbox.relay.relay import relay_for

    relay_for(task.app).close()
    store.engine.dispose()


def _lag_row() -> dict[str, Any]:
    plain_tick, plain_slowest = _lag(outbox=False)
    our_tick, our_slowest = _lag(outbox=True)
    return {
        "benchmark": "async dispatch",
        "case": f"broker frozen {STALL_SECONDS:.0f} s during {LAG_REQUESTS} requests",
        "unit": "ms",
        "plain_tick_ms": plain_tick,
        "ours_tick_ms": our_tick,
        "plain_slowest_ms": plain_slowest,
        "ours_slowest_ms": our_slowest,
        "target": LAG_TARGET_MS,
    }


def run(*, tasks: int, rounds: int) -> list[dict[str, Any]]:
    """Measure both cases; one result row each."""
    lag = _lag_row()  # first: no garbage or threads of the other case in its measurement
    return [_throughput(tasks, rounds), lag]
