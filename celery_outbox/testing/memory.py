"""The in-memory store (:class:`InMemoryOutboxStore`), in one module.

``CompletedTask`` rows of :class:`celery_outbox.testing.InMemoryOutboxStore`.

Dead letters and delivery counts of :class:`celery_outbox.testing.InMemoryOutboxStore`.

The backlog and the sweep record of :class:`celery_outbox.testing.InMemoryOutboxStore`.

Transactions and savepoints over in-memory state, for :mod:`celery_outbox.testing`.

Each thread has its own stack of open frames. A frame keeps a snapshot of the state to
restore when its block raises, the callbacks to run once the outermost frame commits
(a committed savepoint hands them to its parent, a rolled-back one drops them), and the
outermost frame keeps the on-commit publish batches, one per
:func:`~celery_outbox.store.base.publisher_key`.

``Workflow`` rows and chord joins of :class:`celery_outbox.testing.InMemoryOutboxStore`.

An in-memory :class:`~celery_outbox.store.base.OutboxStore` for unit tests (shipped).

It keeps the contract of the real stores, including transactions: use
:meth:`InMemoryOutboxStore.atomic` as you would ``transaction.atomic`` (nested blocks
are savepoints). It is thread-safe but holds one transaction stack per thread.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from celery_outbox.clock import Clock, utcnow
from celery_outbox.store.base import (
    WORKFLOW_STATUSES,
    Backlog,
    Completion,
    JoinProgress,
    LastSweep,
    OutboxStore,
    PublishCallback,
    StoredWorkflow,
    Supersedes,
    publisher_key,
    within_budget,
)
from celery_outbox.store.records import (
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
    cancelled_row,
    empty_parts,
    letter_columns,
    message_columns,
    part_results,
    stored_letter,
    stored_message,
    with_part,
)
from celery_outbox.store.transitions import (
    CANCEL,
    COMPLETE,
    DISCARD,
    FAIL,
    REQUEUE,
    RESUME,
    SUCCEED,
)

# --- ``CompletedTask`` rows of :class:`celery_outbox.testing.InMemoryOutboxStore`.


class MemoryCompletions(OutboxStore):
    """The atomic-task half of the in-memory store: a run holds its task id until it
    commits or rolls back, so a concurrent duplicate waits, as on a unique key.
    """

    completions: dict[str, StoredCompletion]
    _running: set[str]
    _released: threading.Condition
    #: The in-memory store's transaction (``InMemoryOutboxStore.atomic``).
    atomic: Callable[[], AbstractContextManager[None]]

    def atomic_problem(self, using: str | None = None) -> str | None:
        """``None``: the in-memory store runs atomic tasks."""
        return None

    @contextmanager
    def complete_once(
        self,
        task_id: str,
        task_name: str,
        *,
        now: datetime,
        using: str | None = None,
        root_id: str | None = None,
    ) -> Iterator[Completion]:
        with self._holding(task_id), self.atomic():
            previous = self.completions.get(task_id)
            completion = Completion(task_id, task_name, previous=previous)
            yield completion
            if previous is None:
                self.completions[task_id] = StoredCompletion(
                    task_id=task_id,
                    task_name=task_name,
                    completed_at=now,
                    result=completion.result,
                    root_id=root_id,
                )

    @contextmanager
    def _holding(self, task_id: str) -> Iterator[None]:
        with self._released:
            self._released.wait_for(lambda: task_id not in self._running)
            self._running.add(task_id)
        try:
            yield
        finally:
            with self._released:
                self._running.discard(task_id)
                self._released.notify_all()

    def completion(self, task_id: str, *, using: str | None = None) -> StoredCompletion | None:
        return self.completions.get(task_id)

    def count_completed(self, *, using: str | None = None) -> int:
        return len(self.completions)

    def purge_completed(self, *, older_than: datetime, limit: int, using: str | None = None) -> int:
        with self._released:
            doomed = [
                key for key, row in self.completions.items() if row.completed_at < older_than
            ][:limit]
            for key in doomed:
                del self.completions[key]
            return len(doomed)


# --- Dead letters and delivery counts of :class:`celery_outbox.testing.InMemoryOutboxStore`.


class MemoryDeadLetters(OutboxStore):
    """The dead-letter and delivery half of the in-memory store (its rows are the other)."""

    letters: dict[int, StoredDeadLetter]
    deliveries: dict[str, int]
    _ids: itertools.count[int]
    _lock: threading.RLock

    # -- deliveries -----------------------------------------------------------------
    def record_delivery(self, task_id: str, *, now: datetime, using: str | None = None) -> int:
        with self._lock:
            self.deliveries[task_id] = self.deliveries.get(task_id, 1) + 1
            return self.deliveries[task_id]

    def forget_deliveries(self, task_id: str, *, using: str | None = None) -> None:
        with self._lock:
            self.deliveries.pop(task_id, None)

    # -- dead letters -------------------------------------------------------------------
    def add_dead_letter(
        self, letter: NewDeadLetter, *, using: str | None = None, workflow: str | None = None
    ) -> int:
        with self._lock:
            letter_id = next(self._ids)
            self.letters[letter_id] = stored_letter({**letter_columns(letter), "id": letter_id})
            if workflow is not None:
                self.workflow_failed(workflow, letter.task_id, now=letter.failed_at)
            return letter_id

    def get_dead_letter(
        self, letter_id: int, *, using: str | None = None
    ) -> StoredDeadLetter | None:
        return self.letters.get(letter_id)

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
        with self._lock:
            letter = self.letters.get(letter_id)
            if letter is None:
                raise LookupError(f"No dead letter with id {letter_id!r}.")
            if not REQUEUE.allows(letter.status):
                return letter.requeued_task_id, None
            row_id = self.add(message, using=using)
            self.letters[letter_id] = replace(
                letter,
                status=DeadLetterStatus(REQUEUE.target),
                requeued_at=now,
                requeued_by=by,
                requeued_task_id=message.task_id,
            )
            if workflow is not None:
                self.workflow_resumed(workflow)
            return message.task_id, row_id

    def discard_dead_letter(self, letter_id: int, *, using: str | None = None) -> bool:
        with self._lock:
            letter = self.letters.get(letter_id)
            if letter is None or not DISCARD.allows(letter.status):
                return False
            self.letters[letter_id] = replace(letter, status=DeadLetterStatus(DISCARD.target))
            return True

    def complete_dead_letters(self, task_id: str, *, using: str | None = None) -> int:
        with self._lock:
            found = [
                letter
                for letter in self.letters.values()
                if letter.task_id == task_id and COMPLETE.allows(letter.status)
            ]
            for letter in found:
                self.letters[letter.id] = replace(letter, status=DeadLetterStatus(COMPLETE.target))
            return len(found)


# --- The backlog and the sweep record of :class:`celery_outbox.testing.InMemoryOutboxStore`.


class MemoryMonitoring(OutboxStore):
    """The monitoring reads of the in-memory store, on the store's clock.

    The sweep record is not transactional: like the real stores' it is written in a
    transaction of its own, whatever block the caller is in.
    """

    rows: dict[int, StoredMessage]
    letters: dict[int, StoredDeadLetter]
    clock: Callable[[], datetime]
    last_sweep_at: datetime | None
    _lock: threading.RLock

    def now(self, *, using: str | None = None) -> datetime:
        """The store's clock: the one clock of this "database"."""
        return self.clock()

    def backlog(self, *, using: str | None = None, bound: int | None = None) -> Backlog:
        with self._lock:
            now = self.clock()
            pending = [r for r in self.rows.values() if r.status is MessageStatus.PENDING]
            due = [r for r in pending if r.available_at <= now]
            waits = [now - _waiting_since(r) for r in due]
            return Backlog(
                due=len(due),
                parked=len(pending) - len(due),
                failed=sum(r.status is MessageStatus.FAILED for r in self.rows.values()),
                oldest_due_age=max(waits, default=None),
            )

    def next_due(self, *, after: datetime, using: str | None = None) -> datetime | None:
        with self._lock:
            pending = (r for r in self.rows.values() if r.status is MessageStatus.PENDING)
            return min((r.available_at for r in pending if r.available_at > after), default=None)

    def count_dead_letters(
        self, *, using: str | None = None, bound: int | None = None
    ) -> Mapping[DeadLetterStatus, int]:
        with self._lock:
            found = [letter.status for letter in self.letters.values()]
        return {status: found.count(status) for status in DeadLetterStatus}

    def keeps_sweeps(self) -> bool:
        """``True``: the store records the last sweep."""
        return True

    def record_sweep(self, *, every: timedelta, using: str | None = None) -> bool:
        with self._lock:
            now = self.clock()
            if self.last_sweep_at is not None and now - self.last_sweep_at < every:
                return False
            self.last_sweep_at = now
            return True

    def last_sweep(self, *, using: str | None = None) -> LastSweep | None:
        with self._lock:
            at = self.last_sweep_at
            now = self.clock()
            return None if at is None else LastSweep(at=at, age=max(now - at, timedelta(0)))


