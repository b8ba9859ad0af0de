"""Bounded counts (``bound=``, what a metrics scrape asks for) on every store: exact up
to the bound; above it, PostgreSQL's planner estimate (never below ``bound + 1``),
exact elsewhere (:mod:`celery_outbox.store.counts`).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from celery_outbox.store.records import DeadLetterStatus
from tests.contract.factories import FAR_FUTURE, new_dead_letter, new_message
from tests.contract.harness import Harness

HOUR = timedelta(hours=1)


def wall() -> datetime:
    return datetime.now(timezone.utc)


def estimates(h: Harness) -> bool:
    """Whether the store's database is PostgreSQL (the one that estimates)."""
    engine = getattr(h, "engine", None)
    if engine is not None:
        return bool(engine.dialect.name == "postgresql")
    if type(h).__name__ == "DjangoHarness":
        from django.db import connection

        return bool(connection.vendor == "postgresql")
    return False


def analyze(h: Harness) -> None:
    """Fresh statistics, as autovacuum leaves them (the estimates read them)."""
    engine = getattr(h, "engine", None)
    tables = "celery_outbox_message, celery_outbox_deadletter"
    if engine is not None:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"ANALYZE {tables}")
    else:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {tables}")


def seed(h: Harness, *, parked: int, due: int, letters: int) -> None:
    for _ in range(parked):
        h.store.add(new_message(available_at=FAR_FUTURE))
    for i in range(due):
        h.store.add(new_message(available_at=wall() - HOUR - i * timedelta(minutes=1)))
    for _ in range(letters):
        h.store.add_dead_letter(new_dead_letter())


def test_counts_up_to_the_bound_are_exact_on_every_store(harness: Harness) -> None:
    seed(harness, parked=3, due=2, letters=3)

    backlog = harness.store.backlog(bound=3)
    letters = harness.store.count_dead_letters(bound=3)

    assert (backlog.due, backlog.parked, backlog.failed) == (2, 3, 0)
    assert letters[DeadLetterStatus.DEAD] == 3
    assert backlog.oldest_due_age is not None
    assert backlog.oldest_due_age > HOUR


def test_counts_above_the_bound_are_estimated_on_postgresql_and_exact_elsewhere(
    harness: Harness,
) -> None:
    seed(harness, parked=40, due=30, letters=40)
    if estimates(harness):
        analyze(harness)

    backlog = harness.store.backlog(bound=5)
    letters = harness.store.count_dead_letters(bound=5)
    workflows = harness.store.count_workflows(bound=5)

    if estimates(harness):
        # the planner's figures from fresh statistics of a small table: near the truth
        # (40, 30, 40), not the bound
        assert 20 <= backlog.parked <= 80
        assert 15 <= backlog.due <= 60
        assert 20 <= letters[DeadLetterStatus.DEAD] <= 80
    else:
        assert (backlog.parked, backlog.due, letters[DeadLetterStatus.DEAD]) == (40, 30, 40)
    assert letters[DeadLetterStatus.REQUEUED] == 0
    assert sum(workflows.values()) == 0
    # the longest-due rows are read first: the oldest wait is exact
    assert backlog.oldest_due_age is not None
    assert HOUR + timedelta(minutes=29) < backlog.oldest_due_age < HOUR + timedelta(minutes=31)


def test_without_a_bound_counts_are_exact_on_every_store(harness: Harness) -> None:
    seed(harness, parked=12, due=11, letters=0)

    backlog = harness.store.backlog()

    assert (backlog.due, backlog.parked) == (11, 12)


@pytest.mark.parametrize("bound", [0, 1])
def test_a_tiny_bound_still_reports_the_rows_exist(harness: Harness, bound: int) -> None:
    seed(harness, parked=2, due=0, letters=0)

    assert harness.store.backlog(bound=bound).parked >= bound + 1
