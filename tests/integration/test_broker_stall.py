"""A broker that accepts the connection and then stalls costs one bounded wait per commit.

The producer reaches the real broker (Redis, then RabbitMQ) through a loopback
:class:`~tests.stall_proxy.StallProxy`; the worker consumes from the broker directly. Once
the proxy stalls, a transaction dispatching 20 tasks must commit within about one
``outbox_publish_timeout`` (1 s), on a live connection and on a new one alike, whatever the
transport; its rows stay in the outbox. When the proxy resumes, a sweep publishes them and
the worker runs every task exactly once.

Two stalls: ``frozen`` (nothing answers any more, a SIGSTOPped broker) and ``publishes``
(only connections that publish stop being answered, as under a RabbitMQ resource alarm or
Redis ``CLIENT PAUSE WRITE``: connecting and pinging still work, so a relay that reconnects
per message waits once per message).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy")

from celery import Celery
from sqlalchemy import func, insert, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.publishing import broker
from celery_outbox.publishing.broker import Deadline
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, outbox_table
from tests.conftest import StartWorker
from tests.integration.sqlalchemy_app import RECORD, create_app, orders, runs
from tests.stall_proxy import StallProxy
from tests.worker import wait_for

APP_MODULE = "tests.integration.sqlalchemy_app"
#: Tasks per stalled transaction.
TASKS = 20
#: outbox_publish_timeout (seconds), and the longest a commit may take with the broker stalled:
#: one timeout plus slack for the store and a loaded machine.
PUBLISH_TIMEOUT = 1.0
MAX_COMMIT_SECONDS = 2.0
#: What a client sends when it publishes: Redis's LPUSH, AMQP's basic.publish method id.
PUBLISH_BYTES = {"redis": b"LPUSH", "amqp": b"\x00\x3c\x00\x28"}


@pytest.fixture
def proxy(broker_url: str) -> Iterator[StallProxy]:
    stall_proxy = StallProxy.for_url(broker_url)
    yield stall_proxy
    stall_proxy.close()


def _commit(app: Celery, store: SQLAlchemyOutboxStore, first: int, count: int) -> float:
    """Write ``count`` orders and dispatch one task each in one transaction; its duration."""
    started = time.monotonic()
    with Session(store.engine) as session, store.bind_session(session):
        for order_id in range(first, first + count):
            session.execute(insert(orders).values(id=order_id, note="stall"))
            app.tasks[RECORD].delay(order_id)
        session.commit()
    return time.monotonic() - started


def _rows_left(store: SQLAlchemyOutboxStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(outbox_table)).scalar_one())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stall", ["frozen", "publishes"])
def test_a_stalled_broker_costs_one_timeout_per_commit_and_loses_nothing(
    stall: str,
    broker_url: str,
    broker_queue: str,
    proxy: StallProxy,
    postgres_database_url: str,
    tmp_path: Path,
    celery_worker_process: StartWorker,
) -> None:
    database = make_url(postgres_database_url).set(drivername="postgresql+psycopg")
    db_url = database.render_as_string(hide_password=False)
    output = tmp_path / "runs.jsonl"
    app, engine, store = create_app(proxy.url(broker_url), broker_queue, db_url)
    app.conf.outbox_publish_timeout = PUBLISH_TIMEOUT
    env = {
        "OUTBOX_TEST_BROKER": broker_url,
        "OUTBOX_TEST_QUEUE": broker_queue,
        "OUTBOX_TEST_DATABASE": db_url,
        "OUTBOX_TEST_OUTPUT": str(output),
    }
    celery_worker_process(APP_MODULE, queue=broker_queue, env=env)
    try:
        baseline = _commit(app, store, 0, TASKS)  # the broker answers; the connection stays
        scheme = "amqp" if broker_url.startswith("amqp") else "redis"
        proxy.stall(when=PUBLISH_BYTES[scheme] if stall == "publishes" else b"")
        on_live = _commit(app, store, 100, TASKS)  # the held connection stops answering
        on_new = _commit(app, store, 200, TASKS)  # a new connection is accepted, then silent
        assert _rows_left(store) == 2 * TASKS  # nothing lost: all wait for the sweeper
        took = (
            f"stalled commits took {on_live:.2f} s (live connection), {on_new:.2f} s (new one);"
            f" {baseline:.2f} s with the broker answering"
        )
        assert max(on_live, on_new) < MAX_COMMIT_SECONDS, took

        proxy.resume()
        sweeper = Sweeper(
            app=app,
            store=store,
            relay=relay_for(app),
            config=OutboxConfig.from_celery(app),
            clock=lambda: utcnow() + timedelta(minutes=10),  # the rescheduled rows are due
        )
        wait_for(lambda: sweeper.sweep().published == 0 and _rows_left(store) == 0, timeout=30)
        expected = {*range(TASKS), *range(100, 100 + TASKS), *range(200, 200 + TASKS)}
        wait_for(lambda: len(runs(output)) >= len(expected), timeout=30, what="every task")
        time.sleep(0.5)  # a duplicate would arrive now
        seen = Counter(run["order_id"] for run in runs(output))
        assert set(seen) == expected
        assert [order for order, count in seen.items() if count > 1] == []
        assert all(run["saw_order"] for run in runs(output))
    finally:
        relay_for(app).close()
        app.close()
        engine.dispose()


def test_the_socket_bounds_reach_the_broker_driver(broker_url: str) -> None:
    # Each transport ignores option names it does not know: check the driver got ours.
    app = Celery("stall-bounds", broker=broker_url, set_as_current=False)
    conn = broker.connect(app, Deadline.after(timedelta(seconds=PUBLISH_TIMEOUT)))
    try:
        if conn.transport.driver_name == broker.PY_AMQP:
            amqp_connection = conn.connection
            assert 0 < amqp_connection.sock.gettimeout() <= PUBLISH_TIMEOUT
            assert 0 < amqp_connection.read_timeout <= PUBLISH_TIMEOUT
            assert 0 < amqp_connection.write_timeout <= PUBLISH_TIMEOUT
        else:
            kwargs = conn.default_channel.pool.connection_kwargs
            assert 0 < kwargs["socket_timeout"] <= PUBLISH_TIMEOUT
            assert 0 < kwargs["socket_connect_timeout"] <= PUBLISH_TIMEOUT
    finally:
        broker.discard(conn)
        app.close()
