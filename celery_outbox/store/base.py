"""The store: the one seam between the core and a database, in sections.

The store's part in batched dispatch (:mod:`celery_outbox.dispatch.batching`): many rows, one
INSERT.

A store that can tell which transaction a dispatch writes in (:meth:`BulkStore.transaction_token`)
lets a ``group(...)`` or a :func:`~celery_outbox.dispatch.batching.batched_dispatch` block
collect the
rows of that transaction and write them with :meth:`BulkStore.add_many`, one statement where
the database can. A store that cannot (the defaults) gets every row written at its call, as
without batching.

Whether a store lets a sweep claim its next batch on another thread (a part of the store).

A sweep of a backlog waits about as long for each claim (the lease ``UPDATE`` and the
transfer of its rows) as it spends publishing the batch before. With a store that says
yes, the sweeper claims the next batch on a thread of its own while the current one
publishes (:mod:`celery_outbox.relay.sweeper`). That thread uses a connection of its own:
the store says yes only where it sees the same committed rows there and concurrent
claims are safe (``SKIP LOCKED``), never inside the caller's transaction, whose
uncommitted rows another connection cannot see.

The store's part in atomic tasks: one transaction per run, keyed by the task id.

An atomic task (``OutboxTask.atomic``) runs its body inside
:meth:`CompletionStore.complete_once`: the store opens a transaction on the task's
database, inserts the task's ``CompletedTask`` row first (so a concurrent duplicate waits
on that key), lets the body write and dispatch in the same transaction, then writes the
result and commits. A task id that already has a row is a duplicate: the block is told so
and must not run the body. The worker side is :mod:`celery_outbox.worker.atomic`.

The store's part in monitoring: the backlog of pending rows and the last sweep.

What ``outbox status``, the health check (:mod:`celery_outbox.health`) and the metrics
read. Times are the database's where the store can read its clock (PostgreSQL,
MySQL/MariaDB), so a host whose clock is off neither hides an old row nor reports a
fresh sweep as stale; the in-memory store and SQLite (one host) use the store's clock.

The store's part in durable workflows: ``Workflow`` rows and chord joins.

A canvas of ``OutboxTask`` s (Celery's ``chain``, ``group``, ``chord``) gets one
``Workflow`` row, keyed by the ``root_id`` Celery gives its tasks, written in the
transaction that dispatched it; each step's completion counts in the step's own
transaction. A chord whose header is made of atomic ``OutboxTask`` s has a join row
(keyed by the chord's group id) counting its header steps in the database, so it needs no
result backend. The worker side is :mod:`celery_outbox.worker.canvas`.

Every method here writes in the caller's current transaction on ``using`` (the
dispatching transaction, or the atomic step's), like :meth:`OutboxStore.add`, unless it
says otherwise. A store that keeps these defaults has no workflow rows and no
database chord joins: canvases keep Celery's own behaviour on it.

What wakes the relay loop early: PostgreSQL ``NOTIFY``, and the next parked row's due time.

A row written without a lease has no on-commit publisher: with ``outbox_publish_grace``
at 0, a parked retry, a countdown longer than ``outbox_park_after``. On PostgreSQL a
trigger on the outbox table (:data:`CREATE_TRIGGER`, made by the Django migration
``0008_notify_trigger`` and by the SQLAlchemy table's DDL) sends a ``NOTIFY`` on
:data:`CHANNEL` when such a row is inserted. Rows born leased to their on-commit
publisher (the common case) cost the trigger only its ``WHEN`` test: no notification, no
notify lock at commit. PostgreSQL delivers a notification at ``COMMIT`` (never for a
rolled-back row) and merges identical ones, so a transaction writing 100 such rows
sends one. The relay LISTENs (:class:`celery_outbox.relay.loop.Wakeups`) and sweeps as
soon as one arrives.

Parked rows coming due need a timer, not a notification: after an idle pass the relay
sleeps until :meth:`WakeupStore.next_due` (bounded by its poll interval).

The store: the one seam between the core and a database.

``OutboxTask``, the relay and the sweeper talk only to :class:`OutboxStore`: Django's ORM
store, :class:`celery_outbox.sqlalchemy.SQLAlchemyOutboxStore`, or in tests
:class:`celery_outbox.testing.InMemoryOutboxStore`, held to one contract (``tests/contract``).
"""

