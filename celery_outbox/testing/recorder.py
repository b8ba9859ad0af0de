"""The ``outbox`` of a test: what it dispatched, assertions on it, and draining.

:class:`OutboxRecorder` records every ``OutboxTask`` dispatch made while it is active
(the :data:`~celery_outbox.signals.task_dispatched` signal, as
:class:`~celery_outbox.testing.expectations.Dispatch` records), holds the app's on-commit
publishing so the rows stay in the outbox (:mod:`celery_outbox.testing.draining`), and
drains them on demand. The pytest plugin (:mod:`celery_outbox.pytest_plugin`) hands one
to each test as the ``outbox`` fixture; any test framework can use it as a context
manager::

    with OutboxRecorder.recording(app) as outbox:
        place_order()
        outbox.assert_sent(send_receipt, args=(order.id,))
        outbox.drain()
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from celery import Celery, Task

from celery_outbox.registry import store_for
from celery_outbox.signals import task_dispatched
from celery_outbox.store.records import NewMessage
from celery_outbox.testing.draining import by_store, drain_batch, publishing_held
from celery_outbox.testing.expectations import (
    ANY_ALIAS,
    Dispatch,
    DispatchState,
    Drained,
    Expectation,
    Unset,
    matching,
    not_sent_message,
    sent_message,
    task_name_of,
)

#: The names a test reads a recorder's dispatches with (``outbox.dispatches``).
__all__ = ["Dispatch", "DispatchState", "Drained", "OutboxRecorder"]

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
