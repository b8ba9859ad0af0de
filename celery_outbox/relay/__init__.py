"""Which rows go out, and when: the relay, the sweeper and the relay loop."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from celery_outbox.relay.relay import relay_for

__all__ = ["relay_for"]


#: Names of the module ``celery_outbox.relay`` this package replaced: importable from here, with a
#: warning, until a later release.
_MOVED_NAMES = {
    "BackoffPolicy": "celery_outbox.relay.relay",
    "Claim": "celery_outbox.relay.relay",
    "Clock": "celery_outbox.relay.relay",
    "NewMessage": "celery_outbox.relay.relay",
    "OutboxConfig": "celery_outbox.relay.relay",
    "OutboxStore": "celery_outbox.relay.relay",
    "PUBLISH_BACKOFF": "celery_outbox.relay.relay",
    "Producers": "celery_outbox.relay.relay",
    "PublishPath": "celery_outbox.relay.relay",
    "PublishReport": "celery_outbox.relay.relay",
    "Relay": "celery_outbox.relay.relay",
    "StoredMessage": "celery_outbox.relay.relay",
    "bounded_logger": "celery_outbox.relay.relay",
    "message_publish_failed": "celery_outbox.relay.relay",
    "message_published": "celery_outbox.relay.relay",
    "sort_out": "celery_outbox.relay.relay",
    "state_of": "celery_outbox.relay.relay",
    "store_for": "celery_outbox.relay.relay",
    "utcnow": "celery_outbox.relay.relay",
}
_warned: set[str] = set()


def __getattr__(name: str) -> Any:
    """A name of the former module ``celery_outbox.relay``: from its new home, warning once."""
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
