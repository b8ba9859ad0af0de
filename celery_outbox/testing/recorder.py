"""The ``outbox`` of a test: what it dispatched, expectations, draining.

What a test dispatched through the outbox: one :class:`Dispatch` per ``delay`` or
``apply_async`` of an ``OutboxTask``, as :mod:`celery_outbox.testing.recorder` saw it.

A dispatch's :attr:`~Dispatch.state` follows its transaction: ``committed`` once it
committed, ``awaiting commit`` while the transaction is open (under pytest-django's
``django_db`` that is the test's own transaction, which never commits), ``rolled back``
when a rollback dropped it.

Tests hold the outbox's rows, then drain them: run each task in the test process, or
publish the rows to the app's real broker.

While :func:`publishing_held` is active the app's on-commit publisher publishes nothing,
so every row a test dispatched stays ``pending`` in the store, as it would if the broker
were down, until the test drains it. Draining takes rows by id: the rows a rollback
dropped do not exist, so only what the test's transactions kept is run or published.

What a test expects to have been dispatched, and the failure messages when it was not.

An :class:`Expectation` matches :class:`~celery_outbox.testing.recorder.Dispatch` records; when
an assertion fails, the message names what was expected, lists what *was* dispatched,
and says for each dispatch of the same task why it did not match (the arguments that
differ, the alias, an option, a rollback), so the fix is usually visible at once.

The ``outbox`` of a test: what it dispatched, assertions on it, and draining.

:class:`OutboxRecorder` records every ``OutboxTask`` dispatch made while it is active
(the :data:`~celery_outbox.signals.task_dispatched` signal), holds the app's on-commit
publishing so the rows stay in the outbox (:mod:`celery_outbox.testing.recorder`), and drains
them on demand. The pytest plugin (:mod:`celery_outbox.pytest_plugin`) hands one to each
test as the ``outbox`` fixture; any test framework can use it as a context manager::

    with OutboxRecorder.recording(app) as outbox:
        place_order()
        outbox.assert_sent(send_receipt, args=(order.id,))
        outbox.drain()
"""

from __future__ import annotations

import difflib
import enum
import reprlib
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery import Celery, Task

from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.envelope import decode_body
from celery_outbox.registry import store_for
from celery_outbox.relay.relay import PublishReport, Relay, relay_for
from celery_outbox.signals import task_dispatched
from celery_outbox.state import state_of
from celery_outbox.store.records import Claim, NewMessage, StoredMessage

# --- What a test dispatched through the outbox: one :class:`Dispatch` per ``delay`` or

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


# --- Tests hold the outbox's rows, then drain them: run each task in the test process, or

#: How long a drain holds the rows it claimed (it releases them at once when done).
DRAIN_LEASE = timedelta(minutes=5)


class HeldRelay(Relay):
    """A relay whose on-commit publisher publishes nothing (rows stay pending); the
    other entry points (a drain's :meth:`publish_claim`) reach the broker as usual.
    """

    def publish_committed(
        self, messages: Sequence[StoredMessage], *, using: str | None = None
    ) -> PublishReport:
        """Leave the committed rows pending, for the test to drain."""
        return PublishReport()


@contextmanager
def publishing_held(app: Celery) -> Iterator[HeldRelay]:
    """Within this block, ``app``'s dispatches write rows that are not published on
    commit; the relay ``app`` had before is restored afterwards.
    """
    state = state_of(app)
    previous = state.relay
    held = HeldRelay(app, store=store_for(app), config=OutboxConfig.from_celery(app))
    state.relay = held
    try:
        yield held
    finally:
        if state_of(app).relay is held:
            state_of(app).relay = previous
        held.close()


