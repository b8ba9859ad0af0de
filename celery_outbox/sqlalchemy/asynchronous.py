"""The SQLAlchemy store under asyncio: dispatches in an ``AsyncSession``'s transaction.

``store.bind_session(async_session)`` binds the session's ``sync_session`` (the one an
``AsyncSession`` drives through greenlets), after checking that it writes to the store's
database. ``await task.adelay(...)`` then runs the sync dispatch inside
``AsyncSession.run_sync``: the row is written on the session's connection, in its
transaction, by the async driver (asyncpg, psycopg async, aiosqlite, aiomysql, asyncmy);
savepoints (``begin_nested``) behave as in the sync store.

``await session.commit()`` runs the commit's callbacks (the publish of the rows) on a
small thread pool (:data:`PUBLISH_THREADS` threads), never on the event loop: a broker that
is down or stalled costs the loop nothing. A rollback publishes nothing. A commit that is
cancelled (``asyncio.CancelledError``) runs no callback: rows it committed were born
leased and the sweeper publishes them after ``outbox_publish_grace``, once.

A sync ``delay()`` in async code with an ``AsyncSession`` bound cannot run (its driver
needs the loop): it raises :class:`~celery_outbox.exceptions.OutboxError` naming
``adelay``/``aapply_async``. The store keeps its sync ``engine`` for the worker, the
sweeper and the relay (docs/async.md: both engines from one URL).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from celery_outbox.exceptions import OutboxConfigError, OutboxError
from celery_outbox.sqlalchemy import transactions

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

logger = logging.getLogger(__name__)

#: Threads that publish the rows of committed ``AsyncSession`` transactions.
PUBLISH_THREADS = 4

#: ``Session.info`` key: the ``AsyncSession`` driving this ``sync_session`` (a weak reference).
_ASYNC_KEY = "celery_outbox.async_session"

#: Whether an async dispatch is running (inside ``run_sync``), so the session can be used.
_dispatching: ContextVar[bool] = ContextVar("celery_outbox_async_dispatch", default=False)

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_pid: int | None = None
_running: set[Future[None]] = set()

_Result = TypeVar("_Result")


def bind_async(engine: Engine, session: AsyncSession, *, clause: Any) -> Session:
    """The ``sync_session`` of ``session`` to bind, its commits publishing off the loop.

    Raises
    ------
    OutboxConfigError
        When ``session`` writes the outbox table to another database than ``engine``'s.
    """
    sync_session = session.sync_session
    check_same_database(engine, sync_session.get_bind(clause=clause))
    sync_session.info[_ASYNC_KEY] = weakref.ref(session)
    transactions.run_callbacks_with(sync_session, _publish_off_loop)
    return sync_session


def check_same_database(engine: Engine, bind: Any) -> None:
    """Raise :class:`OutboxConfigError`, naming both, unless ``bind`` (a session's
    engine or connection) reaches the database of the store's ``engine``.
    """
    theirs = bind.engine.url if hasattr(bind, "engine") else bind.url
    if _database(theirs) != _database(engine.url):
        raise OutboxConfigError(
            "celery-outbox: the AsyncSession writes to "
            f"{theirs.render_as_string(hide_password=True)!r} but the store's engine is "
            f"{engine.url.render_as_string(hide_password=True)!r}; bind sessions of the "
            "store's database (build both engines from one URL: docs/async.md)."
        )


def _database(url: URL) -> tuple[str, str | None, int | None, str | None]:
    backend = url.get_backend_name()
    database = url.database
    if backend == "sqlite" and database not in (None, "", ":memory:"):
        database = os.path.realpath(database)
    return (backend, url.host, url.port, database)


def async_session_of(session: Session) -> AsyncSession | None:
    """The ``AsyncSession`` bound as ``session`` (its ``sync_session``), if any."""
    ref = session.info.get(_ASYNC_KEY)
    found: AsyncSession | None = ref() if ref is not None else None
    return found


def check_usable(session: Session) -> None:
    """Raise :class:`OutboxError` when ``session`` drives an ``AsyncSession`` and no
    async dispatch is running: a sync ``delay()`` cannot use an async driver.
    """
    if not _dispatching.get() and async_session_of(session) is not None:
        raise OutboxError(
            "celery-outbox: an AsyncSession is bound: dispatch with `await task.adelay(...)` "
            "or `await task.aapply_async(...)` (a sync delay()/apply_async() cannot write "
            "on an async connection)."
        )


async def run_in_session(session: AsyncSession, dispatch: Callable[[], _Result]) -> _Result:
    """Run ``dispatch`` inside ``session.run_sync``: its statements on the session's
    connection, through the async driver, without blocking the loop.
    """

    def run(_: Session) -> _Result:
        token = _dispatching.set(True)
        try:
            return dispatch()
        finally:
            _dispatching.reset(token)

    return await session.run_sync(run)


def _publish_off_loop(job: Callable[[], None]) -> None:
    future = _publish_pool().submit(job)
    with _pool_lock:
        _running.add(future)
    future.add_done_callback(_report)


def _report(future: Future[None]) -> None:
    with _pool_lock:
        _running.discard(future)
    error = future.exception()
    if error is not None:
        logger.error(
            "celery-outbox: publishing after an AsyncSession commit failed; the sweeper "
            "publishes the rows",
            exc_info=error,
        )


def _publish_pool() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():  # a forked child makes its own
            _pool = ThreadPoolExecutor(PUBLISH_THREADS, thread_name_prefix="celery-outbox-publish")
            _pool_pid = os.getpid()
        return _pool


def wait_for_publishes(timeout: float | None = None) -> None:
    """Wait until the publishes submitted so far have run (tests, graceful shutdown)."""
    with _pool_lock:
        running = list(_running)
    futures.wait(running, timeout=timeout)
