"""What a test dispatched through the outbox, and what it expects to have been dispatched.

One :class:`Dispatch` per ``delay`` or ``apply_async`` of an ``OutboxTask``, as the
``outbox`` recorder (:mod:`celery_outbox.testing.recorder`) saw it. A dispatch's
:attr:`~Dispatch.state` follows its transaction: ``committed`` once it committed,
``awaiting commit`` while the transaction is open (under pytest-django's ``django_db``
that is the test's own transaction, which never commits), ``rolled back`` when a
rollback dropped it.

An :class:`Expectation` matches :class:`Dispatch` records; when an assertion fails, the
message names what was expected, lists what *was* dispatched, and says for each dispatch
of the same task why it did not match (the arguments that differ, the alias, an option, a
rollback), so the fix is usually visible at once.
"""

from __future__ import annotations

import difflib
import enum
import reprlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, Task

from celery_outbox.store.records import NewMessage

#: Longest rendering of one argument in a description (longer ones are cut with "...").
_REPR = reprlib.Repr()

_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlist = 10
_REPR.maxdict = 10

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
    """What :meth:`~celery_outbox.testing.recorder.OutboxRecorder.drain` did with a dispatch."""

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


#: Dispatches listed in one failure message (the rest are counted).
MAX_LISTED = 30


class Unset(enum.Enum):
    """The type of :data:`ANY_ALIAS` (``None`` is an alias: the store's default)."""

    ANY = "any"


#: ``using=`` of an expectation that accepts any database alias.
ANY_ALIAS = Unset.ANY


def task_name_of(task: str | Task[Any, Any]) -> str:
    """The registered name of ``task`` (a task or its name)."""
    if isinstance(task, str):
        return task
    name = getattr(task, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"task={task!r}: give a Celery task or a task name (str).")
    return name


@dataclass(frozen=True, kw_only=True)
class Expectation:
    """A dispatch of ``task_name``; ``None`` (and :data:`ANY_ALIAS`) accept any value.

    ``options`` must be a subset of the options given to ``apply_async``. Dispatches a
    rollback dropped never match, unless ``rolled_back`` asks for exactly those.
    """

    task_name: str
    args: tuple[Any, ...] | None = None
    kwargs: Mapping[str, Any] | None = None
    using: str | Unset | None = ANY_ALIAS
    options: Mapping[str, Any] | None = None
    rolled_back: bool = False

    def matches(self, dispatch: Dispatch) -> bool:
        """Whether ``dispatch`` is one of the expected dispatches."""
        return dispatch.task_name == self.task_name and not self.differences(dispatch)

    def differences(self, dispatch: Dispatch) -> list[str]:
        """Why ``dispatch`` (of the same task) does not match: empty when it does."""
        found = self._state_differences(dispatch)
        if self.args is not None and list(dispatch.args) != list(self.args):
            found.append(f"args differ: expected {shown(self.args)}, got {shown(dispatch.args)}")
        if self.kwargs is not None:
            found += _kwargs_differences(self.kwargs, dispatch.kwargs)
        if self.using is not ANY_ALIAS and dispatch.using != self.using:
            found.append(f"using differs: expected {self.using!r}, got {dispatch.using!r}")
        for key, value in (self.options or {}).items():
            if key not in dispatch.options:
                found.append(f"option {key}: expected {shown(value)}, not given")
            elif dispatch.options[key] != value:
                got = dispatch.options[key]
                found.append(f"option {key}: expected {shown(value)}, got {shown(got)}")
        return found

    def _state_differences(self, dispatch: Dispatch) -> list[str]:
        state = dispatch.state
        if self.rolled_back:
            return [] if state is DispatchState.ROLLED_BACK else [f"not rolled back: {state.value}"]
        if state is DispatchState.ROLLED_BACK:
            return ["rolled back: its transaction did not commit"]
        if dispatch.duplicate:
            return ["no row written: a row with its task id was already pending"]
        return []

    def describe(self) -> str:
        """The expected call, with the alias and options asked for."""
        kwargs = None if self.kwargs is None else dict(self.kwargs)
        text = call_text(self.task_name, self.args, kwargs)
        if self.using is not ANY_ALIAS:
            text += f" using={self.using!r}"
        if self.options:
            text += f" with options {shown(dict(self.options))}"
        return text + (" (rolled back)" if self.rolled_back else "")


def _kwargs_differences(expected: Mapping[str, Any], got: Mapping[str, Any]) -> list[str]:
    found = [
        f"kwarg {k}: expected {shown(v)}, not given" for k, v in expected.items() if k not in got
    ]
    found += [
        f"kwarg {k}: not expected, got {shown(v)}" for k, v in got.items() if k not in expected
    ]
    found += [
        f"kwarg {k}: expected {shown(v)}, got {shown(got[k])}"
        for k, v in expected.items()
        if k in got and got[k] != v
    ]
    return found


def not_sent_message(
    expected: Expectation, count: int, matches: Sequence[Dispatch], dispatches: Sequence[Dispatch]
) -> str:
    """The failure of ``assert_sent``: ``count`` expected, ``len(matches)`` found."""
    plural = "" if count == 1 else "es"
    head = (
        f"Expected {count} outbox dispatch{plural} of {expected.describe()}, found {len(matches)}."
    )
    return "\n".join([head, *_hints(expected, dispatches), *listing(expected, dispatches)])


def sent_message(
    expected: Expectation, matches: Sequence[Dispatch], dispatches: Sequence[Dispatch]
) -> str:
    """The failure of ``assert_not_sent``: ``matches`` were found."""
    head = f"Expected no outbox dispatch of {expected.describe()}, found {len(matches)}."
    return "\n".join([head, *listing(expected, dispatches)])


def _hints(expected: Expectation, dispatches: Sequence[Dispatch]) -> list[str]:
    names = sorted({d.task_name for d in dispatches})
    if not names or expected.task_name in names:
        return []
    close = difflib.get_close_matches(expected.task_name, names, n=3, cutoff=0.6)
    similar = f"; similar names: {', '.join(map(repr, close))}" if close else ""
    return [f"No dispatch of {expected.task_name!r} at all{similar}."]


def listing(expected: Expectation, dispatches: Sequence[Dispatch]) -> list[str]:
    """Every dispatch of the test, one line each; matches marked, near misses explained."""
    if not dispatches:
        return [
            "Nothing was dispatched through the outbox during this test (the `outbox` "
            "fixture records OutboxTask dispatches made after it was set up)."
        ]
    lines = [f"Dispatched during this test ({len(dispatches)}):"]
    for dispatch in dispatches[:MAX_LISTED]:
        lines += _entry(expected, dispatch)
    if len(dispatches) > MAX_LISTED:
        lines.append(f"  ... and {len(dispatches) - MAX_LISTED} more")
    return lines


def _entry(expected: Expectation, dispatch: Dispatch) -> list[str]:
    if dispatch.task_name != expected.task_name:
        return [f"  - {dispatch.describe()}"]
    differences = expected.differences(dispatch)
    if not differences:
        return [f"  - {dispatch.describe()}  <- matches"]
    return [f"  - {dispatch.describe()}", *(f"      {d}" for d in differences)]


def matching(expected: Expectation, dispatches: Iterable[Dispatch]) -> list[Dispatch]:
    """The dispatches ``expected`` matches, in dispatch order."""
    return [d for d in dispatches if expected.matches(d)]