def claim_rows(app: Celery, ids: Sequence[int], *, using: str | None) -> Claim:
    """Claim the existing pending rows of ``ids``, due or not (ETA and parked rows are
    made due now), in the order they were written.
    """
    store = store_for(app)
    now = store.now(using=using)
    store.reset(ids, now=now, using=using)
    claim = store.claim(ids, now=now, lease_until=now + DRAIN_LEASE, using=using)
    ordered = tuple(sorted(claim.messages, key=lambda m: m.id))
    return Claim(messages=ordered, lease_until=claim.lease_until)


def run_claimed(app: Celery, claim: Claim, message: StoredMessage, *, using: str | None) -> Any:
    """Remove ``message``'s row as a publish would, then run its task in this process
    (eagerly, as under ``task_always_eager``); the task's exception propagates.

    Raises
    ------
    LookupError
        When ``app`` has no task of that name (its module was never imported).
    """
    task = app.tasks.get(message.task_name)
    if task is None:
        raise LookupError(
            f"drain() cannot run {message.task_name!r} (task id {message.task_id}): app "
            f"{app.main!r} has no task of that name. Import the module that defines it."
        )
    store = store_for(app)
    keep = OutboxConfig.from_celery(app).keep_published > timedelta(0)
    store.mark_published(claim, [message.id], now=store.now(using=using), keep=keep, using=using)
    args, kwargs, _embed = decode_body(
        message.payload, message.options, accept=app.conf.accept_content, max_bytes=None
    )
    return task.apply(args, kwargs, task_id=message.task_id, throw=True).get()


def publish_claimed(app: Celery, claim: Claim, *, using: str | None) -> PublishReport:
    """Publish the claimed rows to ``app``'s broker, as the sweeper would (validated)."""
    return relay_for(app).publish_claim(claim, using=using, validate=True)


def missing_rows_message(missing: Sequence[Dispatch]) -> str:
    """Why ``drain()`` failed: kept dispatches whose row is not in the outbox."""
    lines = "\n  - ".join(d.describe() for d in missing)
    return (
        f"drain() found no pending outbox row for {len(missing)} kept dispatch(es):\n  - {lines}\n"
        "Likely causes: a sweeper, relay or worker published or deleted the row during the "
        "test; or the row is in a transaction the store's connection cannot see (the "
        "SQLAlchemy store claims through its engine: commit the session before draining)."
    )


def publish_failed_message(failed: Mapping[int, str], by_row: Mapping[Any, Dispatch]) -> str:
    """Why ``drain(publish=True)`` failed: each row's dispatch and publish error."""
    lines = "\n  - ".join(f"{by_row[i].describe()}: {error}" for i, error in failed.items())
    return f"drain(publish=True) could not publish {len(failed)} row(s) to the broker:\n  - {lines}"


def by_store(
    dispatches: list[Dispatch], *, default: Celery
) -> dict[tuple[Celery, str | None], list[Dispatch]]:
    """``dispatches`` grouped by the app and database alias their rows are in."""
    groups: dict[tuple[Celery, str | None], list[Dispatch]] = defaultdict(list)
    for dispatch in dispatches:
        groups[(dispatch.app or default, dispatch.using)].append(dispatch)
    return groups


def drain_batch(app: Celery, batch: list[Dispatch], *, using: str | None, publish: bool) -> None:
    """Claim ``batch``'s rows, then run each task here or (``publish``) publish them."""
    __tracebackhide__ = True
    by_row = {d.row_id: d for d in batch}
    claim = claim_rows(app, [d.row_id for d in batch if d.row_id is not None], using=using)
    missing = [d for d in batch if d.row_id not in {m.id for m in claim.messages}]
    if missing:
        raise AssertionError(missing_rows_message(missing))
    if publish:
        report = publish_claimed(app, claim, using=using)
        if report.failed:
            raise AssertionError(publish_failed_message(report.failed, by_row))
        for dispatch in batch:
            dispatch.drained = Drained.PUBLISHED
        return
    for message in claim.messages:
        by_row[message.id].drained = Drained.RAN
        run_claimed(app, claim, message, using=using)


