"""Dispatch from ``async def`` code: ``adelay``/``aapply_async`` and :func:`adispatch`.

An async dispatch is the sync one (:meth:`~celery_outbox.OutboxTask.apply_async`: the
same row, options, signals and ``AsyncResult``) run where the app's store says
(:meth:`~celery_outbox.store.base.OutboxStore.run_dispatch`): the SQLAlchemy store on the
bound ``AsyncSession``'s connection (:mod:`celery_outbox.sqlalchemy.asynchronous`), the
Django store in ``sync_to_async(thread_sensitive=True)``, any other in a worker thread.
The event loop never waits on the database or the broker: the publish after the commit
runs off the loop too. See docs/async.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from celery import Celery

from celery_outbox.registry import store_for

_Result = TypeVar("_Result")


async def adispatch(app: Celery, dispatch: Callable[[], _Result]) -> _Result:
    """Run the sync ``dispatch`` (a ``functools.partial`` of ``apply_async``, a group's
    ``apply_async``, a ``batched_dispatch`` block ...) for async code, through ``app``'s
    outbox store, and return what it returned.

    With ``task_always_eager`` the task runs in a worker thread (it may block).
    """
    if app.conf.task_always_eager:
        return await asyncio.to_thread(dispatch)
    return await store_for(app).run_dispatch(dispatch)


async def aapply_async(task: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
    """``await``-able ``task.apply_async(args, kwargs, **options)``: its ``AsyncResult``."""

    def dispatch() -> Any:
        return task.apply_async(args, kwargs, **options)

    return await adispatch(task.app, dispatch)
