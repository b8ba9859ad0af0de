"""The backlog and the sweep record (``celery_outbox.store.base``) on every store.

Times are the database's clock, so rows are due long ago or far in the future, never
"now" as the tests' fixed ``NOW`` reads it.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

from celery_outbox.store.base import Backlog
from celery_outbox.store.records import Claim
from tests.contract.factories import FAR_FUTURE, new_message
from tests.contract.harness import Harness

HOUR = timedelta(hours=1)
#: Slack for the gap between the database's clock and this process's (same host here).
SLACK = timedelta(seconds=30)


def wall() -> datetime:
    return datetime.now(timezone.utc)


def add(h: Harness, available_at: datetime) -> int:
    row_id = h.store.add(new_message(available_at=available_at))
    assert row_id is not None
    return row_id


def fail_publish(h: Harness, row_id: int, *, retry_at: datetime | None) -> None:
    now = wall()
    claim: Claim = h.store.claim([row_id], now=now, lease_until=now + HOUR)
    assert h.store.record_failure(claim, [row_id], error="broker down", retry_at=retry_at) == 1


# -- backlog ------------------------------------------------------------------------------
def test_an_empty_outbox_has_no_backlog(harness: Harness) -> None:
    assert harness.store.backlog() == Backlog(due=0, parked=0, failed=0, oldest_due_age=None)


def test_backlog_counts_due_parked_and_failed_rows_and_ages_the_oldest_due(
    harness: Harness,
) -> None:
    add(harness, wall() - HOUR)
    add(harness, wall() - timedelta(minutes=1))
    add(harness, FAR_FUTURE)
    fail_publish(harness, add(harness, wall() - 2 * HOUR), retry_at=None)
    published = add(harness, wall() - 3 * HOUR)
    claim = harness.store.claim([published], now=wall(), lease_until=wall() + HOUR)
    harness.store.mark_published(claim, [published], now=wall(), keep=True)

    backlog = harness.store.backlog()

    assert (backlog.due, backlog.parked, backlog.failed) == (2, 1, 1)
    assert backlog.oldest_due_age is not None
    assert HOUR - SLACK < backlog.oldest_due_age < HOUR + SLACK


def test_a_row_whose_publish_failed_waits_from_its_creation(harness: Harness) -> None:
    # Rescheduled into the past: by its due time it would have waited two hours; it was
    # created a moment ago, and that is how long it has waited.
    fail_publish(harness, add(harness, wall()), retry_at=wall() - 2 * HOUR)

    backlog = harness.store.backlog()

    assert (backlog.due, backlog.parked) == (1, 0)
    assert backlog.oldest_due_age is not None
    assert backlog.oldest_due_age < SLACK


def test_rows_due_later_are_parked_and_age_nothing(harness: Harness) -> None:
    add(harness, FAR_FUTURE)
    assert harness.store.backlog() == Backlog(due=0, parked=1, failed=0, oldest_due_age=None)


# -- the sweep record -----------------------------------------------------------------------
def test_every_store_keeps_the_sweep_record_and_has_none_at_first(harness: Harness) -> None:
    assert harness.store.keeps_sweeps()
    assert harness.store.last_sweep() is None


def test_a_sweep_is_recorded_on_the_databases_clock(harness: Harness) -> None:
    before = wall()
    assert harness.store.record_sweep(every=HOUR) is True

    last = harness.store.last_sweep()

    assert last is not None
    assert before - SLACK < last.at < wall() + SLACK
    assert timedelta(0) <= last.age < SLACK


def test_a_record_younger_than_the_interval_is_not_written_again(harness: Harness) -> None:
    assert harness.store.record_sweep(every=HOUR) is True
    first = harness.store.last_sweep()

    assert [harness.store.record_sweep(every=HOUR) for _ in range(5)] == [False] * 5

    last = harness.store.last_sweep()
    assert first is not None
    assert last is not None
    assert last.at == first.at
    assert last.age >= first.age


def test_a_record_older_than_the_interval_is_written_again(harness: Harness) -> None:
    assert harness.store.record_sweep(every=HOUR) is True
    first = harness.store.last_sweep()
    threading.Event().wait(0.01)

    assert harness.store.record_sweep(every=timedelta(microseconds=1)) is True

    last = harness.store.last_sweep()
    assert first is not None
    assert last is not None
    assert last.at > first.at


def test_concurrent_sweepers_record_the_first_sweep_once_without_errors(
    harness: Harness,
) -> None:
    written: list[bool] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)
    lock = threading.Lock()

    def sweeper() -> None:
        def work() -> None:
            barrier.wait(timeout=30)
            outcome = harness.store.record_sweep(every=HOUR)
            with lock:
                written.append(outcome)

        try:
            harness.in_thread(work)
        except BaseException as exc:  # collected: an error in a thread fails the test
            errors.append(exc)

    threads = [threading.Thread(target=sweeper) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert sorted(written) == [False, False, False, True]
    assert harness.store.last_sweep() is not None


def test_concurrent_sweepers_renewing_an_old_record_never_fail(harness: Harness) -> None:
    assert harness.store.record_sweep(every=HOUR) is True
    first = harness.store.last_sweep()
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def sweeper() -> None:
        def work() -> None:
            barrier.wait(timeout=30)
            for _ in range(5):
                harness.store.record_sweep(every=timedelta(microseconds=1))

        try:
            harness.in_thread(work)
        except BaseException as exc:  # collected: an error in a thread fails the test
            errors.append(exc)

    threads = [threading.Thread(target=sweeper) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    last = harness.store.last_sweep()
    assert errors == []
    assert first is not None
    assert last is not None
    assert last.at > first.at
