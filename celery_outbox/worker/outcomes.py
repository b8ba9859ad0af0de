"""Carrying out what follows a failed attempt: decide (:mod:`.policy`), then schedule
the retry (:mod:`.republish`) or write the dead letter (:mod:`.letters`).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from celery import Task

from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.exceptions import (
    OutboxConfigError,
    PayloadError,
    RetriesExhausted,
    ScheduleError,
    StoreError,
)
from celery_outbox.registry import store_for
from celery_outbox.worker.attempt import Attempt
from celery_outbox.worker.letters import write_config_dead_letter, write_dead_letter
from celery_outbox.worker.options import options_from_task, with_retry_arguments
from celery_outbox.worker.policy import Outcome, decide
from celery_outbox.worker.republish import schedule_retry


def _database_now(task: Task[Any, Any], attempt: Attempt) -> datetime:
    """The clock a parked retry's due time is on (the database's), else this worker's
    when the store cannot read it (parking fails then too, and says so).
    """
    try:
        return store_for(task.app).now(using=attempt.using)
    except (StoreError, OutboxConfigError):  # down, or no store: the worker's is next best
        return utcnow()


def after_failure(
    task: Task[Any, Any],
    attempt: Attempt,
    exc: Exception | None,
    *,
    explicit: bool,
    rng: random.Random,
    countdown: Any = None,
    eta: Any = None,
    max_retries: Any = None,
    args: Any = None,
    kwargs: Any = None,
    overrides: Mapping[str, Any] | None = None,
) -> Exception:
    """Schedule the retry of ``attempt`` (returning ``Retry``) or write its dead letter
    (returning ``exc``, to raise; :class:`RetriesExhausted` when ``exc`` is ``None``: a
    ``retry()`` called with no error, whose retries say so rather than name one).

    ``rng`` draws the wait within the window. The other arguments are ``retry()``'s:
    ``explicit`` retries whatever ``exc`` is,
    ``args``/``kwargs`` are the next attempt's arguments, ``overrides`` its extra
    ``apply_async`` options. A bad retry option or ``retry()`` argument found now (one
    the next message cannot be built from, too) is a dead letter naming it, never a
    lost task.

    Raises
    ------
    celery.exceptions.Ignore, celery.exceptions.Reject
        When the message was put back (the store is down) or must be redelivered.
    """
    now: datetime = utcnow()
    failure = exc if exc is not None else RetriesExhausted()
    try:
        config = OutboxConfig.from_celery(task.app)
        options, delay = with_retry_arguments(
            options_from_task(task),
            countdown=countdown,
            eta=eta,
            max_retries=max_retries,
            clock=functools.partial(_database_now, task, attempt),
        )
        following = attempt.with_arguments(args, kwargs, run=task.run)
        decision = decide(
            failure,
            options,
            attempt,
            now=now,
            rng=rng,
            countdown=delay,
            explicit=explicit,
            park_after=config.park_after,
        )
        if decision.outcome is Outcome.RETRY and decision.delay is not None:
            return schedule_retry(
                task,
                following,
                exc,
                delay=decision.delay,
                park=decision.park,
                now=now,
                overrides=overrides,
                queue=options.retry_queue or config.retry_queue,
            )
    except (OutboxConfigError, PayloadError, ScheduleError) as bad:
        # Found only now (the next message cannot be built, too): dead-letter, never drop.
        write_config_dead_letter(task, attempt, failure, bad, now=now)
        return failure
    write_dead_letter(task, attempt, failure, outcome=decision.outcome, now=now)
    return failure
