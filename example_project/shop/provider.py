"""A fake notification provider: configurable failure rate, latency and outages.

Failures are decided by a hash of (seed, channel, notification, attempt), so a run is
reproducible: the same seed fails the same attempts. A channel is down (every send
fails) while the file ``<outage_dir>/<channel>.down`` exists: ``touch`` it to take a
channel down while the worker runs, remove it to bring it back.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: What an SMS gateway or a messenger accepts as a phone number (E.164).
PHONE_NUMBER = re.compile(r"^\+[1-9]\d{7,14}$")
#: Channels that address the customer by phone number.
PHONE_CHANNELS = frozenset({"sms", "messenger"})


class ProviderError(Exception):
    """The provider failed this attempt; another attempt may succeed (retried)."""


class ProviderOutage(ProviderError):
    """The channel is down (retried)."""


class PermanentError(Exception):
    """No attempt can succeed: never retried (``dont_autoretry_for``), a dead letter at once."""


class InvalidPhoneNumber(PermanentError):
    """The phone number is not one an SMS gateway or a messenger can reach."""


class DeviceNotRegistered(PermanentError):
    """The customer has no device registered for push notifications."""


@dataclass(frozen=True, kw_only=True)
class FakeProvider:
    """Sends nothing; fails like a real provider does, on purpose."""

    failure_rates: Mapping[str, float] = field(default_factory=dict)
    latency: float = 0.0
    outage_dir: Path | None = None
    seed: str = ""

    @classmethod
    def from_settings(cls, raw: Mapping[str, Any]) -> FakeProvider:
        """Build from ``settings.SHOP_PROVIDER`` (``failure_rates`` as ``"push=0.3,sms=0.2"``).

        Raises
        ------
        ValueError
            When a rate is not a number between 0 and 1.
        """
        return cls(
            failure_rates=parse_rates(str(raw.get("failure_rates", ""))),
            latency=float(raw.get("latency", 0.0)),
            outage_dir=Path(raw["outage_dir"]) if raw.get("outage_dir") else None,
            seed=str(raw.get("seed", "")),
        )

    def is_down(self, channel: str) -> bool:
        """Whether ``channel`` is in an outage right now."""
        return self.outage_dir is not None and (self.outage_dir / f"{channel}.down").exists()

    def send(self, channel: str, recipient: str, text: str, *, key: str) -> None:
        """Deliver ``text`` to ``recipient`` on ``channel``, or raise.

        Raises
        ------
        DeviceNotRegistered
            Push, and no device token.
        InvalidPhoneNumber
            A phone channel and a number that is not E.164.
        ProviderOutage
            The channel is down.
        ProviderError
            This attempt failed (chance: the channel's failure rate; ``key`` names it).
        """
        time.sleep(self.latency)  # the provider's network round trip, not a retry wait
        if channel == "push" and not recipient:
            raise DeviceNotRegistered("no device registered for push notifications")
        if channel in PHONE_CHANNELS and not PHONE_NUMBER.match(recipient):
            raise InvalidPhoneNumber(f"{recipient!r} is not a phone number ({channel})")
        if self.is_down(channel):
            raise ProviderOutage(f"{channel} provider is down")
        draw = random.Random(f"{self.seed}:{channel}:{key}").random()
        if draw < self.failure_rates.get(channel, 0.0):
            raise ProviderError(f"{channel} provider answered 503 (attempt {key})")


def parse_rates(text: str) -> dict[str, float]:
    """``"push=0.3,sms=0.2"`` to ``{"push": 0.3, "sms": 0.2}``.

    Raises
    ------
    ValueError
        When a rate is not a number between 0 and 1.
    """
    rates: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        channel, _, value = item.partition("=")
        rate = float(value)
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"SHOP_FAILURE_RATES: {item!r} is not a rate between 0 and 1.")
        rates[channel.strip()] = rate
    return rates