from __future__ import annotations

import abc
import asyncio
import functools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from celery_outbox.clock import utcnow
from celery_outbox.exceptions import AtomicUnsupported
from celery_outbox.store.records import (
    OUTBOX_TABLE,
    CancelledRow,
    Claim,
    DeadLetterStatus,
    MessageStatus,
    NewDeadLetter,
    NewMessage,
    StoredCompletion,
    StoredDeadLetter,
    StoredMessage,
    WorkflowStatus,
)
from celery_outbox.store.transitions import CANCEL

# --- The store's part in batched dispatch (:mod:`celery_outbox.dispatch.batching`): many rows,
# one INSERT.


class BulkStore:
    """Mixin of :class:`~celery_outbox.store.base.OutboxStore`: batched inserts (optional)."""

    def transaction_token(self, *, using: str | None = None) -> Hashable | None:
        """What a dispatch with ``using`` writes in now: equal tokens mean the same open
        transaction and the same savepoint; ``None`` outside a transaction (rows are
        committed at once there, and never batched) or when the store cannot tell.
        """
        return None

    def add_many(
        self, messages: Sequence[NewMessage], *, using: str | None = None
    ) -> list[int | None]:
        """Insert ``messages`` as ``pending`` rows in the caller's current transaction, in
        as few statements as the database allows (one on PostgreSQL and SQLite).

        The result is what ``[add(m, using=using) for m in messages]`` returns, in order:
        each new row's id, or ``None`` when its task id was already pending (in the table,
        or earlier in ``messages``). Nothing is superseded (such messages are added one by
        one). All or nothing: a failure writes no row.
        """
        # The default (and MySQL/MariaDB's, whose multi-row INSERT cannot tell which rows
        # the pending key refused): one add per row; the caller's transaction holds them.
        return [self.add(message, using=using) for message in messages]

    if TYPE_CHECKING:

        def add(self, message: NewMessage, *, using: str | None = None) -> int | None:
            """:meth:`~celery_outbox.store.base.OutboxStore.add`."""


# --- Whether a store lets a sweep claim its next batch on another thread (a part of the store).


class ClaimThreads:
    """Claims on a thread beside the caller's; by default a store allows none."""

    def claims_aside(self, using: str | None = None) -> bool:
        """Whether :meth:`~celery_outbox.store.base.OutboxStore.claim_due` of database
        ``using`` may run on another thread now, leasing rows from the same committed
        table as on this one. False by default.
        """
        return False

    def end_claims_aside(self) -> None:
        """Release what the calling thread, one that claimed aside, holds of the store
        (its connections). Called on that thread when the sweep ends. Nothing by default.
        """


# --- The store's part in atomic tasks: one transaction per run, keyed by the task id.


@dataclass
class Completion:
    """One atomic run, as :meth:`CompletionStore.complete_once` yields it.

    ``previous`` is the committed row of an earlier run of the same task id: the body
    must not run. Otherwise the caller sets ``result`` (the serialised return value)
    before the block ends; it is written with the row.
    """

    task_id: str
    task_name: str
    previous: StoredCompletion | None = None
    result: str | None = None