def _waiting_since(row: StoredMessage) -> datetime:
    """When a due row started waiting: its due time, or its creation once a publish
    failed (:class:`~celery_outbox.store.base.Backlog`).
    """
    if row.attempts > 0 and row.created_at is not None:
        return row.created_at
    return row.available_at


# --- Transactions and savepoints over in-memory state, for :mod:`celery_outbox.testing`.


@dataclass(eq=False)  # a frame is its own identity (transaction tokens)
class _Frame:
    """One open transaction or savepoint: what to restore, and what to run on commit."""

    snapshot: Any
    callbacks: list[Callable[[], object]] = field(default_factory=list)
    #: The outermost frame's on-commit batches, by publisher key.
    batches: dict[Hashable, list[StoredMessage]] = field(default_factory=dict)


class MemoryTransactions:
    """Per-thread transaction stacks over state that ``snapshot`` copies and ``restore``
    puts back (both called under ``lock``).
    """

    def __init__(
        self,
        *,
        snapshot: Callable[[], Any],
        restore: Callable[[Any], None],
        lock: AbstractContextManager[Any],
    ) -> None:
        self._snapshot = snapshot
        self._restore = restore
        self._lock = lock
        self._local = threading.local()

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """A transaction (or, nested, a savepoint): rolled back if the block raises."""
        with self._lock:
            frame = _Frame(snapshot=self._snapshot())
        stack = self._stack
        stack.append(frame)
        try:
            yield
        except BaseException:
            stack.pop()
            with self._lock:
                self._restore(frame.snapshot)
            raise
        stack.pop()
        if stack:
            stack[-1].callbacks.extend(frame.callbacks)
            return
        for callback in frame.callbacks:
            callback()

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` after the outermost commit (at once outside a transaction)."""
        if self._stack:
            self._stack[-1].callbacks.append(callback)
        else:
            callback()

    def token(self) -> Hashable | None:
        """This thread's innermost open frame (``None``: no transaction)."""
        stack = self._stack
        return stack[-1] if stack else None

    def awaits(self, callback: Callable[[], None]) -> bool:
        """Whether ``callback`` waits in one of this thread's open frames."""
        return any(callback in frame.callbacks for frame in self._stack)

    def defer_publish(self, message: StoredMessage, publish: PublishCallback) -> None:
        """Add ``message`` to ``publish``'s batch of the outermost transaction."""
        if not self._stack:
            publish((message,))
            return
        outer = self._stack[0]
        key = publisher_key(publish)
        batch = outer.batches.get(key)
        if batch is None:
            batch = outer.batches[key] = []
            rows = batch
            # Registered on the outermost frame, so a rolled-back savepoint cannot drop it;
            # rows of such a savepoint are gone, and still_leased()/claim() skip them.
            outer.callbacks.append(lambda: publish(tuple(rows)))
        batch.append(message)

    @property
    def _stack(self) -> list[_Frame]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        stack: list[_Frame] = self._local.stack
        return stack


# --- ``Workflow`` rows and chord joins of :class:`celery_outbox.testing.InMemoryOutboxStore`.


@dataclass(frozen=True, kw_only=True)
class MemoryJoin:
    """A chord join row (immutable, so a transaction's snapshot can restore it)."""

    root_id: str
    size: int
    remaining: int
    #: The header parts, as every store's ``results`` column (:mod:`~celery_outbox.store.records`).
    parts: str
    created_at: datetime


class MemoryWorkflows(OutboxStore):
    """The workflow half of the in-memory store: every change is one step under its lock,
    inside the caller's :meth:`~celery_outbox.testing.InMemoryOutboxStore.atomic` block.
    """

    workflows: dict[str, StoredWorkflow]
    joins: dict[str, MemoryJoin]
    _lock: threading.RLock

    def keeps_workflows(self) -> bool:
        """``True``: the in-memory store keeps workflows and chord joins."""
        return True

    def add_workflow_steps(
        self, root_id: str, *, name: str, steps: int, now: datetime, using: str | None = None
    ) -> None:
        with self._lock:
            found = self.workflows.get(root_id)
            if found is None:
                self.workflows[root_id] = StoredWorkflow(
                    root_id=root_id,
                    name=name,
                    status="running",
                    steps_total=steps,
                    steps_done=0,
                    created_at=now,
                )
            else:
                self.workflows[root_id] = replace(found, steps_total=found.steps_total + steps)

    def workflow_step_done(self, root_id: str, *, now: datetime, using: str | None = None) -> None:
        with self._lock:
            found = self.workflows.get(root_id)
            if found is None:
                return
            done = min(found.steps_done + 1, found.steps_total)
            if SUCCEED.allows(found.status) and found.steps_done + 1 >= found.steps_total:
                found = replace(found, status=SUCCEED.target, finished_at=now)
            self.workflows[root_id] = replace(found, steps_done=done)

    def workflow_failed(
        self, root_id: str, task_id: str, *, now: datetime, using: str | None = None
    ) -> None:
        with self._lock:
            found = self.workflows.get(root_id)
            if found is not None and FAIL.allows(found.status):
                self.workflows[root_id] = replace(
                    found, status=FAIL.target, failed_task_id=task_id, finished_at=now
                )

    def workflow_cancelled(self, root_id: str, *, now: datetime, using: str | None = None) -> None:
        with self._lock:
            found = self.workflows.get(root_id)
            if found is None or not CANCEL.allows(found.status):
                return
            self.workflows[root_id] = replace(found, status=CANCEL.target, finished_at=now)
            for group_id in [g for g, join in self.joins.items() if join.root_id == root_id]:
                del self.joins[group_id]

    def workflow_resumed(self, root_id: str, *, using: str | None = None) -> None:
        with self._lock:
            found = self.workflows.get(root_id)
            if found is not None and RESUME.allows(found.status):
                self.workflows[root_id] = replace(found, status=RESUME.target, finished_at=None)

    def get_workflow(self, root_id: str, *, using: str | None = None) -> StoredWorkflow | None:
        return self.workflows.get(root_id)

    def count_workflows(
        self, *, using: str | None = None, bound: int | None = None
    ) -> Mapping[WorkflowStatus, int]:
        counts = dict.fromkeys(WORKFLOW_STATUSES, 0)
        with self._lock:
            for workflow in self.workflows.values():
                counts[workflow.status] += 1
        return counts

    def open_join(
        self, group_id: str, *, root_id: str, size: int, now: datetime, using: str | None = None
    ) -> None:
        with self._lock:
            if group_id not in self.joins:
                self.joins[group_id] = MemoryJoin(
                    root_id=root_id,
                    size=size,
                    remaining=size,
                    parts=empty_parts(size),
                    created_at=now,
                )

    def join_part(
        self, group_id: str, index: int, result: str | None, *, using: str | None = None
    ) -> JoinProgress | None:
        with self._lock:
            join = self.joins.get(group_id)
            if join is None:
                return None
            parts = with_part(join.parts, index, result)
            if parts is not None:
                join = replace(join, remaining=join.remaining - 1, parts=parts)
                self.joins[group_id] = join
            return JoinProgress(remaining=join.remaining, results=part_results(join.parts))

    def purge_joins(self, *, older_than: datetime, limit: int, using: str | None = None) -> int:
        with self._lock:
            doomed = [
                key
                for key, join in self.joins.items()
                if join.remaining == 0 and join.created_at < older_than
            ][: max(limit, 0)]
            for key in doomed:
                del self.joins[key]
            return len(doomed)


# --- An in-memory :class:`~celery_outbox.store.base.OutboxStore` for unit tests (shipped).

#: The state a transaction's rollback restores (the delivery counts are not transactional).
_TRANSACTIONAL = ("rows", "letters", "completions", "workflows", "joins")


class InMemoryOutboxStore(MemoryCompletions, MemoryDeadLetters, MemoryWorkflows, MemoryMonitoring):
    """Outbox rows, dead letters, completed atomic tasks, workflows, chord joins and the
    last sweep in dictionaries, with transactions and savepoints.
    """

    def __init__(self, *, clock: Clock = utcnow) -> None:
        self.clock = clock
        self.rows: dict[int, StoredMessage] = {}
        self.letters: dict[int, StoredDeadLetter] = {}
        self.deliveries: dict[str, int] = {}
        self.completions: dict[str, StoredCompletion] = {}
        self.workflows: dict[str, StoredWorkflow] = {}
        self.joins: dict[str, MemoryJoin] = {}
        self.last_sweep_at: datetime | None = None
        self._running: set[str] = set()
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._released = threading.Condition(self._lock)
        self._transactions = MemoryTransactions(
            snapshot=lambda: {name: copy.copy(getattr(self, name)) for name in _TRANSACTIONAL},
            restore=self._restore,
            lock=self._lock,
        )

    # -- transactions ---------------------------------------------------------------
    def atomic(self) -> AbstractContextManager[None]:
        """A transaction (or, nested, a savepoint): rolled back if the block raises."""
        return self._transactions.atomic()

    def _restore(self, snapshot: dict[str, Any]) -> None:
        for name, state in snapshot.items():
            setattr(self, name, state)

    def on_commit(self, callback: Callable[[], None], *, using: str | None = None) -> None:
        self._transactions.on_commit(callback)

    def awaits_commit(self, callback: Callable[[], None], *, using: str | None = None) -> bool:
        return self._transactions.awaits(callback)

    def transaction_token(self, *, using: str | None = None) -> Hashable | None:
        return self._transactions.token()  # the innermost frame: add_many loops over add

    def defer_publish(
        self, message: StoredMessage, publish: PublishCallback, *, using: str | None = None
    ) -> None:
        self._transactions.defer_publish(message, publish)

    # -- dispatch ---------------------------------------------------------------------
    def add(
        self,
        message: NewMessage,
        *,
        using: str | None = None,
        supersedes: Supersedes | None = None,
    ) -> int | None:
        with self._lock:
            pending = next(
                (
                    r
                    for r in self.rows.values()
                    if r.task_id == message.task_id and r.status is MessageStatus.PENDING
                ),
                None,
            )
            if pending is not None:
                if supersedes is None or not supersedes(pending):
                    return None
                del self.rows[pending.id]
            row_id = next(self._ids)
            columns = message_columns(message, created_at=self.clock())
            self.rows[row_id] = stored_message({**columns, "id": row_id})
            return row_id

    # -- publishing and sweeping ----------------------------------------------------------
    def claim(
        self,
        ids: Iterable[int],
        *,
        now: datetime,
        lease_until: datetime,
        max_bytes: int | None = None,
        using: str | None = None,
    ) -> Claim:
        wanted = set(ids)
        return self._claim(
            lambda r: r.id in wanted,
            now=now,
            limit=None,
            lease_until=lease_until,
            max_bytes=max_bytes,
        )

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
        return self._claim(
            lambda r: (
                r.created_at is not None
                and (r.created_at <= created_before or r.available_at > r.created_at)
            ),
            now=now,
            limit=limit,
            lease_until=lease_until,
            max_bytes=max_bytes,
        )

    def _claim(
        self,
        keep: Callable[[StoredMessage], bool],
        *,
        now: datetime,
        limit: int | None,
        lease_until: datetime,
        max_bytes: int | None,
    ) -> Claim:
        with self._lock:
            due = sorted(
                (r for r in self.rows.values() if _claimable(r, now) and keep(r)),
                key=lambda r: (r.available_at, r.id),
            )[:limit]
            due = due[: within_budget((len(r.payload) for r in due), max_bytes)]
            claimed = tuple(replace(r, locked_until=lease_until) for r in due)
            self.rows.update((r.id, r) for r in claimed)
            return Claim(messages=claimed, lease_until=lease_until)

    def mark_published(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        now: datetime,
        keep: bool,
        using: str | None = None,
    ) -> int:
        with self._lock:
            held = self._held(claim, ids)
            for row in held:
                if keep:
                    self.rows[row.id] = replace(
                        row, status=MessageStatus.PUBLISHED, published_at=now, locked_until=None
                    )
                else:
                    del self.rows[row.id]
            return len(held)

    def record_failure(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        error: str,
        retry_at: datetime | None,
        using: str | None = None,
    ) -> int:
        with self._lock:
            held = self._held(claim, ids)
            for row in held:
                failed = retry_at is None
                self.rows[row.id] = replace(
                    row,
                    attempts=row.attempts + 1,
                    last_error=error,
                    locked_until=None,
                    status=MessageStatus.FAILED if failed else MessageStatus.PENDING,
                    available_at=row.available_at if failed or retry_at is None else retry_at,
                )
            return len(held)

    def still_leased(
        self, messages: Sequence[StoredMessage], *, using: str | None = None
    ) -> set[int]:
        with self._lock:
            return {
                m.id
                for m in messages
                if (row := self.rows.get(m.id)) is not None
                and row.status is MessageStatus.PENDING
                and row.locked_until is not None
                and row.locked_until == m.locked_until
            }

    def _held(self, claim: Claim, ids: Iterable[int]) -> list[StoredMessage]:
        rows = (self.rows.get(i) for i in ids)
        leases = claim.leases
        return [
            r
            for r in rows
            if r is not None and r.locked_until in leases and r.status is MessageStatus.PENDING
        ]

    def cancel_pending(
        self,
        *,
        ids: Sequence[int] = (),
        task_ids: Sequence[str] = (),
        now: datetime,
        using: str | None = None,
    ) -> list[CancelledRow]:
        wanted_ids = set(ids)
        wanted_tasks = set(task_ids)
        with self._lock, self.atomic():
            found = [
                row
                for row in sorted(self.rows.values(), key=lambda r: r.id)
                if row.status is MessageStatus.PENDING
                and (row.id in wanted_ids or row.task_id in wanted_tasks)
            ]
            cancelled = [
                cancelled_row(
                    r.id, r.task_id, r.task_name, r.options, leased=r.locked_until is not None
                )
                for r in found
            ]
            for row in found:
                del self.rows[row.id]
            for root in dict.fromkeys(c.root_id for c in cancelled):
                self.workflow_cancelled(root, now=now)
        return cancelled

    def reset(self, ids: Iterable[int], *, now: datetime, using: str | None = None) -> int:
        changed = 0
        with self._lock:
            for row in [self.rows[i] for i in ids if i in self.rows]:
                if row.status is MessageStatus.PUBLISHED or self._other_pending(row):
                    continue
                attempts = 0 if row.status is MessageStatus.FAILED else row.attempts
                self.rows[row.id] = replace(
                    row,
                    status=MessageStatus.PENDING,
                    available_at=now,
                    locked_until=None,
                    attempts=attempts,
                )
                changed += 1
        return changed

    def _other_pending(self, row: StoredMessage) -> bool:
        return any(
            r.task_id == row.task_id and r.id != row.id and r.status is MessageStatus.PENDING
            for r in self.rows.values()
        )

    def count_by_status(self, *, using: str | None = None) -> Mapping[MessageStatus, int]:
        with self._lock:
            return {s: sum(r.status is s for r in self.rows.values()) for s in MessageStatus}

    def oldest_pending(self, *, using: str | None = None) -> datetime | None:
        with self._lock:
            return min(
                (
                    r.created_at
                    for r in self.rows.values()
                    if r.status is MessageStatus.PENDING and r.created_at
                ),
                default=None,
            )

    def purge(
        self,
        *,
        statuses: Iterable[MessageStatus],
        older_than: datetime,
        limit: int,
        using: str | None = None,
    ) -> int:
        wanted = set(statuses)
        with self._lock:
            doomed = [
                r.id
                for r in self.rows.values()
                if r.status in wanted and r.created_at is not None and r.created_at < older_than
            ][:limit]
            for row_id in doomed:
                del self.rows[row_id]
            return len(doomed)


def _claimable(row: StoredMessage, now: datetime) -> bool:
    return (
        row.status is MessageStatus.PENDING
        and row.available_at <= now
        and (row.locked_until is None or row.locked_until <= now)
    )
