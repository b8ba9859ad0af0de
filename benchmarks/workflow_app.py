"""The workflow benchmark's two Celery apps: the same 5-step chain, durable or plain.

A worker runs one of them: ``celery -A benchmarks.workflow_app:outbox_app worker`` or
``...:plain_app``; the harness imports both to dispatch. Broker and queue are the
benchmark run's (:mod:`benchmarks.app`); the database is the benchmark database's name plus
``_workflows`` on the same server (``BENCH_POSTGRES_URL``).

- ``outbox_app``: ``bench.wf_atomic_step``, an atomic ``OutboxTask`` on the SQLAlchemy
  store, **no result backend**: each step's ``INSERT``, its ``CompletedTask`` row, its
  workflow count and its successor's outbox row commit in one transaction.
- ``plain_app``: ``bench.wf_plain_step``, a plain Celery task whose ``INSERT`` commits in
  a transaction of its own, with a Redis result backend (``BENCH_RESULT_URL``, default the
  broker's Redis database), as Celery's canvas is run.

Each step returns its number plus one, which the chain hands to the next step; each writes
one ``bench_wf_step`` row stamped with the database's clock.
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
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, atomic_session
from celery_outbox.sqlalchemy import metadata as outbox_metadata

#: The database of this benchmark (created by the harness).
DATABASE_URL = make_url(POSTGRES_URL)
DATABASE_URL = DATABASE_URL.set(
    drivername="postgresql+psycopg", database=f"{DATABASE_URL.database}_workflows"
)
#: The plain side's result backend.
RESULT_URL = os.environ.get("BENCH_RESULT_URL", REDIS_URL)
#: Steps in each chain.
STEPS = 5

bench_metadata = MetaData()
#: One row per chain dispatched, written in the dispatching transaction.
chain_table = Table(
    "bench_wf_chain",
    bench_metadata,
    Column("chain", Integer, primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.clock_timestamp()),
)
#: One row per step that committed (``kind`` is ``outbox`` or ``plain``).
step_table = Table(
    "bench_wf_step",
    bench_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(10), nullable=False),
    Column("chain", Integer, nullable=False),
    Column("step", Integer, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.clock_timestamp()),
)

engine: Engine = create_engine(DATABASE_URL, pool_size=2, max_overflow=2)
store = SQLAlchemyOutboxStore(engine=engine)


def _app(name: str, **conf: Any) -> Celery:
    app = Celery(name, broker=REDIS_URL, backend=conf.pop("backend", None), set_as_current=False)
    app.conf.update(
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH", "4")),
        **conf,
    )
    return app


outbox_app = _app("celery_outbox_bench_wf", task_ignore_result=True, outbox_beat_schedule=False)
install_store(outbox_app, store)
plain_app = _app("celery_outbox_bench_wf_plain", backend=RESULT_URL, task_ignore_result=False)


def create_tables() -> None:
    """Create the outbox tables, and the benchmark's tables anew (the database must exist)."""
    outbox_metadata.create_all(engine)
    bench_metadata.drop_all(engine)
    bench_metadata.create_all(engine)


@outbox_app.task(base=OutboxTask, atomic=True, shared=False, name="bench.wf_atomic_step")
def atomic_step(n: int, chain: int) -> int:
    """One ``INSERT``, in the step's transaction (with its successor's outbox row)."""
    atomic_session().execute(insert(step_table).values(kind="outbox", chain=chain, step=n + 1))
    return n + 1


@plain_app.task(shared=False, name="bench.wf_plain_step")
def plain_step(n: int, chain: int) -> int:
    """The same ``INSERT``, committed on its own; Celery sends the next step after it."""
    with engine.begin() as conn:
        conn.execute(insert(step_table).values(kind="plain", chain=chain, step=n + 1))
    return n + 1


@worker_process_init.connect
def _fresh_pool(**_: Any) -> None:
    # A forked pool child must not share the parent's pooled connections.
    engine.dispose(close=False)


@worker_ready.connect
def _announce(**_: Any) -> None:
    print(READY, flush=True)
