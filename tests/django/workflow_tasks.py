"""Tasks of the Django workflow end-to-end tests, shared by the test process and its worker.

Every step is an atomic ``OutboxTask`` writing one row of :data:`EFFECT_TABLE` in its own
transaction (the key is unique: an effect twice would fail the step).
"""

from __future__ import annotations

import json
from typing import Any

from celery import Celery, Task
from django.db import connection

from celery_outbox import OutboxTask

ADD = "dwf.add"
COLLECT = "dwf.collect"
FAILS_UNTIL = "dwf.fails_until"
#: One row per step run (``key`` unique), a table of the tests' own.
EFFECT_TABLE = "dwf_effect"
#: Keys ``fails_until`` lets pass.
PASS_TABLE = "dwf_pass"


def create_workflow_app(broker_url: str, queue: str) -> Celery:
    """The app of the workflow tests (no result backend), every task routed to ``queue``."""
    app = Celery("dwf", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        outbox_publish_grace=0.0,
    )
    atomic = {"base": OutboxTask, "shared": False, "atomic": True, "bind": True}
    app.task(name=ADD, **atomic)(add)
    app.task(name=COLLECT, **atomic)(collect)
    app.task(name=FAILS_UNTIL, max_retries=0, **atomic)(fails_until)
    return app


def create_tables() -> None:
    """Create :data:`EFFECT_TABLE` and :data:`PASS_TABLE` if needed."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {EFFECT_TABLE} "
            "(key varchar(100) PRIMARY KEY, value text NOT NULL)"
        )
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {PASS_TABLE} (key varchar(100) PRIMARY KEY)")


def effect(key: str) -> Any:
    """The committed value step ``key`` recorded, or ``None``."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT value FROM {EFFECT_TABLE} WHERE key = %s", [key])
        row = cursor.fetchone()
    return None if row is None else json.loads(row[0])


def let_pass(key: str) -> None:
    """Let ``fails_until`` with ``key`` succeed from now on."""
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {PASS_TABLE} (key) VALUES (%s)", [key])


def _record(key: str, value: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {EFFECT_TABLE} (key, value) VALUES (%s, %s)", [key, json.dumps(value)]
        )


def add(self: Task[Any, Any], x: int, y: int, key: str) -> int:
    """Record ``key`` and return ``x + y``."""
    _record(key, x + y)
    return x + y


def collect(self: Task[Any, Any], results: Any, key: str) -> Any:
    """A chord body: record the header's results, in order."""
    _record(key, results)
    return results


def fails_until(self: Task[Any, Any], value: Any, key: str) -> Any:
    """Fail (no retries: a dead letter) until the test lets ``key`` pass."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {PASS_TABLE} WHERE key = %s", [key])
        if cursor.fetchone() is None:
            raise RuntimeError(f"{key} is not allowed to pass yet")
    _record(key, value)
    return value
