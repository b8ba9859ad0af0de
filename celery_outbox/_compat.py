"""Every Celery internal celery-outbox leans on, in one place.

``tests/unit/test_compat.py`` pins each one: an upgrade that changes one fails there, by
name. (kombu, py-amqp and redis-py internals live in :mod:`celery_outbox.publishing.broker`.)

- :func:`connect_on_app_finalize` / :func:`active_apps`: ``celery._state`` (as Celery
  registers ``celery.backend_cleanup``). Finalize callbacks run *before* the app's pending
  task decorators; ``app.on_after_finalize`` is sent after.
- :func:`registered_tasks`: ``app._tasks``, without ``app.tasks``'s finalising.
- :data:`ORIG_RUN`: a task class defining it is not wrapped for ``autoretry_for``
  (``celery.app.autoretry``); ``OutboxTask`` retries in ``__call__``.
- :func:`capture_message`: Celery's ``Task.apply_async`` against a stand-in producer: the
  exact message, and the ``AsyncResult`` Celery built (``ignored`` set, the Redis backend
  subscribed). Celery reads ``producer.serializer`` and ``producer.connection`` (entering
  only ``_reraise_as_library_errors()``) and calls ``producer.publish(body, **kw)``.
- :data:`REPLACED_TASK_NESTING`: the header counting ``Task.replace()`` hand-ons (0 first).
- :func:`delivered_headers`: Celery's request (``Context``) holds each delivered header as
  an attribute (OpenTelemetry's Celery instrumentation reads them there too).
- :func:`successors` / :func:`forget_successors`: the request's ``callbacks`` and ``chain``
  (Celery's tracer dispatches them after the task returned).
- :func:`install_canvas_hooks`: wraps ``chord.run`` (it calls ``app.backend.apply_chord``
  once, before the header, else only reads ``app.conf``), ``group.apply_async`` (its root_id
  becomes every member's root; it calls each member's ``apply_async``: batched), ``regen``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

from celery import Celery, Signature, Task, chord, group, maybe_signature
from celery import _state as celery_state
from celery.backends.base import DisabledBackend
from celery.canvas import _chain
from celery.result import AsyncResult
from celery.utils.functional import regen
from kombu import Connection
from kombu.utils.uuid import uuid

from celery_outbox.state import state_of

#: The attribute whose presence stops Celery wrapping ``run`` for ``autoretry_for``.
ORIG_RUN = "_orig_run"
#: Celery's message header counting the ``Task.replace()`` generations of a task id.
REPLACED_TASK_NESTING = "replaced_task_nesting"


def connect_on_app_finalize(callback: Callable[[Celery], Any]) -> Callable[[Celery], Any]:
    """Run ``callback(app)`` when any Celery app is finalised (before its pending tasks)."""
    return celery_state.connect_on_app_finalize(callback)


def active_apps() -> list[Celery]:
    """Every Celery app alive in this process."""
    return list(celery_state._get_active_apps())  # type: ignore[attr-defined]


def registered_tasks(app: Celery) -> dict[str, Task[Any, Any]]:
    """The tasks registered with ``app`` so far, without finalising it."""
    return cast("dict[str, Task[Any, Any]]", app._tasks)  # type: ignore[attr-defined]


class _CapturingProducer:
    """Stands in for a kombu ``Producer``: keeps the message Celery built."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.serializer = cast("str | None", None)
        self.body: Any = None
        self.kwargs: dict[str, Any] = {}

    def publish(self, body: Any, **kwargs: Any) -> None:
        self.body = body
        self.kwargs = kwargs


def _unconnected_connection(app: Celery) -> Connection:
    # Celery only enters ``connection._reraise_as_library_errors()``: nothing connects.
    state = state_of(app)
    if state.capture_connection is None:
        state.capture_connection = app.connection_for_write()
    return state.capture_connection


def capture_message(
    task: Task[Any, Any],
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    *,
    task_id: str,
    options: Mapping[str, Any],
) -> tuple[Any, dict[str, Any], AsyncResult[Any]]:
    """Run Celery's ``apply_async`` for ``task`` against a capturing producer.

    Returns the message body, the keyword arguments Celery would pass to
    ``Producer.publish``, and the ``AsyncResult`` Celery returns for the call.
    """
    producer = _CapturingProducer(_unconnected_connection(task.app))
    result = Task.apply_async(
        task,
        tuple(args or ()),
        dict(kwargs or {}),
        task_id=task_id,
        producer=cast(Any, producer),
        **options,
    )
    return producer.body, producer.kwargs, result


def delivered_headers(request: Any, names: Iterable[str]) -> dict[str, str]:
    """The text headers ``names`` of the message the running ``request`` delivered."""
    found = ((name, getattr(request, name, None)) for name in names)
    return {name: value for name, value in found if isinstance(value, str)}


def successors(request: Any) -> tuple[list[Any], list[Any]]:
    """``(callbacks, chain)`` of the running request, as Celery's tracer will read them."""
    return list(request.callbacks or ()), list(request.chain or ())


