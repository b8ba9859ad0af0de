"""The one place the core reads the time (inject ``clock`` everywhere else)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

#: A callable returning the current aware UTC time.
Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(timezone.utc)
