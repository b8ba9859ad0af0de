"""Testing with the outbox: the in-memory store and the ``outbox`` recorder (shipped)."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from celery_outbox.testing.memory import InMemoryOutboxStore

__all__ = ["InMemoryOutboxStore"]


#: Names of the module ``celery_outbox.testing`` this package replaced: importable from here, with a
#: warning, until a later release.
_MOVED_NAMES = {
    "CancelledRow": "celery_outbox.testing.memory",
    "Claim": "celery_outbox.testing.memory",
    "Clock": "celery_outbox.testing.memory",
    "MemoryCompletions": "celery_outbox.testing.memory",
    "MemoryDeadLetters": "celery_outbox.testing.memory",
    "MemoryJoin": "celery_outbox.testing.memory",
    "MemoryMonitoring": "celery_outbox.testing.memory",
    "MemoryTransactions": "celery_outbox.testing.memory",
    "MemoryWorkflows": "celery_outbox.testing.memory",
    "MessageStatus": "celery_outbox.testing.memory",
    "NewMessage": "celery_outbox.testing.memory",
    "PublishCallback": "celery_outbox.testing.memory",
    "StoredCompletion": "celery_outbox.testing.memory",
    "StoredDeadLetter": "celery_outbox.testing.memory",
    "StoredMessage": "celery_outbox.testing.memory",
    "StoredWorkflow": "celery_outbox.testing.memory",
    "Supersedes": "celery_outbox.testing.memory",
    "cancelled_row": "celery_outbox.testing.memory",
    "message_columns": "celery_outbox.testing.memory",
    "stored_message": "celery_outbox.testing.memory",
    "utcnow": "celery_outbox.testing.memory",
    "within_budget": "celery_outbox.testing.memory",
}
_warned: set[str] = set()


def __getattr__(name: str) -> Any:
    """A name of the former module ``celery_outbox.testing``: from its new home, warning once."""
    home = _MOVED_NAMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"{__name__}.{name} moved to {home}.{name}: import it from there.",
            DeprecationWarning,
            stacklevel=2,
        )
    return getattr(importlib.import_module(home), name)
