"""An outbox app for the sweeper's integration tests: SQLAlchemy store on PostgreSQL.

Worker and sweeper subprocesses read the broker from ``OUTBOX_TEST_BROKER``, the queue
from ``OUTBOX_TEST_QUEUE``, the database from ``OUTBOX_TEST_DB`` and the file the task
appends ``"<task id> <n>"`` lines to from ``OUTBOX_TEST_OUTPUT``.
"""

from __future__ import annotations

import ast
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from celery import Celery, Task
from sqlalchemy import Engine, create_engine, insert
from sqlalchemy.engine import make_url

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store, store_for
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, metadata, outbox_table
from celery_outbox.store.records import message_columns
from tests.messages import numbered

#: The registered name of the task that records its runs.
RECORD = "sweep_it.record"


def engine_for(db_url: str) -> Engine:
    """A psycopg 3 engine on ``db_url``."""
    return create_engine(make_url(db_url).set(drivername="postgresql+psycopg"), pool_size=5)


def create_app(broker_url: str, queue: str, db_url: str, **conf: Any) -> Celery:
    """An app on ``broker_url`` routing to ``queue``, its outbox in ``db_url``."""
    app = Celery("sweep_app", broker=broker_url, set_as_current=False)
    app.conf.update(
        {
            "task_default_queue": queue,
            "broker_connection_retry_on_startup": True,
            "worker_hijack_root_logger": False,
            "outbox_beat_schedule": False,
            **conf,
        }
    )
    app.task(base=OutboxTask, name=RECORD, bind=True, shared=False)(record)
    install_store(app, SQLAlchemyOutboxStore(engine=engine_for(db_url)))
    return app


def record(task: Task, n: int) -> None:  # type: ignore[type-arg]
    """Append ``"<task id> <n>"`` to ``OUTBOX_TEST_OUTPUT``."""
    with Path(os.environ["OUTBOX_TEST_OUTPUT"]).open("a") as output:
        output.write(f"{task.request.id} {n}\n")


def create_tables(db_url: str) -> None:
    """The outbox tables in ``db_url``."""
    engine = engine_for(db_url)
    metadata.create_all(engine)
    engine.dispose()


def insert_committed_rows(
    app: Celery, count: int, *, created_at: datetime, prefix: str = "task"
) -> list[str]:
    """Rows as a crash after COMMIT leaves them (never published); their task ids.

    Each message is built as ``record.delay(n)`` builds it, then inserted in bulk.
    """
    store = store_for(app)
    task = app.tasks[RECORD]
    values = []
    for n in range(count):
        message = numbered(task, n, task_id=f"{prefix}-{n}", now=created_at)
        values.append(message_columns(message, created_at=created_at))
    with store.engine.begin() as conn:
        for start in range(0, count, 5000):
            conn.execute(insert(outbox_table), values[start : start + 5000])
    return [v["task_id"] for v in values]


def conf_env(conf: dict[str, Any]) -> str:
    """``OUTBOX_TEST_CONF`` for a subprocess: ``outbox_x=1.5,outbox_y=3``."""
    return ",".join(f"{key}={value!r}" for key, value in conf.items())


def _conf_from_env() -> dict[str, Any]:
    pairs = (
        item.split("=", 1) for item in os.environ.get("OUTBOX_TEST_CONF", "").split(",") if item
    )
    return {key: ast.literal_eval(value) for key, value in pairs}


app = create_app(
    os.environ.get("OUTBOX_TEST_BROKER", "memory://"),
    os.environ.get("OUTBOX_TEST_QUEUE", "celery"),
    os.environ.get("OUTBOX_TEST_DB", "postgresql://postgres@127.0.0.1:5432/test"),
    **_conf_from_env(),
)
