"""A Celery app with the SQLAlchemy outbox store and no Django, for the e2e tests.

It reads its broker (``OUTBOX_TEST_BROKER``), queue (``OUTBOX_TEST_QUEUE``), database
(``OUTBOX_TEST_DATABASE``, an SQLAlchemy URL) and output file (``OUTBOX_TEST_OUTPUT``)
from the environment, so a worker subprocess builds the same app as the test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from celery import Celery, Task
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, create_engine, select

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.sqlalchemy import metadata as outbox_metadata

RECORD = "sa_e2e.record"
ALWAYS_FAILS = "sa_e2e.always_fails"

app_metadata = MetaData()
orders = Table(
    "sa_e2e_order",
    app_metadata,
    Column("id", Integer, primary_key=True),
    Column("note", String(50), nullable=False),
)


class Flaky(RuntimeError):
    """What ``always_fails`` raises, every time."""


def create_app(
    broker_url: str, queue: str, database_url: str
) -> tuple[Celery, Engine, SQLAlchemyOutboxStore]:
    """The app, its engine and its store (tables created if missing)."""
    engine = create_engine(database_url)
    outbox_metadata.create_all(engine)
    app_metadata.create_all(engine)
    app = Celery("sa_e2e", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        outbox_publish_grace=0.0,
    )
    store = SQLAlchemyOutboxStore(engine=engine)
    install_store(app, store)
    app.task(base=OutboxTask, bind=True, name=RECORD, shared=False)(_recorder(engine))
    app.task(
        base=OutboxTask,
        name=ALWAYS_FAILS,
        shared=False,
        autoretry_for=(Flaky,),
        max_retries=2,
        retry_backoff=0.05,
        retry_backoff_max=0.2,
    )(always_fails)
    return app, engine, store


def _recorder(engine: Engine) -> Any:
    def record(self: Task, order_id: int) -> bool:
        """Append this run, and whether the dispatching transaction's order exists."""
        with engine.connect() as conn:
            saw = conn.execute(select(orders.c.id).where(orders.c.id == order_id)).first()
        line = json.dumps(
            {"task_id": self.request.id, "order_id": order_id, "saw_order": saw is not None}
        )
        with Path(os.environ["OUTBOX_TEST_OUTPUT"]).open("a") as output:
            output.write(line + "\n")
        return saw is not None

    return record


def always_fails(n: int) -> None:
    """Fail, to end up as a dead letter."""
    raise Flaky(f"attempt failed for {n}")


def runs(path: Path) -> list[dict[str, Any]]:
    """The runs recorded so far in ``path``."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if "OUTBOX_TEST_DATABASE" in os.environ:
    app, _engine, _store = create_app(
        os.environ["OUTBOX_TEST_BROKER"],
        os.environ["OUTBOX_TEST_QUEUE"],
        os.environ["OUTBOX_TEST_DATABASE"],
    )
