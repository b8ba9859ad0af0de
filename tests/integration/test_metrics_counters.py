"""The in-process counters after real publishes, retries and dead letters (issue 18).

The test process is the producer: it dispatches and commits on PostgreSQL (SQLAlchemy
store) and publishes on Redis after commit, by a sweep or by the relay loop; its counters
are ``prometheus_client``'s default registry. The worker is a real Celery **prefork**
worker (two pool children) with ``PROMETHEUS_MULTIPROC_DIR`` set: its retries, dead
letters and skipped duplicates are read back from that directory with a
``MultiProcessCollector``, as a scrape of a prefork worker would.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy")
pytest.importorskip("prometheus_client")

from celery import Celery
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from sqlalchemy import Engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

import celery_outbox.metrics  # noqa: F401 - this process counts from now on
from celery_outbox.config import OutboxConfig
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, dead_letter_table
from tests import services
from tests.brokers import purge_queue
from tests.integration.metrics_app import (
    ATOMIC,
    DEAD,
    ETA_RETRY,
    PARKED_RETRY,
    RECORD,
    create_app,
)
from tests.worker import SharedWorker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.postgres]

APP_MODULE = "tests.integration.metrics_app"


def here(name: str, **labels: str) -> float:
    """A sample of this process's counters (0 before the first count)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


@dataclass
class World:
    app: Celery
    engine: Engine
    store: SQLAlchemyOutboxStore
    multiproc_dir: Path

    def dispatch(self, name: str, n: int, **options: object) -> str:
        """Dispatch ``name(n)`` in a committed transaction; the task id."""
        with Session(self.engine) as session, self.store.bind_session(session):
            task_id = str(self.app.tasks[name].apply_async((n,), **options).id)
            session.commit()
        return task_id

    def worker(self, name: str, **labels: str) -> float:
        """A sample of the worker's counters, summed over its processes."""
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.multiproc_dir))
        return registry.get_sample_value(name, labels) or 0.0

    def sweeper(self) -> Sweeper:
        config = OutboxConfig.from_celery(self.app)
        return Sweeper(app=self.app, store=self.store, relay=relay_for(self.app), config=config)

    def letters(self, task_name: str) -> int:
        c = dead_letter_table.c
        with self.engine.connect() as conn:
            query = select(func.count()).where(c.task_name == task_name)
            return int(conn.execute(query).scalar_one())


@pytest.fixture(scope="module")
def broker_url() -> str:
    """Redis only: the counters do not depend on the transport."""
    return services.require_service("redis")


@pytest.fixture(scope="module")
def module_database_url(postgres_url: str) -> Iterator[str]:
    name = services.unique_name("outbox_test_")
    services.create_postgres_database(postgres_url, name)
    yield services.with_db_name(postgres_url, name)
    services.drop_postgres_database(postgres_url, name)


@pytest.fixture(scope="module")
def multiproc_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prometheus-multiproc")


@pytest.fixture
def world(
    module_database_url: str,
    broker_url: str,
    module_broker_queue: str,
    multiproc_dir: Path,
    shared_worker: SharedWorker,
) -> Iterator[World]:
    database = make_url(module_database_url).set(drivername="postgresql+psycopg")
    url = database.render_as_string(hide_password=False)
    purge_queue(broker_url, module_broker_queue)
    app, engine, store = create_app(broker_url, module_broker_queue, url)
    env = {
        "OUTBOX_TEST_BROKER": broker_url,
        "OUTBOX_TEST_QUEUE": module_broker_queue,
        "OUTBOX_TEST_DATABASE": url,
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir),
    }
    shared_worker.get(APP_MODULE, queue=module_broker_queue, env=env, pool="prefork", concurrency=2)
    yield World(app, engine, store, multiproc_dir)
    relay_for(app).close()
    app.close()
    engine.dispose()


