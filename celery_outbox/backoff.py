"""Random exponential backoff windows.

Retry number ``r`` (0-based: Celery's ``request.retries`` before this retry) waits a
uniformly random time in ``[0, base]`` for ``r == 0`` and ``[base*2**(r-1), base*2**r]``
after, both ends capped at ``cap``. Unlike full jitter, the lower edge grows too, so
after the first retry a task never fires again at once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from celery_outbox.exceptions import OutboxConfigError

#: Default base of the windows, as DESIGN.md says (``retry_backoff``).
DEFAULT_BASE = timedelta(seconds=1)
#: Default cap of any one wait (``retry_backoff_max``).
DEFAULT_CAP = timedelta(minutes=5)


@dataclass(frozen=True, kw_only=True)
class BackoffPolicy:
    """Where the wait before each retry may fall.

    Parameters
    ----------
    base:
        The width of the first window; each later window doubles. Must be positive.
    cap:
        No wait is longer than this. Must be positive; both window ends are capped,
        so a cap below ``base`` gives waits in ``[0, cap]`` then exactly ``cap``.
    """

    base: timedelta = DEFAULT_BASE
    cap: timedelta = DEFAULT_CAP

    def __post_init__(self) -> None:
        for name in ("base", "cap"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise OutboxConfigError(
                    f"BackoffPolicy.{name}={value!r} is not accepted: "
                    "give a positive datetime.timedelta."
                )

    def window(self, retry: int) -> tuple[timedelta, timedelta]:
        """Return the ``(low, high)`` window of the wait before retry number ``retry``.

        Raises
        ------
        ValueError
            If ``retry`` is negative.
        """
        if retry < 0:
            raise ValueError(f"retry={retry!r} is not accepted: retry numbers start at 0.")
        if retry == 0:
            return timedelta(0), min(self.base, self.cap)
        return self._capped(retry - 1), self._capped(retry)

    def delay_for(self, retry: int, *, rng: random.Random | None = None) -> timedelta:
        """Draw the wait before retry number ``retry``, uniformly within its window.

        Parameters
        ----------
        retry:
            0-based retry number.
        rng:
            Random source; the module's shared generator when omitted.
        """
        low, high = self.window(retry)
        fraction = rng.random() if rng is not None else random.random()
        return low + (high - low) * fraction

    def _capped(self, exponent: int) -> timedelta:
        # Compare exponents before multiplying, so a huge retry number never
        # overflows timedelta (whose maximum is reached near base * 2**46).
        if exponent >= _doublings_to_cap(self.base, self.cap):
            return self.cap
        return self.base * (1 << exponent)


def _doublings_to_cap(base: timedelta, cap: timedelta) -> int:
    """How many doublings take ``base`` to at least ``cap``."""
    doublings = 0
    width = base
    while width < cap:
        width *= 2
        doublings += 1
    return doublings
