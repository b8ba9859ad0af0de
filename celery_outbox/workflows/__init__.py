"""Durable workflows: the shape of Celery's canvas, and what a dispatch of one writes."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

#: Names of the module ``celery_outbox.workflows`` this package replaced: importable from here,
#: with a
#: warning, until a later release.
_MOVED_NAMES = {
    "CANCELLABLE": "celery_outbox.store.base",
    "JoinProgress": "celery_outbox.store.base",
    "StoredWorkflow": "celery_outbox.store.base",
    "WORKFLOW_STATUSES": "celery_outbox.store.base",
    "WorkflowStatus": "celery_outbox.store.records",
    "WorkflowStore": "celery_outbox.store.base",
}
_warned: set[str] = set()


def __getattr__(name: str) -> Any:
    """A name of the former module ``celery_outbox.workflows``: from its new home, warning once."""
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