class CompletionStore:
    """The ``CompletedTask`` rows of atomic tasks (a part of every
    :class:`~celery_outbox.store.base.OutboxStore`).

    A store that cannot run atomic tasks keeps these defaults: :meth:`atomic_problem`
    says why, and the worker refuses to start an atomic task on it.
    """

    def atomic_problem(self, using: str | None = None) -> str | None:
        """Why atomic tasks cannot run on ``using`` (a sentence), or ``None`` if they can."""
        return f"{type(self).__name__} does not run atomic tasks"

    def complete_once(
        self,
        task_id: str,
        task_name: str,
        *,
        now: datetime,
        using: str | None = None,
        root_id: str | None = None,
    ) -> AbstractContextManager[Completion]:
        """A transaction on ``using`` that inserts ``task_id``'s ``CompletedTask`` row first
        (with ``root_id``: the workflow the task is a step of, ``None`` outside one).

        When a committed row exists (or one being written commits while this waits on
        the key) the block gets :attr:`Completion.previous` and must not run the body.
        Otherwise everything the block writes, and every dispatch made in it with
        ``using=None`` (the task's alias), joins this transaction; leaving the block
        writes :attr:`Completion.result` with the row and commits, raising rolls all of
        it back (a duplicate may then run). ``completed_at`` is ``now``.

        Raises
        ------
        AtomicUnsupported
            When :meth:`atomic_problem` has a reason.
        """
        raise AtomicUnsupported(f"{self.atomic_problem(using)} (database {using!r}).")

    def hand_on(
        self,
        message: NewMessage,
        publish: Callable[[Sequence[StoredMessage]], object],
        *,
        using: str | None = None,
    ) -> bool:
        """Take ``message``, a successor an atomic run hands on at its end, to write with
        the run's last writes (its row inserted as by ``add`` with no ``supersedes``, in
        the same transaction, before the commit) and publish after the commit as by
        ``defer_publish``; if the row is not written (a pending row has its task id),
        nothing is published. ``False`` (the default): not taken, the caller adds it.

        Only for a message no one needs the row id of before the commit (no
        ``task_dispatched`` receiver), not superseding, born leased.
        """
        return False

    def completion(self, task_id: str, *, using: str | None = None) -> StoredCompletion | None:
        """The committed ``CompletedTask`` row of ``task_id``, or ``None``."""
        return None

    def count_completed(self, *, using: str | None = None) -> int:
        """How many ``CompletedTask`` rows there are."""
        return 0

    def purge_completed(self, *, older_than: datetime, limit: int, using: str | None = None) -> int:
        """Delete up to ``limit`` ``CompletedTask`` rows completed before ``older_than``
        (bounded: one statement); return how many.
        """
        return 0


# --- The store's part in monitoring: the backlog of pending rows and the last sweep.

#: The key of the sweep's row in the sweep table (one row per database).
SWEEP_NAME = "sweep"


@dataclass(frozen=True, kw_only=True)
class Backlog:
    """The rows of one database still to publish, at one instant of its clock.

    ``due`` rows are ``pending`` and due now (a publisher should have them), ``parked``
    rows are ``pending`` and due later (parked retries, countdowns, rows rescheduled
    after a failed publish), ``failed`` rows gave up publishing.
    ``oldest_due_age``: how long the longest-waiting due row has waited, or ``None``
    without due rows. A row waits from its due time, or, once a publish of it failed,
    from its creation (a broker outage shows as a growing age, not as fresh retries).
    """

    due: int
    parked: int
    failed: int
    oldest_due_age: timedelta | None


@dataclass(frozen=True, kw_only=True)
class LastSweep:
    """When a sweep of one database last recorded itself, and how long ago that was
    (both by the database's clock; ``age`` is never negative).
    """

    at: datetime
    age: timedelta


