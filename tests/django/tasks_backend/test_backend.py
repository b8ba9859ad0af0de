"""The ``django.tasks`` backend without a worker: validation, capabilities, what ``enqueue``
writes, the priority mapping, the signal at enqueue, and the system checks.

The intent of Django's own backend tests (``tests/tasks/test_immediate_backend.py`` and
``test_tasks.py``) where it applies: invalid tasks are refused at definition and at
enqueue, capability flags match what the backend does, ``task_enqueued`` is sent with the
backend class as sender.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from celery import Celery

pytest.importorskip("django.tasks")  # Django >= 6.0

from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone

from celery_outbox import OutboxTask
from django_outbox.models import OutboxMessage
from django_outbox.tasks import DurableTask, OutboxBackend, task
from django_outbox.tasks.backend import broker_priority, runs_low_first
from tests.django.atomic_tasks import events
from tests.django.helpers import rolled_back
from tests.django.tasks_backend.app import app

pytestmark = [
    pytest.mark.usefixtures("tasks_setting"),
    pytest.mark.django_db,
    pytest.mark.redis,
    # Celery's Redis result backend calls redis-py's deprecated ``setex``.
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]


def module_level(key: str) -> None:
    """A function that is not yet a task."""


def badly_configured(key: str) -> None:
    """A function made a task with a bad option."""


def row_of(task_id: str) -> OutboxMessage:
    return OutboxMessage.objects.get(task_id=task_id)


def test_the_backend_is_the_outbox_backend_with_its_capabilities(tasks: ModuleType) -> None:
    backend = task_backends["default"]
    assert isinstance(backend, OutboxBackend)
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_priority
    assert backend.supports_get_result  # a result backend with result_extended
    assert task_backends["plain"].supports_get_result is False  # no result backend
    with pytest.raises(NotImplementedError, match="no result_backend"):
        task_backends["plain"].get_result("any-id")


def test_a_task_is_a_durable_task_with_a_celery_outbox_task(tasks: ModuleType) -> None:
    assert isinstance(tasks.always_fails, DurableTask)
    celery_task = app.tasks["tests.django.tasks_backend.functions.always_fails"]
    assert isinstance(celery_task, OutboxTask)
    assert (celery_task.max_retries, celery_task.retry_backoff) == (2, 0.1)
    assert celery_task.retry_backoff_max == 0.2
    # Options not given keep OutboxTask's defaults.
    record = app.tasks["tests.django.tasks_backend.functions.record"]
    assert record.max_retries == OutboxTask.max_retries
    assert record.retry_queue is None
    elsewhere = app.tasks["tests.django.tasks_backend.functions.retried_elsewhere"]
    assert elsewhere.retry_queue == "retries"


def test_enqueue_writes_a_row_in_the_transaction_with_the_result_id(tasks: ModuleType) -> None:
    with transaction.atomic():
        result = tasks.record.enqueue("k", value={"a": (1, 2)})
        row = row_of(result.id)  # known before COMMIT; the row is in this transaction
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs) == (["k"], {"value": {"a": [1, 2]}})
    assert result.backend == "default"
    assert result.enqueued_at is not None
    assert row.task_name == "tests.django.tasks_backend.functions.record"
    assert json.loads(row.payload)[:2] == [["k"], {"value": {"a": [1, 2]}}]
    assert row.options["routing_key"] == app.conf.task_default_queue


def test_a_rolled_back_enqueue_leaves_no_row(tasks: ModuleType) -> None:
    with rolled_back():
        result = tasks.record.enqueue("k")
    assert not OutboxMessage.objects.filter(task_id=result.id).exists()


def test_queue_priority_and_run_after_become_celery_options(tasks: ModuleType) -> None:
    later = timezone.now() + timedelta(hours=1)
    result = tasks.elsewhere.using(run_after=later).enqueue("k")
    row = row_of(result.id)
    assert row.options["routing_key"] == "djtasks-other"
    assert row.options["properties"]["priority"] == 9  # Django -100 is Redis' last
    assert row.available_at == later  # beyond outbox_park_after: parked in the table
    soon = tasks.record.using(run_after=timezone.now() + timedelta(seconds=0.5)).enqueue("k")
    assert row_of(soon.id).available_at < timezone.now() + timedelta(seconds=0.5)  # an ETA


@pytest.mark.parametrize(
    ("priority", "amqp", "redis"),
    [(-100, 0, 9), (-50, 2, 7), (0, 5, 4), (1, 5, 4), (50, 7, 2), (100, 9, 0)],
)
def test_priority_maps_linearly_onto_the_broker_range(priority: int, amqp: int, redis: int) -> None:
    assert broker_priority(priority, low_first=False) == amqp
    assert broker_priority(priority, low_first=True) == redis


def test_the_priority_order_follows_the_broker_url() -> None:
    assert runs_low_first("redis://localhost/0")
    assert runs_low_first("rediss://h/1")
    assert not runs_low_first("amqp://guest@localhost//")
    assert not runs_low_first(None)


def test_task_enqueued_is_sent_by_the_backend_class(tasks: ModuleType) -> None:
    seen: list[tuple[Any, Any]] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append((sender, task_result))

    task_enqueued.connect(receiver)
    try:
        result = tasks.record.enqueue("k")
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == [(OutboxBackend, result)]


def test_aenqueue_writes_the_row_too(tasks: ModuleType) -> None:
    # async_to_sync: the backend's sync_to_async then runs in this thread, in its transaction.
    result = async_to_sync(tasks.async_double.aenqueue)("k", 2)
    assert row_of(result.id).task_name == "tests.django.tasks_backend.functions.async_double"
    assert result.task.priority == 10


def test_an_invalid_task_is_refused_as_django_refuses_it(tasks: ModuleType) -> None:
    def nested(key: str) -> None:
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task(nested)
    with pytest.raises(InvalidTask, match="priority must be a whole number"):
        task(priority=101)(module_level)
    with pytest.raises(InvalidTask, match="Queue 'nowhere' is not valid"):
        task(queue_name="nowhere")(module_level)
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        task(takes_context=True)(module_level)
    with pytest.raises(InvalidTask, match="aware datetime"):
        tasks.record.using(run_after=datetime(2030, 1, 1))
    with pytest.raises(InvalidTask, match="Queue 'nowhere' is not valid"):
        tasks.record.using(queue_name="nowhere")


def test_arguments_that_are_not_json_are_refused_before_any_row(tasks: ModuleType) -> None:
    with pytest.raises(TypeError):
        tasks.record.enqueue("k", value=object())
    assert not OutboxMessage.objects.exists()


def test_outbox_options_need_an_outbox_backend(settings: Any) -> None:
    settings.TASKS = {
        **settings.TASKS,
        "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
    }
    with pytest.raises(InvalidTask, match="'immediate' is not an outbox backend"):
        task(backend="immediate", max_retries=1)(module_level)


def test_a_bad_outbox_option_is_an_error_at_enqueue_naming_it(tasks: ModuleType) -> None:
    bad = task(retry_backoff_max=-1)(badly_configured)
    with pytest.raises(Exception, match="retry_backoff_max"):
        bad.enqueue("k")


def test_an_unknown_id_does_not_exist(tasks: ModuleType) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("no-such-task-id")


def test_a_pending_row_reads_ready_before_its_commit(tasks: ModuleType) -> None:
    with transaction.atomic():
        result = tasks.record.enqueue("k", value=3)
        read = default_task_backend.get_result(result.id)
    assert (read.status, read.args, read.kwargs) == (TaskResultStatus.READY, ["k"], {"value": 3})
    assert read.task == tasks.record


def check_ids(alias: str) -> list[str]:
    return [message.id for message in task_backends[alias].check()]


def test_checks_report_no_celery_app_an_unrouted_queue_and_unreadable_results(
    settings: Any,
) -> None:
    outbox = "django_outbox.tasks.OutboxBackend"
    app_option = settings.TASKS["default"]["OPTIONS"]
    settings.TASKS = {
        **settings.TASKS,
        "lost": {"BACKEND": outbox, "OPTIONS": {"CELERY_APP": "nowhere_at_all:app"}},
        "strict": {
            "BACKEND": outbox,
            "QUEUES": ["default", "declared", "undeclared"],
            "OPTIONS": {"CELERY_APP": "tests.django.tasks_backend.app:strict_app"},
        },
        "swept": {**settings.TASKS["default"], "OPTIONS": {**app_option, "DATABASE": "other"}},
        "unswept": {**settings.TASKS["default"], "OPTIONS": {**app_option, "DATABASE": "nope"}},
    }
    assert check_ids("default") == []
    assert check_ids("lost") == ["django_outbox.E101"]
    assert check_ids("plain") == ["django_outbox.W101"]
    settings.DJANGO_OUTBOX_DATABASES = ["default", "other"]
    assert "django_outbox.E103" not in check_ids("swept")
    assert "django_outbox.E103" in check_ids("unswept")
    settings.DJANGO_OUTBOX_DATABASES = ["default"]
    assert "django_outbox.E103" in check_ids("swept")
    (unrouted, _) = task_backends["strict"].check()
    assert unrouted.id == "django_outbox.E102"
    assert "'undeclared'" in unrouted.msg
    # Django runs them through its own check of every task backend.
    from django.core.checks import run_checks

    assert {"django_outbox.E101", "django_outbox.E102"} <= {m.id for m in run_checks()}


@pytest.fixture
def outbox_celery_app() -> Celery:
    """The pytest plugin holds the publishing of the backend's app."""
    return app


