"""Durable workflows on the Django store end to end: real PostgreSQL, Redis and a worker,
no result backend. A chain and a chord of atomic steps run each step once and their
``Workflow`` rows succeed; the chord's body gets the header's results in order; a
dead-lettered step fails its workflow, its requeue resumes it, and the admin page lists
the steps. Needs the workflow dispatch of the core (``celery_outbox.workflows.dispatch``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery, chain, chord
from celery.result import AsyncResult
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django.urls import reverse

from celery_outbox.clock import utcnow
from celery_outbox.store.base import StoredWorkflow
from django_outbox.cancelling import cancel_messages
from django_outbox.models import ChordJoin, CompletedTask, DeadLetter, OutboxMessage, Workflow
from django_outbox.store import DjangoOutboxStore
from tests.brokers import delete_queue, new_queue_name, purge_queue
from tests.django.conftest import close_app
from tests.django.helpers import database_url, postgres_only, rolled_back
from tests.django.workflow_tasks import (
    ADD,
    COLLECT,
    FAILS_UNTIL,
    create_tables,
    create_workflow_app,
    effect,
    let_pass,
)
from tests.worker import SharedWorker, wait_for

pytest.importorskip(
    "celery_outbox.workflows.dispatch", reason="no workflow dispatch yet", exc_type=ImportError
)

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]


@dataclass
class Flow:
    """The test's app and a prefix for its effect keys."""

    app: Celery
    prefix: str

    def s(self, name: str, *args: Any) -> Any:
        return self.app.tasks[name].s(*args)

    def key(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def finished(self, root_id: str) -> StoredWorkflow:
        def done() -> bool:
            found = DjangoOutboxStore().get_workflow(root_id)
            return found is not None and found.status != "running"

        wait_for(done, timeout=30, what=f"workflow {root_id} to finish")
        found = DjangoOutboxStore().get_workflow(root_id)
        assert found is not None
        return found


@pytest.fixture(scope="module")
def queue(redis_url: str) -> Iterator[str]:
    name = new_queue_name()
    yield name
    delete_queue(redis_url, name)


@pytest.fixture
def flow(redis_url: str, queue: str, shared_worker: SharedWorker) -> Iterator[Flow]:
    purge_queue(redis_url, queue)
    create_tables()
    env = {
        "OUTBOX_TEST_BROKER": redis_url,
        "OUTBOX_TEST_QUEUE": queue,
        "OUTBOX_DJANGO_DB_URL": database_url(),
    }
    shared_worker.get("tests.django.workflow_worker", queue=queue, env=env)
    app = create_workflow_app(redis_url, queue)
    yield Flow(app=app, prefix=uuid.uuid4().hex[:10])
    close_app(app)


def root_of(result: AsyncResult[Any]) -> str:
    while result.parent is not None:
        result = result.parent
    return str(result.id)


def test_a_chain_runs_each_step_once_and_its_workflow_succeeds(flow: Flow) -> None:
    with transaction.atomic():
        result = chain(
            flow.s(ADD, 1, 2, flow.key("a")), flow.s(ADD, 10, flow.key("b"))
        ).apply_async()
    root = root_of(result)
    done = flow.finished(root)
    assert (done.status, done.steps_done, done.steps_total) == ("succeeded", 2, 2)
    assert (effect(flow.key("a")), effect(flow.key("b"))) == (3, 13)
    assert CompletedTask.objects.filter(root_id=root).count() == 2


def test_a_chord_joins_in_the_database_and_its_body_gets_the_results_in_order(
    flow: Flow,
) -> None:
    header = [flow.s(ADD, n, n, flow.key(f"h{n}")) for n in range(4)]
    with transaction.atomic():
        result = chord(header)(flow.s(COLLECT, flow.key("body")))
    root = root_of(result)
    done = flow.finished(root)
    assert (done.status, done.steps_done, done.steps_total) == ("succeeded", 5, 5)
    assert effect(flow.key("body")) == [0, 2, 4, 6]
    assert list(ChordJoin.objects.values_list("root_id", "remaining")) == [(root, 0)]


def test_a_rolled_back_canvas_leaves_no_workflow(flow: Flow) -> None:
    with rolled_back():
        chain(flow.s(ADD, 1, 2, flow.key("a")), flow.s(ADD, 1, flow.key("b"))).apply_async()
        assert Workflow.objects.count() == 1
    assert not Workflow.objects.exists()


def test_a_dead_lettered_step_fails_its_workflow_and_its_requeue_resumes_it(
    flow: Flow, admin_user: User, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with transaction.atomic():
        result = chain(
            flow.s(ADD, 1, 1, flow.key("first")), flow.s(FAILS_UNTIL, flow.key("second"))
        ).apply_async()
    root = root_of(result)
    failed = flow.finished(root)
    letter = DeadLetter.objects.get(task_name=FAILS_UNTIL)
    assert (failed.status, failed.failed_task_id) == ("failed", letter.task_id)
    client = Client()
    client.force_login(admin_user)
    workflow = Workflow.objects.get(root_id=root)
    page = client.get(reverse("admin:django_outbox_workflow_change", args=[workflow.pk]))
    letter_url = reverse("admin:django_outbox_deadletter_change", args=[letter.pk])
    assert f'<a href="{letter_url}">{letter.task_id}</a>' in page.content.decode()

    let_pass(flow.key("second"))
    with transaction.atomic():
        letter.requeue(by="ops", app=flow.app)
        assert Workflow.objects.get(root_id=root).status == "running"
    done = flow.finished(root)
    assert (done.status, done.steps_done, done.steps_total) == ("succeeded", 2, 2)
    assert effect(flow.key("second")) == 2


def test_a_header_step_running_after_its_chord_was_cancelled_completes_without_the_body(
    flow: Flow,
) -> None:
    # One header step waits 5 s on the worker (a broker ETA), the other is parked for an
    # hour; the parked one is cancelled before the first runs.
    header = [
        flow.s(ADD, 1, 1, flow.key("h0")).set(countdown=5),
        flow.s(ADD, 2, 2, flow.key("h1")).set(countdown=3600),
    ]
    with transaction.atomic():
        result = chord(header)(flow.s(COLLECT, flow.key("body")))
    root = root_of(result)
    parked = OutboxMessage.objects.filter(available_at__gt=utcnow() + timedelta(minutes=30))

    cancelled = cancel_messages(parked, by=None, app=flow.app)

    assert len(cancelled.cancelled) == 1
    assert cancelled.revoked
    closed = Workflow.objects.get(root_id=root)
    assert (closed.status, closed.steps_done, closed.steps_total) == ("cancelled", 0, 3)
    assert effect(flow.key("h0")) is None  # the cancel came first
    assert not ChordJoin.objects.filter(root_id=root).exists()
    # The other header step still runs, finds its chord closed, and is counted done;
    # nothing waits on the cancelled step, and the body is never dispatched.
    wait_for(
        lambda: CompletedTask.objects.filter(root_id=root).exists(),
        timeout=30,
        what="the other header step",
    )
    assert effect(flow.key("h0")) == 2
    time.sleep(1.0)  # a body dispatched by the step would be written with its commit
    done = Workflow.objects.get(root_id=root)
    assert (done.status, done.steps_done, done.finished_at) == ("cancelled", 1, closed.finished_at)
    assert not DeadLetter.objects.exists()
    assert not OutboxMessage.objects.exists()
    assert effect(flow.key("body")) is None