class MonitoredStore(abc.ABC):
    """The backlog and the sweep record (a part of every
    :class:`~celery_outbox.store.base.OutboxStore`).

    :meth:`backlog` is required. The sweep record is optional: these defaults keep
    none (:meth:`keeps_sweeps` is false), and the health check then says nothing
    about sweeps.
    """

    def now(self, *, using: str | None = None) -> datetime:
        """The current time of database ``using``'s clock, aware UTC.

        Every time a store writes or compares for the core (``available_at``, leases,
        ``created_at`` against the grace, parked due times) is on this clock, so hosts
        whose clocks disagree agree on it (:mod:`celery_outbox.clock`). No round
        trip per call: a reading of the database's clock serves for a while. This
        default, for a store that cannot read its database's clock, is this process's.
        """
        return utcnow()

    @abc.abstractmethod
    def backlog(self, *, using: str | None = None, bound: int | None = None) -> Backlog:
        """Count the due, the parked and the failed rows and age the oldest due one.

        A few reads of ranges of the ``status, available_at`` index, committed data.
        ``bound``: a store may read at most about that many index entries per count and
        report a larger count as its database's estimate (:mod:`celery_outbox.store.counts`;
        the oldest age is then that of the ``bound`` rows due longest); ``None``: exact.
        """

    @abc.abstractmethod
    def count_dead_letters(
        self, *, using: str | None = None, bound: int | None = None
    ) -> Mapping[DeadLetterStatus, int]:
        """How many dead letters there are per status (every status present, 0 when none).

        One read of the ``status, failed_at`` index, committed data; ``bound`` as for
        :meth:`backlog`.
        """

    def keeps_sweeps(self) -> bool:
        """Whether this store records when the sweep last ran."""
        return False

    def record_sweep(self, *, every: timedelta, using: str | None = None) -> bool:
        """Record that a sweep of ``using`` runs now (the database's clock), unless the
        record is younger than ``every``; its own short transaction.

        A skipped record writes nothing (no row version, no lock), so a sweep that
        runs many times per ``every`` costs one read each. Concurrent callers (several
        sweepers) never fail and write at most once per ``every`` between them, but
        for a race of two writers at the same instant. Returns whether it wrote.
        """
        return False

    def last_sweep(self, *, using: str | None = None) -> LastSweep | None:
        """The last sweep recorded for ``using``, or ``None`` (none yet, or no record)."""
        return None


# --- The store's part in durable workflows: ``Workflow`` rows and chord joins.

#: Every workflow status, in the order surfaces list them.
WORKFLOW_STATUSES: tuple[WorkflowStatus, ...] = ("running", "succeeded", "failed", "cancelled")

#: The statuses a cancelled step closes its workflow from (``transitions.CANCEL``).
CANCELLABLE = CANCEL.sources


@dataclass(frozen=True, kw_only=True)
class StoredWorkflow:
    """A ``Workflow`` row."""

    root_id: str
    name: str
    status: WorkflowStatus
    steps_total: int
    steps_done: int
    created_at: datetime
    finished_at: datetime | None = None
    failed_task_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class JoinProgress:
    """A chord join after one header step counted: ``remaining`` steps to go, and the
    results stored so far in header order (``None`` where not in yet, or a step that
    returned ``None``).
    """

    remaining: int
    results: list[str | None] = field(default_factory=list)


class WorkflowStore:
    """``Workflow`` rows and chord joins (a part of every
    :class:`~celery_outbox.store.base.OutboxStore`; these defaults keep none).
    """

    def keeps_workflows(self) -> bool:
        """Whether this store keeps ``Workflow`` rows and chord joins."""
        return False

    def add_workflow_steps(
        self, root_id: str, *, name: str, steps: int, now: datetime, using: str | None = None
    ) -> None:
        """Create ``root_id``'s workflow (``running``, ``steps_total=steps``, ``name``,
        ``created_at=now``) or add ``steps`` to the ``steps_total`` of the existing row
        (its name and status unchanged). Concurrent callers never lose an addition.
        """

    def workflow_step_done(self, root_id: str, *, now: datetime, using: str | None = None) -> None:
        """Count one step of ``root_id`` done (``steps_done`` never past ``steps_total``);
        the step that reaches ``steps_total`` of a ``running`` workflow makes it
        ``succeeded`` with ``finished_at=now``. No such workflow: nothing.
        """

    def workflow_failed(
        self, root_id: str, task_id: str, *, now: datetime, using: str | None = None
    ) -> None:
        """Mark ``root_id``'s workflow ``failed`` by ``task_id`` (``failed_task_id``,
        ``finished_at=now``) unless it was cancelled. No such workflow: nothing.
        """

    def workflow_cancelled(self, root_id: str, *, now: datetime, using: str | None = None) -> None:
        """Close ``root_id``'s ``running`` or ``failed`` workflow as ``cancelled``
        (``finished_at=now``, ``failed_task_id`` kept) and delete its chord joins (their
        bodies can never run). A cancelled workflow stays cancelled: a later step done,
        failed or resumed leaves its status, and a second cancel its ``finished_at`` and
        any join opened since. A ``succeeded`` workflow is left as it is. No such
        workflow: nothing.
        """

    def workflow_resumed(self, root_id: str, *, using: str | None = None) -> None:
        """A ``failed`` workflow goes back to ``running`` (``finished_at`` cleared,
        ``failed_task_id`` kept as the last failure). No such workflow: nothing.
        """

    def get_workflow(self, root_id: str, *, using: str | None = None) -> StoredWorkflow | None:
        """``root_id``'s workflow, or ``None`` (its own read, committed data)."""
        return None

    def count_workflows(
        self, *, using: str | None = None, bound: int | None = None
    ) -> Mapping[WorkflowStatus, int]:
        """How many workflows there are per status (every status present, 0 when none);
        ``bound`` as for :meth:`~celery_outbox.store.base.MonitoredStore.backlog`.
        """
        return dict.fromkeys(WORKFLOW_STATUSES, 0)

    def open_join(
        self, group_id: str, *, root_id: str, size: int, now: datetime, using: str | None = None
    ) -> None:
        """Create the join of chord ``group_id`` waiting for ``size`` header steps. A join
        that exists already is left as it is (a chord is opened once per group id).
        """

    def join_part(
        self, group_id: str, index: int, result: str | None, *, using: str | None = None
    ) -> JoinProgress | None:
        """Count header step ``index`` of chord ``group_id`` with its ``result``: lock
        the join row (concurrent steps wait on it), store the result at ``index`` and
        take one off ``remaining``, and return the progress. A step counted already (its
        index done) changes nothing. ``None`` when the chord has no join row (it was
        not opened by this library: Celery's result backend joins it).

        Raises
        ------
        IndexError
            When ``index`` is outside the chord's header.
        """
        return None

    def purge_joins(self, *, older_than: datetime, limit: int, using: str | None = None) -> int:
        """Delete up to ``limit`` joins of chords done (``remaining`` 0) created before
        ``older_than``; return how many (its own transaction).
        """
        return 0


