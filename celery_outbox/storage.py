"""The store: the one seam between the core and a database.

``OutboxTask``, the relay and the sweeper talk only to :class:`OutboxStore`: Django's ORM
store, :class:`celery_outbox.sqlalchemy.SQLAlchemyOutboxStore`, or in tests
:class:`celery_outbox.testing.InMemoryOutboxStore`, held to one contract (``tests/contract``).
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from datetime import datetime

from celery_outbox.bulk_store import BulkStore
from celery_outbox.claim_threads import ClaimThreads
from celery_outbox.completions import CompletionStore
from celery_outbox.monitoring import MonitoredStore
from celery_outbox.records import (
    CancelledRow,
    Claim,
    MessageStatus,
    NewDeadLetter,
    NewMessage,
    StoredDeadLetter,
    StoredMessage,
)
from celery_outbox.wakeups import WakeupStore
from celery_outbox.workflows import WorkflowStore

#: Called after commit with every row one transaction deferred (see ``defer_publish``).
PublishCallback = Callable[[Sequence[StoredMessage]], object]
#: Whether a new message takes the place of the pending row of its task id (see ``add``).
Supersedes = Callable[[StoredMessage], bool]


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
        taken, held = taken + 1, held + size
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
        (:mod:`celery_outbox.superseding` says when). Outside a transaction both are
        committed before this returns. The row's ``locked_until`` is the message's: a
        row born leased is left to its on-commit publisher (no claim takes it) until then.
        """

    @abc.abstractmethod
    def on_commit(self, callback: Callable[[], None], *, using: str | None = None) -> None:
        """Run ``callback`` right after the current transaction commits.

        Never on rollback, nor when the savepoint it was registered in rolls back. Outside
        a transaction ``callback`` runs before this returns."""

    def awaits_commit(self, callback: Callable[[], None], *, using: str | None = None) -> bool:
        """Whether ``callback``, given to :meth:`on_commit`, still waits for the commit of
        an open transaction (no rollback dropped it). For the pytest plugin, whose
        ``django_db`` tests never commit; ``False`` from stores that cannot tell."""
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
        (:meth:`~celery_outbox.workflows.WorkflowStore.workflow_cancelled`, at ``now``),
        all in one transaction (the caller's when there is one). Rows not ``pending`` or
        not found are left. Returns the rows deleted, by id."""

    @abc.abstractmethod
    def reset(self, ids: Iterable[int], *, now: datetime, using: str | None = None) -> int:
        """Make rows ``pending`` and due at ``now`` again, with no lease.

        ``failed`` rows start a fresh attempt budget; ``pending`` rows are simply due
        now (publish-now). Published rows and rows whose task id already has another
        pending row are left alone. Returns how many rows changed.
        """

    def sweep_aliases(self) -> Sequence[str | None]:
        """The database aliases a sweep covers, each passed as ``using``: ``[None]`` (the
        default database) unless a store covers several (Django: ``DJANGO_OUTBOX_DATABASES``)."""
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
        (:meth:`~celery_outbox.workflows.WorkflowStore.workflow_failed`, at ``failed_at``).
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
        (:meth:`~celery_outbox.workflows.WorkflowStore.workflow_resumed`).

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
        letter was written). How many were; in the caller's transaction."""
