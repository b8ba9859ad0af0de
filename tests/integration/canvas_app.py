"""A Celery app whose every task is an ``OutboxTask`` (``task_cls``), as a user moving a whole
project to the outbox would have it: Redis broker and result backend, the SQLAlchemy store
on PostgreSQL. For the tests of ``Task.replace()`` and of what ``apply_async`` returns.

It reads its broker and result backend (``OUTBOX_TEST_BROKER``), queue
(``OUTBOX_TEST_QUEUE``), database (``OUTBOX_TEST_DATABASE``) and output file
(``OUTBOX_TEST_OUTPUT``) from the environment, so a worker subprocess builds the same app.
Every task run appends ``{"done": task_id, "name": ...}`` to the output after it finished
(``task_postrun``: a replaced task too), so a test knows when a worker's dispatches are made.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from celery import Celery, Task, group, signals
from sqlalchemy import Engine, create_engine

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.sqlalchemy import metadata as outbox_metadata

ECHO = "canvas.echo"
REPLACED = "canvas.replaced"
REPLACED_BY_GROUP = "canvas.replaced_by_group"
REPLACED_BY_CHAIN = "canvas.replaced_by_chain"
RESCHEDULED = "canvas.rescheduled"
IGNORED = "canvas.ignored"


def create_app(
    broker_url: str, queue: str, database_url: str
) -> tuple[Celery, Engine, SQLAlchemyOutboxStore]:
    """The app, its engine and its store (tables created if missing)."""
    engine = create_engine(database_url)
    outbox_metadata.create_all(engine)
    app = Celery(
        "canvas", broker=broker_url, backend=broker_url, task_cls=OutboxTask, set_as_current=False
    )
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        outbox_publish_grace=0.0,
    )
    store = SQLAlchemyOutboxStore(engine=engine)
    install_store(app, store)
    echo = app.task(name=ECHO, shared=False)(_echo)

    @app.task(name=REPLACED, bind=True, shared=False)
    def replaced(self: Task, value: str) -> Any:
        """Replace itself with ``echo(value)``: the replacement reuses this task's id."""
        return self.replace(echo.si(value))

    @app.task(name=REPLACED_BY_GROUP, bind=True, shared=False)
    def replaced_by_group(self: Task, value: str) -> Any:
        """Replace itself with a group of two: Celery's chord body takes this task's id and
        is sent by the last of the group, from that task's context.
        """
        return self.replace(group(echo.si(f"{value}-a"), echo.si(f"{value}-b")))

    @app.task(name=REPLACED_BY_CHAIN, bind=True, shared=False)
    def replaced_by_chain(self: Task, value: str) -> Any:
        """Replace itself with a chain of two: the last step takes this task's id and is
        sent by the first step, from that step's context.
        """
        return self.replace(echo.si(f"{value}-1") | echo.si(f"{value}-2"))

    @app.task(name=RESCHEDULED, bind=True, shared=False)
    def rescheduled(self: Task, times: int) -> int:
        """Dispatch itself again under its own id, ``times`` more times."""
        if times:
            self.apply_async((times - 1,), task_id=self.request.id)
        return times

    app.task(name=IGNORED, ignore_result=True, shared=False)(_echo)
    return app, engine, store


def _echo(value: Any) -> Any:
    """Return ``value``."""
    return value


@signals.task_postrun.connect
def _done(sender: Any = None, task_id: str | None = None, **kwargs: Any) -> None:
    path = os.environ.get("OUTBOX_TEST_OUTPUT")
    if path and sender is not None and sender.name.startswith("canvas."):
        with Path(path).open("a") as output:
            output.write(json.dumps({"done": task_id, "name": sender.name}) + "\n")


def lines(path: Path) -> list[dict[str, Any]]:
    """What the worker wrote to ``path`` so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if "OUTBOX_TEST_DATABASE" in os.environ:
    app, _engine, _store = create_app(
        os.environ["OUTBOX_TEST_BROKER"],
        os.environ["OUTBOX_TEST_QUEUE"],
        os.environ["OUTBOX_TEST_DATABASE"],
    )