def forget_successors(request: Any) -> None:
    """Make the tracer dispatch no callbacks and no next chain step for ``request``."""
    request.callbacks = request.chain = None


# -- canvas: the root of a top-level group or chord, and chord joins -----------------

#: Opens a chord's join: ``(group_id, header task ids, body)``, in the caller's transaction.
OpenJoin = Callable[[str, list[str], Signature[Any]], None]


@dataclass(frozen=True)
class CanvasHooks:
    """What celery-outbox changes in Celery's canvas for the apps it serves."""

    #: Whether ``app`` has an outbox store (others keep Celery's canvas untouched).
    serves: Callable[[Celery], bool]
    #: How to open the join of a chord in the database, or ``None``: the result backend's.
    chord_join: Callable[[Celery, group, Signature[Any]], OpenJoin | None]
    #: The context a database-joined chord's header is dispatched in.
    joining: Callable[[], AbstractContextManager[None]]
    #: Whether a chord with this header (a list of signatures) is joined in the database.
    joined_header: Callable[[Celery, list[Any]], bool]
    #: The context of a canvas dispatched outside any task: counts it whole, up front.
    opening: Callable[[Celery, str, list[Any]], AbstractContextManager[None]]
    #: The context of a canvas left to Celery (:func:`drawn_lazily`): opens no workflow.
    uncounted: Callable[[], AbstractContextManager[None]]
    #: The context of a group's dispatch: its members' rows are written at its end, at once.
    batching: Callable[[], AbstractContextManager[None]]


_ORIGINAL_CHORD_RUN = chord.run
_ORIGINAL_GROUP_APPLY_ASYNC = group.apply_async
_ORIGINAL_PREPARE_STEPS = _chain.prepare_steps
_ORIGINAL_ENSURE_CHORDS_ALLOWED = DisabledBackend.ensure_chords_allowed
_hooks: CanvasHooks | None = None  # set once, by install_canvas_hooks
#: Whether the chain being prepared in this context has only database-joined chords.
_chords_joined: ContextVar[bool] = ContextVar("celery_outbox_chords_joined", default=False)


def install_canvas_hooks(hooks: CanvasHooks) -> None:
    """Wrap Celery's ``chord.run`` and ``group.apply_async`` (once per process).

    - A group or chord dispatched outside any task gets its group id as ``root_id``
      (Celery leaves each member its own root), so the whole canvas is one workflow,
      and is dispatched within ``hooks.opening``, which counts all of it at once.
    - A chord for which ``hooks.chord_join`` gives an opener runs Celery's own
      ``chord.run`` with the app's result backend replaced, for that call only, by one
      whose ``apply_chord`` opens the join in the database: no result backend needed.
    - A chain whose chords (held, or groups it upgrades to chords) all have
      ``hooks.joined_header`` is prepared without a result backend: within Celery's
      ``chain.prepare_steps``, ``DisabledBackend.ensure_chords_allowed()`` allows them.
    - A group or chord :func:`drawn_lazily` is Celery's alone; others are ``hooks.batching``.
    """
    global _hooks
    _hooks = hooks
    chord.run = _chord_run  # type: ignore[method-assign,assignment]
    group.apply_async = _group_apply_async  # type: ignore[method-assign,assignment]
    _chain.prepare_steps = _prepare_steps  # type: ignore[method-assign]
    DisabledBackend.ensure_chords_allowed = _ensure_chords_allowed  # type: ignore[method-assign]


def _prepare_steps(self: _chain, args: Any, kwargs: Any, tasks: Any, *rest: Any, **kw: Any) -> Any:
    # The app the chain's tasks belong to: Celery 5.4 takes a chain's app from its first
    # task only, and a chord made without an app leaves it the current app.
    app = _made_by(list(tasks)) or kw.get("app") or (rest[3] if len(rest) > 3 else None) or self.app
    joined = _hooks is not None and _hooks.serves(app) and _chords_all_joined(app, list(tasks))
    token = _chords_joined.set(joined)
    try:
        return _ORIGINAL_PREPARE_STEPS(self, args, kwargs, tasks, *rest, **kw)
    finally:
        _chords_joined.reset(token)


def _made_by(tasks: list[Any]) -> Celery | None:
    """The app the first signature among ``tasks`` (and the canvases they hold) was made
    by, or ``None``.
    """
    for task in tasks:
        made = getattr(task, "_app", None)
        if made is not None:
            return cast(Celery, made)
        inner = getattr(task, "tasks", None)
        nested = [*(inner if isinstance(inner, (list, tuple)) else ()), getattr(task, "body", None)]
        found = _made_by([piece for piece in nested if piece is not None])
        if found is not None:
            return found
    return None


def _ensure_chords_allowed(self: DisabledBackend) -> None:
    if not _chords_joined.get():
        _ORIGINAL_ENSURE_CHORDS_ALLOWED(self)


