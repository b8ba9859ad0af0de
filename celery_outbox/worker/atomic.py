"""Atomic tasks on the worker: the body, its dispatches and its ``CompletedTask`` row
commit together, once per task id (``OutboxTask.atomic``).

The store's side is :meth:`~celery_outbox.store.base.CompletionStore.complete_once`.
Here: which database the run uses, the body run inside it (``retry()`` deferred until
the transaction rolled back), the result serialised before COMMIT, and a duplicate
skipped with :data:`~celery_outbox.signals.task_duplicate_skipped`.
"""

from __future__ import annotations

import base64
import weakref
from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from celery import Task
from celery.exceptions import Ignore
from kombu.serialization import dumps

from celery_outbox.clock import utcnow
from celery_outbox.dispatch.target import writing_to
from celery_outbox.exceptions import (
    AtomicUnsupported,
    NoStoreConfigured,
    StoreError,
    UnstorableResult,
)
from celery_outbox.registry import store_for
from celery_outbox.signals import task_duplicate_skipped
from celery_outbox.worker.attempt import Attempt
from celery_outbox.worker.republish import requeue_later
from celery_outbox.worker.runner import deferring_retries

if TYPE_CHECKING:
    from celery_outbox.store.base import OutboxStore

#: Longest part of a refused result quoted in an error.
_QUOTED = 200


def atomic_alias(task: Task[Any, Any], attempt: Attempt) -> str | None:
    """The database an atomic run uses: the dispatch's ``using``, else the task's
    ``atomic_using``, else the store's default (``None``).
    """
    return attempt.using or getattr(task, "atomic_using", None)


def run_once(
    task: Task[Any, Any],
    attempt: Attempt,
    call: Callable[[], Any],
    *,
    then: Callable[[Any, str | None], object] | None = None,
    root_id: str | None = None,
) -> Any:
    """Run ``call`` (the body) in the task's ``CompletedTask`` transaction; return its value.

    ``then(value, result)`` runs after the body (``result``: the value serialised, as
    ``CompletedTask.result`` stores it), in the same transaction (the step's successors,
    its chord join and workflow count); ``root_id`` is the workflow the step belongs to.

    A task id that already completed is not run: the signal is sent and ``Ignore`` raised
    (the message is acknowledged, the first run's state kept). A failure, or a result
    the serializer refuses, rolls everything back and propagates (the runner retries).
    A store that cannot open the transaction (its database down) spends no retry: the
    message is put back after the store's backoff (``requeue_later``).
    """
    store = store_for(task.app)
    using = atomic_alias(task, attempt)
    extra = {"root_id": root_id} if root_id else {}  # a store written before workflows works
    with ExitStack() as stack:
        try:
            completion = stack.enter_context(
                store.complete_once(attempt.task_id, task.name, now=utcnow(), using=using, **extra)
            )
        except StoreError as exc:
            # The database is unreachable before the body ran: not a failure of the task,
            # so no retry is spent; the message comes back after the store's backoff.
            requeue_later(task, attempt, exc)
        if completion.previous is None:
            with writing_to(using):
                with deferring_retries():
                    value = call()
                completion.result = serialise_result(task, value)
                _settle_letters(store, attempt.task_id, using=using, root_id=root_id)
                if then is not None:
                    then(value, completion.result)
            return value
    task_duplicate_skipped.send(
        sender=task, task_id=attempt.task_id, completed_at=completion.previous.completed_at
    )
    raise Ignore()


def _settle_letters(
    store: OutboxStore, task_id: str, *, using: str | None, root_id: str | None
) -> None:
    # A letter of this task id written while this run was on its way (a redelivery past
    # outbox_max_deliveries dead-letters without running) is settled: `completed`, never
    # requeued by mistake; its workflow runs again, so this step counts.
    if store.complete_dead_letters(task_id, using=using) and root_id:
        store.workflow_resumed(root_id, using=using)


def serialise_result(task: Task[Any, Any], value: Any) -> str | None:
    """``value`` as ``CompletedTask.result``: text of the task's serializer (base64 when
    that serializer is binary), ``None`` for ``None``.

    Raises
    ------
    UnstorableResult
        Naming the task, the value and the serializer, when it cannot serialise it.
    """
    if value is None:
        return None
    serializer = task.serializer or task.app.conf.task_serializer
    try:
        _content_type, encoding, data = dumps(value, serializer=serializer)
    except Exception as exc:  # kombu raises EncodeError, or the serializer's own error
        shown = repr(value)[:_QUOTED]
        raise UnstorableResult(
            f"atomic task {task.name!r} returned {shown}, which its serializer "
            f"{serializer!r} cannot store in CompletedTask.result: {exc}"
        ) from exc
    if isinstance(data, bytes):
        if encoding == "binary":
            return base64.b64encode(data).decode("ascii")
        return data.decode(encoding)
    return str(data)


_checked: weakref.WeakKeyDictionary[type, set[str | None]] = weakref.WeakKeyDictionary()


def check_atomic(task: Task[Any, Any], using: str | None = None) -> None:
    """Refuse an atomic ``task`` whose options, store or database alias cannot run it
    (at worker start-up and at dispatch; each class and alias is checked once).

    Raises
    ------
    AtomicUnsupported
        Naming the task, the option or the alias, and why.
    """
    atomic = getattr(task, "atomic", False)
    if atomic not in (True, False):
        raise AtomicUnsupported(
            f"Task {task.name!r}: atomic={atomic!r} is not accepted: give True or False."
        )
    if not atomic:
        return
    alias = using or getattr(task, "atomic_using", None)
    if alias is not None and not isinstance(alias, str):
        raise AtomicUnsupported(
            f"Task {task.name!r}: atomic_using={alias!r} is not accepted: give a database "
            "alias (a string) or None for the store's default."
        )
    checked = _checked.setdefault(type(task), set())
    if alias in checked:
        return
    try:
        problem = store_for(task.app).atomic_problem(alias)
    except NoStoreConfigured as exc:
        problem = str(exc)
    if problem is not None:
        raise AtomicUnsupported(
            f"Task {task.name!r} is atomic, but cannot run on database {alias or 'default'!r}: "
            f"{problem}."
        )
    checked.add(alias)
