"""End to end without Django: SQLAlchemy store on PostgreSQL, a real broker, a real worker.

Dispatch in a session and commit: the worker runs the task (and sees the order the same
transaction wrote). Roll back: nothing runs. Commit but never publish (a crash right
after COMMIT): the sweeper publishes the row. A task that always fails: a dead letter.
An atomic task: its writes and follow-up once, under a duplicate delivery and a retry.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")

from celery import Celery, chain
from sqlalchemy import Engine, insert, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from celery_outbox.config import OutboxConfig
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, dead_letter_table
from tests import services
from tests.brokers import purge_queue
from tests.integration.sqlalchemy_app import (
    ALWAYS_FAILS,
    RECORD,
    STEP,
    TALLY,
    create_app,
    orders,
    runs,
    tallies,
)
from tests.worker import SharedWorker, wait_for

APP_MODULE = "tests.integration.sqlalchemy_app"


@dataclass
class World:
    app: Celery
    engine: Engine
    store: SQLAlchemyOutboxStore
    output: Path
    #: Runs in :attr:`output` before this test (the file is the module's, like the worker).
    since: int = 0

    def dispatch(self, order_id: int, *, commit: bool = True) -> str:
        """Write an order and dispatch ``record`` for it in one session transaction."""
        with Session(self.engine) as session, self.store.bind_session(session):
            session.execute(insert(orders).values(id=order_id, note="e2e"))
            task_id = self.app.tasks[RECORD].delay(order_id).id
            if commit:
                session.commit()
            else:
                session.rollback()
        return str(task_id)

    def lines(self) -> list[dict[str, Any]]:
        """Everything the worker recorded since this test began."""
        return runs(self.output)[self.since :]

    def runs(self) -> list[dict[str, Any]]:
        """The runs of ``record`` since this test began."""
        return [line for line in self.lines() if "order_id" in line]

    def tally(self, key: str) -> tuple[int, int] | None:
        """``(count, follow_ups)`` of ``key``."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(tallies.c.count, tallies.c.follow_ups).where(tallies.c.key == key)
            ).first()
        return None if row is None else (row.count, row.follow_ups)


