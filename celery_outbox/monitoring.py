"""The store's part in monitoring: the backlog of pending rows and the last sweep.

What ``outbox status``, the health check (:mod:`celery_outbox.health`) and the metrics
read. Times are the database's where the store can read its clock (PostgreSQL,
MySQL/MariaDB), so a host whose clock is off neither hides an old row nor reports a
fresh sweep as stale; the in-memory store and SQLite (one host) use the store's clock.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery_outbox.clock import utcnow
from celery_outbox.records import DeadLetterStatus

#: The key of the sweep's row in the sweep table (one row per database).
SWEEP_NAME = "sweep"


@dataclass(frozen=True, kw_only=True)
class Backlog:
    """The rows of one database still to publish, at one instant of its clock.

    ``due`` rows are ``pending`` and due now (a publisher should have them), ``parked``
    rows are ``pending`` and due later (parked retries, countdowns, rows rescheduled
    after a failed publish), ``failed`` rows gave up publishing.
    ``oldest_due_age``: how long the longest-waiting due row has waited, or ``None``
    without due rows. A row waits from its due time, or, once a publish of it failed,
    from its creation (a broker outage shows as a growing age, not as fresh retries).
    """

    due: int
    parked: int
    failed: int
    oldest_due_age: timedelta | None


@dataclass(frozen=True, kw_only=True)
class LastSweep:
    """When a sweep of one database last recorded itself, and how long ago that was
    (both by the database's clock; ``age`` is never negative)."""

    at: datetime
    age: timedelta


class MonitoredStore(abc.ABC):
    """The backlog and the sweep record (a part of every
    :class:`~celery_outbox.storage.OutboxStore`).

    :meth:`backlog` is required. The sweep record is optional: these defaults keep
    none (:meth:`keeps_sweeps` is false), and the health check then says nothing
    about sweeps.
    """

    def now(self, *, using: str | None = None) -> datetime:
        """The current time of database ``using``'s clock, aware UTC.

        Every time a store writes or compares for the core (``available_at``, leases,
        ``created_at`` against the grace, parked due times) is on this clock, so hosts
        whose clocks disagree agree on it (:mod:`celery_outbox.database_clock`). No round
        trip per call: a reading of the database's clock serves for a while. This
        default, for a store that cannot read its database's clock, is this process's.
        """
        return utcnow()

    @abc.abstractmethod
    def backlog(self, *, using: str | None = None, bound: int | None = None) -> Backlog:
        """Count the due, the parked and the failed rows and age the oldest due one.

        A few reads of ranges of the ``status, available_at`` index, committed data.
        ``bound``: a store may read at most about that many index entries per count and
        report a larger count as its database's estimate (:mod:`celery_outbox.estimates`;
        the oldest age is then that of the ``bound`` rows due longest); ``None``: exact.
        """

    @abc.abstractmethod
    def count_dead_letters(
        self, *, using: str | None = None, bound: int | None = None
    ) -> Mapping[DeadLetterStatus, int]:
        """How many dead letters there are per status (every status present, 0 when none).

        One read of the ``status, failed_at`` index, committed data; ``bound`` as for
        :meth:`backlog`.
        """

    def keeps_sweeps(self) -> bool:
        """Whether this store records when the sweep last ran."""
        return False

    def record_sweep(self, *, every: timedelta, using: str | None = None) -> bool:
        """Record that a sweep of ``using`` runs now (the database's clock), unless the
        record is younger than ``every``; its own short transaction.

        A skipped record writes nothing (no row version, no lock), so a sweep that
        runs many times per ``every`` costs one read each. Concurrent callers (several
        sweepers) never fail and write at most once per ``every`` between them, but
        for a race of two writers at the same instant. Returns whether it wrote.
        """
        return False

    def last_sweep(self, *, using: str | None = None) -> LastSweep | None:
        """The last sweep recorded for ``using``, or ``None`` (none yet, or no record)."""
        return None
