"""The ``outbox_*`` settings, read once from a Celery app into a frozen value object."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_outbox.exceptions import OutboxConfigError

#: The settings' defaults, in the units DESIGN.md gives (seconds for durations).
DEFAULTS: Mapping[str, Any] = {
    "outbox_store": None,
    "outbox_sweep_interval": 5.0,
    "outbox_sweep_batch_size": 500,
    "outbox_sweep_batch_bytes": 16 * 1024 * 1024,
    "outbox_publish_grace": 10.0,
    "outbox_claim_lease": 60.0,
    "outbox_publish_max_attempts": 20,
    "outbox_keep_published": 0.0,
    "outbox_park_after": 30.0,
    "outbox_max_deliveries": 5,
    "outbox_beat_schedule": True,
    "outbox_max_payload_bytes": 4 * 1024 * 1024,
    "outbox_publish_timeout": 1.0,
}


def _duration(name: str, value: Any, *, allow_zero: bool = False) -> timedelta:
    accepted = "a number of seconds >= 0" if allow_zero else "a positive number of seconds"
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        raise OutboxConfigError(f"{name}={value!r} is not accepted: give {accepted} (a float).")
    return timedelta(seconds=float(value))


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise OutboxConfigError(f"{name}={value!r} is not accepted: give a positive integer.")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise OutboxConfigError(f"{name}={value!r} is not accepted: give True or False.")
    return value


#: Accepted range of ``outbox_sweep_batch_bytes``: 64 KiB to 4 GiB.
BATCH_BYTES_RANGE = (64 * 1024, 4 * 1024**3)


def _batch_bytes(name: str, value: Any) -> int:
    low, high = BATCH_BYTES_RANGE
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise OutboxConfigError(
            f"{name}={value!r} is not accepted: give an integer number of bytes from "
            f"{low} (64 KiB) to {high} (4 GiB)."
        )
    return value


def _optional_bytes(name: str, value: Any) -> int | None:
    return None if value is None else _positive_int(name, value)


def _optional_path(name: str, value: Any) -> str | None:
    if value is None or (isinstance(value, str) and "." in value.strip(".")):
        return value
    raise OutboxConfigError(
        f"{name}={value!r} is not accepted: give a dotted path such as "
        "'celery_outbox.sqlalchemy.SQLAlchemyOutboxStore', or None."
    )


_PARSERS: Mapping[str, Callable[[str, Any], Any]] = {
    "outbox_store": _optional_path,
    "outbox_sweep_interval": _duration,
    "outbox_sweep_batch_size": _positive_int,
    "outbox_sweep_batch_bytes": _batch_bytes,
    "outbox_publish_grace": lambda n, v: _duration(n, v, allow_zero=True),
    "outbox_claim_lease": _duration,
    "outbox_publish_max_attempts": _positive_int,
    "outbox_keep_published": lambda n, v: _duration(n, v, allow_zero=True),
    "outbox_park_after": lambda n, v: _duration(n, v, allow_zero=True),
    "outbox_max_deliveries": _positive_int,
    "outbox_beat_schedule": _flag,
    "outbox_max_payload_bytes": _optional_bytes,
    "outbox_publish_timeout": _duration,
}


@dataclass(frozen=True, kw_only=True)
class OutboxConfig:
    """Every ``outbox_*`` setting, validated and in Python units.

    Build it with :meth:`from_celery` (or :meth:`from_mapping`); durations are
    :class:`~datetime.timedelta`, settings stay in seconds.
    """

    store: str | None
    sweep_interval: timedelta
    sweep_batch_size: int
    #: Payload bytes one claim may hold: a batch stops at the row that reaches it
    #: (always at least one row), so memory is bounded by bytes, not only by rows.
    sweep_batch_bytes: int
    publish_grace: timedelta
    claim_lease: timedelta
    publish_max_attempts: int
    keep_published: timedelta
    park_after: timedelta
    max_deliveries: int
    beat_schedule: bool
    max_payload_bytes: int | None
    #: Seconds one publish may wait for the broker before the row is left to the sweeper.
    publish_timeout: timedelta

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any]) -> OutboxConfig:
        """Validate the ``outbox_*`` keys of ``conf``, using defaults for missing ones.

        Raises
        ------
        OutboxConfigError
            Naming the first setting whose value is not accepted.
        """
        values = {
            key.removeprefix("outbox_"): parse(key, conf.get(key, DEFAULTS[key]))
            for key, parse in _PARSERS.items()
        }
        return cls(**values)

    @classmethod
    def from_celery(cls, app: Celery) -> OutboxConfig:
        """Read and validate the settings of a Celery app (cached on the app)."""
        cached: OutboxConfig | None = getattr(app, "_outbox_config", None)
        if cached is None:
            cached = cls.from_mapping({key: app.conf.get(key, DEFAULTS[key]) for key in DEFAULTS})
            app._outbox_config = cached  # type: ignore[attr-defined]
        return cached
