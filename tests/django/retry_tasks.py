"""Tasks of the retry end-to-end tests, shared by the test process and its workers.

Every attempt appends a JSON line to ``OUTBOX_TEST_OUTPUT`` (task, key, retries, time),
so the tests measure waits and count runs from what the worker really did.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import Celery, Task

from celery_outbox import OutboxRetry, OutboxTask

#: Seconds: the base of the flaky task's windows.
FLAKY_BACKOFF = 1.0


class Permanent(Exception):
    """An error no retry can fix."""


def create_retry_app(
    broker_url: str,
    queue: str,
    *,
    misconfigured: Mapping[str, Mapping[str, Any]] | None = None,
    **conf: Any,
) -> Celery:
    """The app of the retry tests, every task routed to ``queue``.

    ``misconfigured`` adds an always failing task per name, with those (bad) options.
    """
    app = Celery("retry_e2e", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        outbox_sweep_interval=0.5,
        outbox_publish_grace=0.0,
        **conf,
    )
    task = app.task
    task(base=OutboxTask, bind=True, name="retry.flaky", retry_backoff=FLAKY_BACKOFF)(flaky)
    task(base=OutboxTask, bind=True, name="retry.always", max_retries=2, retry_backoff=0.1)(always)
    task(base=OutboxTask, bind=True, name="retry.permanent", dont_autoretry_for=(Permanent,))(
        permanent
    )
    task(
        base=OutboxTask,
        bind=True,
        name="retry.deadline",
        max_retries=None,
        retry_backoff=0.2,
        retry_max_elapsed=1.5,
    )(always)
    task(base=OutboxTask, bind=True, name="retry.parked")(parked)
    task(base=OutboxTask, bind=True, name="retry.suicide")(suicide)
    task(base=OutboxTask, bind=True, name="retry.healthy")(healthy)
    task(base=OutboxTask, bind=True, name="retry.poison", max_retries=1, retry_backoff=0.05)(poison)
    task(base=OutboxTask, bind=True, name="retry.poison_once", max_retries=0)(poison)
    task(base=OutboxTask, bind=True, name="retry.huge", max_retries=0)(huge)
    task(base=OutboxTask, bind=True, name="retry.bad_retry_call")(bad_retry_call)
    task(base=OutboxTask, bind=True, name="retry.options_changed")(options_changed)
    task(base=OutboxTask, bind=True, name="retry.new_arguments")(new_arguments)
    task(base=OutboxTask, bind=True, name="retry.bare", max_retries=1)(bare_retry)
    for name, options in (misconfigured or {}).items():
        task(base=OutboxTask, bind=True, name=name, **options)(always)
    return app


def log(task: Task[Any, Any], key: str) -> int:
    """Record this attempt; return how many attempts ``key`` had, this one included."""
    path = Path(os.environ["OUTBOX_TEST_OUTPUT"])
    line = {
        "task": task.name,
        "key": key,
        "retries": task.request.retries,
        "id": task.request.id,
        "at": time.time(),
        "pid": os.getpid(),
    }
    with path.open("a") as output:
        output.write(json.dumps(line) + "\n")
    return sum(1 for entry in attempts(path) if entry["key"] == key)


def attempts(path: Path) -> list[dict[str, Any]]:
    """Every attempt recorded in ``path`` so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def flaky(self: Task[Any, Any], key: str, failures: int) -> str:
    """Fail ``failures`` times, then succeed."""
    if log(self, key) <= failures:
        raise ConnectionError(f"flaky {key}")
    return "ok"


def always(self: Task[Any, Any], key: str) -> None:
    """Always fail with a retryable error."""
    log(self, key)
    raise ValueError(f"always failing {key}")


def permanent(self: Task[Any, Any], key: str) -> None:
    """Fail with an error listed in ``dont_autoretry_for``."""
    log(self, key)
    raise Permanent(f"permanent {key}")


def parked(self: Task[Any, Any], key: str, wait: float) -> str:
    """Ask for one retry ``wait`` seconds later, then succeed."""
    if log(self, key) == 1:
        raise OutboxRetry(delay=timedelta(seconds=wait))
    return "ok"


def suicide(self: Task[Any, Any], key: str) -> None:
    """Kill the worker process running it, every time."""
    log(self, key)
    os.kill(os.getpid(), signal.SIGKILL)


def healthy(self: Task[Any, Any], key: str) -> str:
    """Succeed at once."""
    log(self, key)
    return "ok"


def poison(self: Task[Any, Any], key: str, *values: Any, **named: Any) -> None:
    """Fail with NUL and a lone surrogate in the message (the arguments may hold NaN too)."""
    log(self, key)
    raise ValueError(f"poison {key}: nul=\x00 surrogate=\ud800")


def huge(self: Task[Any, Any], key: str, size: int) -> None:
    """Fail with an exception message of ``size`` characters (issue 43: 9,000,000)."""
    log(self, key)
    raise ValueError("x" * size)


def bad_retry_call(self: Task[Any, Any], key: str, arguments: dict[str, Any]) -> None:
    """Ask for a retry with ``arguments`` that ``retry()`` does not accept."""
    log(self, key)
    raise self.retry(exc=ValueError(f"bad retry call {key}"), **arguments)


def new_arguments(self: Task[Any, Any], key: str, step: int = 1) -> str:
    """Retry with new positional, then new keyword arguments; succeed at step 3."""
    log(self, f"{key}:{step}")
    if step == 1:
        raise self.retry(args=(key, 2), countdown=0)
    if step == 2:
        raise self.retry(kwargs={"step": 3}, countdown=0)
    return "ok"


def options_changed(self: Task[Any, Any], key: str) -> None:
    """Break this task's own ``max_retries`` after the worker checked it, then fail."""
    log(self, key)
    type(self).max_retries = "3"  # type: ignore[assignment]
    raise ValueError(f"options changed {key}")


def bare_retry(self: Task[Any, Any], key: str, wait: float) -> None:
    """Ask for a retry in ``wait`` seconds naming no error; then, in an ``except`` block,
    for one more naming none (``max_retries=1``: that one is exhausted).
    """
    if log(self, key) == 1:
        raise self.retry(countdown=wait)
    try:
        raise LookupError(f"missing {key}")
    except LookupError:
        raise self.retry(countdown=0)  # noqa: B904 (retry() re-raises the handled error)
