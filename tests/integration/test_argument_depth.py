"""Deeply nested arguments: refused at the call site, never a worker crash loop.

A prefork worker pickles each request for its pool; an argument nested ~500-1000 levels
deep passes JSON but not pickle, so the worker's main process died at every redelivery.
``delay()`` now refuses anything deeper than ``MAX_ARGUMENT_DEPTH``, and a call at the
limit runs once on a real prefork worker (Redis, SQLAlchemy store on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")

from celery import Celery
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import make_url

from celery_outbox import PayloadError
from celery_outbox.dispatch.validation import MAX_ARGUMENT_DEPTH
from celery_outbox.relay.relay import relay_for
from celery_outbox.sqlalchemy import outbox_table
from tests.conftest import StartWorker
from tests.integration.nesting_app import MEASURE, create_app, runs
from tests.worker import WorkerProcess, wait_for

APP_MODULE = "tests.integration.nesting_app"


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@dataclass
class World:
    app: Celery
    database: str
    output: Path
    worker: WorkerProcess

    def rows(self) -> int:
        engine = create_engine(self.database)
        with engine.connect() as conn:
            count = conn.execute(select(func.count()).select_from(outbox_table)).scalar_one()
        engine.dispose()
        return int(count)


@pytest.fixture
def world(
    postgres_database_url: str,
    redis_url: str,
    queue_name: str,
    tmp_path: Path,
    celery_worker_process: StartWorker,
) -> Iterator[World]:
    database = make_url(postgres_database_url).set(drivername="postgresql+psycopg")
    url = database.render_as_string(hide_password=False)
    output = tmp_path / "runs.jsonl"
    app = create_app(redis_url, queue_name, url)
    env = {
        "OUTBOX_TEST_BROKER": redis_url,
        "OUTBOX_TEST_QUEUE": queue_name,
        "OUTBOX_TEST_DATABASE": url,
        "OUTBOX_TEST_OUTPUT": str(output),
    }
    worker = celery_worker_process(APP_MODULE, queue=queue_name, env=env, pool="prefork")
    yield World(app, url, output, worker)
    relay_for(app).close()
    app.close()


def test_a_600_deep_argument_is_refused_and_one_at_the_limit_runs_once(world: World) -> None:
    task = world.app.tasks[MEASURE]

    with pytest.raises(PayloadError, match=rf"MAX_ARGUMENT_DEPTH={MAX_ARGUMENT_DEPTH}"):
        task.delay(nested(600))
    assert world.rows() == 0  # nothing written, nothing for a worker to choke on

    task_id = task.delay(nested(MAX_ARGUMENT_DEPTH)).id
    wait_for(lambda: len(runs(world.output)) >= 1, timeout=30, what="the task to run")
    follow = task.delay(nested(1)).id  # a later task proves the first is not redelivered
    wait_for(lambda: len(runs(world.output)) >= 2, timeout=30, what="the next task to run")
    assert runs(world.output) == [
        {"task_id": task_id, "depth": MAX_ARGUMENT_DEPTH},
        {"task_id": follow, "depth": 1},
    ]
    assert world.worker.is_running()
