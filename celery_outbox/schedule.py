"""Validate the timing options of a dispatch (countdown, eta, expires) at the call site."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta, tzinfo
from typing import Any

from celery.utils.time import maybe_make_aware

from celery_outbox.exceptions import ScheduleError

_ACCEPTED = {
    "countdown": "a finite number of seconds (negative means now)",
    "expires": "a finite number of seconds or a datetime",
    "eta": "a datetime or an ISO 8601 string",
}


def check_schedule(options: Mapping[str, Any], *, now: datetime, tz: tzinfo) -> None:
    """Raise :class:`ScheduleError` naming the option whose time cannot be represented.

    Naive datetimes are read in the app's timezone, as Celery reads them.
    """
    if options.get("countdown") is not None:
        _offset("countdown", options["countdown"], now)
    expires = options.get("expires")
    if expires is not None and not isinstance(expires, (datetime, str)):
        _offset("expires", expires, now)
    for name in ("eta", "expires"):
        value = options.get(name)
        if isinstance(value, (datetime, str)):
            as_datetime(name, value, tz=tz)


def as_datetime(name: str, value: datetime | str, *, tz: tzinfo) -> datetime:
    """``value`` as an aware datetime (naive ones in ``tz``); ``ScheduleError`` if not one."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise _error(name, value) from None
    # Naive: in the app's timezone, as Celery's worker reads a naive ETA.
    aware: datetime = maybe_make_aware(value, tz, naive_as_utc=False)
    return aware


def _offset(name: str, value: Any, now: datetime) -> datetime:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value):
        raise _error(name, value)
    try:
        return now + timedelta(seconds=value)
    except OverflowError:
        raise _error(name, value) from None


def _error(name: str, value: Any) -> ScheduleError:
    return ScheduleError(
        f"{name}={value!r} is not accepted: give {_ACCEPTED[name]} "
        "whose time lies between years 1 and 9999."
    )
