"""The Celery apps of the workflow chaos scenario (``test_workflow_chaos.py``).

Two apps over one broker server (a throwaway Redis; each on its own database), each run
by its own prefork worker:

- ``outbox`` (:func:`create_outbox_app`): the reliability app (SQLAlchemy store, no
  result backend) with atomic ``OutboxTask`` steps. ``wfc.step`` records its key in
  ``wfc_effect`` (primary key: a second commit of a step would violate it) and appends a
  row to ``wfc_run`` (no key: every committed run is one row), both through
  :func:`celery_outbox.sqlalchemy.atomic_session`, in the step's own transaction, and
  returns ``value + 1``; ``wfc.collect`` is the chord body and records the results it
  was given the same way.
- ``plain`` (:func:`create_plain_app`): plain Celery tasks (no outbox) with
  ``acks_late`` and ``reject_on_worker_lost``, a Redis result backend (Celery's own chord
  join), writing the same effects into ``wfc_plain_run`` (no key) in a transaction of
  their own: a step run twice is two rows, a step never run is none.

Every body run also appends ``started <key>`` to the ledger before it writes, killed and
rolled-back runs included, and a duplicate delivery an atomic step skipped appends
``skipped <task id>``. Run a worker with ``celery -A tests.reliability.workflow_chaos_app
worker`` and ``RELIABILITY_*`` variables plus ``WFC_VARIANT`` (``outbox`` or ``plain``)
and, for ``plain``, ``WFC_BACKEND``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery, Task
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, Text, insert, select
from sqlalchemy.orm import Session

from celery_outbox.signals import task_duplicate_skipped
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, atomic_session
from tests.reliability import ledger
from tests.reliability.app import FastRetries, create_app, create_tables, make_engine

STEP, COLLECT = "wfc.step", "wfc.collect"
PLAIN_STEP, PLAIN_COLLECT = "wfc.plain_step", "wfc.plain_collect"
#: Ledger event of a duplicate delivery an atomic step skipped (keyed by task id).
SKIPPED = "skipped"

wfc_metadata = MetaData()
#: One row per committed atomic step: a second commit of the same key is a duplicate key.
effect_table = Table(
    "wfc_effect",
    wfc_metadata,
    Column("key", String(100), primary_key=True),
    Column("value", Text, nullable=False),
)
#: One row per committed atomic step run, with no key (counts runs, duplicates included).
run_table = Table(
    "wfc_run",
    wfc_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", String(100), nullable=False),
)
#: One row per committed plain Celery step run (no key), with what it recorded.
plain_run_table = Table(
    "wfc_plain_run",
    wfc_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", String(100), nullable=False),
    Column("value", Text, nullable=False),
)


def create_wfc_tables(engine: Engine) -> None:
    """Create the outbox tables, the reliability tables and this scenario's."""
    create_tables(engine)
    wfc_metadata.create_all(engine)


def runs(engine: Engine, table: Table) -> list[tuple[str, Any]]:
    """Every ``(key, value)`` of ``wfc_run`` joined to its effect, or of ``wfc_plain_run``."""
    with engine.connect() as conn:
        if table is run_table:
            query = select(run_table.c.key, effect_table.c.value).join_from(
                run_table, effect_table, run_table.c.key == effect_table.c.key, isouter=True
            )
        else:
            query = select(plain_run_table.c.key, plain_run_table.c.value)
        return [(row.key, json.loads(row.value or "null")) for row in conn.execute(query)]


def _record_atomic(ledger_dir: str, key: str, value: Any) -> None:
    ledger.append(ledger_dir, ledger.STARTED, key)
    session = atomic_session()
    session.execute(insert(effect_table).values(key=key, value=json.dumps(value)))
    session.execute(insert(run_table).values(key=key))


def register_outbox_tasks(app: Celery, ledger_dir: str) -> None:
    """The atomic steps: ``step(value, key) -> value + 1`` and ``collect(results, key)``."""

    def step(self: Task[Any, Any], value: int, key: str) -> int:
        _record_atomic(ledger_dir, key, value + 1)
        return value + 1

    def collect(self: Task[Any, Any], results: list[int], key: str) -> list[int]:
        _record_atomic(ledger_dir, key, results)
        return results

    for name, body in ((STEP, step), (COLLECT, collect)):
        app.task(
            name=name, base=FastRetries, bind=True, shared=False, atomic=True, ignore_result=True
        )(body)

    def skipped(sender: Task[Any, Any], task_id: str, **_: Any) -> None:
        if sender.name in (STEP, COLLECT):
            ledger.append(ledger_dir, SKIPPED, task_id)

    task_duplicate_skipped.connect(skipped, weak=False)


def create_outbox_app(
    *, broker: str, db_url: str, queue: str, ledger_dir: str, **conf: Any
) -> tuple[Celery, SQLAlchemyOutboxStore]:
    """The reliability app (no result backend) with the atomic workflow steps."""
    app, store = create_app(
        broker=broker, db_url=db_url, queue=queue, ledger_dir=ledger_dir, **conf
    )
    register_outbox_tasks(app, ledger_dir)
    return app, store


def create_plain_app(
    *, broker: str, backend: str, db_url: str, queue: str, ledger_dir: str
) -> tuple[Celery, Engine]:
    """A plain Celery app (no outbox) with a Redis result backend, and its engine."""
    app = Celery("wfc_plain", broker=broker, backend=backend, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        broker_transport_options={"visibility_timeout": 20},
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
        worker_enable_remote_control=False,  # as tests.reliability.app explains
    )
    engine = make_engine(db_url)

    def record(key: str, value: Any) -> None:
        ledger.append(ledger_dir, ledger.STARTED, key)
        with Session(engine) as session, session.begin():
            session.execute(insert(plain_run_table).values(key=key, value=json.dumps(value)))

    def plain_step(value: int, key: str) -> int:
        record(key, value + 1)
        return value + 1

    def plain_collect(results: list[int], key: str) -> list[int]:
        record(key, results)
        return results

    app.task(name=PLAIN_STEP, shared=False)(plain_step)
    app.task(name=PLAIN_COLLECT, shared=False)(plain_collect)
    return app, engine


def _env_app() -> Celery:
    common = {
        "broker": os.environ["RELIABILITY_BROKER"],
        "db_url": os.environ["RELIABILITY_DB"],
        "queue": os.environ["RELIABILITY_QUEUE"],
        "ledger_dir": os.environ["RELIABILITY_LEDGER"],
    }
    if os.environ.get("WFC_VARIANT") == "plain":
        return create_plain_app(backend=os.environ["WFC_BACKEND"], **common)[0]
    conf = json.loads(os.environ.get("RELIABILITY_CONF") or "{}")
    return create_outbox_app(**common, **conf)[0]


if "RELIABILITY_BROKER" in os.environ:
    app = _env_app()
