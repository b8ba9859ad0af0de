"""What follows a failed attempt: retry after some wait (on an ETA or parked), or
dead-letter. Pure logic: no broker, no store, no clock.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery_outbox.exceptions import ArgumentsMismatch, OutboxRetry
from celery_outbox.worker.attempt import Attempt
from celery_outbox.worker.options import RetryOptions


class Outcome(str, enum.Enum):
    """Why an attempt ended the way it did."""

    RETRY = "retry"
    NOT_RETRYABLE = "not retryable"
    EXHAUSTED = "retries exhausted"
    DEADLINE = "retry deadline passed"
    TOO_MANY_DELIVERIES = "too many deliveries"
    BAD_OPTIONS = "bad retry option"


@dataclass(frozen=True, kw_only=True)
class RetryDecision:
    """The decision after one failure.

    ``delay`` is set exactly when ``outcome`` is RETRY; ``park`` then says whether the
    wait is long enough to keep the retry as an outbox row rather than a broker ETA.
    """

    outcome: Outcome
    delay: timedelta | None = None
    park: bool = False


def decide(
    exc: BaseException,
    options: RetryOptions,
    attempt: Attempt,
    *,
    now: datetime,
    rng: random.Random,
    countdown: float | None = None,
    explicit: bool = False,
    park_after: timedelta = timedelta.max,
) -> RetryDecision:
    """Decide what follows the failure ``exc`` of ``attempt`` (its ``retries``: 0-based).

    ``explicit`` (``self.retry()`` or :class:`OutboxRetry`) retries whatever the type of
    ``exc``; ``countdown`` replaces the window, a negative one meaning now, as in Celery.
    A wait longer than ``park_after`` is parked. Arguments that do not fit the task
    (:class:`ArgumentsMismatch`) are never retried: they would fail the same way.
    """
    explicit = explicit or isinstance(exc, OutboxRetry)
    if isinstance(exc, (ArgumentsMismatch, *options.dont_autoretry_for)) or not (
        explicit or isinstance(exc, options.autoretry_for)
    ):
        return RetryDecision(outcome=Outcome.NOT_RETRYABLE)
    if options.max_retries is not None and attempt.retries >= options.max_retries:
        return RetryDecision(outcome=Outcome.EXHAUSTED)
    delay = _delay(exc, options, retries=attempt.retries, rng=rng, countdown=countdown)
    if options.max_elapsed is not None:
        left = (attempt.first_failed_at or now) + options.max_elapsed - now
        if left <= timedelta(0):
            return RetryDecision(outcome=Outcome.DEADLINE)
        delay = min(delay, left)  # the last attempt runs at the deadline, not after it
    return RetryDecision(outcome=Outcome.RETRY, delay=delay, park=delay > park_after)


def too_many_deliveries(deliveries: int, *, limit: int) -> bool:
    """Whether a message delivered ``deliveries`` times is dead-lettered without running
    (``outbox_max_deliveries``: a message that keeps killing its worker).
    """
    return deliveries > limit


def _delay(
    exc: BaseException,
    options: RetryOptions,
    *,
    retries: int,
    rng: random.Random,
    countdown: float | None,
) -> timedelta:
    if isinstance(exc, OutboxRetry) and exc.delay is not None:
        return max(exc.delay, timedelta(0))
    if countdown is not None:
        return timedelta(seconds=max(float(countdown), 0.0))
    if options.fixed_delay is not None:  # retry_backoff off: Celery's default_retry_delay
        return options.fixed_delay
    if not options.jitter:
        return options.policy.window(retries)[1]
    return options.policy.delay_for(retries, rng=rng)