# --- What wakes the relay loop early: PostgreSQL ``NOTIFY``, and the next parked row's due time.

#: The channel the trigger notifies and the relay listens on.
CHANNEL = "celery_outbox"

#: The trigger function and the trigger (PostgreSQL).
NOTIFY_FUNCTION = "celery_outbox_notify"

NOTIFY_TRIGGER = "celery_outbox_notify_insert"

#: Creates (or replaces) the trigger: each statement separately, for any driver.
CREATE_TRIGGER = (
    f"CREATE OR REPLACE FUNCTION {NOTIFY_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS "
    f"$$ BEGIN PERFORM pg_notify('{CHANNEL}', ''); RETURN NULL; END $$",
    f"DROP TRIGGER IF EXISTS {NOTIFY_TRIGGER} ON {OUTBOX_TABLE}",
    # A row-level trigger so that WHEN can skip rows born leased; EXECUTE PROCEDURE is
    # the spelling every supported PostgreSQL accepts.
    f"CREATE TRIGGER {NOTIFY_TRIGGER} AFTER INSERT ON {OUTBOX_TABLE} FOR EACH ROW "
    f"WHEN (NEW.locked_until IS NULL) EXECUTE PROCEDURE {NOTIFY_FUNCTION}()",
)

#: Removes the trigger and its function.
DROP_TRIGGER = (
    f"DROP TRIGGER IF EXISTS {NOTIFY_TRIGGER} ON {OUTBOX_TABLE}",
    f"DROP FUNCTION IF EXISTS {NOTIFY_FUNCTION}()",
)

#: Opens a new DB-API connection to LISTEN on (psycopg 3 or psycopg2), outside any pool.
Connector = Callable[[], Any]


class WakeupStore:
    """The store's part in waking the relay; the defaults mean "poll" (no NOTIFY, no timer)."""

    def next_due(self, *, after: datetime, using: str | None = None) -> datetime | None:
        """The earliest ``available_at`` later than ``after`` of a ``pending`` row (a parked
        retry or countdown, a row rescheduled after a failed publish), or ``None``.

        One probe of the due-row index. The relay sleeps until then when that is sooner
        than its poll interval.
        """
        return None

    def listen_connector(self, *, using: str | None = None) -> Connector | None:
        """How to open a connection to LISTEN on for database ``using`` (a new one,
        outside any pool or transaction management), or ``None`` where the database has
        no ``NOTIFY`` (the relay polls).
        """
        return None


