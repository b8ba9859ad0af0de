"""Rows born leased to their on-commit publisher (``NewMessage.locked_until``).

The publisher skips the claim: it checks with ``still_leased`` that its rows were
committed and are still its own, publishes them, and marks them fenced by each row's
own lease. No claim may take such a row before its lease runs out.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from celery_outbox.store.records import Claim, MessageStatus, NewMessage, StoredMessage
from tests.contract.factories import FAR_FUTURE, LEASE, NOW, new_message, rolled_back
from tests.contract.harness import Harness

#: The birth lease of the rows below (the publish grace).
GRACE = timedelta(seconds=10)


def born_leased(until: datetime = NOW + GRACE) -> NewMessage:
    return replace(new_message(available_at=NOW), locked_until=until)


def add(harness: Harness, message: NewMessage) -> StoredMessage:
    row_id = harness.store.add(message)
    assert row_id is not None
    return StoredMessage.written(message, row_id)


def claim_due(harness: Harness, now: datetime) -> Claim:
    return harness.store.claim_due(
        now=now, created_before=FAR_FUTURE, limit=100, lease_until=now + LEASE
    )


def test_no_claim_takes_a_born_leased_row_before_its_lease_runs_out(harness: Harness) -> None:
    row = add(harness, born_leased())

    assert claim_due(harness, NOW).messages == ()
    assert harness.store.claim([row.id], now=NOW, lease_until=NOW + LEASE).messages == ()
    later = NOW + GRACE + timedelta(microseconds=1)
    assert [m.id for m in claim_due(harness, later).messages] == [row.id]


def test_still_leased_lists_the_committed_rows_holding_their_own_lease(harness: Harness) -> None:
    kept, other = add(harness, born_leased()), add(harness, born_leased(NOW + 2 * GRACE))
    unleased = add(harness, new_message(available_at=NOW))

    assert harness.store.still_leased([kept, other, unleased]) == {kept.id, other.id}
    # A message that names another lease than its row's is not the row's holder.
    assert harness.store.still_leased([replace(kept, locked_until=NOW + LEASE)]) == set()
    assert harness.store.still_leased([]) == set()


def test_still_leased_drops_rows_of_a_rolled_back_savepoint(harness: Harness) -> None:
    with harness.transaction():
        kept = add(harness, born_leased())
        with rolled_back(harness.savepoint):
            lost = add(harness, born_leased())

    assert harness.store.still_leased([kept, lost]) == {kept.id}


def test_a_row_claimed_after_its_birth_lease_is_no_longer_its_publishers(
    harness: Harness,
) -> None:
    row = add(harness, born_leased())
    later = NOW + GRACE + timedelta(seconds=1)
    sweep = claim_due(harness, later)
    assert [m.id for m in sweep.messages] == [row.id]

    assert harness.store.still_leased([row]) == set()
    late = Claim(messages=(row,), lease_until=NOW + GRACE)
    assert harness.store.mark_published(late, [row.id], now=later, keep=False) == 0
    assert harness.store.mark_published(sweep, [row.id], now=later, keep=False) == 1


def test_rows_with_their_own_leases_are_marked_in_one_claim(harness: Harness) -> None:
    rows = [add(harness, born_leased(NOW + GRACE + timedelta(microseconds=n))) for n in range(3)]
    claim = Claim(messages=tuple(rows), lease_until=max(r.locked_until or NOW for r in rows))

    assert harness.store.mark_published(claim, [r.id for r in rows[:2]], now=NOW, keep=False) == 2
    failed = harness.store.record_failure(claim, [rows[2].id], error="down", retry_at=NOW + LEASE)
    assert failed == 1
    (retried,) = claim_due(harness, NOW + LEASE).messages
    assert (retried.id, retried.status, retried.attempts) == (rows[2].id, MessageStatus.PENDING, 1)
