"""Whether a store lets a sweep claim its next batch on another thread (a part of the store).

A sweep of a backlog waits about as long for each claim (the lease ``UPDATE`` and the
transfer of its rows) as it spends publishing the batch before. With a store that says
yes, the sweeper claims the next batch on a thread of its own while the current one
publishes (:mod:`celery_outbox.claim_ahead`). That thread uses a connection of its own:
the store says yes only where it sees the same committed rows there and concurrent
claims are safe (``SKIP LOCKED``), never inside the caller's transaction, whose
uncommitted rows another connection cannot see.
"""

from __future__ import annotations


class ClaimThreads:
    """Claims on a thread beside the caller's; by default a store allows none."""

    def claims_aside(self, using: str | None = None) -> bool:
        """Whether :meth:`~celery_outbox.storage.OutboxStore.claim_due` of database
        ``using`` may run on another thread now, leasing rows from the same committed
        table as on this one. False by default."""
        return False

    def end_claims_aside(self) -> None:
        """Release what the calling thread, one that claimed aside, holds of the store
        (its connections). Called on that thread when the sweep ends. Nothing by default."""
