"""Workflows at dispatch: the ``Workflow`` row a canvas gets, and its chord joins.

Each ``OutboxTask`` dispatch that starts a canvas, or joins one without having been
handed on by a running step, adds its steps to the ``Workflow`` row of its ``root_id``,
in the dispatching transaction (:func:`count_dispatch`). A chord whose header steps are
all atomic ``OutboxTask`` s gets a join row instead of needing a result backend
(:func:`chord_join`, called by Celery's ``chord.run`` through
:func:`celery_outbox._compat.install_canvas_hooks`); its header messages carry
:data:`JOIN_HEADER` so the worker knows to count them there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from celery import Celery, Signature, Task, group, signature

from celery_outbox import _compat
from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.batching import batching
from celery_outbox.dispatch.target import dispatch_alias, is_atomic
from celery_outbox.exceptions import ChordTooLarge, NoStoreConfigured
from celery_outbox.registry import store_for
from celery_outbox.signals import task_dispatched
from celery_outbox.store.base import OutboxStore, PublishCallback
from celery_outbox.store.records import NewMessage
from celery_outbox.workflows import checks as canvas_warnings
from celery_outbox.workflows.shape import (
    count_steps,
    describe,
    describe_canvas,
    dispatch_steps,
    dispatch_task_names,
    handed_on_ids,
    in_canvas,
    task_names,
)

#: Message header of a chord header step whose join is counted in the database (the
#: chord's group id), so the worker counts the step there (:mod:`celery_outbox.worker.steps`).
JOIN_HEADER = "outbox_join"

#: The group ids of the chords whose joins ``chord.run`` opened in this context, while
#: it dispatches their headers.
_opened: ContextVar[set[str] | None] = ContextVar("celery_outbox_opened_joins", default=None)

#: Whether the dispatches in this context are handed on by a running step (counted).
_handing_on: ContextVar[bool] = ContextVar("celery_outbox_handing_on", default=False)
#: Whether an atomic step's successors are being dispatched as it ends (:func:`ending_step`).
_ending: ContextVar[bool] = ContextVar("celery_outbox_step_ending", default=False)

#: Whether a task is a step that reports its completion (an ``OutboxTask``).
IsStepTask = Callable[["Task[Any, Any] | None"], bool]


def install(is_step_task: IsStepTask) -> None:
    """Wire the canvas hooks (once per process), ``is_step_task`` telling ``OutboxTask`` s."""
    _compat.install_canvas_hooks(
        _compat.CanvasHooks(
            serves=_serves,
            chord_join=lambda app, header, body: chord_join(app, header, body, is_step_task),
            joining=_joining,
            joined_header=lambda app, members: joined_header(app, members, is_step_task),
            opening=lambda app, root_id, pieces: opening(app, root_id, pieces, is_step_task),
            uncounted=handing_on,
            batching=batching,
        )
    )


def _serves(app: Celery) -> bool:
    try:
        return store_for(app).keeps_workflows()
    except NoStoreConfigured:
        return False


def chord_join(
    app: Celery, header: group, body: Signature[Any], is_step_task: IsStepTask
) -> _compat.OpenJoin | None:
    """How to open the database join of a chord whose header steps are all atomic
    ``OutboxTask`` s (single tasks), or ``None`` to leave it to Celery's result backend.

    Raises
    ------
    ChordTooLarge
        When the header has more steps than ``outbox_chord_max_header``.
    """
    members = [signature(member, app=app) for member in header.tasks]
    if not joined_header(app, members, is_step_task):
        return None
    limit = OutboxConfig.from_celery(app).chord_max_header
    if limit is not None and len(members) > limit:
        raise ChordTooLarge(
            f"A chord of {len(members)} header steps ({members[0].task} ...) exceeds "
            f"outbox_chord_max_header={limit}: split it into smaller chords, or raise the "
            "setting (None: no limit)."
        )
    first = app.tasks[members[0].task or ""]
    using = dispatch_alias(None) or getattr(first, "atomic_using", None)

    def open_join(group_id: str, task_ids: list[str], body: Signature[Any]) -> None:
        root = body.options.get("root_id") or group_id
        store_for(app).open_join(
            group_id, root_id=root, size=len(task_ids), now=utcnow(), using=using
        )
        opened = _opened.get()
        if opened is not None:
            opened.add(group_id)

    return open_join


def joined_header(app: Celery, members: list[Any], is_step_task: IsStepTask) -> bool:
    """Whether a chord with these header signatures is joined in the database: a store
    that keeps workflows, and every member a single atomic ``OutboxTask``.
    """
    if not members or not _serves(app):
        return False
    for member in members:
        sig = signature(member, app=app)
        task = app.tasks.get(sig.task or "")
        if sig.subtask_type is not None or task is None or not is_step_task(task):
            return False
        if not is_atomic(task):
            return False
    return True


@contextmanager
def _joining() -> Iterator[None]:
    """The context ``chord.run`` runs a database-joined chord in (see :func:`mark_join`)."""
    token = _opened.set(set())
    try:
        yield
    finally:
        _opened.reset(token)


@contextmanager
def handing_on() -> Iterator[None]:
    """Within this block, dispatches are a running step's successors, counted in its
    workflow already (a chord's body dispatched by its last header step).
    """
    token = _handing_on.set(True)
    try:
        yield
    finally:
        _handing_on.reset(token)


@contextmanager
def ending_step() -> Iterator[None]:
    """Within this block an atomic step's body has returned and its successors are
    dispatched in its transaction: nothing reads their rows back before the commit.
    """
    token = _ending.set(True)
    try:
        yield
    finally:
        _ending.reset(token)


def hand_on(
    task: Task[Any, Any],
    message: NewMessage,
    publisher: Callable[[str | None], PublishCallback],
    supersedes: object,
    *,
    store: OutboxStore,
    using: str | None,
) -> bool:
    """Whether the store took ``message`` to write with the running atomic step's last
    writes (:meth:`~celery_outbox.store.base.CompletionStore.hand_on`): only a successor
    dispatched as the step ends (:func:`ending_step`) that :func:`count_dispatch` has
    nothing to count for, born leased, with no ``supersedes`` rule, and no
    ``task_dispatched`` receiver (which would be told the row id before the commit).
    Otherwise the caller adds it.
    """
    if not _ending.get() or supersedes is not None or message.locked_until is None:
        return False
    if task_dispatched.receivers or not _counted(task, message.task_id, store):
        return False
    return store.hand_on(message, publisher(using), using=using)


def _counted(task: Task[Any, Any], task_id: str, store: OutboxStore) -> bool:
    """Whether a dispatch of ``task_id`` has no steps to count: a running step hands it
    on (its steps are counted already), or ``store`` keeps no workflows.
    """
    if _handing_on.get() or not store.keeps_workflows():
        return True
    running = task.app.current_worker_task
    if running is None:
        return False
    request = running.request
    return task_id in handed_on_ids({"chain": request.chain, "chord": request.chord})


@contextmanager
def opening(
    app: Celery, root_id: str, pieces: list[Any], is_step_task: IsStepTask
) -> Iterator[None]:
    """Dispatch a canvas made of ``pieces`` (a group or chord, and the chain it carries)
    at the top: count all its steps in its workflow first, in the caller's transaction
    (or committed at once outside one), so no member can finish the workflow before the
    others are counted; the members' own dispatches (a chord's header group among them)
    are then not counted again.
    """
    if _serves(app) and not _handing_on.get():

        def is_step(name: str) -> bool:
            return is_step_task(app.tasks.get(name))

        names = [name for piece in pieces for name in task_names(piece)]
        canvas_warnings.warn_once(app, names, is_step_task)
        steps = sum(count_steps(piece, is_step) for piece in pieces)
        if steps:
            store_for(app).add_workflow_steps(
                root_id,
                name=describe_canvas(pieces),
                steps=steps,
                now=utcnow(),
                using=dispatch_alias(None),
            )
    with handing_on():
        yield


def mark_join(options: dict[str, Any]) -> None:
    """Give a chord header step being dispatched :data:`JOIN_HEADER` when its chord's
    join was opened in the database (by :func:`chord_join`) in this context.
    """
    group_id = options.get("group_id")
    opened = _opened.get()
    if group_id is not None and options.get("chord") and opened and group_id in opened:
        options["headers"] = {**(options.get("headers") or {}), JOIN_HEADER: group_id}


def count_dispatch(
    task: Task[Any, Any],
    task_id: str,
    options: Mapping[str, Any],
    *,
    store: OutboxStore,
    using: str | None,
    is_step_task: IsStepTask,
) -> None:
    """Add a dispatch's steps to its workflow, in the dispatching transaction, unless a
    running step hands it on (its steps are counted already) or it is no canvas step.
    """
    if _counted(task, task_id, store):
        return
    app = task.app
    running = app.current_worker_task
    root = options.get("root_id")
    inherited = False
    if running is not None:
        request = running.request
        if not root and in_canvas(request.id or "", _request_options(request)):
            root = request.root_id or request.id  # Celery gives the child this root
            inherited = True
    effective = {**options, "root_id": root or task_id}
    if not in_canvas(task_id, effective):
        return
    started_by_a_task = inherited or (root and root != task_id)
    if (  # a task started by a running task joins that task's workflow, if it has one
        started_by_a_task
        and not _carries_canvas(options)
        and store.get_workflow(str(effective["root_id"]), using=using) is None
    ):
        return
    canvas_warnings.warn_once(app, dispatch_task_names(task.name, options), is_step_task)
    steps = dispatch_steps(task.name, options, lambda name: is_step_task(app.tasks.get(name)))
    if steps:
        store.add_workflow_steps(
            str(effective["root_id"]),
            name=describe(task.name, options),
            steps=steps,
            now=utcnow(),
            using=using,
        )


def _carries_canvas(options: Mapping[str, Any]) -> bool:
    return bool(options.get("chain") or options.get("group_id") or options.get("chord"))


def _request_options(request: Any) -> dict[str, Any]:
    return {
        "root_id": request.root_id,
        "group_id": request.group,
        "chain": request.chain,
        "chord": request.chord,
    }
