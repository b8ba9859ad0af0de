"""Fixtures of the Django tests: the ORM store, messages, and an end-to-end world.

Tests that need real commits use ``@pytest.mark.django_db(transaction=True)``; the
end-to-end ones start a real worker (``celery_worker_process``) on the test database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_outbox.store.records import NewMessage
from tests.brokers import purge_queue
from tests.django.celery_app import RECORD, create_app, runs
from tests.django.helpers import database_url
from tests.worker import SharedWorker, WorkerProcess, wait_for

MessageFactory = Callable[..., NewMessage]


@pytest.fixture
def store() -> Any:
    """The ORM store under test."""
    from django_outbox.store import DjangoOutboxStore

    return DjangoOutboxStore()


@pytest.fixture
def now() -> datetime:
    """The current aware UTC time."""
    return datetime.now(timezone.utc)


@pytest.fixture
def message(now: datetime) -> MessageFactory:
    """Factory of ``NewMessage`` values: ``message("task-id", available_at=...)``."""

    def make(
        task_id: str = "task-1",
        *,
        available_at: datetime | None = None,
        task_name: str = "tests.noop",
    ) -> NewMessage:
        return NewMessage(
            task_id=task_id,
            task_name=task_name,
            payload="[[], {}, {}]",
            options={"routing_key": "celery", "headers": {"id": task_id}},
            available_at=available_at or now,
        )

    return make


@dataclass
class World:
    """A Celery app on a real broker, its queue, and the worker's record of runs."""

    app: Celery
    queue: str
    output: Path
    env: dict[str, str]
    #: Runs in :attr:`output` before this test (the file is the module's, like the worker).
    since: int = 0

    @property
    def record(self) -> Any:
        """The recording ``OutboxTask`` of :attr:`app`."""
        return self.app.tasks[RECORD]

    def runs(self) -> list[dict[str, Any]]:
        """What the worker ran so far in this test."""
        return runs(self.output)[self.since :]

    def wait_for_runs(self, count: int, *, timeout: float = 20.0) -> list[dict[str, Any]]:
        """Wait until at least ``count`` runs are recorded; return all of them."""
        wait_for(
            lambda: len(self.runs()) >= count, timeout=timeout, what=f"{count} recorded run(s)"
        )
        return self.runs()


@pytest.fixture(scope="module")
def world_output(broker_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file the module's workers on ``broker_url`` record their runs in."""
    return tmp_path_factory.mktemp("runs") / "runs.jsonl"


@pytest.fixture
def world(request: pytest.FixtureRequest, broker_url: str, world_output: Path) -> Iterator[World]:
    """An app on the real broker (Redis, then RabbitMQ) and its queue.

    A test that starts a worker (:func:`start_worker`) gets the module's queue, which the
    module's worker consumes across tests: such tests drain what they dispatched. Any other
    test gets a queue of its own, deleted afterwards. Runs are counted from this test on.
    """
    if "start_worker" in request.fixturenames:
        queue = str(request.getfixturevalue("module_broker_queue"))
        purge_queue(broker_url, queue)  # nothing an earlier test left reaches this one
    else:
        queue = str(request.getfixturevalue("broker_queue"))
    app = create_app(broker_url, queue)
    env = {
        "OUTBOX_TEST_BROKER": broker_url,
        "OUTBOX_TEST_QUEUE": queue,
        "OUTBOX_TEST_OUTPUT": str(world_output),
    }
    since = len(runs(world_output))
    yield World(app=app, queue=queue, output=world_output, env=env, since=since)
    close_app(app)


def close_app(app: Celery) -> None:
    """Release the relay's broker connection and the app's pools."""
    from celery_outbox.relay.relay import relay_for

    relay_for(app).close()
    app.close()


@pytest.fixture
def start_worker(shared_worker: SharedWorker, world: World) -> Callable[..., WorkerProcess]:
    """A real worker of :func:`world`'s app on the current test database.

    The module's worker when one runs with the same environment (``start(**env)`` adds to
    it), else a new one in its place: starting a worker costs seconds.
    """

    def start(**env: str) -> WorkerProcess:
        return shared_worker.get(
            "tests.django.worker_app",
            queue=world.queue,
            env={**world.env, "OUTBOX_DJANGO_DB_URL": database_url(), **env},
        )

    return start
