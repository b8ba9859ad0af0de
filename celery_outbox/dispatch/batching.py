"""Batched dispatch: the outbox rows of many dispatches in one ``INSERT``.

Within a batch, each ``OutboxTask`` dispatch is checked and built at its call, as always
(a bad argument, option or payload raises there, and nothing of that call is kept), but
its row is only *collected*; the batch writes the rows it collected with one
:meth:`~celery_outbox.store.base.BulkStore.add_many` per store and database when it
ends, then does for each dispatch, in order, what a dispatch does once its row is written
(the ``task_dispatched`` signal, the workflow count, the on-commit publish), so the rows
join their transaction's one on-commit publish and get the ids they would have got one by
one.

A batch opens around every ``group(...)`` dispatch of an app with an outbox store (chord
headers too), and around the block of :func:`batched_dispatch`. Celery's ``chunks``,
``map`` and ``starmap`` send its own ``celery.starmap``/``celery.map`` tasks, which are
not ``OutboxTask`` s: they never reach the outbox, batch or not. Batches do not nest: an
inner one joins the outer one.

A row is collected only when it would be written in the transaction, and savepoint, the
batch was opened in (:meth:`~celery_outbox.store.base.BulkStore.transaction_token`). Any
other dispatch is written at its call, as without a batch: outside a transaction (the row
commits at once, as always), in a savepoint or transaction opened inside the block, to
another database, or one that may supersede a pending row (:mod:`.superseding`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, current_app

from celery_outbox.dispatch.target import dispatch_alias
from celery_outbox.exceptions import BatchWriteError, NoStoreConfigured
from celery_outbox.registry import store_for
from celery_outbox.store.base import BulkStore
from celery_outbox.store.records import NewMessage

#: What a dispatch does once its row is written: given the row id (``None``: a duplicate).
Written = Callable[[int | None], None]


@dataclass
class _Row:
    message: NewMessage
    then: Written
    #: The dispatch's context (the workflow's context variables), to run ``then`` in.
    context: contextvars.Context


@dataclass
class _Part:
    """The rows of one store and database, and the transaction they belong to."""

    store: BulkStore
    using: str | None
    token: Hashable
    rows: list[_Row] = field(default_factory=list)


class DispatchBatch:
    """The rows collected since a batch opened, by store and database."""

    def __init__(self, *, opened: dict[tuple[int, str | None], Hashable] | None = None) -> None:
        #: The transaction of each (store, database) when the batch opened; ``None``: any,
        #: taken from the first dispatch (a group, whose dispatches run no user code between).
        self._opened = opened
        self._parts: dict[tuple[int, str | None], _Part] = {}
        self._order: list[tuple[_Part, _Row]] = []

    def collect(
        self, store: BulkStore, message: NewMessage, using: str | None, then: Written
    ) -> bool:
        """Keep ``message`` for the batch's ``INSERT``; ``False`` when it must be written
        now (outside the batch's transaction).
        """
        token = store.transaction_token(using=using)
        if token is None:
            return False
        key = (id(store), using)
        part = self._parts.get(key)
        if part is None:
            if self._opened is not None and self._opened.get(key) != token:
                return False
            part = self._parts[key] = _Part(store=store, using=using, token=token)
        elif part.token != token:
            return False
        row = _Row(message=message, then=then, context=contextvars.copy_context())
        part.rows.append(row)
        self._order.append((part, row))
        return True

    def write(self) -> None:
        """Write every collected row (one ``add_many`` per part), then finish each dispatch
        in order. Raises :class:`BatchWriteError` naming the tasks when a part fails.
        """
        parts = list(self._parts.values())
        order = self._order
        self._parts = {}
        self._order = []
        ids: dict[int, int | None] = {}
        for part in parts:
            for row, row_id in zip(part.rows, _add_many(part), strict=True):
                ids[id(row)] = row_id
        for _, row in order:
            row.context.run(row.then, ids[id(row)])


def _add_many(part: _Part) -> list[int | None]:
    messages = [row.message for row in part.rows]
    names = ", ".join(f"{m.task_name}[{m.task_id}]" for m in messages[:5])
    more = f" and {len(messages) - 5} more" if len(messages) > 5 else ""
    if part.store.transaction_token(using=part.using) != part.token:
        raise BatchWriteError(
            f"celery-outbox: the transaction (or savepoint) {len(messages)} batched "
            f"dispatches were made in ended before the batch did, so their rows were not "
            f"written: {names}{more}. Open batched_dispatch() inside the transaction."
        )
    try:
        return part.store.add_many(messages, using=part.using)
    except Exception as exc:
        raise BatchWriteError(
            f"celery-outbox: writing the outbox rows of {len(messages)} batched dispatches "
            f"failed, none was written: {names}{more} ({type(exc).__name__}: {exc})"
        ) from exc


_current: contextvars.ContextVar[DispatchBatch | None] = contextvars.ContextVar(
    "celery_outbox_dispatch_batch", default=None
)


def current_batch() -> DispatchBatch | None:
    """The batch open in this context, if any."""
    return _current.get()


@contextmanager
def batching(opened: dict[tuple[int, str | None], Hashable] | None = None) -> Iterator[None]:
    """Open a batch for the block (or join the one open); written when the block ends,
    also when it raises (as the dispatches made before the error would have been).
    """
    if _current.get() is not None:
        yield
        return
    batch = DispatchBatch(opened=opened)
    token = _current.set(batch)
    try:
        yield
    except BaseException as error:
        _current.reset(token)
        try:
            batch.write()
        except BatchWriteError as failed:
            if hasattr(error, "add_note"):
                error.add_note(str(failed))
        raise
    _current.reset(token)
    batch.write()


@contextmanager
def batched_dispatch(*, app: Celery | None = None, using: str | None = None) -> Iterator[None]:
    """Write the outbox rows of the ``OutboxTask`` dispatches made in the block with one
    ``INSERT`` when the block exits, instead of one per dispatch.

    Open it inside the transaction: the rows collected are those written in the
    transaction (and savepoint) current when the block opens, to the database ``using``
    (``None``: the default, or the running atomic task's) of ``app``'s store (``None``:
    the current app). Other dispatches are written at their call, as without the block:
    outside a transaction, in a savepoint opened inside the block, to another database.
    A ``group(...)`` dispatch batches its members on its own.

    Each dispatch is checked at its call (a bad argument or option, a payload over
    ``outbox_max_payload_bytes``, raises there); its ``AsyncResult`` and task id are
    returned at once. The rows are written, the ``task_dispatched`` signal sent and the
    workflow counted when the block exits, also when it exits with an error (the
    dispatches made before it are kept, as without the block).

    Raises
    ------
    BatchWriteError
        At the block's exit, when the rows cannot be written (one statement: none is), or
        when the transaction they were made in ended inside the block; its message names
        the tasks.
    """
    store = _store_of(app or current_app)
    opened: dict[tuple[int, str | None], Hashable] = {}
    if store is not None:
        resolved = dispatch_alias(using)
        entry = store.transaction_token(using=resolved)
        if entry is not None:
            opened[(id(store), resolved)] = entry
    with batching(opened):
        yield


def _store_of(app: Any) -> BulkStore | None:
    try:
        return store_for(app)
    except NoStoreConfigured:
        return None