@pytest.fixture(scope="module")
def module_database_url(postgres_url: str, broker_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database per module and broker (the tests' orders are distinct)."""
    name = services.unique_name("outbox_test_")
    services.create_postgres_database(postgres_url, name)
    yield services.with_db_name(postgres_url, name)
    services.drop_postgres_database(postgres_url, name)


@pytest.fixture(scope="module")
def runs_output(broker_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the module's worker on ``broker_url`` records its runs."""
    return tmp_path_factory.mktemp("runs") / "runs.jsonl"


@pytest.fixture
def world(
    module_database_url: str,
    broker_url: str,
    module_broker_queue: str,
    runs_output: Path,
    shared_worker: SharedWorker,
) -> Iterator[World]:
    # One database, queue and worker per module and broker: the tests use distinct orders
    # and each waits for what it dispatched; runs are counted from each test on.
    database = make_url(module_database_url).set(drivername="postgresql+psycopg")
    url = database.render_as_string(hide_password=False)
    purge_queue(broker_url, module_broker_queue)
    app, engine, store = create_app(broker_url, module_broker_queue, url)
    env = {
        "OUTBOX_TEST_BROKER": broker_url,
        "OUTBOX_TEST_QUEUE": module_broker_queue,
        "OUTBOX_TEST_DATABASE": url,
        "OUTBOX_TEST_OUTPUT": str(runs_output),
    }
    shared_worker.get(APP_MODULE, queue=module_broker_queue, env=env)
    yield World(app, engine, store, runs_output, since=len(runs(runs_output)))
    relay_for(app).close()
    app.close()
    engine.dispose()


def test_a_committed_dispatch_runs_and_sees_its_transaction(world: World) -> None:
    task_id = world.dispatch(1)

    wait_for(lambda: len(world.runs()) == 1, timeout=30, what="the task to run")
    assert world.runs() == [{"task_id": task_id, "order_id": 1, "saw_order": True}]
    assert world.store.oldest_pending() is None  # published and removed


def test_a_rolled_back_dispatch_never_runs(world: World) -> None:
    world.dispatch(2, commit=False)
    after = world.dispatch(3)

    wait_for(lambda: len(world.runs()) >= 1, timeout=30, what="the committed task to run")
    assert [r["task_id"] for r in world.runs()] == [after]
    assert world.store.oldest_pending() is None


def test_a_row_never_published_after_commit_is_swept(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process "dies" right after COMMIT: its on-commit publish never happens.
    monkeypatch.setattr(world.store, "defer_publish", lambda *args, **kwargs: None)
    task_id = world.dispatch(4)
    assert world.store.oldest_pending() is not None
    monkeypatch.undo()

    sweeper = Sweeper(
        app=world.app,
        store=world.store,
        relay=relay_for(world.app),
        config=OutboxConfig.from_celery(world.app),
    )
    report = sweeper.sweep()

    assert report.published == 1
    wait_for(lambda: len(world.runs()) == 1, timeout=30, what="the swept task to run")
    assert world.runs()[0]["task_id"] == task_id
    assert world.store.oldest_pending() is None


def test_an_always_failing_task_becomes_a_dead_letter(world: World) -> None:
    with Session(world.engine) as session, world.store.bind_session(session):
        task_id = world.app.tasks[ALWAYS_FAILS].delay(5).id
        session.commit()

    def letters() -> list[Any]:
        with world.engine.connect() as conn:
            return list(conn.execute(select(dead_letter_table)).mappings())

    wait_for(lambda: len(letters()) == 1, timeout=60, what="the dead letter")
    (letter,) = letters()
    assert (letter["task_id"], letter["task_name"], letter["status"]) == (
        task_id,
        ALWAYS_FAILS,
        "dead",
    )
    assert letter["exception_type"].endswith("Flaky")
    assert letter["args"] == [5]
    assert letter["retries"] == 2


def test_an_atomic_task_has_its_effects_once_under_a_duplicate_delivery(world: World) -> None:
    tally = world.app.tasks[TALLY]
    task_id = tally.delay("dup").id
    wait_for(lambda: world.tally("dup") == (1, 1), timeout=30, what="the tally and its follow-up")
    world.app.send_task(TALLY, args=["dup"], task_id=task_id)  # the broker delivers it again

    wait_for(
        lambda: {"skipped": task_id} in world.lines(), timeout=30, what="the duplicate skipped"
    )
    assert world.tally("dup") == (1, 1)
    completion = world.store.completion(task_id)
    assert completion is not None
    assert (completion.task_name, completion.result) == (TALLY, "1")


def test_a_failed_atomic_attempt_rolls_back_its_writes_and_follow_up(world: World) -> None:
    world.app.tasks[TALLY].delay("retried", fail_first=True)

    wait_for(lambda: world.tally("retried") == (1, 1), timeout=30, what="the retried tally")
    follow_ups = [line for line in world.lines() if line.get("follow") == "retried"]
    assert follow_ups == [{"follow": "retried"}]  # the failed attempt's follow-up rolled back


def test_a_chain_of_atomic_steps_dispatches_each_next_step_once_in_its_transaction(
    world: World,
) -> None:
    step = world.app.tasks[STEP]
    result = chain(step.s([], "chain-a"), step.s("chain-b"), step.s("chain-c")).apply_async()

    wait_for(lambda: world.tally("chain-c") is not None, timeout=30, what="the last step")
    steps = [line for line in world.lines() if "step" in line]
    assert [line["step"] for line in steps] == ["chain-a", "chain-b", "chain-c"]
    assert steps[-1]["task_id"] == result.id
    # each next step was written by its predecessor's transaction, and not sent again by
    # Celery after it: a second dispatch (same frozen task id) would show up as skipped
    assert not [line for line in world.lines() if "skipped" in line]
    completion = world.store.completion(result.id)
    assert completion is not None
    assert completion.result == '["chain-a", "chain-b", "chain-c"]'
