"""The Celery app of the atomic chaos scenario (``test_atomic_chaos.py``): the reliability
app plus two pairs of tasks and the tables they write.

- ``atomic_add`` (``atomic = True``) adds one to the ``atomic`` counter row and records an
  ``atomic-add`` effect in :func:`celery_outbox.sqlalchemy.atomic_session`, and dispatches
  ``atomic_follow``, which records an ``atomic-follow`` effect the same way: each body, its
  dispatch and its ``CompletedTask`` row commit together.
- ``plain_add`` and ``plain_follow`` are their non-atomic twins: the same writes and the
  same dispatch in one transaction of their own (the usual outbox pattern), with nothing
  that recognises a second delivery of the same task id.

The effect table has no unique key: a second run of a body adds a second row, so the
table counts every run that committed. Every body run also appends ``started <key>`` to
the ledger before it writes (rolled-back runs included), and a duplicate delivery an
atomic task skipped appends ``skipped <task id>`` (:data:`task_duplicate_skipped`).

Run a worker of it with ``celery -A tests.reliability.atomic_app worker`` and the
``RELIABILITY_*`` variables of :mod:`tests.reliability.app`.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, Task
from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session

from celery_outbox.signals import task_duplicate_skipped
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from tests.reliability import ledger
from tests.reliability.app import FastRetries, create_app, create_tables

ATOMIC_ADD = "reliability.atomic_add"
ATOMIC_FOLLOW = "reliability.atomic_follow"
PLAIN_ADD = "reliability.plain_add"
PLAIN_FOLLOW = "reliability.plain_follow"

#: The (add, follow-up) task names of each variant.
VARIANTS = {"atomic": (ATOMIC_ADD, ATOMIC_FOLLOW), "plain": (PLAIN_ADD, PLAIN_FOLLOW)}

#: Ledger event of a duplicate delivery an atomic task skipped (keyed by task id).
SKIPPED = "skipped"

chaos_metadata = MetaData()
#: One row per variant (``atomic``, ``plain``): how many times its add task committed.
counter_table = Table(
    "reliability_counter",
    chaos_metadata,
    Column("name", String(20), primary_key=True),
    Column("value", Integer, nullable=False),
)
#: One row per committed body run: ``kind`` is ``<variant>-add`` or ``<variant>-follow``.
effect_table = Table(
    "reliability_effect",
    chaos_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(20), nullable=False),
    Column("key", String(200), nullable=False),
)


def create_chaos_tables(engine: Engine) -> None:
    """Create the outbox tables, the reliability tables and this scenario's, with both
    counters at zero.
    """
    create_tables(engine)
    chaos_metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(counter_table), [{"name": name, "value": 0} for name in VARIANTS])


def counter(engine: Engine, variant: str) -> int:
    """The counter of ``variant``."""
    with engine.connect() as conn:
        query = select(counter_table.c.value).where(counter_table.c.name == variant)
        return int(conn.execute(query).scalar_one())


def effects(engine: Engine, kind: str) -> tuple[int, set[str]]:
    """How many ``kind`` effect rows there are, and their distinct keys."""
    with engine.connect() as conn:
        keys = conn.execute(select(effect_table.c.key).where(effect_table.c.kind == kind))
        found = list(keys.scalars())
    return len(found), set(found)


def effect_rows(engine: Engine) -> int:
    """All effect rows (a cheap progress measure)."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(effect_table)).scalar_one())


def _write(session: Session, variant: str, step: str, key: str) -> None:
    if step == "add":
        c = counter_table.c
        session.execute(update(counter_table).where(c.name == variant).values(value=c.value + 1))
    session.execute(insert(effect_table).values(kind=f"{variant}-{step}", key=key))


def register_chaos_tasks(app: Celery, store: SQLAlchemyOutboxStore, ledger_dir: str) -> None:
    """Register the four tasks on ``app`` and log skipped duplicates to ``ledger_dir``."""

    def atomic_add(self: Task[Any, Any], key: str) -> None:
        from celery_outbox.sqlalchemy import atomic_session

        ledger.append(ledger_dir, ledger.STARTED, f"atomic-{key}")
        _write(atomic_session(), "atomic", "add", key)
        app.tasks[ATOMIC_FOLLOW].delay(key)

    def atomic_follow(self: Task[Any, Any], key: str) -> None:
        from celery_outbox.sqlalchemy import atomic_session

        ledger.append(ledger_dir, ledger.STARTED, f"atomic-follow-{key}")
        _write(atomic_session(), "atomic", "follow", key)

    def plain_add(self: Task[Any, Any], key: str) -> None:
        ledger.append(ledger_dir, ledger.STARTED, f"plain-{key}")
        with Session(store.engine) as session, session.begin(), store.bind_session(session):
            _write(session, "plain", "add", key)
            app.tasks[PLAIN_FOLLOW].delay(key)

    def plain_follow(self: Task[Any, Any], key: str) -> None:
        ledger.append(ledger_dir, ledger.STARTED, f"plain-follow-{key}")
        with Session(store.engine) as session, session.begin():
            _write(session, "plain", "follow", key)

    for name, body, atomic in (
        (ATOMIC_ADD, atomic_add, True),
        (ATOMIC_FOLLOW, atomic_follow, True),
        (PLAIN_ADD, plain_add, False),
        (PLAIN_FOLLOW, plain_follow, False),
    ):
        app.task(name=name, base=FastRetries, bind=True, shared=False, atomic=atomic)(body)

    def skipped(sender: Task[Any, Any], task_id: str, **_: Any) -> None:
        if sender.name in (ATOMIC_ADD, ATOMIC_FOLLOW):
            ledger.append(ledger_dir, SKIPPED, task_id)

    task_duplicate_skipped.connect(skipped, weak=False)


def create_chaos_app(
    *, broker: str, db_url: str, queue: str, ledger_dir: str, **conf: Any
) -> tuple[Celery, SQLAlchemyOutboxStore]:
    """The reliability app with the chaos tasks (``conf`` as :func:`create_app` takes it)."""
    app, store = create_app(
        broker=broker, db_url=db_url, queue=queue, ledger_dir=ledger_dir, **conf
    )
    register_chaos_tasks(app, store, ledger_dir)
    return app, store


def _env_app() -> tuple[Celery, SQLAlchemyOutboxStore]:
    import json

    return create_chaos_app(
        broker=os.environ["RELIABILITY_BROKER"],
        db_url=os.environ["RELIABILITY_DB"],
        queue=os.environ["RELIABILITY_QUEUE"],
        ledger_dir=os.environ["RELIABILITY_LEDGER"],
        **json.loads(os.environ.get("RELIABILITY_CONF") or "{}"),
    )


if "RELIABILITY_BROKER" in os.environ:
    app, store = _env_app()
