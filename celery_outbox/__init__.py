"""celery-outbox: durable Celery dispatch and non-blocking retries.

``import celery_outbox`` never imports Django or SQLAlchemy: the SQLAlchemy store lives
in :mod:`celery_outbox.sqlalchemy`, the Django app in :mod:`django_outbox`. Every name
of ``__all__`` is described in ``docs/api.md``; plumbing (``store_for``, ``relay_for``,
``set_default_store``, ``celery_outbox.state.reset``) is imported from its module.
"""

from __future__ import annotations

from celery_outbox import _moved  # noqa: F401 - installs the old module paths
from celery_outbox.backoff import BackoffPolicy
from celery_outbox.cancelling import CancelResult, cancel
from celery_outbox.config import OutboxConfig
from celery_outbox.dead_letters import discard, requeue
from celery_outbox.dispatch.batching import batched_dispatch
from celery_outbox.exceptions import (
    ArgumentsMismatch,
    AtomicUnsupported,
    BatchWriteError,
    DeadLetterCompleted,
    DeadLetterDiscarded,
    NoStoreConfigured,
    OutboxConfigError,
    OutboxError,
    OutboxRetry,
    PayloadError,
    RetriesExhausted,
    ScheduleError,
    StoreDataError,
    StoreError,
    TooManyDeliveries,
    UnstorableResult,
)
from celery_outbox.registry import install_store
from celery_outbox.relay.relay import Relay
from celery_outbox.relay.sweeper import Sweeper, SweepReport
from celery_outbox.store.base import OutboxStore
from celery_outbox.store.records import DeadLetterStatus, MessageStatus
from celery_outbox.sweep_task import SWEEP_TASK
from celery_outbox.task import OutboxTask

__all__ = [
    "SWEEP_TASK",
    "ArgumentsMismatch",
    "AtomicUnsupported",
    "BackoffPolicy",
    "BatchWriteError",
    "CancelResult",
    "DeadLetterCompleted",
    "DeadLetterDiscarded",
    "DeadLetterStatus",
    "MessageStatus",
    "NoStoreConfigured",
    "OutboxConfig",
    "OutboxConfigError",
    "OutboxError",
    "OutboxRetry",
    "OutboxStore",
    "OutboxTask",
    "PayloadError",
    "Relay",
    "RetriesExhausted",
    "ScheduleError",
    "StoreDataError",
    "StoreError",
    "SweepReport",
    "Sweeper",
    "TooManyDeliveries",
    "UnstorableResult",
    "batched_dispatch",
    "cancel",
    "discard",
    "install_store",
    "requeue",
]
__version__ = "0.1.0"
