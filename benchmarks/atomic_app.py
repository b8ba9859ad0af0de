"""The atomic benchmark's Celery app: the SQLAlchemy store, on a database of its own.

``celery -A benchmarks.atomic_app worker`` runs it; the harness imports it to dispatch.
Broker and queue are the benchmark run's (:mod:`benchmarks.app`); the database is the
benchmark database's name plus ``_atomic`` on the same server (``BENCH_POSTGRES_URL``), so
these SQLAlchemy-created tables never meet the Django migrations of the other benchmarks.

Two tasks with the same body, one ``INSERT`` into ``bench_write``: ``atomic_write``
(``atomic = True``: the insert runs in :func:`celery_outbox.sqlalchemy.atomic_session`,
with the task's ``CompletedTask`` row) and ``plain_write`` (an ``OutboxTask`` that is
not atomic: the insert commits in a transaction of its own).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import worker_process_init, worker_ready
from sqlalchemy import (
    Column,
    DateTime,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    insert,
)
from sqlalchemy.engine import make_url

from benchmarks.app import QUEUE, REDIS_URL
from benchmarks.processes import READY
from benchmarks.settings import POSTGRES_URL
from celery_outbox import OutboxTask, install_store
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.sqlalchemy import metadata as outbox_metadata

#: The database of this benchmark (created by the harness).
DATABASE_URL = make_url(POSTGRES_URL)
DATABASE_URL = DATABASE_URL.set(
    drivername="postgresql+psycopg", database=f"{DATABASE_URL.database}_atomic"
)

bench_metadata = MetaData()
#: One row per task run that committed (``kind`` is ``atomic`` or ``plain``), with the
#: database's clock at the ``INSERT`` (not the transaction's start).
write_table = Table(
    "bench_write",
    bench_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(10), nullable=False),
    Column("i", Integer, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.clock_timestamp()),
)

app = Celery("celery_outbox_bench_atomic", broker=REDIS_URL, set_as_current=False)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH", "4")),
    outbox_beat_schedule=False,
)
engine: Engine = create_engine(DATABASE_URL, pool_size=2, max_overflow=2)
store = SQLAlchemyOutboxStore(engine=engine)
install_store(app, store)


def create_tables() -> None:
    """Create the outbox tables, and ``bench_write`` anew (the database must exist)."""
    outbox_metadata.create_all(engine)
    bench_metadata.drop_all(engine)
    bench_metadata.create_all(engine)


@app.task(base=OutboxTask, atomic=True, name="bench.atomic_write")
def atomic_write(i: int) -> None:
    """One ``INSERT``, in the task's ``CompletedTask`` transaction."""
    from celery_outbox.sqlalchemy import atomic_session

    atomic_session().execute(insert(write_table).values(kind="atomic", i=i))


@app.task(base=OutboxTask, name="bench.plain_write")
def plain_write(i: int) -> None:
    """The same ``INSERT``, committed on its own (not atomic)."""
    with engine.begin() as conn:
        conn.execute(insert(write_table).values(kind="plain", i=i))


@worker_process_init.connect
def _fresh_pool(**_: Any) -> None:
    # A forked pool child must not share the parent's pooled connections.
    engine.dispose(close=False)


@worker_ready.connect
def _announce(**_: Any) -> None:
    print(READY, flush=True)
