"""The in-process counters of the outbox, fed by the library's signals.

Imported by :mod:`celery_outbox.metrics` (which checks that ``prometheus_client`` is
installed): the counters are registered in ``prometheus_client``'s default registry and
:func:`connect` hooks them to :mod:`celery_outbox.signals`. Until then the signals have
no receivers and sending them costs a check each.

Under a Celery prefork worker each child counts its own publishes, retries and dead
letters: run the worker with ``PROMETHEUS_MULTIPROC_DIR`` set (an empty directory, set
before ``prometheus_client`` is imported) and serve a registry holding a
``prometheus_client.multiprocess.MultiProcessCollector`` (docs/observability.md).

Labels are task names and entry points only, never task ids or arguments.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Histogram

from celery_outbox import signals
from celery_outbox.clock import utcnow
from celery_outbox.records import StoredMessage

#: Upper bounds of the latency histogram's buckets, in seconds: an on-commit publish
#: takes milliseconds, a sweep up to a few intervals, a broker outage minutes to hours.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0, 900.0, 3600.0,
)  # fmt: skip

PUBLISHED = Counter(
    "celery_outbox_published",
    "Outbox rows published, by entry point (commit, sweep, relay, now).",
    ["path"],
)
PUBLISH_ERRORS = Counter(
    "celery_outbox_publish_errors",
    "Outbox rows a publish pass left unpublished (rescheduled or failed for good).",
)
PUBLISH_LATENCY = Histogram(
    "celery_outbox_publish_latency_seconds",
    "From a row's commit (its due time; its creation once a publish failed) to the broker.",
    buckets=LATENCY_BUCKETS,
)
RETRIES = Counter(
    "celery_outbox_retries",
    "Task retries scheduled by workers, by path (eta: a broker ETA; parked: an outbox row).",
    ["path"],
)
DEAD_LETTERED = Counter(
    "celery_outbox_dead_lettered", "Tasks that became dead letters, by task name.", ["task"]
)
DUPLICATES_SKIPPED = Counter(
    "celery_outbox_duplicates_skipped",
    "Duplicate deliveries of atomic tasks skipped without running, by task name.",
    ["task"],
)


def connect() -> None:
    """Count from now on (idempotent: each receiver is connected once)."""
    for signal, receiver in _RECEIVERS:
        uid = f"celery_outbox.metrics.{receiver.__name__}"
        signal.connect(receiver, weak=False, dispatch_uid=uid)


def disconnect() -> None:
    """Stop counting (the counters keep their values; :func:`connect` resumes)."""
    for signal, receiver in _RECEIVERS:
        signal.disconnect(dispatch_uid=f"celery_outbox.metrics.{receiver.__name__}")


def on_published(
    sender: Any = None, messages: Sequence[StoredMessage] = (), path: str = "", **_: Any
) -> None:
    """Count published rows and observe how long each waited for the broker."""
    if not messages:
        return
    _child(PUBLISHED, path).inc(len(messages))
    now = utcnow()
    for message in messages:
        since = message.available_at
        if message.attempts > 0 and message.created_at is not None:
            since = message.created_at  # waited since its commit, through failed publishes
        PUBLISH_LATENCY.observe(max((now - since).total_seconds(), 0.0))


def on_publish_failed(sender: Any = None, task_ids: Sequence[str] = (), **_: Any) -> None:
    """Count rows a publish pass left unpublished."""
    PUBLISH_ERRORS.inc(len(task_ids))


def on_retry(sender: Any = None, path: str = "", **_: Any) -> None:
    """Count one retry by its path."""
    _child(RETRIES, path).inc()


def on_dead_lettered(sender: Any = None, **_: Any) -> None:
    """Count one dead letter of the task ``sender``."""
    _child(DEAD_LETTERED, _task_name(sender)).inc()


def on_duplicate_skipped(sender: Any = None, **_: Any) -> None:
    """Count one skipped duplicate of the task ``sender``."""
    _child(DUPLICATES_SKIPPED, _task_name(sender)).inc()


@functools.lru_cache(maxsize=4096)
def _child(counter: Counter, label: str) -> Any:
    """``counter.labels(label)``, kept: a publish on the request's path then costs one
    dictionary lookup, not the lock and checks of ``labels()`` (entry points and task
    names are few; the cache is bounded all the same)."""
    return counter.labels(label)


def _task_name(task: Any) -> str:
    return str(getattr(task, "name", None) or "unknown")


_RECEIVERS = (
    (signals.message_published, on_published),
    (signals.message_publish_failed, on_publish_failed),
    (signals.task_retry_scheduled, on_retry),
    (signals.task_dead_lettered, on_dead_lettered),
    (signals.task_duplicate_skipped, on_duplicate_skipped),
)
