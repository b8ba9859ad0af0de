"""The clock: the one place the core reads the time, and the database's clock.

The one place the core reads the time (inject ``clock`` everywhere else).

The database's clock, as every process that writes or compares outbox times reads it.

Hosts' clocks may disagree. Every time one process writes and another compares
(``available_at``, ``locked_until``, ``created_at`` against the grace, leases, parked due
times) is taken from the database's clock, never from the host's, so a producer, worker
or sweeper whose clock is a minute off publishes nothing twice and runs nothing early.

Reading the database's clock costs a round trip, and a dispatch must not pay one more.
:class:`DatabaseClock` reads it once per ``every`` (one ``SELECT`` of
``statement_timestamp()`` on PostgreSQL, ``UTC_TIMESTAMP(6)`` on MySQL/MariaDB) and
advances the reading with this process's *monotonic* clock in between, which no change of
the wall clock (an NTP step, a wrong time zone, a host a minute off) moves. Its error is
half the read's round trip plus the monotonic clock's drift over ``every``: milliseconds,
against a grace and leases of seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from celery_outbox.store.records import check_aware

# --- The one place the core reads the time (inject ``clock`` everywhere else).

#: A callable returning the current aware UTC time.
Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(timezone.utc)


# --- The database's clock, as every process that writes or compares outbox times reads it.

#: How long a reading of the database's clock is advanced on the monotonic clock before
#: the database is asked again.
CLOCK_READ_EVERY = timedelta(seconds=30)


class DatabaseClock:
    """The database's current time: a reading of ``read`` advanced on ``monotonic``.

    Parameters
    ----------
    read
        Reads the database's current time (aware UTC): one round trip.
    every
        How long one reading serves before ``read`` is called again.
    monotonic
        Seconds on a clock no wall-clock change moves (``time.monotonic``).

    Calling the instance gives the database's time now, never earlier than a time it
    gave before. Thread-safe: one thread reads
    when the reading is stale, the others wait for it. A failed read raises (whatever
    ``read`` raised) and the next call reads again.
    """

    def __init__(
        self,
        read: Callable[[], datetime],
        *,
        every: timedelta = CLOCK_READ_EVERY,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.read = read
        self.every = every.total_seconds()
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._reading: tuple[datetime, float] | None = None
        self._given = datetime.min.replace(tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        reading = self._reading
        now = self.monotonic()
        if reading is None or not 0 <= now - reading[1] < self.every:
            reading = self._read()
            now = self.monotonic()
        at, taken = reading
        value = at + timedelta(seconds=now - taken)
        # Never earlier than a time already given (a new reading may be a little behind
        # the last one advanced, by its round trip): no row is due before its birth.
        if value < self._given:
            return self._given
        self._given = value
        return value

    def serves(self, seconds: float) -> bool:
        """Whether the reading held serves ``seconds`` more (a call makes no round trip)."""
        reading = self._reading
        return reading is not None and 0 <= self.monotonic() - reading[1] < self.every - seconds

    def _read(self) -> tuple[datetime, float]:
        with self._lock:
            reading = self._reading
            if reading is not None and 0 <= self.monotonic() - reading[1] < self.every:
                return reading  # another thread read it while this one waited
            before = self.monotonic()
            at = check_aware("the database's time", self.read())
            after = self.monotonic()
            # The database read its clock somewhere within the round trip: its middle.
            self._reading = reading = (at, (before + after) / 2)
            return reading
