"""An atomic step's successors, written in the step's own transaction.

Celery's tracer dispatches a task's ``link`` callbacks and the next step of its chain
after the task returned, that is after an atomic task's transaction committed: a worker
lost in between loses them, and a redelivered duplicate (skipped) would not send them
again. For an atomic step whose successors are all plain ``OutboxTask`` signatures, they
are dispatched here instead, inside the transaction (as outbox rows that commit with the
step), and the tracer is told there is nothing left to dispatch. A successor may be a
canvas (a group, a chord, a chain) when every task in it is an ``OutboxTask``: a chord
whose header is atomic then opens its join in this transaction too
(:mod:`celery_outbox.workflow_dispatch`). When any task is not an ``OutboxTask``, all the
successors are left to Celery, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from celery import Celery, Signature, Task, signature

from celery_outbox import _compat


def dispatch_in_transaction(
    task: Task[Any, Any], value: Any, *, durable: Callable[[Task[Any, Any] | None], bool]
) -> bool:
    """Dispatch the running step's callbacks and next chain step with ``value``, as
    Celery's tracer would (same parent, root and priority), when ``durable`` holds for
    the task of each (an ``OutboxTask``); whether it did."""
    app, request = task.app, task.request
    callbacks, chain = _compat.successors(request)
    if not callbacks and not chain:
        return False
    links = [signature(callback, app=app) for callback in callbacks]
    following = signature(chain[-1], app=app) if chain else None
    steps = [*links, *([following] if following is not None else [])]
    if not _all_durable(app, steps, durable):
        return False
    options: dict[str, Any] = {"parent_id": request.id, "root_id": request.root_id}
    if app.conf.task_inherit_parent_priority:
        options["priority"] = (request.delivery_info or {}).get("priority")
    for link in links:
        link.apply_async((value,), **options)
    if following is not None:
        following.apply_async((value,), chain=chain[:-1], **options)
    _compat.forget_successors(request)
    return True


def _all_durable(
    app: Celery,
    signatures: Sequence[Signature[Any]],
    durable: Callable[[Task[Any, Any] | None], bool],
) -> bool:
    """Whether ``durable`` holds for every task in ``signatures`` (canvases included)."""
    return all(durable(app.tasks.get(name)) for sig in signatures for name in _task_names(sig))


def _task_names(sig: Any) -> Iterator[str]:
    """The name of every task a signature (or canvas) runs, ``link`` callbacks included."""
    sig = signature(sig)
    kind = sig.subtask_type
    if kind in ("chain", "group"):
        for member in sig.tasks:
            yield from _task_names(member)
    elif kind == "chord":
        for member in sig.tasks:
            yield from _task_names(member)
        yield from _task_names(sig.body)
    else:
        yield sig.task or ""
    for callback in sig.options.get("link") or ():
        yield from _task_names(callback)
