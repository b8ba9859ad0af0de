"""Sending the running task's message again: its retry, or the same message put back.

Nothing here sleeps. A retry either rides on a Celery ETA (short waits) or is parked as
an outbox row (long waits, or when the ETA publish fails); if parking fails too, the
current message is rejected with requeue, never dropped. While the store is unreachable
a message is put back after a backoff (:func:`requeue_later`), ``outbox_store_requeues``
times at most; then it is held on the broker, on its holding queue
(:func:`holding_queue`), which no worker consumes unless told to.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore, QueueNotFound, Reject, Retry

from celery_outbox.backoff import BackoffPolicy
from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.envelope import build_message
from celery_outbox.long_text import bounded_logger, loggable
from celery_outbox.registry import store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.signals import task_retry_scheduled
from celery_outbox.store.records import NewMessage
from celery_outbox.store.superseding import superseding
from celery_outbox.worker.attempt import (
    FIRST_FAILED_HEADER,
    HELD_HEADER,
    HOME_HEADER,
    PENDING_LETTER_HEADER,
    REQUEUES_HEADER,
    Attempt,
)

logger = bounded_logger(__name__)

#: The header of a retry message (and parked row) saying which error caused the retry.
RETRY_REASON_HEADER = "outbox_retry_reason"
#: Longest :func:`retry_reason` kept in a header.
RETRY_REASON_CHARS = 300
#: The reason of a retry the task asked for with ``retry()`` and no error.
NO_ERROR_REASON = "retry() called without an error"

#: Windows between puts-back of a message while the store is unreachable (1 s ... 1 min).
STORE_BACKOFF = BackoffPolicy(base=timedelta(seconds=1), cap=timedelta(seconds=60))
#: What a holding queue's name adds to the name of the queue its messages came from.
HOLDING_SUFFIX = ".outbox_held"


def schedule_retry(
    task: Task[Any, Any],
    attempt: Attempt,
    exc: Exception | None,
    *,
    delay: timedelta,
    park: bool,
    now: datetime,
    overrides: Mapping[str, Any] | None = None,
    queue: str | None = None,
) -> Retry:
    """Send the next attempt of the failed ``attempt`` in ``delay``; return the ``Retry``
    to raise. ``park`` keeps it as an outbox row rather than a broker ETA. ``exc`` is
    the error retried (``None``: a ``retry()`` called with none).

    ``attempt`` carries the arguments of the next attempt, ``overrides`` its extra
    ``apply_async`` options (``retry(**options)``). ``queue`` is the retry queue
    (``None``: where the task came from); a ``queue`` among ``overrides`` wins over it.

    Raises
    ------
    celery.exceptions.Reject
        With ``requeue=True`` when neither the ETA publish nor parking succeeded.
    """
    eta = now + delay
    first_failed = attempt.first_failed_at or now
    headers: dict[str, Any] = {
        FIRST_FAILED_HEADER: first_failed.isoformat(),
        RETRY_REASON_HEADER: retry_reason(exc),
    }
    overrides = dict(overrides or {})
    if queue and not overrides.get("queue"):
        overrides["queue"] = queue
        # The task's own queue, for a requeue of its dead letter.
        headers[HOME_HEADER] = json.dumps(attempt.routing())
    options = attempt.resend_options(
        eta=eta, retries=attempt.retries + 1, headers=headers, overrides=overrides
    )
    message = _message(task, attempt, options, now=now)
    if not park and _publish_eta(task, attempt, message):
        return _scheduled(task, attempt, exc, eta=eta, path="eta")
    if _park(task, attempt, message, delay=delay):
        return _scheduled(task, attempt, exc, eta=eta, path="parked")
    # The store failed (logged): ride on an ETA rather than drop the retry.
    if park and _publish_eta(task, attempt, message):
        return _scheduled(task, attempt, exc, eta=eta, path="eta")
    raise Reject(
        f"retry of {task.name}[{attempt.task_id}] could be neither published nor parked",
        requeue=True,
    )


def retry_reason(exc: BaseException | None) -> str:
    """``module.Type: first line of the message``, cut to :data:`RETRY_REASON_CHARS`
    (what the admin shows as the reason a retry is parked); :data:`NO_ERROR_REASON` for
    a ``retry()`` called with no error.
    """
    if exc is None:
        return NO_ERROR_REASON
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__module__}.{type(exc).__qualname__}"
    return (f"{text}: {lines[0]}" if lines else text)[:RETRY_REASON_CHARS]


def _scheduled(
    task: Task[Any, Any], attempt: Attempt, exc: Exception | None, *, eta: datetime, path: str
) -> Retry:
    """Announce the retry sent by ``path`` (``eta`` or ``parked``); the ``Retry`` to raise."""
    task_retry_scheduled.send(sender=task, task_id=attempt.task_id, eta=eta, path=path)
    return Retry(exc=exc, when=eta)


def requeue_later(
    task: Task[Any, Any],
    attempt: Attempt,
    cause: Exception,
    *,
    letter: Mapping[str, Any] | None = None,
) -> NoReturn:
    """The store is unreachable: put this message back after a backoff, not at once.

    The same message (task id, retries, headers) is published again with an ETA on
    :data:`STORE_BACKOFF`'s window for how often it was put back, and this delivery is
    acknowledged (``Ignore``). ``letter`` (the failure of a run whose dead letter could
    not be written) rides along: the next delivery writes it without running the body.
    A message already put back ``outbox_store_requeues`` times is held instead
    (:func:`_hold_on_broker`), or put back again if the broker refuses the hold. Only if
    the broker refuses the put-back too is the message rejected with requeue, so a long
    store outage never turns into a hot redelivery loop and nothing is lost.
    """
    pending = letter if letter is not None else attempt.pending_letter
    limit = OutboxConfig.at_run_time(task.app).store_requeues
    if attempt.requeues >= limit and _hold_on_broker(task, attempt, cause, pending=pending):
        raise Ignore()
    now = utcnow()
    eta = now + STORE_BACKOFF.delay_for(attempt.requeues)
    headers = {**_put_back_headers(attempt, pending), REQUEUES_HEADER: attempt.requeues + 1}
    options = attempt.resend_options(eta=eta, retries=attempt.retries, headers=headers)
    if _publish_eta(task, attempt, _message(task, attempt, options, now=now)):
        logger.warning(
            "celery-outbox: store unreachable (%s); %s[%s] put back until %s (put-back %d of %d%s)",
            loggable(cause),
            task.name,
            attempt.task_id,
            eta.isoformat(),
            attempt.requeues + 1,
            limit,
            "; its dead letter waits: the task will not run again" if pending else "",
        )
        raise Ignore()
    raise Reject(cause, requeue=True)


def _hold_on_broker(
    task: Task[Any, Any],
    attempt: Attempt,
    cause: Exception,
    *,
    pending: Mapping[str, Any] | None,
) -> bool:
    """The store still fails after ``outbox_store_requeues`` put-backs: hold the message
    on its holding queue (:func:`holding_queue`) and log an ERROR naming the task id and
    the last error; ``False`` (logged) when the broker refused it.

    No worker consumes a holding queue unless told to, so the message waits there, whole
    (its dead letter too, if it carries one), until the store is back and a worker is
    started on that queue; delivered from there it is sent on as if it came from where
    it was held from (:data:`~celery_outbox.worker.attempt.HELD_HEADER`), with
    ``outbox_store_requeues`` put-backs again.
    """
    home = attempt.routing()
    queue = holding_queue(home, default=task.app.conf.task_default_queue)
    headers = {**_put_back_headers(attempt, pending), HELD_HEADER: json.dumps(home)}
    options = attempt.resend_options(
        eta=None, retries=attempt.retries, headers=headers, overrides={"queue": queue}
    )
    try:
        message = _message(task, attempt, options, now=utcnow())
    except QueueNotFound:
        logger.warning(
            "celery-outbox: cannot hold %s[%s] on queue %r: task_create_missing_queues is "
            "off and task_queues does not declare it; putting it back instead",
            task.name,
            attempt.task_id,
            queue,
        )
        return False
    if not _publish_eta(task, attempt, message):
        return False
    logger.error(
        "celery-outbox: %s[%s] was put back %d times while its store failed (last error: %s); "
        "held on queue %r%s. Once the store is back, consume that queue (celery worker "
        "-Q %s) to send it on.",
        task.name,
        attempt.task_id,
        attempt.requeues,
        loggable(cause),
        queue,
        " with its dead letter: the task will not run again" if pending else "",
        queue,
    )
    return True


def holding_queue(routing: Mapping[str, Any], *, default: str) -> str:
    """The queue a message from ``routing`` (:meth:`Attempt.routing`) is held on: its
    queue's name (else its routing key, else ``default``) plus :data:`HOLDING_SUFFIX`.
    """
    name = str(routing.get("queue") or routing.get("routing_key") or default)
    return name if name.endswith(HOLDING_SUFFIX) else name + HOLDING_SUFFIX


def _put_back_headers(attempt: Attempt, pending: Mapping[str, Any] | None) -> dict[str, Any]:
    """Headers a message put back or held keeps: its first failure, the dead letter it
    carries, and its task's own routing when it was on a retry queue.
    """
    headers: dict[str, Any] = {}
    if pending is not None:
        headers[PENDING_LETTER_HEADER] = json.dumps(dict(pending))
    if attempt.first_failed_at is not None:
        headers[FIRST_FAILED_HEADER] = attempt.first_failed_at.isoformat()
    if attempt.home is not None:  # put back on the retry queue: keep the task's own routing
        headers[HOME_HEADER] = json.dumps(dict(attempt.home))
    return headers


def _message(
    task: Task[Any, Any], attempt: Attempt, options: dict[str, Any], *, now: datetime
) -> NewMessage:
    """The message sending ``attempt`` again with ``options``, due now (not parked)."""
    return build_message(
        task,
        attempt.args,
        attempt.kwargs,
        task_id=attempt.task_id,
        options=options,
        now=now,
        park_after=timedelta.max,
        max_bytes=None,
        validate=False,  # checked when first dispatched; a worker must not fail here
    )


def _publish_eta(task: Task[Any, Any], attempt: Attempt, message: NewMessage) -> bool:
    """Publish the message (with its ETA, if any); ``False`` when the broker refused it."""
    try:
        relay_for(task.app).publish_message(message)
    except Exception:
        logger.warning(
            "celery-outbox: publish of %s[%s] (a retry, put-back or hold) failed",
            task.name,
            attempt.task_id,
            exc_info=True,
        )
        return False
    return True


def _park(task: Task[Any, Any], attempt: Attempt, message: NewMessage, *, delay: timedelta) -> bool:
    """Write the retry as a row parked for ``delay`` on the database's clock (not this
    worker's: a worker whose clock is off runs no retry early); ``False`` when the store
    failed (logged).

    A pending row of the task id is superseded (:mod:`celery_outbox.store.superseding`, rule 1:
    this run is the delivery of its message): the row this attempt was published from,
    which its publisher has not removed yet, or a retry a duplicate delivery parked.
    """
    try:
        store = store_for(task.app)
        parked = replace(message, available_at=store.now() + delay)
        supersedes = superseding(parked, running_task_id=attempt.task_id)
        return store.add(parked, supersedes=supersedes) is not None
    except Exception:
        logger.exception("celery-outbox: could not park retry %s[%s]", task.name, attempt.task_id)
        return False
