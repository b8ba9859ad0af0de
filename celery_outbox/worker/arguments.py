"""Whether a delivered message's arguments fit its task's signature.

A message written by another version of the code (a row dispatched before a deploy that
changed the task's parameters, a dead letter requeued after) would raise ``TypeError``
at the call, which the task's ``autoretry_for`` may retry: the same arguments, the same
error, every time. It is checked before the body runs instead, as Celery checks at
dispatch (when the task's ``typing`` is on), and a mismatch is an
:class:`~celery_outbox.exceptions.ArgumentsMismatch` naming the task, the message and
the arguments, which is dead-lettered at once (its arguments kept, to requeue once the
code accepts them).
"""

from __future__ import annotations

import inspect
import reprlib
from collections.abc import Mapping
from typing import Any

from celery import Task

from celery_outbox.exceptions import ArgumentsMismatch

#: Short reprs of the arguments in the error (the dead letter keeps all of them).
_short = reprlib.Repr()
_short.maxstring = _short.maxother = 80


def mismatch(task: Task[Any, Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """Why ``args``/``kwargs`` cannot be passed to ``task.run`` (the signature, the
    arguments, short, and Python's reason), or ``None`` when they can, when
    ``task.typing`` is off, or when the signature cannot be read (a builtin).
    """
    if not getattr(task, "typing", True):
        return None
    try:
        signature = inspect.signature(task.run)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return (
            f"do not fit its signature {signature}: args={_short.repr(tuple(args))} "
            f"kwargs={_short.repr(dict(kwargs))} ({exc})"
        )
    return None


def check_arguments(
    task: Task[Any, Any], task_id: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> None:
    """Raise :class:`ArgumentsMismatch` naming the task, the message and the arguments
    when they do not fit ``task.run`` (see :func:`mismatch`).
    """
    problem = mismatch(task, args, kwargs)
    if problem is not None:
        raise ArgumentsMismatch(
            f"The arguments of task {task.name!r} [{task_id}] {problem}. Written by "
            "another version of the code? Dead-lettered without running; requeue it once "
            "the task accepts them, or discard it."
        )
