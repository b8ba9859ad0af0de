"""Django task functions of the ``django.tasks`` backend tests (imported with ``TASKS`` set).

Every run appends a JSON line to ``OUTBOX_TEST_OUTPUT`` (:func:`tests.django.atomic_tasks.log`):
a file, so it counts runs whether their transaction committed or not.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from django.tasks import TaskContext
from django.tasks import task as django_task

from django_outbox.tasks import task
from tests.django.atomic_tasks import log


class Unavailable(ConnectionError):
    """The failure :func:`always_fails` raises."""


@task
def record(key: str, value: Any = None) -> Any:
    """Record the run; return ``value``."""
    log("run", "record", "", key=key, at=time.time())
    return value


@task(max_retries=2, retry_backoff=0.1, retry_backoff_max=0.2)
def always_fails(key: str) -> None:
    """Record the run, then fail (retried twice, then a dead letter)."""
    log("run", "always_fails", "", key=key)
    raise Unavailable(f"down for {key}")


@task(retry_queue="retries")
def retried_elsewhere(key: str) -> None:
    """Never enqueued: its Celery task carries ``retry_queue``."""


@task(atomic=True)
def atomic_record(key: str) -> str:
    """An atomic task: its ``CompletedTask`` row commits with its body."""
    log("run", "atomic_record", "", key=key)
    return key


@django_task  # Django's own decorator: the backend's task_class, OutboxTask defaults
def slow(key: str, seconds: float) -> str:
    """Record the start, sleep ``seconds``, return ``"done"``."""
    log("run", "slow", "", key=key, at=time.time())
    time.sleep(seconds)
    return "done"


@task(priority=10)
async def async_double(key: str, n: int) -> int:
    """An async task function: record the run, return ``2 * n``."""
    await asyncio.sleep(0)
    log("run", "async_double", "", key=key)
    return 2 * n


@task(takes_context=True, retry_backoff=0.1)
def flaky_with_context(context: TaskContext, key: str) -> int:
    """Fail on the first attempt; return the attempt number (``context.attempt``)."""
    log("run", "flaky_with_context", context.task_result.id, key=key, attempt=context.attempt)
    if context.attempt == 1:
        raise Unavailable("first attempt")
    return int(context.attempt)


@task(queue_name="djtasks-other", priority=-100)
def elsewhere(key: str) -> None:
    """A task of another queue (no worker consumes it)."""


@task(backend="plain")
def plain(key: str) -> None:
    """A task of the backend without a result backend."""
