"""The one exception hierarchy of celery-outbox.

Every error the library raises on purpose is an :class:`OutboxError`. Each class's
docstring is its default message.
"""

from __future__ import annotations

from datetime import timedelta


class OutboxError(Exception):
    """An error in celery-outbox."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.__doc__)


class OutboxConfigError(OutboxError, ValueError):
    """A celery-outbox setting has a value it does not accept."""


class StoreError(OutboxError):
    """The outbox store could not complete an operation; the cause is chained."""


class StoreDataError(StoreError):
    """The store refused a value it cannot hold: not an outage, so the same write fails again."""


class NoStoreConfigured(OutboxConfigError):
    """No outbox store is installed: set outbox_store (CELERY_OUTBOX_STORE in Django)."""


class PayloadError(OutboxError, TypeError):
    """A task's arguments cannot be serialised or are too large to dispatch."""


class ArgumentsMismatch(OutboxError, TypeError):
    """A message's arguments do not fit its task's signature (a message written by another
    version of the code): dead-lettered without running, never retried.
    """


class ScheduleError(OutboxError, ValueError):
    """A countdown, eta or expires cannot be represented as a time to run the task."""


class DeadLetterDiscarded(OutboxError, LookupError):
    """The dead letter was discarded (perhaps while being requeued): it cannot be requeued."""


class DeadLetterCompleted(OutboxError, LookupError):
    """The dead letter's task completed after the letter was written (a duplicate delivery
    of an atomic task): requeueing it would run the task again, so it is not requeued.
    """


class RetriesExhausted(OutboxError):
    """The task used up its retries (or its retry deadline) and became a dead letter."""


class TooManyDeliveries(OutboxError):
    """The task's message was delivered outbox_max_deliveries times without finishing."""


class OutboxRetry(OutboxError):
    """Retry this task without logging an error.

    Raise it from :meth:`OutboxTask.run` to ask for another attempt; ``delay``
    overrides the backoff window for this one retry.
    """

    def __init__(self, message: str | None = None, *, delay: timedelta | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class AtomicUnsupported(OutboxConfigError):
    """An atomic task cannot run on this store or database alias."""


class UnstorableResult(OutboxError, TypeError):
    """An atomic task returned a value its serializer cannot store in CompletedTask.result."""


class ChordTooLarge(OutboxConfigError):
    """A chord joined in the database has more header steps than outbox_chord_max_header."""


class JoinMissing(OutboxError):
    """A chord header step found no join row for its chord (purged, or on another database)."""


class BatchWriteError(StoreError):
    """The outbox rows a batch of dispatches collected could not be written when it ended.

    A :class:`StoreError`, so code that catches a store outage around its transaction
    catches a failed batch (or ``group(...)``) the same way as a failed single dispatch.
    """
