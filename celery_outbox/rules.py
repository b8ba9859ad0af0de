"""Rules of the ``outbox_*`` settings: the accepted range of each, and its parsing.

A rule turns a raw setting value into its Python value or raises an
:class:`~celery_outbox.exceptions.OutboxConfigError` naming the setting, the value and
:attr:`Rule.accepted`, the range also given in ``docs/settings.md``. Every range has both
ends: a duration of ``1e13`` seconds or a batch of a billion rows is refused when the
configuration is read, not when the first dispatch fails.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery_outbox.exceptions import OutboxConfigError

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
    ``zero`` is allowed; converted to a :class:`~datetime.timedelta`."""

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
