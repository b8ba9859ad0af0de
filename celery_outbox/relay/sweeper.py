"""The sweeper, and the claim it makes ahead while a batch publishes.

A sweep's next claim, made on a thread of its own while the batch before it publishes.

Only where the store allows it (:meth:`ClaimThreads.claims_aside
<celery_outbox.store.base.ClaimThreads.claims_aside>`), and only once a batch came
back full (a backlog): a sweep of one batch, the usual case, starts no thread. The thread
lives for one sweep and claims with the sweep's own parameters and clock; its rows are
leased like any claim's. A claim made ahead that the sweep does not publish (it stopped:
the broker is unreachable) is given back at once, due as its oldest row was, so the next
sweep takes it instead of waiting ``outbox_claim_lease``. A claim that fails raises its
:class:`~celery_outbox.exceptions.StoreError` where the sweep takes it.

The sweeper: publish the outbox rows that their on-commit publisher never published.

A row stays ``pending`` when its process died after COMMIT, or when the broker was down
at commit time. A sweep claims due rows batch after batch (``SKIP LOCKED`` where the
database has it, each batch leased until ``now + outbox_claim_lease``), publishes each
batch through the relay's one broker connection, and lets the relay mark or reschedule
the batch in one statement. Claims make concurrent sweeps safe by construction: two
sweepers never hold the same row, and one whose lease ran out cannot mark the rows
another sweeper took over (fencing).

A sweep also records that it ran (``store.record_sweep``, read by the health check): a
sweeper asks the store at most twice per ``outbox_sweep_interval`` and the store writes
at most once per interval, however often the relay loop sweeps and however many run.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING

from celery_outbox.long_text import bounded_logger
from celery_outbox.store.records import Claim

if TYPE_CHECKING:
    from celery_outbox.store.base import OutboxStore
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery import Celery

from celery_outbox.clock import Clock
from celery_outbox.config import OutboxConfig
from celery_outbox.exceptions import StoreError
from celery_outbox.relay.loop import RelayLoop
from celery_outbox.relay.relay import PublishPath, Relay
from celery_outbox.store.base import OutboxStore
from celery_outbox.store.records import MessageStatus

logger = bounded_logger(__name__)


# --- A sweep's next claim, made on a thread of its own while the batch before it publishes.


class ClaimAhead:
    """The next claim of one sweep of database ``using``, on a thread of its own.

    Use it as a context manager: leaving it gives back a claim not taken and ends the
    thread (its connections released by the store, on that thread).
    """

    def __init__(
        self, store: OutboxStore, claim: Callable[[], Claim], *, using: str | None
    ) -> None:
        self.store = store
        self.claim = claim
        self.using = using
        self._thread: ThreadPoolExecutor | None = None
        self._next: Future[Claim] | None = None

    def start(self) -> bool:
        """Start claiming the next batch, if the store allows it now; whether it started."""
        if self._next is not None:
            raise RuntimeError("the next claim is already being made")
        if not self.store.claims_aside(self.using):
            return False
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="celery-outbox-claim")
        self._next = self._thread.submit(self.claim)
        return True

    def take(self) -> Claim:
        """The claim :meth:`start` began, once made; raises what it raised."""
        if self._next is None:
            raise RuntimeError("no claim was started")
        future = self._next
        self._next = None
        return future.result()

    def __enter__(self) -> ClaimAhead:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._next is not None:
                self._give_back(self.take())
        except Exception:
            if exc is None:
                raise
            logger.warning(
                "celery-outbox: the claim made ahead failed, or its rows could not be given "
                "back (they wait for their lease to end)",
                exc_info=True,
            )
        finally:
            if self._thread is not None:
                self._thread.submit(self.store.end_claims_aside).result()
                self._thread.shutdown()
                self._thread = None

    def _give_back(self, claim: Claim) -> None:
        # The rows are pending and leased to this sweep (the lease is far from over):
        # pending again, unleased, due as the oldest of them was.
        if claim.messages:
            due = min(m.available_at for m in claim.messages)
            self.store.reset([m.id for m in claim.messages], now=due, using=self.using)


# --- The sweeper: publish the outbox rows that their on-commit publisher never published.

#: How long one sweep keeps claiming batches before it leaves the rest to the next one.
SWEEP_BUDGET = timedelta(seconds=30)


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    """What a sweep did.

    ``published`` rows reached the broker; ``rescheduled`` rows failed to and wait for
    their next attempt; ``failed`` rows gave up (too many attempts, unknown task or
    undecodable payload). ``more`` is true when the time budget ran out with due rows
    left (a sweep that finds the broker unreachable stops without it: the rows it
    claimed are rescheduled, the others wait for the next sweep). ``purged`` published
    rows outlived ``outbox_keep_published`` and were deleted, ``purged_completed``
    ``CompletedTask`` rows and done chord joins outlived ``outbox_keep_completed``.
    """

    published: int = 0
    failed: int = 0
    rescheduled: int = 0
    batches: int = 0
    more: bool = False
    purged: int = 0
    purged_completed: int = 0

    def __add__(self, other: SweepReport) -> SweepReport:
        return SweepReport(
            published=self.published + other.published,
            failed=self.failed + other.failed,
            rescheduled=self.rescheduled + other.rescheduled,
            batches=self.batches + other.batches,
            more=self.more or other.more,
            purged=self.purged + other.purged,
            purged_completed=self.purged_completed + other.purged_completed,
        )

    def as_dict(self) -> dict[str, int | bool]:
        """The report as a JSON-ready mapping (the sweep task's result)."""
        return {
            "published": self.published,
            "failed": self.failed,
            "rescheduled": self.rescheduled,
            "batches": self.batches,
            "more": self.more,
            "purged": self.purged,
            "purged_completed": self.purged_completed,
        }


class Sweeper:
    """Claims due outbox rows in batches and publishes them through a :class:`Relay`.

    Parameters
    ----------
    app
        The Celery app whose tasks the rows name.
    store
        Where the rows live.
    relay
        Publishes a claim through one broker connection per thread.
    config
        ``sweep_batch_size``, ``sweep_batch_bytes``, ``publish_grace``, ``claim_lease``
        and ``publish_max_attempts`` are used.
    clock
        The current aware UTC time for due times, leases, the grace and purges; by
        default each database's own clock (``store.now``), so a host whose clock is
        off neither takes rows early nor publishes a row twice.
    budget
        How long one :meth:`sweep` may keep claiming batches.
    """

    def __init__(
        self,
        *,
        app: Celery,
        store: OutboxStore,
        relay: Relay,
        config: OutboxConfig,
        clock: Clock | None = None,
        budget: timedelta = SWEEP_BUDGET,
    ) -> None:
        self.app = app
        self.store = store
        self.relay = relay
        self.config = config
        self.clock = clock
        self.budget = budget
        self._noted: dict[str | None, datetime] = {}

    # -- one pass -------------------------------------------------------------------
    def sweep(self, using: str | None = None, *, path: PublishPath = "sweep") -> SweepReport:
        """Publish the due rows of database ``using``, batch after batch.

        Each batch holds at most ``outbox_sweep_batch_size`` rows and stops at the row
        that brings it to ``outbox_sweep_batch_bytes`` of payload, so memory is bounded
        however large the rows. Stops after a short batch (nothing more is due), when the
        time budget is spent, or when a batch published nothing because the broker is
        unreachable. Where the store allows it, the batch after a full one is claimed
        on a thread while the full one publishes (:mod:`celery_outbox.relay.sweeper`: two
        batches in memory at most); a sweep that stops gives such a batch back, due again.
        ``path`` names the entry point in each publish span (``relay`` from :meth:`run`).

        Raises
        ------
        StoreError
            When the store fails; rows already claimed stay leased until their lease ends.
        """
        deadline = self.now(using) + self.budget
        report = SweepReport()
        with ClaimAhead(self.store, lambda: self._claim(using), using=using) as ahead:
            self._note_sweep(using)
            claim = self._claim(using)
            while claim.messages:
                more = self._full(claim)
                over = self.now(using) >= deadline
                # A full batch means a backlog: the next batch is claimed as this one publishes.
                started = more and not over and ahead.start()
                batch = self._publish(claim, using, path)
                report += batch
                if not more or _broker_down(batch):
                    break
                if over:
                    return report + SweepReport(more=True)
                self._note_sweep(using)
                claim = ahead.take() if started else self._claim(using)
        return report

    def sweep_all(
        self, aliases: Sequence[str | None] | None = None, *, path: PublishPath = "sweep"
    ) -> SweepReport:
        """:meth:`sweep` each of ``aliases`` (default: ``store.sweep_aliases()``).

        A database whose store fails (down, or an alias removed from settings) does not
        stop the others: each is swept, then the failures are raised as one
        :class:`StoreError` naming their aliases (a single database's error is raised as is).
        """
        report = SweepReport()
        aliases = list(self.store.sweep_aliases() if aliases is None else aliases)
        failed: list[tuple[str | None, StoreError]] = []
        for alias in aliases:
            try:
                report += (
                    self.sweep(alias, path=path)
                    + self.purge_expired(alias)
                    + self.purge_completed(alias)
                )
            except StoreError as exc:
                if len(aliases) == 1:
                    raise
                failed.append((alias, exc))
                logger.error("celery-outbox: could not sweep database %r; sweeping on", alias)
        if failed:
            names = ", ".join(repr(alias) for alias, _ in failed)
            errors = " ".join(f"{alias!r}: {exc}" for alias, exc in failed)
            raise StoreError(
                f"celery-outbox: could not sweep database(s) {names} (the others were swept, "
                f"{report.as_dict()}). {errors}"
            ) from failed[0][1]
        return report

    def purge_expired(self, using: str | None = None) -> SweepReport:
        """Delete one batch of published rows older than ``outbox_keep_published``.

        One bounded batch per sweep, so a backlog drains over a few ticks without a
        long-running DELETE. Nothing to do when published rows are not kept.
        """
        keep = self.config.keep_published
        if keep <= timedelta(0):
            return SweepReport()
        purged = self.store.purge(
            statuses=[MessageStatus.PUBLISHED],
            older_than=self.now(using) - keep,
            limit=self.config.sweep_batch_size,
            using=using,
        )
        return SweepReport(purged=purged)

    def purge_completed(self, using: str | None = None) -> SweepReport:
        """Delete one batch of ``CompletedTask`` rows older than ``outbox_keep_completed``
        (a duplicate of such a task that arrives later runs again), and one batch of the
        joins of chords done before then.
        """
        older_than = self.now(using) - self.config.keep_completed
        limit = self.config.sweep_batch_size
        purged = self.store.purge_completed(older_than=older_than, limit=limit, using=using)
        purged += self.store.purge_joins(older_than=older_than, limit=limit, using=using)
        return SweepReport(purged_completed=purged)

    def _note_sweep(self, using: str | None) -> None:
        """Record that the sweep of ``using`` runs: the store is asked at most every half
        interval (a read; it writes when its record is an interval old), so a long sweep
        keeps its record fresh too. A store that cannot record it is logged, and the
        sweep goes on: publishing matters more than the health check's record.
        """
        now = self.now(using)
        every = self.config.sweep_interval
        noted = self._noted.get(using)
        if noted is not None and now - noted < every / 2:
            return
        self._noted[using] = now
        try:
            self.store.record_sweep(every=every, using=using)
        except StoreError:
            logger.warning(
                "celery-outbox: could not record the sweep of %s; sweeping on",
                using or "the default database",
                exc_info=True,
            )

    def now(self, using: str | None = None) -> datetime:
        """Database ``using``'s clock (``store.now``), unless a ``clock`` was given."""
        return self.store.now(using=using) if self.clock is None else self.clock()

    def _claim(self, using: str | None) -> Claim:
        now = self.now(using)
        return self.store.claim_due(
            now=now,
            created_before=now - self.config.publish_grace,
            limit=self.config.sweep_batch_size,
            lease_until=now + self.config.claim_lease,
            max_bytes=self.config.sweep_batch_bytes,
            using=using,
        )

    def _full(self, claim: Claim) -> bool:
        """Whether the claim stopped at a limit (rows or bytes): more may be due."""
        config = self.config
        if len(claim.messages) >= config.sweep_batch_size:
            return True
        return sum(len(m.payload) for m in claim.messages) >= config.sweep_batch_bytes

    def _publish(self, claim: Claim, using: str | None, path: PublishPath) -> SweepReport:
        outcome = self.relay.publish_claim(claim, using=using, validate=True, path=path)
        return SweepReport(
            published=len(outcome.published),
            failed=len(outcome.gave_up),
            rescheduled=len(outcome.failed) - len(outcome.gave_up),
            batches=1,
        )

    # -- the continuous relay loop ----------------------------------------------------
    def run(
        self,
        stop: threading.Event,
        poll: float | timedelta,
        *,
        aliases: Sequence[str | None] | None = None,
        listen: bool = True,
    ) -> None:
        """Sweep ``aliases`` (default: every alias of the store) until ``stop`` is set:
        the relay loop of ``outbox relay`` (:class:`~celery_outbox.relay.loop.RelayLoop`).

        ``poll`` (seconds, or a timedelta) is the longest pause between passes that found
        nothing more to do; the pause ends sooner when a parked row comes due and, with
        ``listen``, at a PostgreSQL ``NOTIFY`` of a row nobody publishes at commit.
        """
        RelayLoop(self, listen=listen).run(stop, poll, aliases=aliases)


def _broker_down(batch: SweepReport) -> bool:
    """A batch that published nothing and rescheduled rows: the broker is unreachable."""
    return batch.published == 0 and batch.rescheduled > 0
