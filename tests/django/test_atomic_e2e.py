"""Atomic tasks end to end: real PostgreSQL, Redis and a prefork worker (two processes).

Each task adds one to a counter row and dispatches a follow-up in its transaction. A
duplicate delivery, later or at the same moment, changes nothing and is skipped with the
signal; a failing attempt rolls its write and its follow-up back, and the retry commits
them once.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from django_outbox.models import CompletedTask, OutboxMessage
from tests.brokers import delete_queue, new_queue_name, purge_queue
from tests.django.atomic_tasks import counter, create_atomic_app, create_counter, events
from tests.django.conftest import close_app
from tests.django.helpers import database_url, postgres_only
from tests.worker import SharedWorker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]


@dataclass
class Run:
    """The test's app (the worker's tasks), its counter key, and the worker's event log."""

    app: Celery
    output: Path
    key: str
    since: int

    def events(self, event: str, task: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in events(self.output)[self.since :]
            if e["event"] == event and (task is None or e["task"] == task)
        ]

    def wait(self, event: str, count: int, task: str | None = None) -> list[dict[str, Any]]:
        wait_for(
            lambda: len(self.events(event, task)) >= count,
            timeout=30,
            what=f"{count} {event} event(s) of {task or 'any task'}",
        )
        return self.events(event, task)


@pytest.fixture(scope="module")
def queue(redis_url: str) -> Iterator[str]:
    name = new_queue_name()
    yield name
    delete_queue(redis_url, name)


@pytest.fixture
def run(
    redis_url: str, queue: str, shared_worker: SharedWorker, tmp_path_factory: Any
) -> Iterator[Run]:
    purge_queue(redis_url, queue)
    output = Path(str(tmp_path_factory.getbasetemp())) / f"atomic-events-{queue}.jsonl"
    env = {
        "OUTBOX_TEST_BROKER": redis_url,
        "OUTBOX_TEST_QUEUE": queue,
        "OUTBOX_TEST_OUTPUT": str(output),
        "OUTBOX_DJANGO_DB_URL": database_url(),
    }
    shared_worker.get(
        "tests.django.atomic_worker", queue=queue, env=env, pool="prefork", concurrency=2
    )
    key = f"k-{uuid.uuid4().hex[:12]}"
    create_counter(key)
    app = create_atomic_app(redis_url, queue)
    yield Run(app=app, output=output, key=key, since=len(events(output)))
    close_app(app)


def settled(run: Run) -> None:
    """Wait until the outbox is empty (every row published), then long enough for a
    duplicate follow-up, were there one, to run.
    """
    wait_for(lambda: not OutboxMessage.objects.exists(), timeout=15, what="an empty outbox")
    time.sleep(0.5)


def test_a_duplicate_delivered_later_is_skipped_and_changes_nothing(run: Run) -> None:
    bump = run.app.tasks["atomic.bump"]
    task_id = f"bump-{run.key}"
    bump.apply_async(args=[run.key], task_id=task_id)
    run.wait("follow", 1)
    first = CompletedTask.objects.get(task_id=task_id)
    assert (first.task_name, json.loads(first.result or "")) == ("atomic.bump", 1)

    bump.apply_async(args=[run.key], task_id=task_id)  # the same task id, delivered again
    (skipped,) = run.wait("skipped", 1)
    settled(run)
    assert (skipped["task"], skipped["id"]) == ("atomic.bump", task_id)
    assert skipped["completed_at"] == first.completed_at.isoformat()
    assert counter(run.key) == 1
    assert len(run.events("run", "atomic.bump")) == 1
    assert len(run.events("follow")) == 1
    assert list(CompletedTask.objects.filter(task_id=task_id).values_list("result", flat=True)) == [
        first.result
    ]


def test_a_duplicate_delivered_during_the_first_run_waits_then_is_skipped(run: Run) -> None:
    task_id = f"slow-{run.key}"
    # Two deliveries of one message, straight to the broker: both worker processes take one.
    for _ in range(2):
        run.app.send_task("atomic.slow", args=[run.key, 1.5], task_id=task_id)
    run.wait("skipped", 1)
    run.wait("follow", 1)
    settled(run)
    assert counter(run.key) == 1
    assert len(run.events("run", "atomic.slow")) == 1
    assert len(run.events("follow")) == 1
    assert CompletedTask.objects.filter(task_id=task_id).count() == 1


def test_a_failed_attempt_rolls_back_then_the_retry_commits_once(run: Run) -> None:
    task_id = f"flaky-{run.key}"
    run.app.tasks["atomic.flaky"].apply_async(args=[run.key], task_id=task_id)
    attempts = run.wait("run", 2, "atomic.flaky")
    run.wait("follow", 1)
    settled(run)
    assert [a["retries"] for a in attempts] == [0, 1]
    assert counter(run.key) == 1  # the first attempt's write rolled back
    assert len(run.events("follow")) == 1  # and so did its follow-up
    completion = CompletedTask.objects.get(task_id=task_id)
    assert json.loads(completion.result or "") == 1
    assert run.events("skipped") == []
