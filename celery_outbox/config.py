"""The ``outbox_*`` settings: their rules, and the frozen value read from an app.

Rules of the ``outbox_*`` settings: the accepted range of each, and its parsing.

A rule turns a raw setting value into its Python value or raises an
:class:`~celery_outbox.exceptions.OutboxConfigError` naming the setting, the value and
:attr:`Rule.accepted`, the range also given in ``docs/settings.md``. Every range has both
ends: a duration of ``1e13`` seconds or a batch of a billion rows is refused when the
configuration is read, not when the first dispatch fails.

The ``outbox_*`` settings, read once from a Celery app into a frozen value object.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_outbox.exceptions import OutboxConfigError
from celery_outbox.state import state_of

# --- Rules of the ``outbox_*`` settings: the accepted range of each, and its parsing.

#: The shortest positive duration a setting accepts: ``timedelta`` keeps microseconds,
#: so anything shorter would silently round to zero.
SHORTEST = 0.001


class Rule(ABC):
    """How one setting is validated and converted."""

    @property
    @abstractmethod
    def accepted(self) -> str:
        """What the setting accepts, as shown in errors and in ``docs/settings.md``."""

    @abstractmethod
    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is within :attr:`accepted`."""

    def convert(self, value: Any) -> Any:
        """The Python value of an accepted ``value`` (itself, unless a rule says otherwise)."""
        return value

    def parse(self, name: str, value: Any) -> Any:
        """``value`` converted, or an error naming ``name``, ``value`` and the range.

        Raises
        ------
        OutboxConfigError
            When ``value`` is outside :attr:`accepted`.
        """
        if not self.accepts(value):
            raise OutboxConfigError(f"{name}={value!r} is not accepted: give {self.accepted}.")
        return self.convert(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plain(seconds: float) -> str:
    """``86400`` rather than ``86400.0`` or ``8.64e+04``."""
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


@dataclass(frozen=True, kw_only=True)
class Seconds(Rule):
    """A duration in seconds (a number) from ``minimum`` to ``maximum``, or ``0`` if
    ``zero`` is allowed; converted to a :class:`~datetime.timedelta`.
    """

    minimum: float
    maximum: float
    zero: bool = False

    @property
    def accepted(self) -> str:
        """``"0, or 0.001 to 3600 seconds"`` and the like."""
        span = f"{_plain(self.minimum)} to {_plain(self.maximum)} seconds"
        return f"0, or {span}" if self.zero else span

    def accepts(self, value: Any) -> bool:
        """A finite number in range (checked before any ``timedelta`` could overflow)."""
        if not _number(value) or not math.isfinite(value):
            return False
        return self.minimum <= value <= self.maximum or (self.zero and value == 0)

    def convert(self, value: Any) -> timedelta:
        """The ``timedelta`` of ``value`` seconds."""
        return timedelta(seconds=float(value))


@dataclass(frozen=True, kw_only=True)
class Count(Rule):
    """An integer from ``minimum`` to ``maximum`` (of ``unit``), or ``None`` if allowed."""

    minimum: int
    maximum: int
    unit: str
    none: bool = False

    @property
    def accepted(self) -> str:
        """``"an integer from 1 to 10000 rows"`` and the like."""
        span = f"an integer from {self.minimum} to {self.maximum} {self.unit}"
        return f"None, or {span}" if self.none else span

    def accepts(self, value: Any) -> bool:
        """An ``int`` (not a bool) in range, or ``None`` when allowed."""
        if value is None:
            return self.none
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        return self.minimum <= value <= self.maximum


@dataclass(frozen=True, kw_only=True)
class Flag(Rule):
    """``True`` or ``False``."""

    @property
    def accepted(self) -> str:
        """Always ``"True or False"``."""
        return "True or False"

    def accepts(self, value: Any) -> bool:
        """Only a bool."""
        return isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class DottedPath(Rule):
    """``None`` or a dotted import path (whether it imports is a system check's job)."""

    example: str

    @property
    def accepted(self) -> str:
        """``"None, or a dotted path such as '...'"``."""
        return f"None, or a dotted path such as {self.example!r}"

    def accepts(self, value: Any) -> bool:
        """``None`` or a string with a dot inside."""
        return value is None or (isinstance(value, str) and "." in value.strip("."))


@dataclass(frozen=True, kw_only=True)
class QueueName(Rule):
    """``None`` or the name of a queue (a non-empty string without surrounding spaces)."""

    @property
    def accepted(self) -> str:
        """``"None, or a queue name such as 'retries'"``."""
        return "None, or a queue name such as 'retries'"

    def accepts(self, value: Any) -> bool:
        """``None``, or a string that is not empty and not padded with spaces."""
        return value is None or (isinstance(value, str) and bool(value) and value == value.strip())


# --- The ``outbox_*`` settings, read once from a Celery app into a frozen value object.

#: Seconds in an hour and in a day (for the ranges below).
HOUR = 3600.0

DAY = 24 * HOUR

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
    "outbox_retry_queue": None,
    "outbox_publish_timeout": 1.0,
    "outbox_keep_completed": 7 * 24 * 3600.0,
    "outbox_chord_max_header": 1000,
    "outbox_store_requeues": 60,
}