# --- What a test expects to have been dispatched, and the failure messages when it was not.

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


# --- The ``outbox`` of a test: what it dispatched, assertions on it, and draining.

#: Rounds of ``drain()`` before it gives up on tasks that keep dispatching tasks.
MAX_DRAIN_ROUNDS = 100

_LIVE = (DispatchState.COMMITTED, DispatchState.AWAITING_COMMIT)


class OutboxRecorder:
    """The dispatches made through the outbox while recording, and helpers on them.

    Build it with :meth:`recording`. ``app`` is the Celery app whose publishing is held
    from the start; another app's publishing is held from its first dispatch on, and
    :meth:`drain` runs each task with its own app's store and registry.
    """

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._dispatches: list[Dispatch] = []
        self._lock = threading.RLock()
        self._held: set[int] = set()
        self._holds = ExitStack()

    @classmethod
    @contextmanager
    def recording(cls, app: Celery) -> Iterator[OutboxRecorder]:
        """Record dispatches and hold ``app``'s on-commit publishing within the block."""
        recorder = cls(app)
        with recorder._holds:
            recorder._hold(app)
            task_dispatched.connect(recorder._record, weak=False)
            try:
                yield recorder
            finally:
                task_dispatched.disconnect(recorder._record)

    def _hold(self, app: Celery) -> None:
        # Called before the dispatch defers its publish: even the first row stays held.
        with self._lock:
            if id(app) not in self._held:
                self._holds.enter_context(publishing_held(app))
                self._held.add(id(app))

    def _record(
        self,
        sender: Task[Any, Any],
        *,
        task_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: dict[str, Any],
        using: str | None,
        message: NewMessage | None,
        row_id: int | None,
        **_signal: Any,
    ) -> None:
        dispatch = Dispatch(
            task_name=sender.name,
            task_id=task_id,
            args=args,
            kwargs=kwargs,
            options=options,
            using=using,
            row_id=row_id,
            message=message,
            app=sender.app,
        )
        self._hold(sender.app)
        store = store_for(sender.app)

        def committed() -> None:
            dispatch.committed = True

        dispatch.awaiting = lambda: store.awaits_commit(committed, using=using)
        store.on_commit(committed, using=using)
        with self._lock:
            self._dispatches.append(dispatch)

    # -- what was dispatched ----------------------------------------------------------
    @property
    def dispatches(self) -> list[Dispatch]:
        """Every dispatch recorded, in order, rolled back ones included."""
        with self._lock:
            return list(self._dispatches)

    def sent(
        self,
        task: str | Task[Any, Any] | None = None,
        *,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        using: str | Unset | None = ANY_ALIAS,
        options: Mapping[str, Any] | None = None,
        rolled_back: bool = False,
    ) -> list[Dispatch]:
        """The dispatches that match (all that will reach a worker when ``task`` is
        ``None``); ``None`` arguments match anything. See :meth:`assert_sent`.
        """
        if task is None:
            if rolled_back:
                return [d for d in self.dispatches if d.state is DispatchState.ROLLED_BACK]
            return [d for d in self.dispatches if _kept(d)]
        expected = _expectation(task, args, kwargs, using, options, rolled_back)
        return matching(expected, self.dispatches)

    def assert_sent(
        self,
        task: str | Task[Any, Any],
        *,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        using: str | Unset | None = ANY_ALIAS,
        options: Mapping[str, Any] | None = None,
        count: int = 1,
        rolled_back: bool = False,
    ) -> Dispatch:
        """Assert ``task`` was dispatched exactly ``count`` times as described; return
        the first matching dispatch.

        Parameters
        ----------
        task
            The task, or its registered name.
        args, kwargs
            The arguments given (``args`` compared as a sequence); ``None``: any.
        using
            The database alias given (``None``: the default); omitted: any.
        options
            ``apply_async`` options that must have been given (``{"queue": "mail"}``).
        count
            How many matching dispatches there must be.
        rolled_back
            Match only dispatches a rollback dropped (by default those never match).

        Raises
        ------
        AssertionError
            Naming the expected call and listing every dispatch of the test, with the
            reasons each dispatch of the same task did not match.
        """
        __tracebackhide__ = True  # pytest shows the user's line, not this method's
        if count < 1:
            raise ValueError(f"count={count!r}: give 1 or more (or use assert_not_sent).")
        expected = _expectation(task, args, kwargs, using, options, rolled_back)
        dispatches = self.dispatches
        matches = matching(expected, dispatches)
        if len(matches) != count:
            raise AssertionError(not_sent_message(expected, count, matches, dispatches))
        return matches[0]

    def assert_not_sent(
        self,
        task: str | Task[Any, Any] | None = None,
        *,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        using: str | Unset | None = ANY_ALIAS,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Assert no kept dispatch matches (none at all when ``task`` is ``None``).

        Dispatches a rollback dropped do not count: they never reach a worker.
        """
        __tracebackhide__ = True
        dispatches = self.dispatches
        if task is None:
            kept = [d for d in dispatches if _kept(d)]
            if kept:
                lines = [d.describe() for d in kept]
                raise AssertionError(
                    f"Expected no outbox dispatch, found {len(kept)}:\n  - " + "\n  - ".join(lines)
                )
            return
        expected = _expectation(task, args, kwargs, using, options, False)
        matches = matching(expected, dispatches)
        if matches:
            raise AssertionError(sent_message(expected, matches, dispatches))

    def clear(self) -> None:
        """Forget the dispatches recorded so far (their rows stay in the outbox)."""
        with self._lock:
            self._dispatches.clear()

    # -- draining -------------------------------------------------------------------------
    def drain(self, *, publish: bool = False) -> list[Dispatch]:
        """Run (or, with ``publish``, publish to the broker) every kept dispatch not yet
        drained, until none is left; return the dispatches drained.

        A kept dispatch is one whose transaction committed or is still open (the
        test's own under ``django_db``); rows a rollback dropped are never run. Rows
        due later (``countdown``, ``eta``) are drained too. Without ``publish`` each
        task runs in this process, in dispatch order, as under ``task_always_eager``;
        what those tasks dispatch is drained in the next round. With ``publish`` the
        rows go to the app's broker as the sweeper would send them, for a real worker.

        Raises
        ------
        AssertionError
            When a kept dispatch's row is not in the outbox (published or deleted by
            someone else, or written on a connection this test cannot see), when a
            publish fails, or when tasks keep dispatching for ``MAX_DRAIN_ROUNDS`` rounds.
        """
        __tracebackhide__ = True
        drained: list[Dispatch] = []
        for _ in range(MAX_DRAIN_ROUNDS):
            due = [d for d in self.dispatches if _drainable(d)]
            if not due:
                return drained
            for (app, using), batch in by_store(due, default=self.app).items():
                drain_batch(app, batch, using=using, publish=publish)
            drained += due
        raise AssertionError(
            f"drain() stopped after {MAX_DRAIN_ROUNDS} rounds: the tasks it ran kept "
            f"dispatching tasks. Last round: {', '.join(d.call() for d in due[:5])}"
        )


def _expectation(
    task: str | Task[Any, Any],
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    using: str | Unset | None,
    options: Mapping[str, Any] | None,
    rolled_back: bool,
) -> Expectation:
    return Expectation(
        task_name=task_name_of(task),
        args=None if args is None else tuple(args),
        kwargs=kwargs,
        using=using,
        options=options,
        rolled_back=rolled_back,
    )


def _kept(dispatch: Dispatch) -> bool:
    return dispatch.state in _LIVE and not dispatch.duplicate


def _drainable(dispatch: Dispatch) -> bool:
    return dispatch.row_id is not None and dispatch.drained is None and _kept(dispatch)
