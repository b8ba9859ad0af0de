"""A Celery app whose outbox tasks send their retries to a retry queue, for the e2e tests
of ``retry_queue`` (SQLAlchemy store, no Django).

It reads its broker (``OUTBOX_TEST_BROKER``), queue (``OUTBOX_TEST_QUEUE``), retry queue
(``OUTBOX_TEST_RETRY_QUEUE``), database (``OUTBOX_TEST_DATABASE``) and output file
(``OUTBOX_TEST_OUTPUT``) from the environment, so worker subprocesses build the same app
as the test. Every run appends a line: its task id, retry number, the queue it was
delivered from and the worker that ran it. A task fails while the file
``OUTBOX_TEST_OUTPUT`` + ``.healed`` does not exist and it has retries left in its plan.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery import Celery, Task
from sqlalchemy import Engine, create_engine, func, select

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.sqlalchemy import metadata as outbox_metadata

#: Fails twice (autoretry), then succeeds.
AUTORETRY = "rq_e2e.autoretry"
#: Calls ``self.retry()`` twice, then succeeds.
EXPLICIT = "rq_e2e.explicit"
#: Retries once with a countdown past ``outbox_park_after`` (a parked retry), then succeeds.
PARKED = "rq_e2e.parked"
#: Fails until healed, one retry allowed: a dead letter.
DEAD = "rq_e2e.dead"
#: ``outbox_park_after`` of the app, and the countdown of :data:`PARKED` (longer: parked).
PARK_AFTER, PARKED_COUNTDOWN = 0.2, 1.0


class Flaky(RuntimeError):
    """What the failing tasks raise."""


def create_app(
    broker_url: str, queue: str, retry_queue: str, database_url: str
) -> tuple[Celery, Engine, SQLAlchemyOutboxStore]:
    """The app, its engine and its store (tables created if missing)."""
    engine = create_engine(database_url)
    outbox_metadata.create_all(engine)
    app = Celery("rq_e2e", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        outbox_publish_grace=0.0,
        outbox_park_after=PARK_AFTER,
        outbox_retry_queue=retry_queue,  # the setting: AUTORETRY, EXPLICIT, PARKED
    )
    store = SQLAlchemyOutboxStore(engine=engine)
    install_store(app, store)
    fast = {"retry_backoff": 0.05, "retry_backoff_max": 0.2, "shared": False, "bind": True}
    app.task(base=OutboxTask, name=AUTORETRY, autoretry_for=(Flaky,), **fast)(_autoretry)
    app.task(base=OutboxTask, name=EXPLICIT, **fast)(_explicit)
    app.task(base=OutboxTask, name=PARKED, **fast)(_parked)
    app.task(
        base=OutboxTask,
        name=DEAD,
        autoretry_for=(Flaky,),
        max_retries=1,
        retry_queue=retry_queue,  # the task's own option
        **fast,
    )(_dead)
    return app, engine, store


def _record(task: Task) -> int:
    request = task.request
    line = {
        "task_id": request.id,
        "retries": request.retries,
        "queue": (request.delivery_info or {}).get("routing_key"),
        "hostname": request.hostname,
    }
    with _output().open("a") as output:
        output.write(json.dumps(line) + "\n")
    return int(request.retries)


def _autoretry(self: Task) -> None:
    if _record(self) < 2:
        raise Flaky("down")


def _explicit(self: Task) -> None:
    if _record(self) < 2:
        raise self.retry()


def _parked(self: Task) -> None:
    if _record(self) < 1:
        # Until its publisher deletes the dispatch's own row (slow on a busy machine), a
        # retry cannot be parked under the same task id and rides on an ETA instead, by
        # design (worker/republish.py): wait for the row to go, so that this one parks.
        _until_no_pending_row(self.request.id)
        raise self.retry(countdown=PARKED_COUNTDOWN)


def _until_no_pending_row(task_id: str, *, timeout: float = 30.0) -> None:
    table = _store.tables.outbox
    query = select(func.count()).where(table.c.task_id == task_id, table.c.status == "pending")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with _engine.connect() as conn:
            if not conn.execute(query).scalar():
                return
        time.sleep(0.05)


def _dead(self: Task) -> None:
    _record(self)
    if not healed(_output()):
        raise Flaky("down until healed")


def _output() -> Path:
    return Path(os.environ["OUTBOX_TEST_OUTPUT"])


def healed(output: Path) -> bool:
    """Whether :data:`DEAD` succeeds now (its marker file exists)."""
    return output.with_suffix(".healed").exists()


def runs(path: Path) -> list[dict[str, Any]]:
    """The runs recorded so far in ``path``."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if "OUTBOX_TEST_DATABASE" in os.environ:
    app, _engine, _store = create_app(
        os.environ["OUTBOX_TEST_BROKER"],
        os.environ["OUTBOX_TEST_QUEUE"],
        os.environ["OUTBOX_TEST_RETRY_QUEUE"],
        os.environ["OUTBOX_TEST_DATABASE"],
    )