def _chords_all_joined(app: Celery, tasks: list[Any]) -> bool:
    """Whether every chord of a chain's ``tasks`` (a group followed by a task is one) has
    a database-joined header.
    """
    assert _hooks is not None
    for index, task in enumerate(tasks):
        task = maybe_signature(task, app=app)
        if isinstance(task, _chain) and not _chords_all_joined(app, list(task.tasks)):
            return False
        if isinstance(task, chord):
            header = task.tasks
            header_tasks = getattr(header, "tasks", header)
        elif isinstance(task, group) and index < len(tasks) - 1:
            header_tasks = task.tasks  # upgraded: chord(group, next task)
        else:
            continue
        if drawn_lazily(header_tasks) or not _hooks.joined_header(app, list(header_tasks)):
            return False
    return True


def drawn_lazily(tasks: Any) -> bool:
    """Whether a group's ``tasks`` are a generator Celery has not drawn to its end (its
    ``regen``), which Celery dispatches as it draws (celery#3021): left to Celery.
    """
    return isinstance(tasks, _REGEN) and not getattr(tasks, "_regen__done", True)


_REGEN = type(regen(iter(())))  # celery.utils.functional._regen


def _at_top(app: Celery) -> bool:
    return _hooks is not None and app.current_worker_task is None and _hooks.serves(app)


def _group_apply_async(self: group, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
    app = self.app
    if _hooks is None:
        return _ORIGINAL_GROUP_APPLY_ASYNC(self, args, kwargs, **options)
    if drawn_lazily(self.tasks):  # dispatched as Celery draws it: not counted, not batched
        with _hooks.uncounted() if _at_top(app) else nullcontext():
            return _ORIGINAL_GROUP_APPLY_ASYNC(self, args, kwargs, **options)
    with _hooks.batching():  # the members' rows: one INSERT when the group is dispatched
        if not _at_top(app):
            return _ORIGINAL_GROUP_APPLY_ASYNC(self, args, kwargs, **options)
        root_id = options.get("root_id") or self.options.get("root_id")
        if not root_id:
            root_id = self.options.get("task_id") or options.get("task_id") or uuid()
            if "task_id" not in self.options:
                options["task_id"] = root_id
            options["root_id"] = root_id
        with _hooks.opening(app, str(root_id), [self, *(options.get("chain") or ())]):
            return _ORIGINAL_GROUP_APPLY_ASYNC(self, args, kwargs, **options)


def _chord_run(
    self: chord, header: group, body: Signature[Any], partial_args: Any, app: Any = None, **kw: Any
) -> Any:
    app = app or self._get_app(body)  # type: ignore[attr-defined]
    if _hooks is None or not _hooks.serves(app):
        return _ORIGINAL_CHORD_RUN(self, header, body, partial_args, app=app, **kw)
    if drawn_lazily(header.tasks):
        with _hooks.uncounted():
            return _ORIGINAL_CHORD_RUN(self, header, body, partial_args, app=app, **kw)
    top = _at_top(app)
    root_id = kw.get("root_id") or body.options.get("root_id")
    if not root_id and top:
        root_id = header.options.get("task_id") or uuid()
        header.options["task_id"] = root_id
        body.options["root_id"] = root_id
    open_join = _hooks.chord_join(app, header, body)
    if open_join is None:
        # Celery's own chord: refused before its workflow is counted (counted outside a
        # transaction, it would stay `running` with nothing to run).
        app.backend.ensure_chords_allowed()
    opened: AbstractContextManager[None] = nullcontext()
    if top and root_id:
        whole = chord(header, body=body, app=app)
        # From Celery 5.5 on, the body carries the chain's tail in its own `chain` option
        # too (5.4 sets it inside chord.run): count that tail once.
        carried = list(body.options.get("chain") or ())
        tail = [piece for piece in kw.get("chain") or () if piece not in carried]
        opened = _hooks.opening(app, str(root_id), [whole, *tail])
    with opened:
        if open_join is None:
            return _ORIGINAL_CHORD_RUN(self, header, body, partial_args, app=app, **kw)
        joined = cast(Any, _JoinApp(app, open_join))
        with _hooks.joining():
            return _ORIGINAL_CHORD_RUN(self, header, body, partial_args, app=joined, **kw)


class _JoinBackend:
    """The app's result backend, but ``apply_chord`` opens the join in the database."""

    def __init__(self, backend: Any, open_join: OpenJoin) -> None:
        self._backend = backend
        self._open_join = open_join

    def apply_chord(self, header_result_args: Any, body: Signature[Any], **kwargs: Any) -> None:
        self._open_join(header_result_args[0], [r.id for r in header_result_args[1]], body)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


class _JoinApp:
    """``app`` as ``chord.run`` sees it: the same app, with :class:`_JoinBackend`."""

    def __init__(self, app: Celery, open_join: OpenJoin) -> None:
        self._app = app
        self.backend = _JoinBackend(app.backend, open_join)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._app, name)
