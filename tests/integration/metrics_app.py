"""A Celery app counting metrics (SQLAlchemy store, no Django) for ``test_metrics_counters.py``.

The worker process reads its broker (``OUTBOX_TEST_BROKER``), queue (``OUTBOX_TEST_QUEUE``)
and database (``OUTBOX_TEST_DATABASE``) from the environment and imports
``celery_outbox.metrics`` as a production worker would; run as a prefork worker with
``PROMETHEUS_MULTIPROC_DIR`` set, each pool child writes its counters there.
"""

from __future__ import annotations

import os
import time

from celery import Celery
from sqlalchemy import Engine, create_engine

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.sqlalchemy import metadata as outbox_metadata

RECORD = "metrics.record"
#: Fails its first attempt; the retry waits 0.1 s on a broker ETA.
ETA_RETRY = "metrics.eta_retry"
#: Fails its first attempt; the retry waits 1 s: parked as a row (``outbox_park_after``
#: is 0.5 s here).
PARKED_RETRY = "metrics.parked_retry"
#: Always fails, without retries: a dead letter at once.
DEAD = "metrics.dead"
#: An atomic task: a second delivery of a task id that completed is skipped.
ATOMIC = "metrics.atomic"


class Flaky(RuntimeError):
    """What the failing tasks raise."""


def create_app(
    broker_url: str, queue: str, database_url: str
) -> tuple[Celery, Engine, SQLAlchemyOutboxStore]:
    """The app, its engine and its store (tables created if missing)."""
    engine = create_engine(database_url)
    outbox_metadata.create_all(engine)
    # No pooled connection may outlive the fork: two pool children sharing one socket
    # read each other's replies (each child opens its own on first use).
    engine.dispose()
    app = Celery("metrics_e2e", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        outbox_publish_grace=0.0,
        outbox_park_after=0.5,
        outbox_publish_timeout=0.5,
    )
    store = SQLAlchemyOutboxStore(engine=engine)
    install_store(app, store)
    app.task(base=OutboxTask, name=RECORD, shared=False)(record)
    app.task(base=OutboxTask, name=ATOMIC, atomic=True, shared=False)(record)
    retrying = {"retry_jitter": False, "max_retries": 3, "shared": False, "bind": True}
    app.task(base=OutboxTask, name=ETA_RETRY, retry_backoff=0.1, **retrying)(fail_once)
    app.task(base=OutboxTask, name=PARKED_RETRY, retry_backoff=1.0, **retrying)(fail_once_late)
    app.task(base=OutboxTask, name=DEAD, max_retries=0, shared=False)(always_fails)
    return app, engine, store


def record(n: int) -> int:
    """Succeed."""
    return n


def fail_once(self: OutboxTask, n: int) -> int:
    """Fail the first attempt (in whichever pool child), then succeed."""
    if not self.request.retries:
        raise Flaky(f"first attempt of {n}")
    return n


def fail_once_late(self: OutboxTask, n: int) -> int:
    """:func:`fail_once`, failing only after the publisher removed the row it published
    (a retry parked while that row is there rides on an ETA instead).
    """
    if not self.request.retries:
        time.sleep(0.5)
    return fail_once(self, n)


def always_fails(n: int) -> None:
    """Fail, to end up as a dead letter."""
    raise Flaky(f"always fails: {n}")


if "OUTBOX_TEST_DATABASE" in os.environ:
    import celery_outbox.metrics  # noqa: F401 - the worker counts, as in production

    app, _engine, _store = create_app(
        os.environ["OUTBOX_TEST_BROKER"],
        os.environ["OUTBOX_TEST_QUEUE"],
        os.environ["OUTBOX_TEST_DATABASE"],
    )
