"""A sweep's next claim, made on a thread of its own while the batch before it publishes.

Only where the store allows it (:meth:`ClaimThreads.claims_aside
<celery_outbox.claim_threads.ClaimThreads.claims_aside>`), and only once a batch came
back full (a backlog): a sweep of one batch, the usual case, starts no thread. The thread
lives for one sweep and claims with the sweep's own parameters and clock; its rows are
leased like any claim's. A claim made ahead that the sweep does not publish (it stopped:
the broker is unreachable) is given back at once, due as its oldest row was, so the next
sweep takes it instead of waiting ``outbox_claim_lease``. A claim that fails raises its
:class:`~celery_outbox.exceptions.StoreError` where the sweep takes it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING

from celery_outbox.long_text import bounded_logger
from celery_outbox.records import Claim

if TYPE_CHECKING:
    from celery_outbox.storage import OutboxStore

logger = bounded_logger(__name__)


class ClaimAhead:
    """The next claim of one sweep of database ``using``, on a thread of its own.

    Use it as a context manager: leaving it gives back a claim not taken and ends the
    thread (its connections released by the store, on that thread).
    """

    def __init__(
        self, store: OutboxStore, claim: Callable[[], Claim], *, using: str | None
    ) -> None:
        self.store, self.claim, self.using = store, claim, using
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
        future, self._next = self._next, None
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
