"""Running one delivery of an outbox task, and letting its stack go.

Running one delivery of an outbox task on a worker, and ``OutboxTask.retry`` within it.

The attempt being run is held here (a context variable), with whether its failure was
already handled: a task that called ``self.retry()`` and was dead-lettered re-raises
its error through the run without being handled twice.

Letting a retried or failed ``OutboxTask``'s stack go as soon as Celery's tracer is done
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
``tests/unit/worker/test_runner_retry_frames.py`` fails loudly if an upgrade of Celery changes the
cycle this relies on.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from celery.signals import task_postrun

from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.exceptions import OutboxConfigError, StoreError
from celery_outbox.long_text import bounded_logger
from celery_outbox.registry import store_for
from celery_outbox.store.base import OutboxStore
from celery_outbox.worker.attempt import Attempt
from celery_outbox.worker.letters import (
    write_pending_letter,
    write_redelivery_dead_letter,
    write_unreadable_limit_dead_letter,
)
from celery_outbox.worker.outcomes import after_failure
from celery_outbox.worker.policy import too_many_deliveries
from celery_outbox.worker.republish import requeue_later

logger = bounded_logger(__name__)


# --- Running one delivery of an outbox task on a worker, and ``OutboxTask.retry`` within it.


@dataclass
class _Run:
    """The attempt running in this context; ``handled`` once its failure was handled;
    ``deferring`` while its body runs inside an atomic task's transaction.
    """

    attempt: Attempt
    handled: bool = False
    deferring: bool = False


class DeferredRetry(Retry):
    """``retry()`` called inside an atomic task's transaction: carried out by the runner
    once that transaction rolled back, so the retry is not rolled back with it.
    """

    def __init__(self, perform: Callable[[], Exception]) -> None:
        super().__init__("retry deferred until the atomic transaction rolled back")
        self.perform = perform


_running: ContextVar[_Run | None] = ContextVar("celery_outbox_attempt", default=None)


@contextmanager
def _running_attempt(attempt: Attempt) -> Iterator[_Run]:
    run = _Run(attempt)
    token = _running.set(run)
    try:
        yield run
    finally:
        _running.reset(token)


def run_attempt(
    task: Task[Any, Any], attempt: Attempt, call: Callable[[], Any], *, rng: random.Random
) -> Any:
    """Run ``attempt`` (``call`` runs the task body); on failure retry it without
    sleeping, or write its dead letter. A redelivered message is counted first, and
    dead-lettered without running past ``outbox_max_deliveries``. A message put back
    because its dead letter could not be written writes that letter and does not run.
    """
    if attempt.pending_letter is not None:
        write_pending_letter(task, attempt)
        raise Ignore()
    with _running_attempt(attempt) as run:
        if attempt.redelivered:
            return _run_redelivered(task, run, call, rng)
        return _run(task, run, call, rng)


def retry(
    task: Task[Any, Any],
    attempt: Attempt,
    exc: Exception | None,
    *,
    rng: random.Random,
    args: Any = None,
    kwargs: Any = None,
    countdown: Any = None,
    eta: Any = None,
    max_retries: Any = None,
    overrides: Mapping[str, Any] | None = None,
) -> Exception:
    """``OutboxTask.retry``: the ``Retry`` to raise, or ``exc`` once dead-lettered
    (:class:`RetriesExhausted` when ``exc`` is ``None``: no error to name).

    ``attempt`` is the one running (:func:`running_attempt`), or built from the request
    when none runs here.
    """
    run = _running.get()
    if run is not None and run.attempt is attempt:
        if run.deferring:
            run.deferring = False
            return DeferredRetry(
                lambda: retry(
                    task,
                    attempt,
                    exc,
                    rng=rng,
                    args=args,
                    kwargs=kwargs,
                    countdown=countdown,
                    eta=eta,
                    max_retries=max_retries,
                    overrides=overrides,
                )
            )
        run.handled = True
    return after_failure(
        task,
        attempt,
        exc,
        explicit=True,
        rng=rng,
        countdown=countdown,
        eta=eta,
        max_retries=max_retries,
        args=args,
        kwargs=kwargs,
        overrides=overrides,
    )


def handled_error() -> Exception | None:
    """The error being handled where ``retry()`` was called (its ``except`` block), if any."""
    error = sys.exc_info()[1]
    return error if isinstance(error, Exception) and not isinstance(error, Retry) else None


def running_attempt() -> Attempt | None:
    """The attempt running in this context, if any."""
    run = _running.get()
    return None if run is None else run.attempt


@contextmanager
def deferring_retries() -> Iterator[None]:
    """Within this block (an atomic task's transaction), ``retry()`` returns a
    :class:`DeferredRetry` instead of writing its retry.
    """
    run = _running.get()
    if run is None:
        yield
        return
    run.deferring = True
    try:
        yield
    finally:
        run.deferring = False


def _run(task: Task[Any, Any], run: _Run, call: Callable[[], Any], rng: random.Random) -> Any:
    try:
        return call()
    except DeferredRetry as deferred:  # the transaction rolled back: now write the retry
        raise deferred.perform() from None
    except (Retry, Ignore, Reject):
        raise
    except Exception as exc:  # any failure is retried or dead-lettered: that is the point
        if run.handled:
            raise
        run.handled = True
        outcome = after_failure(task, run.attempt, exc, explicit=False, rng=rng)
        if isinstance(outcome, Retry):
            raise outcome from None
        raise


def _run_redelivered(
    task: Task[Any, Any], run: _Run, call: Callable[[], Any], rng: random.Random
) -> Any:
    # A redelivered message may be one that keeps killing its worker: count it,
    # and past outbox_max_deliveries dead-letter it without running it again.
    attempt = run.attempt
    app = task.app
    now = utcnow()
    store = store_for(app)
    try:
        limit = OutboxConfig.from_celery(app).max_deliveries
    except OutboxConfigError as bad:  # settings changed (and re-read) while running
        run.handled = True
        raise write_unreadable_limit_dead_letter(task, attempt, bad, now=now) from None
    try:
        deliveries = store.record_delivery(attempt.task_id, now=now)
    except StoreError as store_exc:
        requeue_later(task, attempt, store_exc)
    if too_many_deliveries(deliveries, limit=limit):
        run.handled = True
        error = write_redelivery_dead_letter(
            task, attempt, deliveries=deliveries, limit=limit, now=now
        )
        _forget_deliveries(store, attempt.task_id)
        raise error
    try:
        return _run(task, run, call, rng)
    finally:
        _forget_deliveries(store, attempt.task_id)


def _forget_deliveries(store: OutboxStore, task_id: str) -> None:
    try:
        store.forget_deliveries(task_id)
    except StoreError:  # a stale count only makes a later redelivery look older
        logger.warning(
            "celery-outbox: could not clear the delivery count of %s", task_id, exc_info=True
        )


# --- Letting a retried or failed ``OutboxTask``'s stack go as soon as Celery's tracer is done

#: Whether a task is an ``OutboxTask``.
IsOutboxTask = Callable[["Task[Any, Any] | None"], bool]


def install(is_outbox_task: IsOutboxTask) -> None:
    """Connect the release of retried and failed stacks to ``task_postrun`` (once per
    process).
    """

    def release(sender: Task[Any, Any] | None = None, retval: Any = None, **_: Any) -> None:
        if isinstance(retval, BaseException) and is_outbox_task(sender):
            retval.__traceback__ = None

    task_postrun.connect(release, weak=False, dispatch_uid="celery_outbox_retry_frames")
