"""The Celery app of the reliability tests, for the test process, producers and workers.

It uses the SQLAlchemy store, and reads everything from its environment so a worker
subprocess (``celery -A tests.reliability.app worker``) and a producer subprocess
(``python -m tests.reliability.producer``) build the same app as the test:

- ``RELIABILITY_BROKER``: broker URL; ``RELIABILITY_DB``: SQLAlchemy database URL;
- ``RELIABILITY_QUEUE``: the one queue every task goes to;
- ``RELIABILITY_LEDGER``: the directory the tasks record their runs in (:mod:`ledger`);
- ``RELIABILITY_BEAT_SCHEDULE``: where ``worker -B`` keeps beat's schedule file;
- ``RELIABILITY_CONF``: optional JSON object of extra Celery settings.

Every task records ``done <key>`` when its body finished; the tests count those lines.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery, Task
from sqlalchemy import Column, Engine, MetaData, String, Table, create_engine

from celery_outbox import OutboxTask, install_store
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.sqlalchemy import metadata as outbox_metadata
from tests.reliability import ledger

RECORD = "reliability.record"
FLAKY = "reliability.flaky"
DOOMED = "reliability.doomed"
SLOW = "reliability.slow"

#: Retries of ``doomed`` before it becomes a dead letter.
DOOMED_RETRIES = 2

#: The tests' own table: the keys whose dispatch committed (written in the same transaction).
test_metadata = MetaData()
expected_table = Table(
    "reliability_expected", test_metadata, Column("key", String(200), primary_key=True)
)


class FlakyError(Exception):
    """Raised by ``flaky`` while it has retries left to burn."""


class DoomedError(Exception):
    """Raised by ``doomed`` on every attempt."""


class FastRetries(OutboxTask):
    """Retry windows of 0-0.2, 0.2-0.4, 0.4-0.8 s ..., capped at 1 s: a test's timescale."""

    retry_backoff = 0.2
    retry_backoff_max = 1.0


def make_engine(url: str) -> Engine:
    """An engine that notices a restarted server (pre-ping) and fails fast when it is down."""
    connect_args = {"connect_timeout": 2} if url.startswith("postgresql") else {}
    return create_engine(
        url, pool_pre_ping=True, pool_size=5, max_overflow=5, connect_args=connect_args
    )


def create_tables(engine: Engine) -> None:
    """Create the outbox tables and the tests' own table."""
    outbox_metadata.create_all(engine)
    test_metadata.create_all(engine)


def create_app(
    *, broker: str, db_url: str, queue: str, ledger_dir: str, beat_schedule: str = "", **conf: Any
) -> tuple[Celery, SQLAlchemyOutboxStore]:
    """The app and its store; ``conf`` overrides the (fast) outbox settings below."""
    app = Celery("reliability", broker=broker, set_as_current=False)
    app.conf.update(
        {
            "task_default_queue": queue,
            "task_ignore_result": True,
            "broker_connection_retry_on_startup": True,
            "broker_connection_max_retries": None,
            "broker_transport_options": {"visibility_timeout": 20},
            "worker_hijack_root_logger": False,
            "worker_prefetch_multiplier": 1,
            # No pub/sub connection for remote control: kombu's Redis transport can crash the
            # worker ("'NoneType' object has no attribute 'hostname'") reconnecting it.
            "worker_enable_remote_control": False,
            "beat_schedule_filename": beat_schedule or os.devnull,
            "outbox_sweep_interval": 0.5,
            "outbox_publish_grace": 0.5,
            "outbox_claim_lease": 5.0,
            "outbox_park_after": 1.0,
            "outbox_publish_timeout": 1.0,
            **conf,
        }
    )
    _register_tasks(app, ledger_dir)
    store = SQLAlchemyOutboxStore(engine=make_engine(db_url))
    install_store(app, store)
    return app, store


def _register_tasks(app: Celery, ledger_dir: str) -> None:
    def record(self: Task[Any, Any], key: str) -> None:
        ledger.append(ledger_dir, ledger.DONE, key)

    def flaky(self: Task[Any, Any], key: str, failures: int) -> None:
        ledger.append(ledger_dir, ledger.STARTED, key)
        if self.request.retries < failures:
            raise FlakyError(f"{key}: attempt {self.request.retries} fails")
        ledger.append(ledger_dir, ledger.DONE, key)

    def doomed(self: Task[Any, Any], key: str) -> None:
        ledger.append(ledger_dir, ledger.STARTED, key)
        raise DoomedError(f"{key} always fails")

    def slow(self: Task[Any, Any], key: str, seconds: float) -> None:
        ledger.append(ledger_dir, ledger.STARTED, key)
        time.sleep(seconds)
        ledger.append(ledger_dir, ledger.DONE, key)

    app.task(name=RECORD, base=FastRetries, bind=True, shared=False)(record)
    app.task(name=FLAKY, base=FastRetries, bind=True, shared=False, max_retries=10)(flaky)
    app.task(name=DOOMED, base=FastRetries, bind=True, shared=False, max_retries=DOOMED_RETRIES)(
        doomed
    )
    app.task(name=SLOW, base=FastRetries, bind=True, shared=False)(slow)


def env_app() -> tuple[Celery, SQLAlchemyOutboxStore]:
    """The app built from ``RELIABILITY_*`` environment variables."""
    return create_app(
        broker=os.environ["RELIABILITY_BROKER"],
        db_url=os.environ["RELIABILITY_DB"],
        queue=os.environ["RELIABILITY_QUEUE"],
        ledger_dir=os.environ["RELIABILITY_LEDGER"],
        beat_schedule=os.environ.get("RELIABILITY_BEAT_SCHEDULE", ""),
        **json.loads(os.environ.get("RELIABILITY_CONF") or "{}"),
    )


if "RELIABILITY_BROKER" in os.environ:
    app, store = env_app()
