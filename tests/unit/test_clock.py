"""DatabaseClock: one read of the database's clock per interval, advanced on the monotonic
clock, whatever the wall clock of this host says.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from celery_outbox.clock import DatabaseClock

DB_NOW = datetime(2031, 6, 1, 12, 0, tzinfo=timezone.utc)


class Ticks:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Database:
    """The database's clock: counts its reads, runs ``skew`` seconds off ``DB_NOW``."""

    def __init__(self, ticks: Ticks) -> None:
        self.ticks, self.reads, self.skew = ticks, 0, 0.0

    def __call__(self) -> datetime:
        self.reads += 1
        return DB_NOW + timedelta(seconds=self.ticks.now - 100.0 + self.skew)


def test_reads_the_database_once_per_interval_and_advances_on_the_monotonic_clock() -> None:
    ticks = Ticks()
    database = Database(ticks)
    clock = DatabaseClock(database, every=timedelta(seconds=30), monotonic=ticks)
    assert clock() == DB_NOW
    ticks.now += 12.5
    assert clock() == DB_NOW + timedelta(seconds=12.5)
    assert database.reads == 1
    ticks.now += 20
    assert clock() == DB_NOW + timedelta(seconds=32.5)
    assert database.reads == 2


def test_a_new_reading_replaces_the_advanced_one() -> None:
    ticks = Ticks()
    database = Database(ticks)
    clock = DatabaseClock(database, every=timedelta(seconds=30), monotonic=ticks)
    clock()
    database.skew = 5.0  # the database's clock was set forward meanwhile
    ticks.now += 30
    assert clock() == DB_NOW + timedelta(seconds=35)


def test_never_gives_a_time_before_one_it_gave() -> None:
    ticks = Ticks()
    database = Database(ticks)
    clock = DatabaseClock(database, every=timedelta(seconds=30), monotonic=ticks)
    clock()
    ticks.now += 29
    first = clock()
    database.skew = -2.0
    ticks.now += 1
    assert clock() == first  # the new reading is 1 s behind: held, not gone back
    ticks.now += 3
    assert clock() == DB_NOW + timedelta(seconds=31)


def test_a_failed_read_raises_and_the_next_call_reads_again() -> None:
    ticks, calls = Ticks(), []

    def read() -> datetime:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("database down")
        return DB_NOW

    clock = DatabaseClock(read, monotonic=ticks)
    with pytest.raises(ConnectionError):
        clock()
    assert clock() == DB_NOW
    assert len(calls) == 2


def test_a_naive_reading_is_refused() -> None:
    clock = DatabaseClock(lambda: datetime(2031, 6, 1, 12, 0), monotonic=Ticks())
    with pytest.raises(ValueError, match="naive"):
        clock()


def test_threads_share_one_read() -> None:
    ticks = Ticks()
    database = Database(ticks)
    clock = DatabaseClock(database, monotonic=ticks)
    threads = [threading.Thread(target=clock) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert database.reads == 1
