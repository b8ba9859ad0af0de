"""The Django store under asyncio: where ``adelay``/``aapply_async`` run, and the refusal
of a sync dispatch on an event loop's thread.

Django's ORM is synchronous and its connections belong to their thread. An async dispatch
(:mod:`celery_outbox.dispatch.asynchronous`) runs the sync one in
``sync_to_async(thread_sensitive=True)``: on the thread Django runs the request's sync code
on, with that thread's connection, so it joins a transaction a ``sync_to_async`` block
opened there and its publish after the commit runs there too, never on the loop.

A sync ``delay()``/``apply_async()`` on the loop's thread would reach the ORM there, which
Django refuses with ``SynchronousOnlyOperation`` from somewhere deep in the dispatch: the
store refuses first, with an :class:`~celery_outbox.exceptions.OutboxError` naming the
async calls (``DJANGO_ALLOW_ASYNC_UNSAFE`` lifts both, as it lifts Django's check).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TypeVar

from asgiref.sync import sync_to_async

from celery_outbox.exceptions import OutboxError

_Result = TypeVar("_Result")


async def run_dispatch(dispatch: Callable[[], _Result]) -> _Result:
    """Run the sync ``dispatch`` on Django's thread for sync code."""
    return await sync_to_async(dispatch, thread_sensitive=True)()


def refuse_event_loop() -> None:
    """Raise :class:`OutboxError` on a thread running an event loop (async code).

    Raises
    ------
    OutboxError
        Naming ``adelay``/``aapply_async``, the calls async code dispatches with.
    """
    if os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE"):
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise OutboxError(
        "celery-outbox: a sync delay()/apply_async() was called from async code (an event "
        "loop runs in this thread) with the Django store: use `await task.adelay(...)` or "
        "`await task.aapply_async(...)`, or dispatch inside your sync_to_async block."
    )