# --- The store: the one seam between the core and a database.

#: Called after commit with every row one transaction deferred (see ``defer_publish``).
PublishCallback = Callable[[Sequence[StoredMessage]], object]

#: Whether a new message takes the place of the pending row of its task id (see ``add``).
Supersedes = Callable[[StoredMessage], bool]

#: What a sync dispatch returns (see ``run_dispatch``).
_Result = TypeVar("_Result")


def within_budget(sizes: Iterable[int], max_bytes: int | None) -> int:
    """How many of the leading rows of sizes ``sizes`` one claim of ``max_bytes`` takes.

    A row is taken while the rows before it hold fewer than ``max_bytes`` bytes: a claim is
    never empty, and exceeds the budget by one row at most. Stores that cannot cut in SQL
    cut with this, on the sizes the database counted.
    """
    taken = held = 0
    for size in sizes:
        if max_bytes is not None and taken and held >= max_bytes:
            break
        taken = taken + 1
        held = held + size
    return taken


def publisher_key(publish: PublishCallback) -> Hashable:
    """The key of ``publish``'s on-commit batch: equal for publishers that do the same thing.

    Every store groups the rows one transaction deferred by this key: two equal partials
    of one function and arguments (``Relay.publisher``) share a batch, others get one each.
    """
    if isinstance(publish, functools.partial):
        try:
            key = (publisher_key(publish.func), publish.args, frozenset(publish.keywords.items()))
            hash(key)
        except TypeError:  # unhashable arguments: this publisher gets its own batch
            return publish
        return key
    return publish


