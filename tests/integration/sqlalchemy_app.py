"""A Celery app with the SQLAlchemy outbox store and no Django, for the e2e tests.

It reads its broker (``OUTBOX_TEST_BROKER``), queue (``OUTBOX_TEST_QUEUE``), database
(``OUTBOX_TEST_DATABASE``, an SQLAlchemy URL) and output file (``OUTBOX_TEST_OUTPUT``)
from the environment, so a worker subprocess builds the same app as the test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from celery import Celery, Task
from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    insert,
    select,
    update,
)

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.signals import task_duplicate_skipped
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, atomic_session
from celery_outbox.sqlalchemy import metadata as outbox_metadata

RECORD = "sa_e2e.record"
ALWAYS_FAILS = "sa_e2e.always_fails"
TALLY = "sa_e2e.tally"
FOLLOW = "sa_e2e.follow"
STEP = "sa_e2e.step"

app_metadata = MetaData()
orders = Table(
    "sa_e2e_order",
    app_metadata,
    Column("id", Integer, primary_key=True),
    Column("note", String(50), nullable=False),
)
#: What the atomic ``tally`` adds to (one row per key) and its follow-ups record.
tallies = Table(
    "sa_e2e_tally",
    app_metadata,
    Column("key", String(50), primary_key=True),
    Column("count", Integer, nullable=False),
    Column("follow_ups", Integer, nullable=False),
)


class Flaky(RuntimeError):
    """What ``always_fails`` raises, every time."""


def create_app(
    broker_url: str, queue: str, database_url: str
) -> tuple[Celery, Engine, SQLAlchemyOutboxStore]:
    """The app, its engine and its store (tables created if missing)."""
    engine = create_engine(database_url)
    outbox_metadata.create_all(engine)
    app_metadata.create_all(engine)
    app = Celery("sa_e2e", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        outbox_publish_grace=0.0,
    )
    store = SQLAlchemyOutboxStore(engine=engine)
    install_store(app, store)
    app.task(base=OutboxTask, bind=True, name=RECORD, shared=False)(_recorder(engine))
    app.task(
        base=OutboxTask,
        name=ALWAYS_FAILS,
        shared=False,
        autoretry_for=(Flaky,),
        max_retries=2,
        retry_backoff=0.05,
        retry_backoff_max=0.2,
    )(always_fails)
    follow = app.task(base=OutboxTask, name=FOLLOW, shared=False)(_follow(engine))
    app.task(base=OutboxTask, name=TALLY, shared=False, atomic=True, retry_backoff=0.05)(
        _tally(follow)
    )
    app.task(base=OutboxTask, name=STEP, shared=False, atomic=True, bind=True)(step)
    return app, engine, store


def step(self: Task, done: list[str], key: str) -> list[str]:
    """A chain step: count ``key`` (atomic with the step) and pass the keys so far on."""
    session = atomic_session()
    session.execute(insert(tallies).values(key=key, count=1, follow_ups=0))
    _write({"step": key, "task_id": self.request.id})
    return [*done, key]


def _tally(follow: Task) -> Any:
    def tally(key: str, fail_first: bool = False) -> int:
        """Add one to ``key``'s count, dispatch its follow-up (both atomic with the task's
        ``CompletedTask`` row); with ``fail_first``, the first attempt raises after both.
        """
        session = atomic_session()
        count = session.execute(select(tallies.c.count).where(tallies.c.key == key)).scalar()
        if count is None:
            session.execute(insert(tallies).values(key=key, count=1, follow_ups=0))
        else:
            session.execute(update(tallies).where(tallies.c.key == key).values(count=count + 1))
        follow.delay(key)
        if fail_first and _attempts.setdefault(key, 0) == 0:
            _attempts[key] += 1
            raise Flaky(f"first attempt of {key} fails after its writes")
        return (count or 0) + 1

    return tally


#: Attempts of ``tally`` per key in this worker process (its first one fails on request).
_attempts: dict[str, int] = {}


def _follow(engine: Engine) -> Any:
    def follow(key: str) -> None:
        """Count the follow-up of ``key``'s tally."""
        with engine.begin() as conn:
            conn.execute(
                update(tallies)
                .where(tallies.c.key == key)
                .values(follow_ups=tallies.c.follow_ups + 1)
            )
        _write({"follow": key})

    return follow


def _write(line: dict[str, Any]) -> None:
    with Path(os.environ["OUTBOX_TEST_OUTPUT"]).open("a") as output:
        output.write(json.dumps(line) + "\n")


@task_duplicate_skipped.connect
def _skipped(sender: Any, task_id: str, **kwargs: Any) -> None:
    _write({"skipped": task_id})


def _recorder(engine: Engine) -> Any:
    def record(self: Task, order_id: int) -> bool:
        """Append this run, and whether the dispatching transaction's order exists."""
        with engine.connect() as conn:
            saw = conn.execute(select(orders.c.id).where(orders.c.id == order_id)).first()
        _write({"task_id": self.request.id, "order_id": order_id, "saw_order": saw is not None})
        return saw is not None

    return record


def always_fails(n: int) -> None:
    """Fail, to end up as a dead letter."""
    raise Flaky(f"attempt failed for {n}")


def runs(path: Path) -> list[dict[str, Any]]:
    """The runs recorded so far in ``path``."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if "OUTBOX_TEST_DATABASE" in os.environ:
    app, _engine, _store = create_app(
        os.environ["OUTBOX_TEST_BROKER"],
        os.environ["OUTBOX_TEST_QUEUE"],
        os.environ["OUTBOX_TEST_DATABASE"],
    )
