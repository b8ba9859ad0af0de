"""Counts exact up to a cap and estimated beyond, on real PostgreSQL (and SQLite)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection

from django_outbox.admin.counts import (
    HOUR_SAMPLE,
    Count,
    bounded_count,
    hour_count,
    hourly_counts,
)
from django_outbox.models import DeadLetter
from tests.django.admin_app import make_letter

START = datetime(2026, 3, 4, 5, 0, tzinfo=timezone.utc)


@pytest.mark.django_db
def test_a_count_up_to_the_cap_is_exact() -> None:
    for _ in range(3):
        make_letter()
    assert bounded_count(DeadLetter.objects.all(), 3) == Count(value=3)


@pytest.mark.django_db
def test_beyond_the_cap_postgresql_estimates_and_others_give_a_lower_bound() -> None:
    for _ in range(10):
        make_letter()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {DeadLetter._meta.db_table}")
        assert bounded_count(DeadLetter.objects.filter(status="dead"), 3) == Count(
            value=10, exact=False
        )
    else:
        assert bounded_count(DeadLetter.objects.all(), 3) == Count(
            value=3, exact=False, lower_bound=True
        )


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (Count(value=12_345), "12,345"),
        (Count(value=12_345, exact=False), "about 12,345"),
        (Count(value=10_000, exact=False, lower_bound=True), "more than 10,000"),
    ],
)
def test_a_count_says_what_it_is(count: Count, text: str) -> None:
    assert str(count) == text


def test_an_hour_below_the_sample_is_exact() -> None:
    assert hour_count(START, 12, None, START + timedelta(hours=3)) == Count(value=12)


def test_a_full_hour_above_the_sample_is_estimated_from_its_first_rows() -> None:
    sample_end = START + timedelta(minutes=6)  # the first 1,000 rows took 6 minutes
    found = hour_count(START, HOUR_SAMPLE, sample_end, START + timedelta(hours=3))
    assert found == Count(value=HOUR_SAMPLE * 10, exact=False)


def test_the_current_hour_is_estimated_over_its_elapsed_part() -> None:
    found = hour_count(
        START, HOUR_SAMPLE, START + timedelta(minutes=6), START + timedelta(minutes=12)
    )
    assert found == Count(value=HOUR_SAMPLE * 2, exact=False)


def test_sqlite_text_timestamps_are_read() -> None:
    found = hour_count(START, HOUR_SAMPLE, "2026-03-04 05:30:00", START + timedelta(hours=2))
    assert found == Count(value=HOUR_SAMPLE * 2, exact=False)


@pytest.mark.django_db
def test_hourly_counts_put_each_row_in_its_hour() -> None:
    now = datetime.now(timezone.utc)
    for back in (0, 0, 2, 30):  # the last is older than the chart
        make_letter(failed_at=now - timedelta(hours=back))
    counts = hourly_counts(DeadLetter.objects.all(), "failed_at", now)
    assert len(counts) == 24
    assert [c.count.value for c in counts[-3:]] == [1, 0, 2]
    assert sum(c.count.value for c in counts) == 3
    assert all(c.count.exact for c in counts)