class OutboxStore(
    CompletionStore, WorkflowStore, MonitoredStore, WakeupStore, BulkStore, ClaimThreads, abc.ABC
):
    """Where outbox rows and dead letters live.

    Every method taking ``using`` accepts a database alias (Django) or ``None`` for the store's
    default; stores with a single database ignore it. Datetimes are aware UTC. Driver errors
    are :class:`~celery_outbox.exceptions.StoreError` (cause chained). Parts: :mod:`.wakeups`,
    :mod:`.completions`, :mod:`.workflows`, :mod:`.monitoring`, :mod:`.bulk_store`,
    :mod:`.claim_threads`.
    """

    # -- dispatch ---------------------------------------------------------------
    @abc.abstractmethod
    def add(
        self,
        message: NewMessage,
        *,
        using: str | None = None,
        supersedes: Supersedes | None = None,
    ) -> int | None:
        """Insert ``message`` as a ``pending`` row in the caller's current transaction.

        Returns the new row's id, or ``None`` when a ``pending`` row with the same
        ``task_id`` already exists (nothing is written: ``task_id`` is an idempotency key)
        and ``supersedes`` is not given or returns false for that row. When it returns
        true the pending row is *superseded*: deleted (only while it is still pending)
        and ``message`` inserted, in the same transaction, so a rollback restores it
        (:mod:`celery_outbox.store.superseding` says when). Outside a transaction both are
        committed before this returns. The row's ``locked_until`` is the message's: a
        row born leased is left to its on-commit publisher (no claim takes it) until then.
        """

    async def run_dispatch(self, dispatch: Callable[[], _Result]) -> _Result:
        """Run ``dispatch`` (a sync ``apply_async``, a group's, a batch) for a caller on an
        event loop (``adelay``/``aapply_async``: :mod:`celery_outbox.dispatch.asynchronous`).

        Each store decides where its blocking work runs so that the loop never waits on
        the database or the broker. The default: a worker thread (``asyncio.to_thread``,
        the caller's context copied), writing through the store's own transactions.
        """
        return await asyncio.to_thread(dispatch)

    @abc.abstractmethod
    def on_commit(self, callback: Callable[[], None], *, using: str | None = None) -> None:
        """Run ``callback`` right after the current transaction commits.

        Never on rollback, nor when the savepoint it was registered in rolls back. Outside
        a transaction ``callback`` runs before this returns.
        """

    def awaits_commit(self, callback: Callable[[], None], *, using: str | None = None) -> bool:
        """Whether ``callback``, given to :meth:`on_commit`, still waits for the commit of
        an open transaction (no rollback dropped it). For the pytest plugin, whose
        ``django_db`` tests never commit; ``False`` from stores that cannot tell.
        """
        return False

    @abc.abstractmethod
    def defer_publish(
        self, message: StoredMessage, publish: PublishCallback, *, using: str | None = None
    ) -> None:
        """Arrange for ``publish(messages)`` to run once, right after the current commit.

        ``messages`` holds every row deferred in that transaction with that publisher
        (one batch, one callback, per :func:`publisher_key`). A rolled-back transaction
        calls nothing; rows of a rolled-back savepoint may still be listed, and
        :meth:`still_leased` and :meth:`claim` drop them because they do not exist.
        Outside a transaction ``publish`` runs before this returns.
        """

    @abc.abstractmethod
    def still_leased(
        self, messages: Sequence[StoredMessage], *, using: str | None = None
    ) -> set[int]:
        """The ids of ``messages`` whose row exists, is ``pending`` and holds the message's
        own lease (``locked_until``): rows committed and taken by no one else.

        One read, no write: the on-commit publisher's check before it publishes rows
        that were born leased to it.
        """

    # -- publishing and sweeping ------------------------------------------------
    @abc.abstractmethod
    def claim(
        self,
        ids: Iterable[int],
        *,
        now: datetime,
        lease_until: datetime,
        max_bytes: int | None = None,
        using: str | None = None,
    ) -> Claim:
        """Lease those of ``ids`` that are pending, due and not leased by anyone else.

        Oldest due first; with ``max_bytes``, the claim stops at the row whose payload
        brings it to ``max_bytes`` (see :func:`within_budget`): the others stay for the
        next claim. A bounded number of statements whatever ``len(ids)``.
        """

    @abc.abstractmethod
    def claim_due(
        self,
        *,
        now: datetime,
        created_before: datetime,
        limit: int,
        lease_until: datetime,
        max_bytes: int | None = None,
        using: str | None = None,
    ) -> Claim:
        """Lease up to ``limit`` pending rows due at ``now`` and created before
        ``created_before`` (younger rows may belong to their on-commit publisher), or
        parked: due later than they were created (no on-commit publisher has them).

        Oldest due first, and, with ``max_bytes``, no row after the one whose payload
        brings the claim to ``max_bytes`` (always at least one row): a batch of large
        rows is short instead of holding ``limit`` of them in memory.

        Concurrent callers get disjoint rows (``SKIP LOCKED`` where the database has it).
        """

    @abc.abstractmethod
    def mark_published(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        now: datetime,
        keep: bool,
        using: str | None = None,
    ) -> int:
        """Delete (or, with ``keep``, mark ``published``) the claimed rows in ``ids``.

        One statement. Fenced: rows whose lease is no longer one of ``claim.leases``
        are left alone. Returns how many rows it changed.
        """

    @abc.abstractmethod
    def record_failure(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        error: str,
        retry_at: datetime | None,
        using: str | None = None,
    ) -> int:
        """Count a failed publish attempt of claimed rows and release them.

        One statement. Each row's ``attempts`` grows by one and ``last_error`` becomes
        ``error``; with ``retry_at`` the rows stay ``pending``, due then; without it they
        become ``failed`` and keep their ``available_at``. Whether a row gives up is the
        relay's decision (``outbox_publish_max_attempts``), made once, not the store's.
        Fenced like :meth:`mark_published`. Returns how many rows changed.
        """

    @abc.abstractmethod
    def cancel_pending(
        self,
        *,
        ids: Sequence[int] = (),
        task_ids: Sequence[str] = (),
        now: datetime,
        using: str | None = None,
    ) -> list[CancelledRow]:
        """Cancel the ``pending`` rows among ``ids`` and ``task_ids`` (due or parked): lock
        them, delete them, and close the workflow each was a step of as ``cancelled``
        (:meth:`~celery_outbox.store.base.WorkflowStore.workflow_cancelled`, at ``now``),
        all in one transaction (the caller's when there is one). Rows not ``pending`` or
        not found are left. Returns the rows deleted, by id.
        """

    @abc.abstractmethod
    def reset(self, ids: Iterable[int], *, now: datetime, using: str | None = None) -> int:
        """Make rows ``pending`` and due at ``now`` again, with no lease.

        ``failed`` rows start a fresh attempt budget; ``pending`` rows are simply due
        now (publish-now). Published rows and rows whose task id already has another
        pending row are left alone. Returns how many rows changed.
        """

    def sweep_aliases(self) -> Sequence[str | None]:
        """The database aliases a sweep covers, each passed as ``using``: ``[None]`` (the
        default database) unless a store covers several (Django: ``DJANGO_OUTBOX_DATABASES``).
        """
        return [None]

    @abc.abstractmethod
    def count_by_status(self, *, using: str | None = None) -> Mapping[MessageStatus, int]:
        """How many rows are in each status."""

    @abc.abstractmethod
    def oldest_pending(self, *, using: str | None = None) -> datetime | None:
        """``created_at`` of the oldest ``pending`` row, or ``None``."""

    @abc.abstractmethod
    def purge(
        self,
        *,
        statuses: Iterable[MessageStatus],
        older_than: datetime,
        limit: int,
        using: str | None = None,
    ) -> int:
        """Delete up to ``limit`` rows in ``statuses`` created before ``older_than``."""

    # -- deliveries ---------------------------------------------------------------
    @abc.abstractmethod
    def record_delivery(self, task_id: str, *, now: datetime, using: str | None = None) -> int:
        """Count one more delivery of a *redelivered* task message; return the total.

        First deliveries are never recorded (only redeliveries pay a write), so the
        first call for a ``task_id`` returns 2. Committed before returning.
        """

    @abc.abstractmethod
    def forget_deliveries(self, task_id: str, *, using: str | None = None) -> None:
        """Drop the delivery count of a task whose attempt finished."""

    # -- dead letters -----------------------------------------------------------
    @abc.abstractmethod
    def add_dead_letter(
        self, letter: NewDeadLetter, *, using: str | None = None, workflow: str | None = None
    ) -> int:
        """Write a dead letter (committed before returning when outside a transaction).

        ``workflow``: the ``root_id`` of the workflow the task is a step of; in the same
        transaction, that workflow is marked failed by the letter's task
        (:meth:`~celery_outbox.store.base.WorkflowStore.workflow_failed`, at ``failed_at``).
        """

    @abc.abstractmethod
    def get_dead_letter(
        self, letter_id: int, *, using: str | None = None
    ) -> StoredDeadLetter | None:
        """The dead letter with that id, or ``None``."""

    @abc.abstractmethod
    def requeue_dead_letter(
        self,
        letter_id: int,
        message: NewMessage,
        *,
        by: str,
        now: datetime,
        using: str | None = None,
        workflow: str | None = None,
    ) -> tuple[str, int | None]:
        """Mark a ``dead`` letter ``requeued`` and add ``message`` in the same transaction.

        ``workflow``: the ``root_id`` of the workflow the task is a step of; when the
        letter is requeued, that workflow resumes in the same transaction
        (:meth:`~celery_outbox.store.base.WorkflowStore.workflow_resumed`).

        Returns ``(task_id, row_id)``: the new task id and outbox row, or, when the
        letter is not ``dead`` any more, its existing ``requeued_task_id`` and ``None``
        (nothing written). Raises ``LookupError`` for an unknown id.
        """

    @abc.abstractmethod
    def discard_dead_letter(self, letter_id: int, *, using: str | None = None) -> bool:
        """Mark a ``dead`` letter ``discarded``; ``False`` when it was not ``dead``."""

    @abc.abstractmethod
    def complete_dead_letters(self, task_id: str, *, using: str | None = None) -> int:
        """Mark the ``dead`` letters of ``task_id`` ``completed``: its task finished after
        all, through a duplicate delivery (an atomic task's run committing after its
        letter was written). How many were; in the caller's transaction.
        """
