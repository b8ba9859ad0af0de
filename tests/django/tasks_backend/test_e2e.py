"""The ``django.tasks`` backend end to end: PostgreSQL, Redis (broker and results) and a
real worker. The promises of ``OutboxTask``, through ``@task`` and ``enqueue()``.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("django.tasks")  # Django >= 6.0

from django.db import transaction
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils import timezone

from celery_outbox.sweep_task import sweep_app
from django_outbox.models import CompletedTask, DeadLetter, OutboxMessage
from tests.brokers import purge_queue
from tests.django.atomic_tasks import events
from tests.django.helpers import database_url, postgres_only, rolled_back
from tests.django.tasks_backend.app import app
from tests.worker import REPO_ROOT, SharedWorker, wait_for, worker_env

pytestmark = [
    pytest.mark.usefixtures("tasks_setting"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.redis,
    postgres_only,
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]


@dataclass
class Run:
    """The worker's event log from this test on, and the environment it runs with."""

    output: Path
    env: dict[str, str]
    since: int

    def events(self, event: str, key: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in events(self.output)[self.since :]
            if e["event"] == event and (key is None or e.get("key") == key)
        ]

    def signals(self, task_id: str) -> list[tuple[str, str]]:
        """``(signal, status)`` of the worker's Django signals for ``task_id``."""
        return [
            (e["event"], e["status"])
            for e in events(self.output)[self.since :]
            if e["id"] == task_id and e["event"] in ("started", "finished")
        ]

    def wait(self, what: Any, *, timeout: float = 30) -> None:
        wait_for(what, timeout=timeout, what=getattr(what, "__doc__", None) or "the worker")


@pytest.fixture
def run(
    redis_url: str, djtasks_queue: str, shared_worker: SharedWorker, tmp_path_factory: Any
) -> Run:
    purge_queue(redis_url, djtasks_queue)
    output = Path(str(tmp_path_factory.getbasetemp())) / f"djtasks-{djtasks_queue}.jsonl"
    env = {
        "OUTBOX_TEST_BROKER": redis_url,
        "OUTBOX_TEST_QUEUE": djtasks_queue,
        "OUTBOX_TEST_OUTPUT": str(output),
        "OUTBOX_DJANGO_DB_URL": database_url(),
    }
    shared_worker.get("tests.django.tasks_backend.worker", queue=djtasks_queue, env=env)
    return Run(output=output, env=env, since=len(events(output)))


def key() -> str:
    return f"k-{uuid.uuid4().hex[:10]}"


def result_of(result_id: str) -> Any:
    return task_backends["default"].get_result(result_id)


def finished(result_id: str) -> bool:
    return bool(result_of(result_id).is_finished)


def test_a_committed_task_runs_once_with_django_signals_and_reads_successful(
    run: Run, tasks: ModuleType
) -> None:
    k = key()
    with transaction.atomic():
        result = tasks.record.enqueue(k, value={"n": 1})
    run.wait(lambda: finished(result.id))
    read = result_of(result.id)
    assert read.status == TaskResultStatus.SUCCESSFUL
    assert read.return_value == {"n": 1}
    assert (read.args, read.kwargs, read.task) == ([k], {"value": {"n": 1}}, tasks.record)
    assert read.finished_at is not None
    assert len(read.worker_ids) == 1
    assert len(run.events("run", k)) == 1
    assert run.signals(result.id) == [("started", "RUNNING"), ("finished", "SUCCESSFUL")]
    assert {e["sender"] for e in run.events("started")} == {"OutboxBackend"}


def test_a_rolled_back_enqueue_runs_nothing(run: Run, tasks: ModuleType) -> None:
    rolled, kept = key(), key()
    with rolled_back():
        lost = tasks.record.enqueue(rolled)
    with transaction.atomic():
        sentinel = tasks.record.enqueue(kept)
    run.wait(lambda: finished(sentinel.id))
    time.sleep(0.5)
    assert run.events("run", rolled) == []
    assert not OutboxMessage.objects.filter(task_id=lost.id).exists()
    with pytest.raises(TaskResultDoesNotExist):
        result_of(lost.id)


