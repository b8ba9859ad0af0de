"""What to do after a failed attempt: retry after some wait, or dead-letter. Pure logic."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import Task

from celery_outbox.backoff import BackoffPolicy
from celery_outbox.exceptions import OutboxConfigError, OutboxRetry


class Outcome(str, enum.Enum):
    """Why an attempt ended the way it did."""

    RETRY = "retry"
    NOT_RETRYABLE = "not retryable"
    EXHAUSTED = "retries exhausted"
    DEADLINE = "retry deadline passed"
    TOO_MANY_DELIVERIES = "too many deliveries"


@dataclass(frozen=True, kw_only=True)
class RetryOptions:
    """A task's retry options in Python units (see :func:`options_from_task`)."""

    autoretry_for: tuple[type[BaseException], ...]
    dont_autoretry_for: tuple[type[BaseException], ...]
    max_retries: int | None
    policy: BackoffPolicy
    max_elapsed: timedelta | None


@dataclass(frozen=True, kw_only=True)
class RetryDecision:
    """The decision after one failure: ``delay`` is set exactly when ``outcome`` is RETRY."""

    outcome: Outcome
    delay: timedelta | None = None


def options_from_task(task: Task[Any, Any]) -> RetryOptions:
    """Read Celery's option names off ``task`` (seconds) into :class:`RetryOptions`.

    Raises
    ------
    OutboxConfigError
        Naming the task and the option that has a value it does not accept.
    """
    max_elapsed = getattr(task, "retry_max_elapsed", None)
    return RetryOptions(
        autoretry_for=_exception_types(task, "autoretry_for"),
        dont_autoretry_for=_exception_types(task, "dont_autoretry_for"),
        max_retries=task.max_retries,
        policy=BackoffPolicy(
            base=_seconds(task, "retry_backoff"), cap=_seconds(task, "retry_backoff_max")
        ),
        max_elapsed=None if max_elapsed is None else _seconds(task, "retry_max_elapsed"),
    )


def decide(
    exc: BaseException,
    options: RetryOptions,
    *,
    retries: int,
    first_failed_at: datetime,
    now: datetime,
    rng: random.Random,
    countdown: float | None = None,
    explicit: bool = False,
) -> RetryDecision:
    """Decide what follows the failure ``exc`` of attempt number ``retries`` (0-based).

    ``explicit`` (``self.retry()`` or :class:`OutboxRetry`) retries whatever the type of
    ``exc``; ``countdown`` replaces the window, a negative one meaning now, as in Celery.
    """
    explicit = explicit or isinstance(exc, OutboxRetry)
    if isinstance(exc, options.dont_autoretry_for) or not (
        explicit or isinstance(exc, options.autoretry_for)
    ):
        return RetryDecision(outcome=Outcome.NOT_RETRYABLE)
    if options.max_retries is not None and retries >= options.max_retries:
        return RetryDecision(outcome=Outcome.EXHAUSTED)
    delay = _delay(exc, options, retries=retries, rng=rng, countdown=countdown)
    if options.max_elapsed is not None:
        left = first_failed_at + options.max_elapsed - now
        if left <= timedelta(0):
            return RetryDecision(outcome=Outcome.DEADLINE)
        delay = min(delay, left)  # the last attempt runs at the deadline, not after it
    return RetryDecision(outcome=Outcome.RETRY, delay=delay)


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
    return options.policy.delay_for(retries, rng=rng)


def _seconds(task: Task[Any, Any], name: str) -> timedelta:
    value: Any = getattr(task, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise OutboxConfigError(
            f"{task.name}.{name}={value!r} is not accepted: give a positive number of seconds."
        )
    return timedelta(seconds=float(value))


def _exception_types(task: Task[Any, Any], name: str) -> tuple[type[BaseException], ...]:
    value = tuple(getattr(task, name, ()) or ())
    for item in value:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise OutboxConfigError(
                f"{task.name}.{name} holds {item!r}: give a tuple of exception classes."
            )
    return value