def test_the_pytest_plugin_sees_an_enqueue_and_drains_it(
    tasks: ModuleType, outbox: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_TEST_OUTPUT", str(tmp_path / "runs.jsonl"))
    with transaction.atomic():
        result = tasks.record.enqueue("drained", value=5)
    dispatch = outbox.assert_sent(tasks.record.module_path, args=("drained",), kwargs={"value": 5})
    assert dispatch.task_id == result.id
    assert dispatch.using == "default"
    outbox.drain()  # runs the function here, in the test
    assert [run["key"] for run in events(tmp_path / "runs.jsonl")] == ["drained"]


@pytest.mark.django_db(databases=["default", "other"])
def test_enqueue_joins_the_transaction_of_the_backend_database(
    tasks: ModuleType, settings: Any
) -> None:
    settings.TASKS = {
        **settings.TASKS,
        "default": {
            **settings.TASKS["default"],
            "OPTIONS": {**settings.TASKS["default"]["OPTIONS"], "DATABASE": "other"},
        },
    }
    with rolled_back(using="other"):
        rolled = tasks.record.enqueue("k")
        assert OutboxMessage.objects.using("other").filter(task_id=rolled.id).exists()
    with transaction.atomic(using="other"):
        kept = tasks.record.enqueue("k")
    other = OutboxMessage.objects.using("other")
    assert not other.filter(task_id=rolled.id).exists()  # rolled back with "other"
    assert other.filter(task_id=kept.id).exists()  # the test's transaction: never published
    assert not OutboxMessage.objects.using("default").exists()
