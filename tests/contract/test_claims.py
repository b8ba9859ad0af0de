"""Publishing and sweeping: claims, leases, fencing, marks, failures, reset, maintenance."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from celery_outbox.store.records import Claim, MessageStatus
from tests.contract.factories import FAR_FUTURE, LEASE, NOW, new_message
from tests.contract.harness import Harness

SECOND = timedelta(seconds=1)
PAST = datetime(2000, 1, 1, tzinfo=timezone.utc)


def add(h: Harness, *, available_at: datetime = NOW, task_id: str | None = None) -> int:
    row_id = h.store.add(new_message(available_at=available_at, task_id=task_id))
    assert row_id is not None
    return row_id


def claim_due(
    h: Harness,
    *,
    now: datetime = NOW,
    limit: int = 1000,
    created_before: datetime = FAR_FUTURE,
    lease: timedelta = LEASE,
) -> Claim:
    return h.store.claim_due(
        now=now, created_before=created_before, limit=limit, lease_until=now + lease
    )


def ids(claim: Claim) -> list[int]:
    return [m.id for m in claim.messages]


def rows(h: Harness) -> dict[MessageStatus, int]:
    return {s: n for s, n in h.store.count_by_status().items() if n}


# -- claim(ids) -----------------------------------------------------------------------
def test_claim_leases_the_pending_due_rows_it_is_given(harness: Harness) -> None:
    a, b = add(harness), add(harness, available_at=NOW - SECOND)
    not_due = add(harness, available_at=NOW + SECOND)

    claim = harness.store.claim([a, b, not_due, 10**12], now=NOW, lease_until=NOW + LEASE)

    assert ids(claim) == [b, a]  # oldest due first; missing and not-due rows dropped
    assert claim.lease_until == NOW + LEASE
    assert all(m.locked_until == NOW + LEASE for m in claim.messages)


def test_claim_skips_rows_leased_by_someone_else(harness: Harness) -> None:
    a = add(harness)
    assert ids(harness.store.claim([a], now=NOW, lease_until=NOW + LEASE)) == [a]

    assert ids(harness.store.claim([a], now=NOW + SECOND, lease_until=NOW + LEASE * 2)) == []


def test_claim_of_nothing_is_empty(harness: Harness) -> None:
    assert harness.store.claim([], now=NOW, lease_until=NOW + LEASE).messages == ()


# -- claim_due --------------------------------------------------------------------------
def test_claim_due_takes_due_rows_oldest_first_up_to_the_limit(harness: Harness) -> None:
    late = add(harness, available_at=NOW - SECOND)
    early = add(harness, available_at=NOW - 3 * SECOND)
    add(harness, available_at=NOW + SECOND)
    middle = add(harness, available_at=NOW - 2 * SECOND)

    assert ids(claim_due(harness, limit=2)) == [early, middle]
    assert ids(claim_due(harness, limit=2)) == [late]
    assert ids(claim_due(harness, limit=2)) == []


def test_claim_due_leaves_young_rows_to_their_on_commit_publisher(harness: Harness) -> None:
    add(harness, available_at=datetime.now(timezone.utc) - SECOND)  # due at once: fresh
    (created_at,) = {
        m.created_at for m in harness.store.claim([], now=NOW, lease_until=NOW).messages
    } or {harness.store.oldest_pending()}
    assert created_at is not None

    assert ids(claim_due(harness, created_before=created_at - SECOND)) == []
    assert len(ids(claim_due(harness, created_before=created_at))) == 1


def test_claim_due_skips_leased_rows_until_the_lease_expires(harness: Harness) -> None:
    a = add(harness)
    first = claim_due(harness, lease=LEASE)
    assert ids(first) == [a]

    assert ids(claim_due(harness, now=NOW + LEASE - SECOND)) == []
    second = claim_due(harness, now=NOW + LEASE)
    assert ids(second) == [a]
    assert second.messages[0].locked_until == NOW + 2 * LEASE


def test_concurrent_claimers_get_disjoint_rows(harness: Harness) -> None:
    every = {add(harness) for _ in range(60)}
    claimed: list[list[int]] = []
    barrier = threading.Barrier(4)
    lock = threading.Lock()

    def claimer(n: int) -> None:
        def work() -> None:
            barrier.wait(timeout=30)
            while True:
                claim = claim_due(harness, limit=7, lease=LEASE + n * timedelta(microseconds=1))
                if not claim.messages:
                    return
                with lock:
                    claimed.append(ids(claim))

        harness.in_thread(work)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    flat = [row_id for batch in claimed for row_id in batch]
    assert len(flat) == len(set(flat))
    assert set(flat) == every


# -- fencing and marks -------------------------------------------------------------------
def test_a_stale_claim_changes_nothing(harness: Harness) -> None:
    a = add(harness)
    stale = claim_due(harness)
    fresh = claim_due(harness, now=NOW + LEASE + SECOND)
    assert ids(fresh) == [a]

    assert harness.store.mark_published(stale, [a], now=NOW, keep=False) == 0
    assert harness.store.record_failure(stale, [a], error="late", retry_at=NOW) == 0
    assert harness.store.mark_published(fresh, [a], now=NOW, keep=False) == 1
    assert harness.store.mark_published(fresh, [a], now=NOW, keep=False) == 0


def test_mark_published_deletes_the_rows(harness: Harness) -> None:
    a, b = add(harness), add(harness)
    claim = claim_due(harness)

    assert harness.store.mark_published(claim, [a], now=NOW, keep=False) == 1
    assert rows(harness) == {MessageStatus.PENDING: 1}
    assert harness.store.mark_published(claim, [b], now=NOW, keep=False) == 1
    assert rows(harness) == {}


def test_mark_published_with_keep_marks_them_published(harness: Harness) -> None:
    a, b = add(harness), add(harness)
    claim = claim_due(harness)

    assert harness.store.mark_published(claim, [a, b], now=NOW + SECOND, keep=True) == 2
    assert rows(harness) == {MessageStatus.PUBLISHED: 2}
    assert ids(claim_due(harness, now=NOW + 10 * LEASE)) == []
    assert harness.store.mark_published(claim, [a, b], now=NOW, keep=True) == 0


def test_mark_published_of_nothing_changes_nothing(harness: Harness) -> None:
    claim = claim_due(harness)
    assert harness.store.mark_published(claim, [], now=NOW, keep=False) == 0
    assert harness.store.record_failure(claim, [], error="x", retry_at=None) == 0


# -- failures -----------------------------------------------------------------------------
def test_record_failure_counts_the_attempt_and_reschedules(harness: Harness) -> None:
    a = add(harness)
    claim = claim_due(harness)
    retry_at = NOW + 5 * SECOND

    assert harness.store.record_failure(claim, [a], error="broker down", retry_at=retry_at) == 1

    assert ids(claim_due(harness, now=retry_at - SECOND)) == []  # released, but not due yet
    (row,) = claim_due(harness, now=retry_at).messages
    assert (row.status, row.attempts, row.last_error) == (MessageStatus.PENDING, 1, "broker down")
    assert row.available_at == retry_at


def test_record_failure_counts_every_attempt_until_the_row_fails(harness: Harness) -> None:
    a = add(harness)
    now = NOW
    for attempt in range(1, 4):
        claim = claim_due(harness, now=now)
        assert ids(claim) == [a]
        assert claim.messages[0].attempts == attempt - 1
        now += SECOND
        retry_at = now if attempt < 3 else None  # the relay gives up at its third attempt
        assert (
            harness.store.record_failure(claim, [a], error=f"try {attempt}", retry_at=retry_at) == 1
        )

    assert rows(harness) == {MessageStatus.FAILED: 1}
    assert ids(claim_due(harness, now=now + 10 * LEASE)) == []
    assert harness.store.reset([a], now=now) == 1
    (row,) = claim_due(harness, now=now).messages
    assert (row.attempts, row.last_error) == (0, "try 3")


def test_record_failure_without_retry_at_fails_every_row(harness: Harness) -> None:
    a, b = add(harness), add(harness)
    claim = claim_due(harness)

    assert harness.store.record_failure(claim, [a, b], error="unknown task", retry_at=None) == 2
    assert rows(harness) == {MessageStatus.FAILED: 2}


def test_record_failure_touches_only_the_given_rows(harness: Harness) -> None:
    a, b = add(harness), add(harness)
    claim = claim_due(harness)

    harness.store.record_failure(claim, [a], error="x", retry_at=None)
    assert harness.store.mark_published(claim, [b], now=NOW, keep=True) == 1
    assert rows(harness) == {MessageStatus.FAILED: 1, MessageStatus.PUBLISHED: 1}


# -- reset --------------------------------------------------------------------------------
def test_reset_makes_pending_rows_due_now_and_frees_their_lease(harness: Harness) -> None:
    later = add(harness, available_at=NOW + LEASE)
    leased = add(harness)
    claim_due(harness)

    assert harness.store.reset([later, leased], now=NOW + SECOND) == 2
    assert sorted(ids(claim_due(harness, now=NOW + SECOND))) == sorted([later, leased])


def test_reset_leaves_published_rows_and_unknown_ids_alone(harness: Harness) -> None:
    a = add(harness)
    harness.store.mark_published(claim_due(harness), [a], now=NOW, keep=True)

    assert harness.store.reset([a, 10**12], now=NOW) == 0
    assert harness.store.reset([], now=NOW) == 0
    assert rows(harness) == {MessageStatus.PUBLISHED: 1}


def test_reset_leaves_a_failed_row_whose_task_is_pending_again(harness: Harness) -> None:
    failed = add(harness, task_id="dup")
    harness.store.record_failure(claim_due(harness), [failed], error="x", retry_at=None)
    add(harness, task_id="dup")

    assert harness.store.reset([failed], now=NOW) == 0
    assert rows(harness) == {MessageStatus.FAILED: 1, MessageStatus.PENDING: 1}


# -- maintenance --------------------------------------------------------------------------
def test_count_by_status_and_oldest_pending(harness: Harness) -> None:
    assert harness.store.oldest_pending() is None
    assert all(n == 0 for n in harness.store.count_by_status().values())
    a, b, _ = add(harness), add(harness), add(harness)
    claim = claim_due(harness)
    harness.store.mark_published(claim, [a], now=NOW, keep=True)
    harness.store.record_failure(claim, [b], error="x", retry_at=None)

    counts = harness.store.count_by_status()
    assert {s: counts.get(s, 0) for s in MessageStatus} == {
        MessageStatus.PENDING: 1,
        MessageStatus.PUBLISHED: 1,
        MessageStatus.FAILED: 1,
    }
    oldest = harness.store.oldest_pending()
    assert oldest is not None
    assert oldest.tzinfo is not None


def test_oldest_pending_is_the_earliest_created(harness: Harness) -> None:
    add(harness)
    first = harness.store.oldest_pending()
    add(harness)

    assert harness.store.oldest_pending() == first


def test_purge_deletes_old_rows_in_the_given_statuses_up_to_the_limit(harness: Harness) -> None:
    published = [add(harness) for _ in range(3)]
    failed = add(harness)
    add(harness, available_at=NOW + SECOND)  # stays pending: not due at the claim
    claim = claim_due(harness, limit=4)
    harness.store.mark_published(claim, published, now=NOW, keep=True)
    harness.store.record_failure(claim, [failed], error="x", retry_at=None)
    store = harness.store

    assert store.purge(statuses=[MessageStatus.PUBLISHED], older_than=PAST, limit=10) == 0
    assert store.purge(statuses=[MessageStatus.PUBLISHED], older_than=FAR_FUTURE, limit=2) == 2
    assert (
        store.purge(
            statuses=[MessageStatus.PUBLISHED, MessageStatus.FAILED],
            older_than=FAR_FUTURE,
            limit=10,
        )
        == 2
    )
    assert rows(harness) == {MessageStatus.PENDING: 1}


@pytest.mark.parametrize("bad", [NOW.replace(tzinfo=None)])
def test_naive_datetimes_are_refused(harness: Harness, bad: datetime) -> None:
    with pytest.raises(ValueError, match="naive"):
        new_message(available_at=bad)


def test_claim_due_does_not_hold_back_parked_rows_for_the_grace(harness: Harness) -> None:
    # A parked retry (due after it was written) has no on-commit publisher to wait for.
    real_now = datetime.now(timezone.utc)
    parked = add(harness, available_at=real_now + 2 * SECOND)
    fresh = add(harness, available_at=real_now - SECOND)
    later = real_now + 3 * SECOND

    claimed = ids(claim_due(harness, now=later, created_before=real_now - 60 * SECOND))

    assert claimed == [parked]
    assert fresh not in claimed
