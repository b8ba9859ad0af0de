"""Tasks of the atomic end-to-end tests, shared by the test process and its workers.

Each atomic task adds one to its key's row of :data:`COUNTER_TABLE` and dispatches the
follow-up ``atomic.follow`` in its transaction. Every run of a body, and every skipped
duplicate (the Django signal ``task_duplicate_skipped``), appends a JSON line to
``OUTBOX_TEST_OUTPUT``: a file is outside the transaction, so it counts runs, rolled back
or not.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery import Celery, Task
from django.db import connection

from celery_outbox import OutboxTask

#: The counter rows (``name``, ``n``), a table of the tests' own.
COUNTER_TABLE = "atomic_e2e_counter"


def create_atomic_app(broker_url: str, queue: str, **conf: Any) -> Celery:
    """The app of the atomic tests, every task routed to ``queue``."""
    app = Celery("atomic_e2e", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        outbox_sweep_interval=0.5,
        outbox_publish_grace=0.0,
        **conf,
    )
    task = app.task
    task(base=OutboxTask, bind=True, name="atomic.follow")(follow)
    task(base=OutboxTask, bind=True, name="atomic.bump", atomic=True)(bump)
    task(base=OutboxTask, bind=True, name="atomic.flaky", atomic=True, retry_backoff=0.1)(flaky)
    task(base=OutboxTask, bind=True, name="atomic.slow", atomic=True)(slow)
    return app


def log(event: str, task: str, task_id: str, **details: Any) -> None:
    """Append one event to ``OUTBOX_TEST_OUTPUT``."""
    line = {"event": event, "task": task, "id": task_id, "pid": os.getpid(), **details}
    with Path(os.environ["OUTBOX_TEST_OUTPUT"]).open("a") as output:
        output.write(json.dumps(line) + "\n")


def events(path: Path) -> list[dict[str, Any]]:
    """Every event in ``path`` so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def create_counter(name: str) -> None:
    """Create :data:`COUNTER_TABLE` if needed, and the row ``name`` at 0."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {COUNTER_TABLE} "
            "(name varchar(100) PRIMARY KEY, n integer NOT NULL)"
        )
        cursor.execute(f"INSERT INTO {COUNTER_TABLE} (name, n) VALUES (%s, 0)", [name])


def counter(name: str) -> int:
    """The committed value of counter ``name``."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT n FROM {COUNTER_TABLE} WHERE name = %s", [name])
        (value,) = cursor.fetchone()
    return int(value)


def _add_one_and_follow(task: Task[Any, Any], key: str) -> int:
    log("run", task.name, task.request.id, key=key, retries=task.request.retries)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {COUNTER_TABLE} SET n = n + 1 WHERE name = %s", [key])
    task.app.tasks["atomic.follow"].delay(key)
    return counter(key)


def bump(self: Task[Any, Any], key: str) -> int:
    """Add one and dispatch the follow-up; return the counter as this run left it."""
    return _add_one_and_follow(self, key)


def flaky(self: Task[Any, Any], key: str) -> int:
    """Add one and dispatch the follow-up, then fail on the first attempt."""
    value = _add_one_and_follow(self, key)
    if self.request.retries == 0:
        raise ConnectionError(f"flaky {key}")
    return value


def slow(self: Task[Any, Any], key: str, seconds: float) -> int:
    """Add one and dispatch the follow-up, then hold the transaction ``seconds``."""
    value = _add_one_and_follow(self, key)
    time.sleep(seconds)
    return value


def follow(self: Task[Any, Any], key: str) -> None:
    """Record that the follow-up ran."""
    log("follow", self.name, self.request.id, key=key)


def log_skipped(sender: Any, task_id: str, completed_at: Any, **kwargs: Any) -> None:
    """Receiver of ``django_outbox.signals.task_duplicate_skipped``: record the skip."""
    log("skipped", sender.name, task_id, completed_at=completed_at.isoformat())
