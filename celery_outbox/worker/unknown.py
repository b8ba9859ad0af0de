"""A message for a task the worker does not know becomes a dead letter, not a loss.

Celery's worker rejects such a message (it is gone: no requeue) and sends
``task_unknown``. For an app with an outbox store, the message is written as a dead
letter instead (its arguments, routing and place in its canvas), so it can be requeued
once the task is deployed; a workflow step marks its workflow failed, and a requeue
resumes it. The dead letter is written right after Celery rejected the message: a worker
lost in between loses it, as plain Celery would.
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import NotRegistered
from celery.signals import task_unknown

from celery_outbox.canvas_shape import canvas_options, workflow_root
from celery_outbox.clock import utcnow
from celery_outbox.dead_letters import build_dead_letter
from celery_outbox.exceptions import NoStoreConfigured
from celery_outbox.long_text import bounded_logger, loggable
from celery_outbox.registry import store_for
from celery_outbox.worker.letters import storable
from celery_outbox.workflow_dispatch import JOIN_HEADER

logger = bounded_logger(__name__)


def dead_letter_unknown(sender: Any, message: Any, name: str, id: str, **_: Any) -> int | None:
    """``task_unknown`` receiver: write the message's dead letter; its id, or ``None``
    when the app has no outbox store or the message cannot be read (logged)."""
    app = sender.app
    try:
        store = store_for(app)
    except NoStoreConfigured:
        return None
    try:
        args, kwargs, embed = message.decode()
    except Exception:  # a body the worker cannot decode: nothing to keep but the log
        logger.exception("celery-outbox: could not read the unknown task %s[%s]", name, id)
        return None
    headers, info = message.headers or {}, message.delivery_info or {}
    options = {
        "root_id": headers.get("root_id"),
        "parent_id": headers.get("parent_id"),
        "group_id": headers.get("group"),
        "group_index": headers.get("group_index"),
        "chord": (embed or {}).get("chord"),
        "chain": (embed or {}).get("chain"),
        "link": (embed or {}).get("callbacks"),
        "link_error": (embed or {}).get("errbacks"),
        "headers": headers,
    }
    canvas = canvas_options(options, headers=(JOIN_HEADER,))
    now, hostname = utcnow(), getattr(sender, "hostname", "this worker")
    anonymous = info.get("exchange") in ("", None)
    letter = build_dead_letter(
        task_name=name,
        task_id=id,
        args=args,
        kwargs=kwargs,
        options={
            "queue": info.get("routing_key") if anonymous else None,
            "exchange": None if anonymous else info.get("exchange"),
            "routing_key": None if anonymous else info.get("routing_key"),
            "priority": info.get("priority"),
            **({"canvas": canvas} if canvas else {}),
        },
        exc=NotRegistered(f"task {name!r} is not registered on {hostname}"),
        retries=int(headers.get("retries") or 0),
        first_failed_at=now,
        failed_at=now,
    )
    workflow = workflow_root(id, options)
    extra = {"workflow": workflow} if workflow else {}
    try:
        letter_id = store.add_dead_letter(storable(app, letter), **extra)
    except Exception:  # the message is gone already: say so loudly
        logger.critical(
            "celery-outbox: unknown task %s[%s] was rejected and its dead letter could not be "
            "written: args=%s kwargs=%s",
            name,
            id,
            loggable(args),
            loggable(kwargs),
            exc_info=True,
        )
        return None
    logger.error("celery-outbox: unknown task %s[%s] is dead letter %s", name, id, letter_id)
    return letter_id


def install() -> None:
    """Connect :func:`dead_letter_unknown` to Celery's ``task_unknown`` (once)."""
    task_unknown.connect(dead_letter_unknown, weak=False, dispatch_uid="celery_outbox_unknown")
