"""A Celery app of workflow steps on the SQLAlchemy store, with no result backend.

It reads its broker (``OUTBOX_TEST_BROKER``), queue (``OUTBOX_TEST_QUEUE``), database
(``OUTBOX_TEST_DATABASE``) and, optionally, a result backend (``OUTBOX_TEST_BACKEND``)
from the environment, so a worker subprocess builds the same app as the test. Every
step writes one ``wf_effect`` row in its own transaction (atomic steps through
:func:`atomic_session`): an effect twice would be a duplicate key.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery, Task
from sqlalchemy import (
    Column,
    Engine,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    insert,
    select,
)

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.signals import task_duplicate_skipped
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, atomic_session
from celery_outbox.sqlalchemy import metadata as outbox_metadata

ADD = "wf.add"
COLLECT = "wf.collect"
FAILS_UNTIL = "wf.fails_until"
LOOSE = "wf.loose"

app_metadata = MetaData()
#: One row per step run: ``key`` is unique, so a step's effect cannot happen twice.
effects = Table(
    "wf_effect",
    app_metadata,
    Column("key", String(100), primary_key=True),
    Column("value", Text, nullable=False),
)
#: Keys ``fails_until`` lets pass (the test inserts them to let a step succeed).
passes = Table("wf_pass", app_metadata, Column("key", String(100), primary_key=True))
#: Every delivery of an atomic step that was skipped as a duplicate (its task id).
skipped = Table("wf_skipped", app_metadata, Column("task_id", String(100), nullable=False))


def create_app(
    broker_url: str, queue: str, database_url: str, backend: str | None = None
) -> tuple[Celery, Engine, SQLAlchemyOutboxStore]:
    """The app, its engine and its store (tables created if missing)."""
    engine = create_engine(database_url, pool_size=10)
    outbox_metadata.create_all(engine)
    app_metadata.create_all(engine)
    app = Celery("wf", broker=broker_url, backend=backend, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        outbox_publish_grace=0.0,
        outbox_chord_max_header=50,
    )
    store = SQLAlchemyOutboxStore(engine=engine)
    install_store(app, store)
    atomic = {"base": OutboxTask, "shared": False, "atomic": True, "bind": True}
    app.task(name=ADD, **atomic)(add)
    app.task(name=COLLECT, **atomic)(collect)
    app.task(name=FAILS_UNTIL, max_retries=0, **atomic)(fails_until)
    app.task(name=LOOSE, base=OutboxTask, shared=False, bind=True)(_loose(engine))

    def record_skip(sender: Any, task_id: str, **_: Any) -> None:
        with engine.begin() as conn:
            conn.execute(insert(skipped).values(task_id=task_id))

    task_duplicate_skipped.connect(record_skip, weak=False)
    return app, engine, store


def _effect(key: str, value: Any) -> None:
    atomic_session().execute(insert(effects).values(key=key, value=json.dumps(value)))


def add(self: Task, x: int, y: int, key: str) -> int:
    """Record ``key`` and return ``x + y``."""
    _effect(key, x + y)
    return x + y


def collect(self: Task, results: Any, key: str) -> Any:
    """A chord body: record the results it was given, in order, and pass them on."""
    _effect(key, results)
    return results


def fails_until(self: Task, value: Any, key: str) -> Any:
    """Fail (no retries: a dead letter) until the test lets ``key`` pass."""
    session = atomic_session()
    if session.execute(select(passes.c.key).where(passes.c.key == key)).first() is None:
        raise RuntimeError(f"{key} is not allowed to pass yet")
    _effect(key, value)
    return value


def _loose(engine: Engine) -> Any:
    def loose(self: Task, value: Any, key: str) -> Any:
        """A non-atomic step: record ``key`` in its own transaction."""
        with engine.begin() as conn:
            conn.execute(insert(effects).values(key=key, value=json.dumps(value)))
        return value

    return loose


if "OUTBOX_TEST_DATABASE" in os.environ:
    app, _engine, _store = create_app(
        os.environ["OUTBOX_TEST_BROKER"],
        os.environ["OUTBOX_TEST_QUEUE"],
        os.environ["OUTBOX_TEST_DATABASE"],
        os.environ.get("OUTBOX_TEST_BACKEND") or None,
    )
