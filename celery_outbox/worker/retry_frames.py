"""Letting a retried or failed ``OutboxTask``'s stack go as soon as Celery's tracer is done
with it.

Celery's tracer catches the task's ``Retry`` (or its error) in its own frame and keeps the
exception in
that frame's locals (``retval``, and the ``TraceInfo`` and ``ExceptionInfo`` it builds). The
exception's ``__traceback__`` leads back to the same frame, so after the task returns the
tracer's frame, every frame it was called from (the consumer's, kombu's) and Celery's
copy of the traceback (billiard's ``Traceback``, each code object's positions listed) form
a reference cycle: freed only by a full garbage collection, which CPython runs when the
objects waiting for one reach a quarter of the long-lived ones. A worker whose tasks keep
retrying (every parked retry is one) thus grows by tens of MiB of such stacks before they
are collected, and keeps the memory from then on: 86 MiB idle, ~150 MiB after 1,000 retries
on the retry-memory benchmark, flat at 88 MiB with this (docs/benchmarks.md §3).
Celery's own fix for this (celery/celery#8882, ``traceback_clear``) clears the frames of
the exception's traceback but cannot clear the tracer's, which is still running then.

Celery's ``task_postrun`` signal carries that exception (``retval``) once the retry or the
failure was stored, logged and signalled (``task_retry``/``task_failure``, ``on_retry``/
``on_failure``, and the worker's events read ``ExceptionInfo``, whose traceback text is
formatted when it is built; the dead letter was written before). Dropping the exception's
traceback there breaks the cycle, so the stack is freed by reference counting when the
tracer returns. Only ``OutboxTask`` s are touched (a ``task_postrun`` receiver connected
after this one sees their exception without its traceback);
``tests/unit/worker/test_retry_frames.py`` fails loudly if an upgrade of Celery changes the
cycle this relies on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Task
from celery.signals import task_postrun

#: Whether a task is an ``OutboxTask``.
IsOutboxTask = Callable[["Task[Any, Any] | None"], bool]


def install(is_outbox_task: IsOutboxTask) -> None:
    """Connect the release of retried and failed stacks to ``task_postrun`` (once per
    process)."""

    def release(sender: Task[Any, Any] | None = None, retval: Any = None, **_: Any) -> None:
        if isinstance(retval, BaseException) and is_outbox_task(sender):
            retval.__traceback__ = None

    task_postrun.connect(release, weak=False, dispatch_uid="celery_outbox_retry_frames")
