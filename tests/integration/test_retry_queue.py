"""``retry_queue`` end to end: SQLAlchemy store on PostgreSQL, a real broker, two real
workers, one consuming only the task queue and one only the retry queue.

Autoretries, ``self.retry()`` and parked retries (published by the sweeper) are delivered
from the retry queue and run by its worker; a dead letter keeps the task's own routing, and
its requeue runs from the task's own queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")

from celery import Celery
from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from celery_outbox.config import OutboxConfig
from celery_outbox.dead_letters import requeue
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, dead_letter_table
from tests import services
from tests.brokers import delete_queue, new_queue_name
from tests.integration.retry_queue_app import (
    AUTORETRY,
    DEAD,
    EXPLICIT,
    PARKED,
    create_app,
    runs,
)
from tests.worker import WorkerStarter, wait_for

APP_MODULE = "tests.integration.retry_queue_app"


@dataclass
class World:
    app: Celery
    engine: Engine
    store: SQLAlchemyOutboxStore
    output: Path
    queue: str
    retry_queue: str
    #: Node names of the task queue's worker and of the retry queue's worker.
    task_worker: str
    retry_worker: str

    def dispatch(self, name: str) -> str:
        """Dispatch task ``name`` in a committed session; its task id."""
        with Session(self.engine) as session, self.store.bind_session(session):
            task_id = str(self.app.tasks[name].delay().id)
            session.commit()
        return task_id

    def runs_of(self, task_id: str) -> list[dict[str, Any]]:
        """``(retries, queue, worker)`` of each run of ``task_id``, in order."""
        return [
            {**run, "worker": self._worker(run["hostname"])}
            for run in runs(self.output)
            if run["task_id"] == task_id
        ]

    def wait_runs(self, task_id: str, count: int) -> list[tuple[int, str, str]]:
        """The first ``count`` runs of ``task_id`` as ``(retries, queue, worker)``."""
        wait_for(lambda: len(self.runs_of(task_id)) >= count, timeout=60, what=f"{count} runs")
        return [(r["retries"], r["queue"], r["worker"]) for r in self.runs_of(task_id)]

    def letters(self, task_id: str) -> list[Any]:
        with self.engine.connect() as conn:
            query = select(dead_letter_table).where(dead_letter_table.c.task_id == task_id)
            return list(conn.execute(query).mappings())

    def _worker(self, hostname: str) -> str:
        names = {self.task_worker: "task worker", self.retry_worker: "retry worker"}
        return names.get(hostname, hostname)


@pytest.fixture(scope="module")
def world(
    postgres_url: str, broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    # One database, two queues and two workers per module and broker; each test follows
    # its own task ids.
    name = services.unique_name("outbox_test_")
    services.create_postgres_database(postgres_url, name)
    database = make_url(services.with_db_name(postgres_url, name))
    url = database.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    queue, retry_queue = new_queue_name(), new_queue_name()
    output = tmp_path_factory.mktemp("runs") / "runs.jsonl"
    app, engine, store = create_app(broker_url, queue, retry_queue, url)
    env = {
        "OUTBOX_TEST_BROKER": broker_url,
        "OUTBOX_TEST_QUEUE": queue,
        "OUTBOX_TEST_RETRY_QUEUE": retry_queue,
        "OUTBOX_TEST_DATABASE": url,
        "OUTBOX_TEST_OUTPUT": str(output),
    }
    starter = WorkerStarter(tmp_path_factory.mktemp("workers"))
    try:
        task_worker = starter(APP_MODULE, queue=queue, env=env)
        retry_worker = starter(APP_MODULE, queue=retry_queue, env=env)
        yield World(
            app,
            engine,
            store,
            output,
            queue,
            retry_queue,
            task_worker=task_worker.nodename(),
            retry_worker=retry_worker.nodename(),
        )
    finally:
        starter.stop_all()
        relay_for(app).close()
        app.close()
        engine.dispose()
        for each in (queue, retry_queue):
            delete_queue(broker_url, each)
        services.drop_postgres_database(postgres_url, name)


@pytest.mark.parametrize("task", [AUTORETRY, EXPLICIT])
def test_retries_are_delivered_from_the_retry_queue_and_run_by_its_worker(
    world: World, task: str
) -> None:
    task_id = world.dispatch(task)

    assert world.wait_runs(task_id, 3) == [
        (0, world.queue, "task worker"),
        (1, world.retry_queue, "retry worker"),
        (2, world.retry_queue, "retry worker"),
    ]
    assert world.letters(task_id) == []


def test_a_parked_retry_is_published_by_the_sweeper_to_the_retry_queue(world: World) -> None:
    task_id = world.dispatch(PARKED)
    world.wait_runs(task_id, 1)
    # The retry waits longer than outbox_park_after: a parked row, not a broker message.
    try:
        wait_for(lambda: world.store.oldest_pending() is not None, timeout=30, what="parking")
    except TimeoutError as exc:  # say what became of the task instead
        raise AssertionError(
            f"no parked row after 30 s; runs: {world.runs_of(task_id)}, "
            f"dead letters: {world.letters(task_id)}"
        ) from exc
    sweeper = Sweeper(
        app=world.app,
        store=world.store,
        relay=relay_for(world.app),
        config=OutboxConfig.from_celery(world.app),
    )
    wait_for(lambda: sweeper.sweep().published == 1, timeout=30, what="the due row's sweep")

    assert world.wait_runs(task_id, 2) == [
        (0, world.queue, "task worker"),
        (1, world.retry_queue, "retry worker"),
    ]
    assert world.store.oldest_pending() is None


def test_a_requeued_dead_letter_runs_from_the_tasks_own_queue(world: World) -> None:
    task_id = world.dispatch(DEAD)
    wait_for(lambda: world.letters(task_id) != [], timeout=60, what="the dead letter")
    assert world.wait_runs(task_id, 2) == [
        (0, world.queue, "task worker"),
        (1, world.retry_queue, "retry worker"),
    ]
    (letter,) = world.letters(task_id)
    routing = {k: letter["options"].get(k) for k in ("queue", "exchange", "routing_key")}
    assert world.retry_queue not in routing.values()
    assert world.queue in routing.values()

    world.output.with_suffix(".healed").touch()  # the next run succeeds
    with Session(world.engine) as session, world.store.bind_session(session):
        new_id = requeue(world.app, letter["id"], by="ops")
        session.commit()

    assert world.wait_runs(new_id, 1) == [(0, world.queue, "task worker")]
