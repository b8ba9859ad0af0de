"""A stateful property test of the store contract (hypothesis ``RuleBasedStateMachine``).

Random interleavings of dispatch (the same task id twice included, committed or rolled
back, born leased to an on-commit publisher or not), parked rows, sweeps' claims by
several publishers, lease expiry (the clock moves on), publish success and failure,
the on-commit publisher's fenced publish, reset, dead letters requeued and discarded,
and purges, on every store of the contract suite, against a plain model written here.

After every step: the store holds exactly the model's rows (ids, task ids, statuses,
due times, leases, attempts), at most one ``pending`` row per task id, the counts by
status match, and no row was ever marked published twice. ``test_interleavings.py``
compares stores with the in-memory store on short random programs; this one holds each
store, the in-memory one too, to an independent model, including dead letters.

Time goes only through ``now=`` arguments from :data:`tests.contract.factories.NOW`
(the contract suite's time control), so the rows' ``created_at`` (the store's clock) is
always before it. Fast by default (60 programs of up to 30 steps on the in-memory store,
10 of up to 20 on each database: about a minute for the file on a loaded 2-core machine);
``OUTBOX_TEST_STATEFUL=long`` runs ten times as many programs::

    OUTBOX_TEST_STATEFUL=long pytest -n 0 tests/contract/test_store_machine.py
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_outbox.store.records import Claim, DeadLetterStatus, MessageStatus, NewMessage
from tests.contract.factories import (
    FAR_FUTURE,
    NOW,
    new_dead_letter,
    new_message,
    rolled_back,
    written,
)
from tests.contract.harness import Harness, MemoryHarness

LEASE = timedelta(seconds=10)
GRACE = timedelta(seconds=5)
PUBLISHERS = 3
#: Few task ids, so dispatching one that is already pending happens often.
TASK_IDS = [f"machine-{n}" for n in range(2)]
LONG = os.environ.get("OUTBOX_TEST_STATEFUL", "").lower() == "long"
STATUSES = list(MessageStatus)
_serials = itertools.count()
DONE = [MessageStatus.PUBLISHED, MessageStatus.FAILED]


@dataclass
class Row:
    """The model of one outbox row."""

    task_id: str
    status: MessageStatus
    available_at: datetime
    locked_until: datetime | None
    attempts: int
    message: NewMessage
    #: Unique per row written: SQLite gives a new row the id of a deleted one.
    serial: int = field(default_factory=lambda: next(_serials))

    def claimable(self, now: datetime) -> bool:
        return (
            self.status is MessageStatus.PENDING
            and self.available_at <= now
            and (self.locked_until is None or self.locked_until <= now)
        )

    def state(self) -> tuple[object, ...]:
        return (self.task_id, self.status, self.available_at, self.locked_until, self.attempts)


@dataclass
class Letter:
    """The model of one dead letter."""

    status: DeadLetterStatus = DeadLetterStatus.DEAD
    requeued_task_id: str | None = None


class StoreMachine(RuleBasedStateMachine):
    """One store (``harness``) driven by random rules and checked against the model."""

    harness: Harness

    def __init__(self) -> None:
        super().__init__()
        self.store = self.harness.store
        self.now = NOW
        self.rows: dict[int, Row] = {}
        self.letters: dict[int, Letter] = {}
        self.claims: dict[int, Claim] = {}
        self.marked: Counter[int] = Counter()  # by Row.serial
        #: Rows written, rows deleted on publish, rows purged: nothing else may go.
        self.added = self.deleted = self.purged = 0

    @initialize()
    def empty(self) -> None:
        self.harness.clear()

    # -- dispatch -----------------------------------------------------------------------
    def _dispatch(self, task_id: str, due: datetime, *, born_leased: bool) -> None:
        message = new_message(task_id=task_id, available_at=due)
        if born_leased:  # dispatched inside a transaction: leased to its on-commit publisher
            message = replace(message, locked_until=self.now + GRACE)
        with self.harness.transaction():
            row_id = self.store.add(message)
        pending = any(
            r.task_id == task_id and r.status is MessageStatus.PENDING for r in self.rows.values()
        )
        if pending:
            assert row_id is None, f"a second pending row for {task_id}: {row_id}"
            return
        assert row_id is not None
        assert row_id not in self.rows
        self.added += 1
        self.rows[row_id] = Row(
            task_id, MessageStatus.PENDING, due, message.locked_until, 0, message
        )

    @rule(
        task_id=st.sampled_from(TASK_IDS),
        offset=st.integers(-5, 0),
        how=st.sampled_from(["committed", "born leased", "committed", "rolled back"]),
    )
    def add(self, task_id: str, offset: int, how: str) -> None:
        """Dispatch (due now or a little earlier): committed, born leased to its on-commit
        publisher, or rolled back (nothing written).
        """
        if how == "rolled back":
            with rolled_back(self.harness.transaction):
                self.store.add(new_message(task_id=task_id, available_at=self.now))
            return
        due = self.now + timedelta(seconds=offset)
        self._dispatch(task_id, due, born_leased=how == "born leased")

    @rule(task_id=st.sampled_from(TASK_IDS), delay=st.integers(1, 30))
    def park(self, task_id: str, delay: int) -> None:
        """A parked retry (or countdown): a row due later, which no on-commit publisher has."""
        self._dispatch(task_id, self.now + timedelta(seconds=delay), born_leased=False)

    # -- publishing -----------------------------------------------------------------------
    @rule(
        publisher=st.integers(0, PUBLISHERS - 1),
        limit=st.integers(1, 4),
        outcome=st.sampled_from(["hold", "published", "kept", "failed", "retry"]),
        retry_in=st.integers(0, 20),
    )
    def sweep(self, publisher: int, limit: int, outcome: str, retry_in: int) -> None:
        """A sweep's claim, finished at once, or held (``hold``) for a later :meth:`finish`
        while time passes; a publisher's earlier claim is abandoned (it died).
        """
        lease_until = self.now + LEASE + timedelta(microseconds=publisher)
        claim = self.store.claim_due(
            now=self.now, created_before=FAR_FUTURE, limit=limit, lease_until=lease_until
        )
        claimable = {i: r.available_at for i, r in self.rows.items() if r.claimable(self.now)}
        due = [m.id for m in claim.messages]
        # Oldest due first; of rows due at the same instant, any (the due index's order).
        assert len(set(due)) == len(due)
        assert set(due) <= set(claimable)
        times = [claimable[i] for i in due]
        assert sorted(times) == sorted(claimable.values())[:limit]
        assert times == sorted(times)  # returned oldest due first
        for row_id in due:
            self.rows[row_id].locked_until = lease_until
        if outcome == "hold":
            self.claims[publisher] = claim
        else:
            self.claims.pop(publisher, None)
            self._finish(claim, outcome, retry_in)

    def _held(self, claim: Claim) -> list[int]:
        leases = claim.leases
        return [
            m.id
            for m in claim.messages
            if (row := self.rows.get(m.id)) is not None
            and row.status is MessageStatus.PENDING
            and row.locked_until in leases
        ]

    def _published(self, claim: Claim, *, keep: bool) -> None:
        expected = self._held(claim)
        ids = [m.id for m in claim.messages]
        assert self.store.mark_published(claim, ids, now=self.now, keep=keep) == len(expected)
        for row_id in expected:
            self.marked[self.rows[row_id].serial] += 1
            if keep:
                row = self.rows[row_id]
                row.status, row.locked_until = MessageStatus.PUBLISHED, None
            else:
                del self.rows[row_id]
                self.deleted += 1

    @precondition(lambda self: bool(self.claims))
    @rule(
        data=st.data(),
        outcome=st.sampled_from(["published", "kept", "failed", "retry"]),
        retry_in=st.integers(0, 20),
    )
    def finish(self, data: st.DataObject, outcome: str, retry_in: int) -> None:
        """A publisher's claim ends: published (rows deleted, or kept as ``published``),
        or the publish failed (rows ``failed``, or pending again, due in ``retry_in``).
        """
        claim = self.claims.pop(data.draw(st.sampled_from(sorted(self.claims))))
        self._finish(claim, outcome, retry_in)

    def _finish(self, claim: Claim, outcome: str, retry_in: int) -> None:
        if outcome in ("published", "kept"):
            self._published(claim, keep=outcome == "kept")
            return
        retry_at = self.now + timedelta(seconds=retry_in) if outcome == "retry" else None
        expected = self._held(claim)
        ids = [m.id for m in claim.messages]
        changed = self.store.record_failure(claim, ids, error="broker down", retry_at=retry_at)
        assert changed == len(expected)
        for row_id in expected:
            row = self.rows[row_id]
            row.attempts += 1
            row.locked_until = None
            if retry_at is None:
                row.status = MessageStatus.FAILED
            else:
                row.available_at = retry_at

    @precondition(lambda self: any(r.message.locked_until for r in self.rows.values()))
    @rule(data=st.data(), keep=st.booleans())
    def publish_on_commit(self, data: st.DataObject, keep: bool) -> None:
        """The on-commit publisher of a row born leased: its check, then its fenced mark."""
        born = sorted(i for i, r in self.rows.items() if r.message.locked_until)
        row_id = data.draw(st.sampled_from(born))
        message = written(row_id, self.rows[row_id].message)
        row = self.rows[row_id]
        still = row.status is MessageStatus.PENDING and row.locked_until == message.locked_until
        assert self.store.still_leased([message]) == ({row_id} if still else set())
        assert message.locked_until is not None
        self._published(Claim(messages=(message,), lease_until=message.locked_until), keep=keep)

    @rule(seconds=st.integers(1, 15), to_lease_end=st.booleans())
    def tick(self, seconds: int, to_lease_end: bool) -> None:
        """Time passes: ``seconds``, or exactly to the next lease's end (the boundary
        where a lease has expired), so due times and leases are reached.
        """
        ends = [r.locked_until for r in self.rows.values() if r.locked_until is not None]
        later = sorted(end for end in ends if end > self.now)
        if to_lease_end and later:
            self.now = later[0]
        else:
            self.now += timedelta(seconds=seconds)

    @precondition(lambda self: bool(self.rows))
    @rule(data=st.data(), failed=st.booleans())
    def reset(self, data: st.DataObject, failed: bool) -> None:
        """Publish now (a pending row) or retry (a failed one: ``failed`` picks one, if
        any, so a retry beside a newer pending row of its task id is often tried).
        """
        failures = [i for i, r in self.rows.items() if r.status is MessageStatus.FAILED]
        row_id = data.draw(st.sampled_from(sorted(failures if failed and failures else self.rows)))
        row = self.rows[row_id]
        other_pending = any(
            r.task_id == row.task_id and i != row_id and r.status is MessageStatus.PENDING
            for i, r in self.rows.items()
        )
        expected = row.status is not MessageStatus.PUBLISHED and not other_pending
        assert self.store.reset([row_id], now=self.now) == int(expected)
        if expected:
            if row.status is MessageStatus.FAILED:
                row.attempts = 0
            row.status, row.available_at, row.locked_until = MessageStatus.PENDING, self.now, None

    @rule(statuses=st.sets(st.sampled_from(DONE), min_size=1))
    def purge(self, statuses: set[MessageStatus]) -> None:
        """The sweep's purge of published rows, or the operator's of failed ones."""
        doomed = [i for i, r in self.rows.items() if r.status in statuses]
        purged = self.store.purge(statuses=statuses, older_than=FAR_FUTURE, limit=10_000)
        assert purged == len(doomed)
        for row_id in doomed:
            del self.rows[row_id]
        self.purged += purged

    # -- dead letters -----------------------------------------------------------------------
    @rule(data=st.data(), action=st.sampled_from(["write", "requeue", "discard"]))
    def dead_letter(self, data: st.DataObject, action: str) -> None:
        """Write a dead letter (also before the first requeue or discard), requeue one
        (again too), or discard one.
        """
        if action == "write" or not self.letters:
            letter_id = self.store.add_dead_letter(new_dead_letter(failed_at=self.now))
            assert letter_id not in self.letters
            self.letters[letter_id] = Letter()
            if action == "write":
                return
        letter_id = data.draw(st.sampled_from(sorted(self.letters)))
        if action == "requeue":
            self._requeue(letter_id)
        else:
            self._discard(letter_id)

    def _requeue(self, letter_id: int) -> None:
        letter = self.letters[letter_id]
        message = new_message(task_id=f"requeued-{uuid.uuid4()}", available_at=self.now)
        task_id, row_id = self.store.requeue_dead_letter(
            letter_id, message, by="machine", now=self.now
        )
        if letter.status is DeadLetterStatus.DEAD:
            assert (task_id, row_id is not None) == (message.task_id, True)
            assert row_id not in self.rows
            letter.status, letter.requeued_task_id = DeadLetterStatus.REQUEUED, task_id
            self.added += 1
            self.rows[row_id] = Row(task_id, MessageStatus.PENDING, self.now, None, 0, message)
        elif letter.status is DeadLetterStatus.REQUEUED:
            assert (task_id, row_id) == (letter.requeued_task_id, None)
        else:
            assert (bool(task_id), row_id) == (False, None)

    def _discard(self, letter_id: int) -> None:
        letter = self.letters[letter_id]
        was_dead = letter.status is DeadLetterStatus.DEAD
        assert self.store.discard_dead_letter(letter_id) is was_dead
        if was_dead:
            letter.status = DeadLetterStatus.DISCARDED

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def the_store_holds_the_model(self) -> None:
        stored = {row.id: row for row in self.harness.rows()}
        assert {
            i: (r.task_id, r.status, r.available_at, r.locked_until, r.attempts)
            for i, r in stored.items()
        } == {i: r.state() for i, r in self.rows.items()}
        pending = Counter(r.task_id for r in stored.values() if r.status is MessageStatus.PENDING)
        assert all(n == 1 for n in pending.values()), pending
        counts = self.store.count_by_status()
        assert {s: counts.get(s, 0) for s in STATUSES} == {
            s: sum(r.status is s for r in self.rows.values()) for s in STATUSES
        }
        assert all(n == 1 for n in self.marked.values()), "a row was published twice"

    def teardown(self) -> None:
        # Nothing lost: every row written is still there (the invariant compared it with
        # the store's), was deleted as published, or was purged.
        assert self.added == len(self.rows) + self.deleted + self.purged
        for letter_id, letter in self.letters.items():
            stored = self.store.get_dead_letter(letter_id)
            assert stored is not None
            assert (stored.status, stored.requeued_task_id or None) == (
                letter.status,
                letter.requeued_task_id,
            )


def test_the_store_follows_the_model(harness: Harness) -> None:
    memory = isinstance(harness, MemoryHarness)
    examples = (60 if memory else 10) * (10 if LONG else 1)
    machine = type("Machine", (StoreMachine,), {"harness": harness})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=30 if memory else 20,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
