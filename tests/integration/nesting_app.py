"""A Celery app whose task records how deeply nested its argument was, for the depth tests.

Broker (``OUTBOX_TEST_BROKER``), queue (``OUTBOX_TEST_QUEUE``), database
(``OUTBOX_TEST_DATABASE``, an SQLAlchemy URL) and output file (``OUTBOX_TEST_OUTPUT``)
come from the environment, so a worker subprocess builds the same app as the test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from celery import Celery, Task
from sqlalchemy import create_engine

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, metadata

MEASURE = "nesting.measure"


def create_app(broker_url: str, queue: str, database_url: str) -> Celery:
    """The app with its SQLAlchemy store (tables created if missing)."""
    engine = create_engine(database_url)
    metadata.create_all(engine)
    app = Celery("nesting", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        outbox_publish_grace=0.0,
    )
    install_store(app, SQLAlchemyOutboxStore(engine=engine))
    app.task(base=OutboxTask, bind=True, name=MEASURE, shared=False)(measure)
    return app


def depth_of(value: Any) -> int:
    """How many lists ``value`` is wrapped in (iteratively: it may be deep)."""
    depth = 0
    while isinstance(value, list):
        value, depth = value[0] if value else None, depth + 1
    return depth


def measure(self: Task, tree: Any) -> int:
    """Append this run and the depth of ``tree`` to the output file."""
    line = json.dumps({"task_id": self.request.id, "depth": depth_of(tree)})
    with Path(os.environ["OUTBOX_TEST_OUTPUT"]).open("a") as output:
        output.write(line + "\n")
    return depth_of(tree)


def runs(path: Path) -> list[dict[str, Any]]:
    """The runs recorded so far in ``path``."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if "OUTBOX_TEST_DATABASE" in os.environ:
    app = create_app(
        os.environ["OUTBOX_TEST_BROKER"],
        os.environ["OUTBOX_TEST_QUEUE"],
        os.environ["OUTBOX_TEST_DATABASE"],
    )