def test_a_publish_after_commit_counts_on_the_commit_path_with_its_latency(world: World) -> None:
    published = here("celery_outbox_published_total", path="commit")
    latencies = here("celery_outbox_publish_latency_seconds_count")
    slow = here("celery_outbox_publish_latency_seconds_bucket", le="+Inf") - here(
        "celery_outbox_publish_latency_seconds_bucket", le="5.0"
    )

    world.dispatch(RECORD, 1)
    world.dispatch(RECORD, 2)

    assert here("celery_outbox_published_total", path="commit") == published + 2
    assert here("celery_outbox_publish_latency_seconds_count") == latencies + 2
    # committed and published in the same second: neither waited 5 s
    assert (
        here("celery_outbox_publish_latency_seconds_bucket", le="+Inf")
        - here("celery_outbox_publish_latency_seconds_bucket", le="5.0")
        == slow
    )


def test_a_swept_row_counts_on_the_sweep_path(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(world.store, "defer_publish", lambda *args, **kwargs: None)
    world.dispatch(RECORD, 3)  # committed, never published: a crash
    monkeypatch.undo()
    swept = here("celery_outbox_published_total", path="sweep")
    committed = here("celery_outbox_published_total", path="commit")

    assert world.sweeper().sweep().published == 1

    assert here("celery_outbox_published_total", path="sweep") == swept + 1
    assert here("celery_outbox_published_total", path="commit") == committed


def test_a_relayed_row_counts_on_the_relay_path(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(world.store, "defer_publish", lambda *args, **kwargs: None)
    world.dispatch(RECORD, 4)
    monkeypatch.undo()
    relayed = here("celery_outbox_published_total", path="relay")
    stop = threading.Event()
    relay = threading.Thread(target=world.sweeper().run, args=(stop, 0.05))
    relay.start()
    try:
        wait_for(
            lambda: here("celery_outbox_published_total", path="relay") == relayed + 1,
            timeout=30,
            what="the relay's publish",
        )
    finally:
        stop.set()
        relay.join(timeout=10)


def test_a_publish_the_broker_refuses_counts_an_error(
    world: World, module_database_url: str
) -> None:
    database = make_url(module_database_url).set(drivername="postgresql+psycopg")
    down, engine, store = create_app(
        "redis://127.0.0.1:1/0", "nowhere", database.render_as_string(hide_password=False)
    )
    errors = here("celery_outbox_publish_errors_total")
    try:
        with Session(engine) as session, store.bind_session(session):
            down.tasks[RECORD].delay(5)
            session.commit()
    finally:
        relay_for(down).close()
        down.close()
        engine.dispose()

    assert here("celery_outbox_publish_errors_total") == errors + 1


def test_the_prefork_workers_retries_are_counted_by_path(world: World) -> None:
    eta, parked = (world.worker("celery_outbox_retries_total", path=p) for p in ("eta", "parked"))

    world.dispatch(ETA_RETRY, 6)
    world.dispatch(PARKED_RETRY, 7)

    wait_for(
        lambda: (
            world.worker("celery_outbox_retries_total", path="eta") == eta + 1
            and world.worker("celery_outbox_retries_total", path="parked") == parked + 1
        ),
        timeout=30,
        what="one retry on each path",
    )


def test_the_prefork_workers_dead_letters_are_counted_by_task_name(world: World) -> None:
    before = world.worker("celery_outbox_dead_lettered_total", task=DEAD)

    world.dispatch(DEAD, 8)
    world.dispatch(DEAD, 9)

    wait_for(lambda: world.letters(DEAD) >= 2, timeout=30, what="two dead letters")
    wait_for(
        lambda: world.worker("celery_outbox_dead_lettered_total", task=DEAD) == before + 2,
        timeout=10,
        what="two dead letters counted",
    )


def test_a_duplicate_of_a_completed_atomic_task_is_counted_skipped(world: World) -> None:
    before = world.worker("celery_outbox_duplicates_skipped_total", task=ATOMIC)
    task_id = world.dispatch(ATOMIC, 10)
    wait_for(
        lambda: world.store.completion(task_id) is not None,
        timeout=30,
        what="the atomic task to complete",
    )

    world.dispatch(ATOMIC, 10, task_id=task_id)  # delivered again

    wait_for(
        lambda: world.worker("celery_outbox_duplicates_skipped_total", task=ATOMIC) == before + 1,
        timeout=30,
        what="the duplicate skipped",
    )
