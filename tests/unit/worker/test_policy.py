"""The retry decision (pure): windows, exhaustion, deadlines, non-retryable errors."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from celery_outbox import OutboxRetry, OutboxTask
from celery_outbox.worker.attempt import Attempt
from celery_outbox.worker.options import RetryOptions, options_from_task
from celery_outbox.worker.policy import Outcome, decide

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def attempt(retries: int) -> Attempt:
    """Attempt number ``retries`` (0-based) of a task that first failed at ``NOW``."""
    return Attempt(task_name="t.x", task_id="t1", retries=retries, first_failed_at=NOW)


def noop(*args: object) -> None:
    """A task body that does nothing."""


class Permanent(Exception):
    pass


def make_task(**attrs: object) -> OutboxTask:
    app = Celery("t", set_as_current=False)
    return app.task(base=OutboxTask, name="t.x", **attrs)(noop)  # type: ignore[no-any-return]


def options(**attrs: object) -> RetryOptions:
    return options_from_task(make_task(**attrs))


def test_defaults_follow_design() -> None:
    opts = options()
    assert opts.autoretry_for == (Exception,)
    assert opts.max_retries == 5
    assert opts.policy.base == timedelta(seconds=1)
    assert opts.policy.cap == timedelta(seconds=300)
    assert opts.max_elapsed is None


@pytest.mark.parametrize("retries", [0, 1, 2, 4])
def test_retry_waits_lie_in_the_window(retries: int) -> None:
    opts = options(retry_backoff=2.0)
    low, high = opts.policy.window(retries)
    for seed in range(50):
        decision = decide(
            ValueError(),
            opts,
            attempt(retries),
            now=NOW,
            rng=random.Random(seed),
        )
        assert decision.outcome is Outcome.RETRY
        assert decision.delay is not None
        assert low <= decision.delay <= high


def test_exhausted_after_max_retries() -> None:
    opts = options(max_retries=2)
    rng = random.Random(1)
    assert decide(ValueError(), opts, attempt(1), now=NOW, rng=rng).outcome is Outcome.RETRY
    assert decide(ValueError(), opts, attempt(2), now=NOW, rng=rng).outcome is Outcome.EXHAUSTED


def test_dont_autoretry_for_goes_straight_to_dead_letters() -> None:
    opts = options(autoretry_for=(Exception,), dont_autoretry_for=(Permanent,))
    decision = decide(Permanent(), opts, attempt(0), now=NOW, rng=random.Random())
    assert decision.outcome is Outcome.NOT_RETRYABLE


def test_error_outside_autoretry_for_is_not_retried_unless_explicit() -> None:
    opts = options(autoretry_for=(KeyError,))
    rng = random.Random()
    assert decide(ValueError(), opts, attempt(0), now=NOW, rng=rng).outcome is Outcome.NOT_RETRYABLE
    assert (
        decide(ValueError(), opts, attempt(0), now=NOW, rng=rng, explicit=True).outcome
        is Outcome.RETRY
    )
    assert decide(OutboxRetry(), opts, attempt(0), now=NOW, rng=rng).outcome is Outcome.RETRY


def test_deadline_ends_retries_on_time() -> None:
    opts = options(retry_max_elapsed=10, retry_backoff=8.0)
    rng = random.Random(3)
    late = decide(ValueError(), opts, attempt(3), now=NOW + timedelta(seconds=9), rng=rng)
    assert late.outcome is Outcome.RETRY
    assert late.delay == timedelta(seconds=1)  # clipped to the deadline
    over = decide(ValueError(), opts, attempt(3), now=NOW + timedelta(seconds=10), rng=rng)
    assert over.outcome is Outcome.DEADLINE


def test_explicit_delays_and_negative_countdown() -> None:
    opts = options()
    rng = random.Random()
    assert decide(
        OutboxRetry(delay=timedelta(seconds=42)),
        opts,
        attempt(0),
        now=NOW,
        rng=rng,
    ).delay == timedelta(seconds=42)
    assert decide(
        ValueError(),
        opts,
        attempt(0),
        now=NOW,
        rng=rng,
        countdown=-5,
        explicit=True,
    ).delay == timedelta(0)
