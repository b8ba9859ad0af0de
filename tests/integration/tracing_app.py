"""A traced Celery app (SQLAlchemy store, no Django) for ``test_tracing.py``.

The worker process reads its broker (``OUTBOX_TEST_BROKER``), queue
(``OUTBOX_TEST_QUEUE``) and database (``OUTBOX_TEST_DATABASE``) from the environment, and
traces as a production worker would: OpenTelemetry's SDK and
``opentelemetry-instrumentation-celery``, its spans appended to ``OUTBOX_TEST_SPANS``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import Celery
from sqlalchemy import Engine, create_engine

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.sqlalchemy import metadata as outbox_metadata

RECORD = "tracing.record"
#: Fails its first attempt in a worker process; the retry waits 0.1 s on a broker ETA.
ETA_RETRY = "tracing.eta_retry"
#: Fails its first attempt in a worker process; the retry waits 1 s: parked as a row
#: (``outbox_park_after`` is 0.5 s here), for the sweeper to publish.
PARKED_RETRY = "tracing.parked_retry"
#: Always fails, without retries: a dead letter at once.
DEAD = "tracing.dead"
#: Seconds above which a retry is parked, in this app.
PARK_AFTER = 0.5

#: Task ids whose first attempt failed in this worker process.
_failed: set[str] = set()


class Flaky(RuntimeError):
    """What the failing tasks raise."""


def create_app(
    broker_url: str, queue: str, database_url: str
) -> tuple[Celery, Engine, SQLAlchemyOutboxStore]:
    """The app, its engine and its store (tables created if missing)."""
    engine = create_engine(database_url)
    outbox_metadata.create_all(engine)
    app = Celery("tracing_e2e", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        outbox_publish_grace=0.0,
        outbox_park_after=PARK_AFTER,
    )
    store = SQLAlchemyOutboxStore(engine=engine)
    install_store(app, store)
    app.task(base=OutboxTask, name=RECORD, shared=False)(record)
    retrying = {"retry_jitter": False, "max_retries": 3, "shared": False, "bind": True}
    app.task(base=OutboxTask, name=ETA_RETRY, retry_backoff=0.1, **retrying)(fail_once)
    app.task(base=OutboxTask, name=PARKED_RETRY, retry_backoff=1.0, **retrying)(fail_once_late)
    app.task(base=OutboxTask, name=DEAD, max_retries=0, shared=False)(always_fails)
    return app, engine, store


def record(n: int) -> int:
    """Do nothing worth a trace but run."""
    return n


def fail_once(self: OutboxTask, n: int) -> int:
    """Fail the first attempt of this task id, then succeed."""
    if self.request.id not in _failed:
        _failed.add(self.request.id)
        raise Flaky(f"first attempt of {n}")
    return n


def fail_once_late(self: OutboxTask, n: int) -> int:
    """:func:`fail_once`, failing only after the publisher removed the row it published:
    a retry parked while that row is still there rides on an ETA instead (the row's task
    id is taken), and this task is here to be parked.
    """
    if self.request.id not in _failed:
        time.sleep(0.5)
    return fail_once(self, n)


def always_fails(n: int) -> None:
    """Fail, to end up as a dead letter."""
    raise Flaky(f"always fails: {n}")


def _trace_this_worker(spans: Path) -> None:
    # As a production worker sets tracing up (the solo pool runs tasks in this process).
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    from tests.spans import export_to_file

    export_to_file(spans)
    CeleryInstrumentor().instrument()


if "OUTBOX_TEST_DATABASE" in os.environ:
    app, _engine, _store = create_app(
        os.environ["OUTBOX_TEST_BROKER"],
        os.environ["OUTBOX_TEST_QUEUE"],
        os.environ["OUTBOX_TEST_DATABASE"],
    )
    _trace_this_worker(Path(os.environ["OUTBOX_TEST_SPANS"]))
