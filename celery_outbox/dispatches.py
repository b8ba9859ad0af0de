"""What a test dispatched through the outbox: one :class:`Dispatch` per ``delay`` or
``apply_async`` of an ``OutboxTask``, as :mod:`celery_outbox.recorder` saw it.

A dispatch's :attr:`~Dispatch.state` follows its transaction: ``committed`` once it
committed, ``awaiting commit`` while the transaction is open (under pytest-django's
``django_db`` that is the test's own transaction, which never commits), ``rolled back``
when a rollback dropped it.
"""

from __future__ import annotations

import enum
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery import Celery

from celery_outbox.records import NewMessage

#: Longest rendering of one argument in a description (longer ones are cut with "...").
_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 60, 60, 10, 10
#: Options shown in a dispatch's description, when given.
_SHOWN_OPTIONS = ("queue", "countdown", "eta", "priority", "routing_key", "expires")


class DispatchState(str, enum.Enum):
    """Where a dispatch's transaction is."""

    COMMITTED = "committed"
    #: Its transaction is open: still running, or the test's own (``django_db``).
    AWAITING_COMMIT = "awaiting commit"
    #: A rollback dropped it (stores that cannot tell report an open one so too).
    ROLLED_BACK = "rolled back"


class Drained(str, enum.Enum):
    """What :meth:`~celery_outbox.recorder.OutboxRecorder.drain` did with a dispatch."""

    RAN = "ran"
    PUBLISHED = "published"


@dataclass(eq=False)
class Dispatch:
    """One dispatch of an ``OutboxTask`` made during a test.

    ``args``, ``kwargs`` and ``options`` are the values given to ``apply_async``
    (options without those left ``None``); ``using`` is the database alias given
    (``None``: the store's default). ``row_id`` is the outbox row written, ``None``
    when none was: under ``task_always_eager`` (``message`` is ``None`` too), or when
    the task id was already pending (the dispatch was a duplicate).
    """

    task_name: str
    task_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    using: str | None
    row_id: int | None
    message: NewMessage | None = field(repr=False)
    #: Whether its transaction committed (set by an on-commit callback).
    committed: bool = False
    #: What ``drain()`` did with it, if anything.
    drained: Drained | None = None
    #: Whether its on-commit callback still waits in an open transaction.
    awaiting: Callable[[], bool] = field(default=lambda: False, repr=False)
    #: The Celery app of the task (its store holds the row).
    app: Celery | None = field(default=None, repr=False)

    @property
    def state(self) -> DispatchState:
        """Where its transaction is now (asks the store while it is not committed)."""
        if self.committed:
            return DispatchState.COMMITTED
        if self.awaiting():
            return DispatchState.AWAITING_COMMIT
        return DispatchState.ROLLED_BACK

    @property
    def eager(self) -> bool:
        """Dispatched under ``task_always_eager``: no row, the task ran on commit."""
        return self.message is None

    @property
    def duplicate(self) -> bool:
        """Its task id was already pending, so no row was written."""
        return self.message is not None and self.row_id is None

    def call(self) -> str:
        """The call as code: ``name(1, 'a', b=2)``."""
        return call_text(self.task_name, self.args, self.kwargs)

    def describe(self) -> str:
        """One line: the call, then its state, alias, notable options and task id."""
        notes = [self.status(), f"using={self.using!r}"]
        notes += [f"{k}={_REPR.repr(self.options[k])}" for k in _SHOWN_OPTIONS if k in self.options]
        notes.append(f"task_id={self.task_id}")
        return f"{self.call()}  [{', '.join(notes)}]"

    def status(self) -> str:
        """Its state in words, with what was (not) written and what drain() did."""
        if self.eager:
            return f"{self.state.value}, eager: no row"
        if self.duplicate:
            return f"{self.state.value}, no row: task id already pending"
        state = self.state.value
        return state if self.drained is None else f"{state}, {self.drained.value}"


def call_text(task_name: str, args: tuple[Any, ...] | None, kwargs: dict[str, Any] | None) -> str:
    """``name(1, b=2)``; ``None`` (any) shows as ``*any`` and ``**any``."""
    parts = ["*any"] if args is None else [_REPR.repr(a) for a in args]
    parts += ["**any"] if kwargs is None else [f"{k}={_REPR.repr(v)}" for k, v in kwargs.items()]
    return f"{task_name}({', '.join(parts)})"


def shown(value: Any) -> str:
    """``value`` as a failure message shows it (long values cut)."""
    return _REPR.repr(value)
