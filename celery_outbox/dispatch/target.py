"""Where a dispatch writes: the database alias of the atomic body running in this context.

A task dispatched from an atomic task's body joins that body's transaction, whatever
database it runs on: the worker marks the body's alias here (:func:`writing_to`) for the
time the body runs, and every dispatch reads it (:func:`dispatch_alias`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from celery import Task

#: The database alias of the atomic body running in this context (a 1-tuple: the alias
#: may be ``None``, the store's default).
_running_alias: ContextVar[tuple[str | None] | None] = ContextVar(
    "celery_outbox_atomic_alias", default=None
)


def is_atomic(task: Task[Any, Any]) -> bool:
    """Whether ``task`` is atomic (``atomic = True``, as a class attribute or task option)."""
    return getattr(task, "atomic", False) is True


@contextmanager
def writing_to(using: str | None) -> Iterator[None]:
    """Make ``using`` the alias dispatches write to inside the block (an atomic body)."""
    token = _running_alias.set((using,))
    try:
        yield
    finally:
        _running_alias.reset(token)


def dispatch_alias(using: str | None) -> str | None:
    """The alias a dispatch writes to: ``using`` when given, else, inside an atomic body,
    that body's alias (its follow-up tasks commit with it), else ``None``.
    """
    if using is not None:
        return using
    running = _running_alias.get()
    return None if running is None else running[0]
