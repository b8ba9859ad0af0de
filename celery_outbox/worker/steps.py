"""A workflow step on the worker, and the successors it dispatches.

An atomic step's successors, written in the step's own transaction.

Celery's tracer dispatches a task's ``link`` callbacks and the next step of its chain
after the task returned, that is after an atomic task's transaction committed: a worker
lost in between loses them, and a redelivered duplicate (skipped) would not send them
again. For an atomic step whose successors are all plain ``OutboxTask`` signatures, they
are dispatched here instead, inside the transaction (as outbox rows that commit with the
step), and the tracer is told there is nothing left to dispatch. A successor may be a
canvas (a group, a chord, a chain) when every task in it is an ``OutboxTask``: a chord
whose header is atomic then opens its join in this transaction too
(:mod:`celery_outbox.workflows.dispatch`). When any task is not an ``OutboxTask``, all the
successors are left to Celery, as before.

A workflow step on the worker: its chord join, its successors, its ``Workflow`` count.

For an atomic step all of it happens in the step's own transaction
(:meth:`Step.committing`, run by :func:`~celery_outbox.worker.atomic.run_once` after the
body): the header result is stored in the chord's join and, when it is the last one,
the chord's body is dispatched with every result in header order; the next chain step
and ``link`` callbacks are dispatched (:mod:`celery_outbox.worker.steps`); the
workflow counts the step done. A non-atomic step counts itself done after it returned,
in its own transaction (at least once), and leaves its successors to Celery.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery, Signature, Task, signature
from kombu.serialization import dumps, loads

from celery_outbox import _compat
from celery_outbox.clock import utcnow
from celery_outbox.exceptions import JoinMissing, StoreError
from celery_outbox.long_text import bounded_logger
from celery_outbox.registry import store_for
from celery_outbox.worker.atomic import atomic_alias, serialise_result
from celery_outbox.worker.attempt import Attempt
from celery_outbox.workflows.dispatch import JOIN_HEADER, ending_step, handing_on
from celery_outbox.workflows.shape import workflow_root

logger = bounded_logger(__name__)


# --- An atomic step's successors, written in the step's own transaction.


def dispatch_in_transaction(
    task: Task[Any, Any], value: Any, *, durable: Callable[[Task[Any, Any] | None], bool]
) -> bool:
    """Dispatch the running step's callbacks and next chain step with ``value``, as
    Celery's tracer would (same parent, root and priority), when ``durable`` holds for
    the task of each (an ``OutboxTask``); whether it did.
    """
    app = task.app
    request = task.request
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


# --- A workflow step on the worker: its chord join, its successors, its ``Workflow`` count.


@dataclass(frozen=True)
class Step:
    """What a running task is in its workflow: ``root`` (counted when it completes; ``None``
    outside a canvas), ``join`` (its chord's group id when the chord is joined in the
    database) and ``index`` (its place in the chord's header).
    """

    task: Task[Any, Any]
    attempt: Attempt
    root: str | None
    join: str | None
    index: int

    @classmethod
    def of(cls, task: Task[Any, Any], request: Any, attempt: Attempt) -> Step:
        """The step ``request`` runs. A chord header step joined in the database hides its
        chord from Celery's result backend (the ``attempt`` keeps it for retries).
        """
        options = attempt.options
        join = getattr(request, JOIN_HEADER, None)
        if join is not None:
            request.chord = None  # the join is ours: no result backend counts this step
        return cls(
            task=task,
            attempt=attempt,
            root=workflow_root(attempt.task_id, options),
            join=str(join) if join else None,
            index=int(options.get("group_index") or 0),
        )

    def committing(
        self,
        value: Any,
        result: str | None,
        *,
        durable: Callable[[Task[Any, Any] | None], bool],
    ) -> None:
        """In the atomic step's transaction: count the chord join (``result``: ``value``
        serialised once, as ``CompletedTask.result``), dispatch the successors
        (``durable``: which tasks are ``OutboxTask`` s), count the step.
        """
        with ending_step():
            if self.join is not None:
                self._join(result)
            dispatch_in_transaction(self.task, value, durable=durable)
        if self.root is not None:
            store_for(self.task.app).workflow_step_done(
                self.root, now=utcnow(), using=atomic_alias(self.task, self.attempt)
            )

    def finished(self) -> None:
        """After a non-atomic step returned: count it done (its own transaction; a
        failure to count is logged, the task's success stands).
        """
        if self.root is None:
            return
        try:
            store_for(self.task.app).workflow_step_done(
                self.root, now=utcnow(), using=self.attempt.using
            )
        except StoreError:
            logger.warning(
                "celery-outbox: could not count step %s of workflow %s",
                self.attempt.task_id,
                self.root,
                exc_info=True,
            )

    def _cancelled(self, using: str | None) -> bool:
        """Whether this step's workflow, on database ``using`` (its join's), was cancelled
        (its chord joins closed with it).
        """
        if self.root is None:
            return False
        found = store_for(self.task.app).get_workflow(self.root, using=using)
        return found is not None and found.status == "cancelled"

    def _join(self, result: str | None) -> None:
        task = self.task
        join = str(self.join)
        store = store_for(task.app)
        using = atomic_alias(task, self.attempt)
        part = encode_part(task, None, text=result)
        progress = store.join_part(join, self.index, part, using=using)
        if progress is None and self._cancelled(using):
            return  # its workflow was cancelled: the join was closed, the body never runs
        if progress is None:
            raise JoinMissing(
                f"Chord {join}: its join row is missing on database {using or 'default'!r} "
                f"(step {self.index} of the header, task {self.attempt.task_id}); it was "
                "purged or written to another database."
            )
        if progress.remaining:
            return
        body = signature(self.attempt.options["chord"], app=task.app)
        request = task.request
        with handing_on():
            body.apply_async(
                ([decode_part(part) for part in progress.results],),
                parent_id=request.id,
                root_id=request.root_id,
            )


def encode_part(task: Task[Any, Any], value: Any, *, text: str | None = None) -> str | None:
    """A header step's return value as its join stores it: the content type and encoding
    of its serializer, and the text :func:`~celery_outbox.worker.atomic.serialise_result`
    gives (``text``: that text already made, ``value`` then unused).
    """
    text = text if text is not None else serialise_result(task, value)
    if text is None:
        return None
    content_type, encoding, _ = dumps(
        None, serializer=task.serializer or task.app.conf.task_serializer
    )
    return json.dumps([content_type, encoding, text])


def decode_part(part: str | None) -> Any:
    """The value :func:`encode_part` stored."""
    if part is None:
        return None
    content_type, encoding, text = json.loads(part)
    data: str | bytes = text
    if encoding == "binary":
        data = base64.b64decode(text)
    return loads(data, content_type, encoding, accept={content_type})
