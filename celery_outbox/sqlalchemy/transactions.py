"""Run callbacks after a ``Session`` commits: Django's ``on_commit`` for SQLAlchemy.

A callback belongs to the innermost transaction open when it was registered: the
session's savepoint (``begin_nested``) or its root transaction. A released savepoint
hands its callbacks to its parent; a rolled-back one drops them. When the root
transaction commits, the callbacks run in order once the session has closed that
transaction (so they may use the engine, and the session's connection is back in
the pool); on rollback they are dropped.

The state lives in ``Session.info``, and the listeners are attached to each session
once, so sessions from any ``sessionmaker`` (or none) work.

The rows a root transaction deferred are known to exist once it commits, unless a
savepoint was rolled back on its connection after the first of them was written (it may
have taken some of them along): :func:`watch_savepoints` counts those rollbacks on an
engine's connections, session and Core savepoints alike. While that commit's callbacks
run, :func:`committed_rows` names the rows known that way, and the store skips reading
them back (:meth:`~celery_outbox.sqlalchemy.SQLAlchemyOutboxStore.still_leased`). A
hand-written ``ROLLBACK`` statement executed through SQLAlchemy counts too; one sent on
the raw DBAPI cursor is not seen.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from contextvars import ContextVar, copy_context
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.orm import Session, SessionTransaction

from celery_outbox.store.base import PublishCallback, publisher_key
from celery_outbox.store.records import StoredMessage

_INFO_KEY = "celery_outbox.after_commit"
#: ``Session.info`` key: what runs a committed transaction's callbacks (``run_callbacks_with``).
_RUNNER_KEY = "celery_outbox.callback_runner"
#: ``Connection.info`` key: savepoints rolled back on that database connection so far.
_ROLLBACKS_KEY = "celery_outbox.savepoint_rollbacks"
#: The rows known committed while their transaction's callbacks run.
_committed: ContextVar[frozenset[int]] = ContextVar("celery_outbox_committed", default=frozenset())

Callback = Callable[[], None]
#: Runs a committed transaction's callbacks (one job, in order), e.g. on another thread.
Runner = Callable[[Callback], None]


@dataclass
class _SessionCallbacks:
    #: Callbacks by the transaction (root or savepoint) they were registered in.
    pending: dict[SessionTransaction, list[Callback]] = field(default_factory=dict)
    #: Callbacks of a committed root transaction, run once it has closed.
    ready: list[Callback] = field(default_factory=list)
    #: Rows deferred in the root transaction, one batch per publish callback.
    batches: dict[Hashable, list[StoredMessage]] = field(default_factory=dict)
    #: The deferred rows' connection info, and its savepoint rollbacks when the first row
    #: was deferred (``None``: not watched, so the rows are not known committed).
    watch: tuple[dict[Any, Any], int] | None = None
    #: Some deferred row may be gone at the commit (not watched, or deleted in it).
    unsure: bool = False
    #: The rows of the committed root transaction known to exist.
    committed: frozenset[int] = frozenset()


def watch_savepoints(engine: Engine) -> None:
    """Count the savepoints rolled back on ``engine``'s connections (once per engine),
    so that rows deferred on them can be known committed without reading them back:
    through SQLAlchemy, and a ``ROLLBACK`` statement written by hand.
    """
    if not event.contains(engine, "rollback_savepoint", _count_rollback):
        event.listen(engine, "rollback_savepoint", _count_rollback)
        event.listen(engine, "before_cursor_execute", _count_rollback_statement)


def _count_rollback(conn: Connection, name: str, context: object) -> None:
    conn.info[_ROLLBACKS_KEY] = conn.info.get(_ROLLBACKS_KEY, 0) + 1


def _count_rollback_statement(conn: Connection, cursor: object, statement: str, *_: object) -> None:
    if statement[:16].lstrip()[:8].upper() == "ROLLBACK":
        _count_rollback(conn, "", None)


def committed_rows() -> frozenset[int]:
    """While a root commit's callbacks run: the ids of the rows it deferred that are
    known to exist (no savepoint rolled back since they were written); else empty.
    """
    return _committed.get()


def run_callbacks_with(session: Session, runner: Runner) -> None:
    """Have ``runner`` run the callbacks of ``session``'s commits (one job per commit, the
    callbacks in order, in a copy of the committing context) instead of running them on the
    committing thread: an ``AsyncSession`` commits on the event loop's thread, which must
    not wait on the broker (:mod:`celery_outbox.sqlalchemy.asynchronous`).
    """
    session.info[_RUNNER_KEY] = runner


def doubt_rows(session: Session) -> None:
    """Some row deferred in ``session``'s transaction may be gone at its commit (the
    store deleted a pending row in it): read them all back after the commit.
    """
    _callbacks(session).unsure = True


def on_commit(session: Session, callback: Callback, *, root: bool = False) -> None:
    """Run ``callback`` after ``session``'s root transaction commits.

    The session must be in a transaction. With ``root``, the callback survives the
    rollback of the savepoint it was registered in (it is tied to the root).
    """
    transaction = _root(session) if root else _innermost(session)
    _callbacks(session).pending.setdefault(transaction, []).append(callback)


def awaits(session: Session, callback: Callback) -> bool:
    """Whether ``callback`` waits for a commit of ``session``'s open transaction."""
    state: _SessionCallbacks | None = session.info.get(_INFO_KEY)
    return state is not None and any(callback in cbs for cbs in state.pending.values())


