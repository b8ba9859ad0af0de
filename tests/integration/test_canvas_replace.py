"""``Task.replace()`` and ``apply_async``'s result on a real worker (issue 22).

Every task of the app is an ``OutboxTask`` (``task_cls``); Redis is broker and result
backend, the SQLAlchemy store on PostgreSQL. Celery sends a replacement (a single task,
a chord body, a chain's last step) under the replaced task's id. The row that carried the
replaced task is still ``pending`` while its publisher has not deleted it yet, and here
that publisher is held before its DELETE until the worker has sent the replacement, so
every run meets that window. A replacement must not vanish into the idempotency key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")

from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from celery_outbox.relay.relay import relay_for
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from tests import services
from tests.brokers import delete_queue, new_queue_name, purge_queue
from tests.integration.canvas_app import (
    ECHO,
    IGNORED,
    REPLACED,
    REPLACED_BY_CHAIN,
    REPLACED_BY_GROUP,
    RESCHEDULED,
    create_app,
    lines,
)
from tests.worker import SharedWorker, wait_for

APP_MODULE = "tests.integration.canvas_app"


@dataclass
class World:
    app: Celery
    engine: Engine
    store: SQLAlchemyOutboxStore
    output: Path
    since: int = 0

    def done(self) -> list[dict[str, Any]]:
        """The task runs the worker finished since this test began."""
        return lines(self.output)[self.since :]

    def hold_publisher(
        self, monkeypatch: pytest.MonkeyPatch, until: Callable[[list[dict[str, Any]]], bool]
    ) -> None:
        """Hold this process's publisher after its publish, before its DELETE, until
        ``until(done)``: the published row stays ``pending`` while the worker runs it.
        """
        original = self.store.mark_published

        def held(*args: Any, **kwargs: Any) -> int:
            monkeypatch.setattr(self.store, "mark_published", original)
            wait_for(lambda: until(self.done()), timeout=30, what="the worker's dispatches")
            return original(*args, **kwargs)

        monkeypatch.setattr(self.store, "mark_published", held)


@pytest.fixture(scope="module")
def database_url(postgres_url: str) -> Iterator[str]:
    name = services.unique_name("outbox_test_")
    services.create_postgres_database(postgres_url, name)
    url = make_url(services.with_db_name(postgres_url, name))
    yield url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    services.drop_postgres_database(postgres_url, name)


@pytest.fixture(scope="module")
def queue(redis_url: str) -> Iterator[str]:
    name = new_queue_name()
    yield name
    delete_queue(redis_url, name)


@pytest.fixture
def world(
    database_url: str,
    redis_url: str,
    queue: str,
    shared_worker: SharedWorker,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    output = Path(str(tmp_path_factory.getbasetemp())) / f"canvas-{queue}.jsonl"
    purge_queue(redis_url, queue)
    app, engine, store = create_app(redis_url, queue, database_url)
    env = {
        "OUTBOX_TEST_BROKER": redis_url,
        "OUTBOX_TEST_QUEUE": queue,
        "OUTBOX_TEST_DATABASE": database_url,
        "OUTBOX_TEST_OUTPUT": str(output),
    }
    shared_worker.get(APP_MODULE, queue=queue, env=env)
    yield World(app, engine, store, output, since=len(lines(output)))
    relay_for(app).close()
    app.close()
    engine.dispose()


def _ran(done: list[dict[str, Any]], task_id: str) -> bool:
    return any(line["done"] == task_id for line in done)


def _names(done: list[dict[str, Any]], name: str) -> int:
    return sum(line["name"] == name for line in done)


@pytest.mark.parametrize("attempt", range(3))
def test_a_replacement_sent_while_the_replaced_row_is_pending_runs(
    world: World, monkeypatch: pytest.MonkeyPatch, attempt: int
) -> None:
    task_id = f"replaced-{attempt}-{world.since}"
    world.hold_publisher(monkeypatch, until=lambda done: _ran(done, task_id))

    result = world.app.tasks[REPLACED].apply_async((f"value-{attempt}",), task_id=task_id)

    assert result.get(timeout=15) == f"value-{attempt}"


def test_a_chord_body_sent_from_another_task_while_the_replaced_row_is_pending_runs(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The body (celery.accumulate, an OutboxTask here) is sent by the last header task.
    world.hold_publisher(monkeypatch, until=lambda done: _names(done, ECHO) == 2)

    result = world.app.tasks[REPLACED_BY_GROUP].delay("g")

    assert result.get(timeout=15) == ["g-a", "g-b"]


def test_a_chain_tail_sent_from_another_task_while_the_replaced_row_is_pending_runs(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.hold_publisher(monkeypatch, until=lambda done: _names(done, ECHO) == 1)

    result = world.app.tasks[REPLACED_BY_CHAIN].delay("c")

    assert result.get(timeout=15) == "c-2"


def test_a_task_dispatching_itself_under_its_own_id_runs_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id = f"rescheduled-{world.since}"
    world.hold_publisher(monkeypatch, until=lambda done: _ran(done, task_id))

    world.app.tasks[RESCHEDULED].apply_async((2,), task_id=task_id)

    wait_for(
        lambda: sum(line["done"] == task_id for line in world.done()) == 3,
        timeout=15,
        what="three runs",
    )


def test_apply_async_returns_the_result_celery_built(world: World) -> None:
    ignored = world.app.tasks[IGNORED].delay("quiet")
    echoed = world.app.tasks[ECHO].delay("loud")

    assert ignored.ignored is True
    assert echoed.ignored is not True
    assert echoed.get(timeout=15) == "loud"
    wait_for(lambda: _ran(world.done(), ignored.id), timeout=15, what="the ignored task")
