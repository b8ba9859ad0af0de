"""Worker-side handling of a failed attempt: schedule the retry, or put the message back.

Nothing here sleeps. A retry either rides on a Celery ETA (short waits) or is parked as
an outbox row (long waits, or when the ETA publish fails); if parking fails too, the
current message is rejected with requeue, never dropped. While the store is unreachable
a message is put back after a backoff (:func:`requeue_later`). Dead letters are written
by :mod:`celery_outbox.dead_lettering`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore, Reject, Retry

from celery_outbox.backoff import BackoffPolicy
from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.envelope import build_message
from celery_outbox.records import NewMessage
from celery_outbox.registry import relay_for, store_for

logger = logging.getLogger(__name__)

#: Message header carrying the time of a task's first failure across its retries.
FIRST_FAILED_HEADER = "outbox_first_failed_at"
#: Message header counting how often a message was put back because the store failed.
REQUEUES_HEADER = "outbox_requeues"
#: Windows between puts-back of a message while the store is unreachable (1 s ... 1 min).
STORE_BACKOFF = BackoffPolicy(base=timedelta(seconds=1), cap=timedelta(seconds=60))


def first_failed_at(request: Any, now: datetime) -> datetime:
    """When this task first failed: from its retry header, else ``now``."""
    value = getattr(request, FIRST_FAILED_HEADER, None)
    return datetime.fromisoformat(value) if isinstance(value, str) else now


def schedule_retry(
    task: Task[Any, Any],
    request: Any,
    exc: Exception,
    *,
    delay: timedelta,
    first_failed: datetime,
    now: datetime,
) -> Retry:
    """Schedule the next attempt of the running task; return the ``Retry`` to raise.

    Raises
    ------
    celery.exceptions.Reject
        With ``requeue=True`` when neither the ETA publish nor parking succeeded.
    """
    app = task.app
    config = OutboxConfig.from_celery(app)
    eta = now + delay
    message = build_message(
        task,
        request.args,
        request.kwargs,
        task_id=request.id,
        options=republish_options(
            task,
            request,
            eta=eta,
            retries=request.retries + 1,
            headers={FIRST_FAILED_HEADER: first_failed.isoformat()},
        ),
        now=now,
        park_after=config.park_after,
        max_bytes=None,
        validate=False,  # checked when first dispatched; a worker must not fail here
    )
    short = message.available_at <= now
    if short and _publish_eta(task, request, message):
        return Retry(exc=exc, when=eta)
    if _park(task, request, replace(message, available_at=eta)):
        return Retry(exc=exc, when=eta)
    # A pending row with this task id still exists: the row this attempt was published
    # from, not yet removed by its publisher. Ride on an ETA rather than drop the retry.
    if not short and _publish_eta(task, request, message):
        return Retry(exc=exc, when=eta)
    raise Reject(
        f"retry of {task.name}[{request.id}] could be neither published nor parked", requeue=True
    )


def _publish_eta(task: Task[Any, Any], request: Any, message: NewMessage) -> bool:
    """Publish the retry with its ETA; ``False`` when the broker refused it."""
    try:
        relay_for(task.app).publish_message(message)
    except Exception:
        logger.warning(
            "celery-outbox: ETA publish of retry %s[%s] failed",
            task.name,
            request.id,
            exc_info=True,
        )
        return False
    return True


def _park(task: Task[Any, Any], request: Any, message: NewMessage) -> bool:
    """Write the retry as a parked row; ``False`` when a pending row already has its task
    id, or the store failed (logged)."""
    try:
        return store_for(task.app).add(message) is not None
    except Exception:
        logger.exception("celery-outbox: could not park retry %s[%s]", task.name, request.id)
        return False


def requeue_later(task: Task[Any, Any], request: Any, cause: Exception) -> NoReturn:
    """The store is unreachable: put this message back after a backoff, not at once.

    The same message (task id, retries, headers) is published again with an ETA on
    :data:`STORE_BACKOFF`'s window for how often it was put back, and this delivery is
    acknowledged (``Ignore``). Only if the broker refuses too is the message rejected
    with requeue, so a long store outage never turns into a hot redelivery loop and
    nothing is lost.
    """
    count = int(getattr(request, REQUEUES_HEADER, 0) or 0)
    now = utcnow()
    eta = now + STORE_BACKOFF.delay_for(count)
    headers = {REQUEUES_HEADER: count + 1}
    if isinstance(getattr(request, FIRST_FAILED_HEADER, None), str):
        headers[FIRST_FAILED_HEADER] = getattr(request, FIRST_FAILED_HEADER)
    options = republish_options(task, request, eta=eta, retries=request.retries, headers=headers)
    message = build_message(
        task,
        request.args,
        request.kwargs,
        task_id=request.id,
        options=options,
        now=now,
        park_after=timedelta.max,
        max_bytes=None,
        validate=False,  # checked when first dispatched; a worker must not fail here
    )
    if _publish_eta(task, request, message):
        logger.warning(
            "celery-outbox: store unreachable (%s); %s[%s] put back until %s",
            cause,
            task.name,
            request.id,
            eta.isoformat(),
        )
        raise Ignore()
    raise Reject(cause, requeue=True)


def republish_options(
    task: Task[Any, Any], request: Any, *, eta: datetime, retries: int, headers: dict[str, Any]
) -> dict[str, Any]:
    """``apply_async`` options sending the running task's message again at ``eta``."""
    signature = task.signature_from_request(request, eta=eta, retries=retries)
    options = dict(signature.options)
    for key in ("task_id", "eta", "countdown", "retries"):
        options.pop(key, None)
    merged = {**(options.get("headers") or {}), **headers}
    return {**options, "headers": merged, "eta": eta, "retries": retries}
