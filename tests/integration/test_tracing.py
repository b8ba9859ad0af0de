"""The request's trace reaches the worker on every publish path (issue 18).

The test process is the web app: it dispatches inside a ``request`` span (OpenTelemetry's
SDK, in-memory exporter) and publishes after commit, or sweeps, or relays. The worker is a
real Celery worker (Redis and RabbitMQ, SQLAlchemy store on PostgreSQL) traced as in production,
with ``opentelemetry-instrumentation-celery``, its spans written to a file. On every path
(on-commit, sweep, relay, ETA retry, parked retry, requeue of a dead letter) every run of
the task (each of its worker spans) must carry the request's trace id.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")
pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.instrumentation.celery")

from celery import Celery
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from celery_outbox import tracing
from celery_outbox.config import OutboxConfig
from celery_outbox.dead_letters import requeue
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, dead_letter_table
from tests import services
from tests.brokers import purge_queue
from tests.integration.tracing_app import DEAD, ETA_RETRY, PARKED_RETRY, RECORD, create_app
from tests.spans import memory_exporter, read_records
from tests.worker import SharedWorker, wait_for

APP_MODULE = "tests.integration.tracing_app"
tracer = trace.get_tracer(__name__)


def hex_trace(span: Any) -> str:
    return f"{span.get_span_context().trace_id:032x}"


@dataclass
class World:
    app: Celery
    engine: Engine
    store: SQLAlchemyOutboxStore
    spans: InMemorySpanExporter
    worker_spans: Path

    def dispatch(self, name: str, n: int) -> tuple[str, str]:
        """Dispatch ``name(n)`` in a committed transaction inside a ``request`` span;
        ``(task id, the request's trace id)``.
        """
        task_id, request = self.dispatch_in_span(name, n)
        return task_id, hex_trace(request)

    def dispatch_in_span(self, name: str, n: int) -> tuple[str, Any]:
        """:meth:`dispatch`, returning the ``request`` span itself."""
        with (
            tracer.start_as_current_span("request") as request,
            Session(self.engine) as session,
            self.store.bind_session(session),
        ):
            task_id = str(self.app.tasks[name].delay(n).id)
            session.commit()
        return task_id, request

    def runs(self, task_id: str) -> list[dict[str, Any]]:
        """The worker's spans of the runs of ``task_id`` (the Celery instrumentation's)."""
        return [
            span
            for span in read_records(self.worker_spans)
            if span["name"].startswith("run/")
            and span["attributes"].get("messaging.message.id") == task_id
        ]

    def wait_runs(self, task_id: str, count: int) -> list[dict[str, Any]]:
        wait_for(lambda: len(self.runs(task_id)) >= count, timeout=30, what=f"{count} run(s)")
        return self.runs(task_id)

    def publishes(self, task_id: str, path: str) -> list[Any]:
        """This process's publish spans of ``task_id`` on ``path``."""
        return [
            span
            for span in self.spans.get_finished_spans()
            if span.name == tracing.PUBLISH_SPAN
            and (span.attributes or {}).get(tracing.MESSAGE_ID_ATTRIBUTE) == task_id
            and (span.attributes or {}).get(tracing.PATH_ATTRIBUTE) == path
        ]

    def sweeper(self) -> Sweeper:
        config = OutboxConfig.from_celery(self.app)
        return Sweeper(app=self.app, store=self.store, relay=relay_for(self.app), config=config)

    def letter_of(self, task_id: str) -> int | None:
        with self.engine.connect() as conn:
            found = conn.execute(
                select(dead_letter_table.c.id).where(dead_letter_table.c.task_id == task_id)
            ).scalar()
        return None if found is None else int(found)


@pytest.fixture(scope="module")
def module_database_url(postgres_url: str) -> Iterator[str]:
    name = services.unique_name("outbox_test_")
    services.create_postgres_database(postgres_url, name)
    yield services.with_db_name(postgres_url, name)
    services.drop_postgres_database(postgres_url, name)