#: The accepted range of each setting (``docs/settings.md`` shows the same text). A new
#: setting gets its rule here, beside its default.
RULES: Mapping[str, Rule] = {
    "outbox_store": DottedPath(example="proj.outbox.make_store"),
    # Below 0.1 s beat would send sweeps faster than one can run.
    "outbox_sweep_interval": Seconds(minimum=0.1, maximum=DAY),
    "outbox_sweep_batch_size": Count(minimum=1, maximum=10_000, unit="rows"),
    # Below 64 KiB a claim would be one row of any real size; above 4 GiB bounds nothing.
    "outbox_sweep_batch_bytes": Count(minimum=64 * 1024, maximum=4 * 1024**3, unit="bytes"),
    "outbox_publish_grace": Seconds(minimum=SHORTEST, maximum=HOUR, zero=True),
    "outbox_claim_lease": Seconds(minimum=1.0, maximum=DAY),
    "outbox_publish_max_attempts": Count(minimum=1, maximum=10_000, unit="attempts"),
    "outbox_keep_published": Seconds(minimum=SHORTEST, maximum=3650 * DAY, zero=True),
    "outbox_park_after": Seconds(minimum=SHORTEST, maximum=DAY, zero=True),
    "outbox_max_deliveries": Count(minimum=1, maximum=1000, unit="deliveries"),
    "outbox_beat_schedule": Flag(),
    "outbox_max_payload_bytes": Count(minimum=1, maximum=1024**3, unit="bytes", none=True),
    # None: a retry goes back to the queue its task came from.
    "outbox_retry_queue": QueueName(),
    "outbox_publish_timeout": Seconds(minimum=0.01, maximum=300.0),
    # Put-backs of one message while its store fails, before it is held (60: about an hour).
    "outbox_store_requeues": Count(minimum=1, maximum=10_000, unit="put-backs"),
    # A duplicate arriving after this window runs again: keep it longer than any redelivery.
    "outbox_keep_completed": Seconds(minimum=1.0, maximum=3650 * DAY),
    # Every header step locks the join row once: past this, split the chord.
    "outbox_chord_max_header": Count(minimum=1, maximum=100_000, unit="steps", none=True),
}


def setting_errors(conf: Mapping[str, Any]) -> dict[str, str]:
    """Every setting of ``conf`` that is not accepted, mapped to its error message.

    Missing settings take their defaults (which are always accepted).
    """
    errors: dict[str, str] = {}
    for key, rule in RULES.items():
        try:
            rule.parse(key, conf.get(key, DEFAULTS[key]))
        except OutboxConfigError as exc:
            errors[key] = str(exc)
    return errors


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
    #: The queue of every retry of a task without its own ``retry_queue`` (``None``: the
    #: queue the task came from).
    retry_queue: str | None
    #: Seconds one publish may wait for the broker before the row is left to the sweeper.
    publish_timeout: timedelta
    #: How long ``CompletedTask`` rows of atomic tasks are kept (the duplicate window).
    keep_completed: timedelta
    #: Header steps a chord joined in the database may have (``None``: no limit).
    chord_max_header: int | None
    #: Put-backs of one message while its store fails (each after a backoff); the next
    #: failure holds it on its holding queue (:mod:`celery_outbox.worker.republish`).
    store_requeues: int

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any]) -> OutboxConfig:
        """Validate the ``outbox_*`` keys of ``conf``, using defaults for missing ones.

        Raises
        ------
        OutboxConfigError
            Naming every setting whose value is not accepted, with its range.
        """
        errors = setting_errors(conf)
        if errors:
            raise OutboxConfigError(" ".join(errors.values()))
        values = {
            key.removeprefix("outbox_"): rule.parse(key, conf.get(key, DEFAULTS[key]))
            for key, rule in RULES.items()
        }
        return cls(**values)

    @classmethod
    def from_celery(cls, app: Celery) -> OutboxConfig:
        """Read and validate the settings of a Celery app (once; see :mod:`celery_outbox.state`)."""
        state = state_of(app)
        if not isinstance(state.config, cls):
            conf = {key: app.conf.get(key, DEFAULTS[key]) for key in DEFAULTS}
            state.config = cls.from_mapping(conf)
        return state.config

    @classmethod
    def at_run_time(cls, app: Celery) -> OutboxConfig:
        """The settings of ``app``, or the defaults while they are not accepted (changed to
        a bad value and read again in a running worker): for the worker's failure paths,
        which must not fail on a setting (the bad value is reported where it is read).
        """
        try:
            return cls.from_celery(app)
        except OutboxConfigError:
            return cls.from_mapping(DEFAULTS)