def test_a_process_killed_after_commit_loses_nothing_the_sweep_publishes_it(
    run: Run, tasks: ModuleType
) -> None:
    k = key()
    done = subprocess.run(
        [sys.executable, "-m", "tests.django.tasks_backend.client", k],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=worker_env(run.env),
    )
    assert done.returncode == -9, done.stderr  # SIGKILL, right after COMMIT
    task_id = done.stdout.strip()
    assert OutboxMessage.objects.filter(task_id=task_id, status="pending").exists()
    assert result_of(task_id).status == TaskResultStatus.READY  # the row proves it exists
    time.sleep(0.5)
    assert run.events("run", k) == []  # never published
    sweep_app(app)
    run.wait(lambda: finished(task_id))
    assert result_of(task_id).return_value == "swept"
    assert len(run.events("run", k)) == 1


@pytest.mark.parametrize("delay", [1.5, 3.0], ids=["eta", "parked"])
def test_run_after_is_honoured(run: Run, tasks: ModuleType, delay: float) -> None:
    k = key()
    run_after = timezone.now() + timedelta(seconds=delay)
    with transaction.atomic():
        result = tasks.record.using(run_after=run_after).enqueue(k)
    parked = OutboxMessage.objects.filter(task_id=result.id, status="pending").exists()
    assert parked is (delay > app.conf.outbox_park_after)

    def ran() -> bool:
        sweep_app(app)  # the beat's job: publishes the parked row once it is due
        return bool(run.events("run", k))

    run.wait(ran)
    (started,) = run.events("run", k)
    assert started["at"] >= run_after.timestamp()
    run.wait(lambda: finished(result.id))


def test_failures_retry_then_become_a_dead_letter_that_reads_failed(
    run: Run, tasks: ModuleType
) -> None:
    k = key()
    with transaction.atomic():
        result = tasks.always_fails.enqueue(k)
    run.wait(lambda: DeadLetter.objects.filter(task_id=result.id).exists())
    assert len(run.events("run", k)) == 3  # max_retries=2
    read = result_of(result.id)
    assert read.status == TaskResultStatus.FAILED
    (error,) = read.errors
    assert error.exception_class_path == "tests.django.tasks_backend.functions.Unavailable"
    assert f"down for {k}" in error.traceback
    assert run.signals(result.id) == [("started", "RUNNING"), ("finished", "FAILED")] * 3
    with pytest.raises(ValueError, match="Task failed"):
        read.return_value  # noqa: B018


def test_get_result_reads_ready_then_running_then_successful(run: Run, tasks: ModuleType) -> None:
    with transaction.atomic():
        result = tasks.slow.enqueue(key(), 1.5)
        assert result_of(result.id).status == TaskResultStatus.READY  # its row, before COMMIT
    assert result_of(result.id).status in (TaskResultStatus.READY, TaskResultStatus.RUNNING)
    run.wait(lambda: result_of(result.id).status == TaskResultStatus.RUNNING)
    run.wait(lambda: finished(result.id))
    read = result_of(result.id)
    assert (read.status, read.return_value) == (TaskResultStatus.SUCCESSFUL, "done")
    result.refresh()  # Django's API: the enqueued result object catches up
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_async_functions_context_attempts_and_atomic_tasks(run: Run, tasks: ModuleType) -> None:
    with transaction.atomic():
        doubled = tasks.async_double.enqueue(key(), 21)
        flaky = tasks.flaky_with_context.enqueue(key())
        atomic = tasks.atomic_record.enqueue(k := key())
    for result in (doubled, flaky, atomic):
        run.wait(lambda result=result: finished(result.id))
    assert result_of(doubled.id).return_value == 42
    read = result_of(flaky.id)
    assert (read.return_value, read.attempts) == (2, 2)
    assert [e["attempt"] for e in run.events("run") if e["id"] == flaky.id] == [1, 2]
    assert CompletedTask.objects.get(task_id=atomic.id).task_name.endswith("atomic_record")
    assert result_of(atomic.id).return_value == k


def test_a_task_the_worker_never_imported_becomes_a_dead_letter(
    run: Run, tasks: ModuleType
) -> None:
    from tests.django.tasks_backend.unimported import unknown_to_the_worker

    with transaction.atomic():
        result = unknown_to_the_worker.enqueue(key())
    run.wait(lambda: DeadLetter.objects.filter(task_id=result.id).exists())
    letter = DeadLetter.objects.get(task_id=result.id)
    assert letter.task_name == "tests.django.tasks_backend.unimported.unknown_to_the_worker"
    read = result_of(result.id)
    assert read.status == TaskResultStatus.FAILED
    assert read.errors[0].exception_class_path == letter.exception_type