@pytest.fixture(scope="module")
def worker_spans(broker_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the module's worker on ``broker_url`` writes its spans."""
    return tmp_path_factory.mktemp("spans") / "worker-spans.jsonl"


@pytest.fixture
def world(
    module_database_url: str,
    broker_url: str,
    module_broker_queue: str,
    worker_spans: Path,
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
        "OUTBOX_TEST_SPANS": str(worker_spans),
    }
    shared_worker.get(APP_MODULE, queue=module_broker_queue, env=env)
    yield World(app, engine, store, memory_exporter(), worker_spans)
    relay_for(app).close()
    app.close()
    engine.dispose()


def assert_all_in_trace(runs: list[dict[str, Any]], trace_id: str) -> None:
    assert runs
    assert [run["trace_id"] for run in runs] == [trace_id] * len(runs)


def test_on_commit_the_worker_span_is_a_child_of_the_request_that_records_the_publish(
    world: World,
) -> None:
    task_id, request = world.dispatch_in_span(RECORD, 1)

    runs = world.wait_runs(task_id, 1)

    assert_all_in_trace(runs, hex_trace(request))
    assert runs[0]["parent_id"] == f"{request.get_span_context().span_id:016x}"
    assert world.publishes(task_id, "commit") == []  # published inside the request's span:
    (event,) = [e for e in request.events if e.name == tracing.PUBLISH_SPAN]  # an event on it
    assert (event.attributes or {})[tracing.PATH_ATTRIBUTE] == "commit"
    assert (event.attributes or {})[tracing.MESSAGE_ID_ATTRIBUTE] == task_id
    assert (event.attributes or {})[tracing.WAIT_ATTRIBUTE] >= 0.0


def test_a_swept_row_runs_in_the_requests_trace(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(world.store, "defer_publish", lambda *args, **kwargs: None)
    task_id, trace_id = world.dispatch(RECORD, 2)  # committed, never published: a crash
    monkeypatch.undo()

    assert world.sweeper().sweep().published == 1  # in no span, as the beat task does

    assert_all_in_trace(world.wait_runs(task_id, 1), trace_id)
    (publish,) = world.publishes(task_id, "sweep")
    assert hex_trace(publish) == trace_id
    assert (publish.attributes or {})[tracing.WAIT_ATTRIBUTE] >= 0.0


def test_a_relayed_row_runs_in_the_requests_trace(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(world.store, "defer_publish", lambda *args, **kwargs: None)
    task_id, trace_id = world.dispatch(RECORD, 3)
    monkeypatch.undo()
    stop = threading.Event()
    relay = threading.Thread(target=world.sweeper().run, args=(stop, 0.05))
    relay.start()
    try:
        runs = world.wait_runs(task_id, 1)
    finally:
        stop.set()
        relay.join(timeout=10)

    assert_all_in_trace(runs, trace_id)
    (publish,) = world.publishes(task_id, "relay")
    assert hex_trace(publish) == trace_id


def test_both_runs_of_a_task_retried_on_an_eta_are_in_the_requests_trace(world: World) -> None:
    task_id, trace_id = world.dispatch(ETA_RETRY, 4)

    runs = world.wait_runs(task_id, 2)

    assert_all_in_trace(runs, trace_id)
    retry = [
        span
        for span in read_records(world.worker_spans)
        if span["name"] == tracing.PUBLISH_SPAN
        and span["attributes"][tracing.MESSAGE_ID_ATTRIBUTE] == task_id
    ]
    # The Celery instrumentation's apply_async span is current at the retry's dispatch and
    # ended at its publish: the publish has a span of its own, under that one.
    assert [span["attributes"][tracing.PATH_ATTRIBUTE] for span in retry] == ["eta"]
    assert runs[1]["parent_id"] == retry[0]["span_id"]  # the retry's run: a child of its publish


def test_both_runs_of_a_task_retried_from_a_parked_row_are_in_the_requests_trace(
    world: World,
) -> None:
    task_id, trace_id = world.dispatch(PARKED_RETRY, 5)
    world.wait_runs(task_id, 1)
    wait_for(lambda: world.store.oldest_pending() is not None, timeout=30, what="the parked row")
    sweeper = world.sweeper()

    wait_for(lambda: sweeper.sweep().published == 1, timeout=30, what="the parked row to be due")

    runs = world.wait_runs(task_id, 2)
    assert_all_in_trace(runs, trace_id)
    (publish,) = world.publishes(task_id, "sweep")
    assert hex_trace(publish) == trace_id


def test_a_requeued_dead_letter_runs_in_the_trace_of_the_request_not_the_requeuers(
    world: World,
) -> None:
    task_id, trace_id = world.dispatch(DEAD, 6)
    world.wait_runs(task_id, 1)
    wait_for(lambda: world.letter_of(task_id) is not None, timeout=30, what="the dead letter")
    letter_id = world.letter_of(task_id)
    assert letter_id is not None

    with (
        tracer.start_as_current_span("admin request") as admin,
        Session(world.engine) as session,
        world.store.bind_session(session),
    ):
        new_id = requeue(world.app, letter_id, by="ops")
        session.commit()

    assert new_id != task_id
    assert hex_trace(admin) != trace_id
    assert_all_in_trace(world.wait_runs(new_id, 1), trace_id)
