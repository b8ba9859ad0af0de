"""Reading a task's retry options with Celery's meanings, and refusing bad ones by name."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

from celery_outbox import OutboxConfigError, OutboxTask
from celery_outbox.worker.attempt import Attempt
from celery_outbox.worker.options import (
    checked_options,
    options_from_task,
    with_retry_arguments,
)
from celery_outbox.worker.policy import Outcome, decide

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def attempt(retries: int) -> Attempt:
    """Attempt number ``retries`` (0-based) of a task that first failed at ``NOW``."""
    return Attempt(task_name="t.x", task_id="t1", retries=retries, first_failed_at=NOW)


class ProviderError(Exception):
    pass


def noop(*args: object) -> None:
    """A task body that does nothing."""


def make_task(app: Celery | None = None, name: str = "opts.x", **attrs: Any) -> OutboxTask:
    app = app or Celery("t", set_as_current=False)
    app.task(base=OutboxTask, name=name, shared=False, **attrs)(noop)
    task: OutboxTask = app.tasks[name]  # the task itself, not a lazy proxy
    return task


def delay(task: OutboxTask, retries: int = 0) -> timedelta | None:
    return decide(
        ValueError(),
        options_from_task(task),
        attempt(retries),
        now=NOW,
        rng=random.Random(3),
    ).delay


def test_retry_backoff_true_is_celerys_one_second() -> None:
    opts = options_from_task(make_task(retry_backoff=True))
    assert opts.policy.base == timedelta(seconds=1)
    assert opts.fixed_delay is None


@pytest.mark.parametrize("off", [False, 0])
def test_retry_backoff_off_waits_default_retry_delay(off: object) -> None:
    task = make_task(retry_backoff=off, default_retry_delay=7)
    assert options_from_task(task).fixed_delay == timedelta(seconds=7)
    assert delay(task, retries=3) == timedelta(seconds=7)


def test_retry_backoff_off_uses_retry_kwargs_countdown() -> None:
    task = make_task(retry_backoff=False, retry_kwargs={"countdown": 2, "max_retries": 9})
    opts = options_from_task(task)
    assert (opts.fixed_delay, opts.max_retries) == (timedelta(seconds=2), 9)


def test_retry_jitter_false_waits_the_top_of_each_window() -> None:
    task = make_task(retry_backoff=2, retry_jitter=False, retry_backoff_max=600)
    assert [delay(task, r) for r in range(4)] == [timedelta(seconds=s) for s in (2, 4, 8, 16)]


def test_lists_of_exception_classes_are_accepted() -> None:
    opts = options_from_task(
        make_task(autoretry_for=[ProviderError], dont_autoretry_for=[KeyError])
    )
    assert (opts.autoretry_for, opts.dont_autoretry_for) == ((ProviderError,), (KeyError,))


@pytest.mark.parametrize(
    ("option", "value", "accepted"),
    [
        ("retry_backoff", 1e-7, "True (1 s), False"),
        ("retry_backoff", "1", "True (1 s), False"),
        ("retry_backoff", math.inf, "True (1 s), False"),
        ("retry_backoff_max", 0, "from 0.001 to 31536000"),
        ("retry_backoff_max", 1e13, "from 0.001 to 31536000"),
        ("max_retries", "3", "a whole number >= 0, or None"),
        ("max_retries", -1, "a whole number >= 0, or None"),
        ("max_retries", True, "a whole number >= 0, or None"),
        ("autoretry_for", ("ProviderError",), "tuple of exception classes"),
        ("dont_autoretry_for", (ValueError, 3), "(not 3)"),
        ("retry_jitter", "yes", "True or False"),
        ("retry_max_elapsed", -1.0, "from 0.001"),
        ("default_retry_delay", "soon", "from 0 to"),
        ("retry_kwargs", {"countdown": 1, "exc": 2}, "only 'max_retries' and 'countdown'"),
        ("retry_queue", "", "None, or a queue name"),
        ("retry_queue", ["retries"], "None, or a queue name"),
    ],
)
def test_a_bad_option_is_named_with_the_task_and_what_is_accepted(
    option: str, value: object, accepted: str
) -> None:
    with pytest.raises(OutboxConfigError) as caught:
        options_from_task(make_task(name="shop.send_sms", **{option: value}))
    message = str(caught.value)
    assert "'shop.send_sms'" in message
    assert f"{option}={value!r}" in message
    assert accepted in message


def test_retry_queue_is_read_off_the_task() -> None:
    assert options_from_task(make_task(retry_queue="retries")).retry_queue == "retries"
    assert options_from_task(make_task()).retry_queue is None


def test_every_bad_option_is_reported_at_once() -> None:
    with pytest.raises(OutboxConfigError) as caught:
        options_from_task(make_task(max_retries="3", retry_backoff=1e-7))
    assert "max_retries='3'" in str(caught.value)
    assert "retry_backoff=1e-07" in str(caught.value)


def test_checked_options_reads_once_per_task_class_and_never_caches_errors() -> None:
    task = make_task(max_retries=2)
    assert checked_options(task) is checked_options(task)
    bad = make_task(max_retries="2")
    for _ in range(2):
        with pytest.raises(OutboxConfigError):
            checked_options(bad)


def test_retry_arguments_are_checked() -> None:
    opts = options_from_task(make_task())
    assert with_retry_arguments(opts, countdown=5, eta=None, max_retries=1)[0].max_retries == 1
    assert with_retry_arguments(opts, countdown=5, eta=None, max_retries=None)[1] == 5.0
    for bad in ({"countdown": "5"}, {"max_retries": "3"}, {"eta": "tomorrow"}):
        arguments: dict[str, Any] = {"countdown": None, "eta": None, "max_retries": None, **bad}
        with pytest.raises(OutboxConfigError, match="retry\\(\\) arguments not accepted"):
            with_retry_arguments(opts, **arguments)


def test_bad_options_outcome_names_itself() -> None:
    assert Outcome.BAD_OPTIONS.value == "bad retry option"