def defer_publish(
    session: Session, message: StoredMessage, publish: PublishCallback, *, connection: Connection
) -> None:
    """Add ``message`` (written on ``connection``) to the batch ``publish`` receives after
    the root commit (one batch per :func:`~celery_outbox.store.base.publisher_key`).

    The first row of a batch registers one callback on the root transaction, so a
    rolled-back savepoint cannot drop the batch of its parent; rows written in such a
    savepoint stay listed, and the relay skips them (they do not exist).
    """
    state = _callbacks(session)
    key = publisher_key(publish)
    _watch(state, connection)
    batch = state.batches.get(key)
    if batch is None:
        batch = state.batches[key] = []
        rows = batch

        def run() -> None:
            publish(tuple(rows))

        on_commit(session, run, root=True)
    batch.append(message)


def _watch(state: _SessionCallbacks, connection: Connection) -> None:
    info = connection.info
    if state.watch is None and not state.unsure:
        if event.contains(connection.engine, "rollback_savepoint", _count_rollback):
            state.watch = (info, info.get(_ROLLBACKS_KEY, 0))
        else:
            state.unsure = True
    elif state.watch is not None and state.watch[0] is not info:
        state.unsure = True  # rows on two connections: not worth following


def _innermost(session: Session) -> SessionTransaction:
    transaction = session.get_nested_transaction() or session.get_transaction()
    if transaction is None:
        raise RuntimeError("celery-outbox: the session is not in a transaction.")
    return transaction


def _root(session: Session) -> SessionTransaction:
    transaction = session.get_transaction()
    if transaction is None:
        raise RuntimeError("celery-outbox: the session is not in a transaction.")
    return transaction


def _callbacks(session: Session) -> _SessionCallbacks:
    state: _SessionCallbacks | None = session.info.get(_INFO_KEY)
    if state is None:
        state = session.info[_INFO_KEY] = _SessionCallbacks()
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_transaction_end", _after_transaction_end)
    return state


def _boundary(transaction: SessionTransaction | None) -> SessionTransaction | None:
    # The nearest enclosing savepoint or root; skips the flush's internal subtransactions.
    while transaction is not None and not (transaction.nested or transaction.parent is None):
        transaction = transaction.parent
    return transaction


def _after_commit(session: Session) -> None:
    # Fired for the root COMMIT and for each RELEASE SAVEPOINT, before the
    # transaction closes: the innermost transaction is the one that committed.
    state: _SessionCallbacks = session.info[_INFO_KEY]
    savepoint = session.get_nested_transaction()
    if savepoint is None:
        root = session.get_transaction()
        state.ready.extend(state.pending.pop(root, []) if root is not None else [])
        watch = state.watch
        if watch is not None and not state.unsure and watch[0].get(_ROLLBACKS_KEY, 0) == watch[1]:
            state.committed = frozenset(m.id for rows in state.batches.values() for m in rows)
        return
    callbacks = state.pending.pop(savepoint, [])
    parent = _boundary(savepoint.parent)
    if callbacks and parent is not None:
        state.pending.setdefault(parent, []).extend(callbacks)


def _after_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    state: _SessionCallbacks = session.info[_INFO_KEY]
    # Callbacks still listed under a closing transaction were not committed: drop them.
    state.pending.pop(transaction, None)
    if transaction.parent is not None:
        return
    ready = state.ready
    state.ready = []
    committed = state.committed
    state.committed = frozenset()
    state.pending.clear()
    state.batches.clear()
    state.watch = None
    state.unsure = False
    if not ready:
        return

    def run() -> None:
        token = _committed.set(committed)
        try:
            for callback in ready:
                callback()
        finally:
            _committed.reset(token)

    runner: Runner | None = session.info.get(_RUNNER_KEY)
    if runner is None:
        run()
    else:
        runner(functools.partial(copy_context().run, run))
