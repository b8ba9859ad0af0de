"""The Attempt value: built once from Celery's request, and the next attempt's arguments
and options after ``retry(args=..., kwargs=..., **options)``, merged as Celery does.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.app.task import Context

from celery_outbox import OutboxConfigError, OutboxTask
from celery_outbox.worker.attempt import (
    FIRST_FAILED_HEADER,
    REQUEUES_HEADER,
    Attempt,
    attempt_from_request,
)

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def body(key: str, step: int = 1, *rest: Any, **named: Any) -> None:
    """A task body with positional, defaulted and variadic parameters."""


def make_task() -> OutboxTask:
    app = Celery("attempt-unit", set_as_current=False)
    task: OutboxTask = app.task(base=OutboxTask, name="unit.attempt", shared=False)(body)
    return app.tasks[task.name]  # type: ignore[no-any-return]


def test_built_from_celerys_request() -> None:
    request = Context(
        id="t1",
        args=["k", 2],
        kwargs={"x": 1},
        retries=3,
        delivery_info={"exchange": "", "routing_key": "q1", "priority": 4, "redelivered": True},
        headers={"h": "v"},
        expires="2026-01-02T00:00:00+00:00",
        **{FIRST_FAILED_HEADER: NOW.isoformat(), REQUEUES_HEADER: 2},
    )
    attempt = attempt_from_request(make_task(), request)
    assert (attempt.task_name, attempt.task_id, attempt.retries) == ("unit.attempt", "t1", 3)
    assert (attempt.args, attempt.kwargs) == (("k", 2), {"x": 1})
    assert (attempt.first_failed_at, attempt.requeues, attempt.redelivered) == (NOW, 2, True)
    assert attempt.options["queue"] == "q1"
    assert attempt.options["priority"] == 4
    assert attempt.options["expires"] == "2026-01-02T00:00:00+00:00"
    assert not {"task_id", "eta", "countdown", "retries"} & set(attempt.options)
    assert attempt.routing() == {
        "queue": "q1",
        "exchange": None,
        "routing_key": None,
        "priority": 4,
    }


def test_a_first_delivery_has_no_first_failure_and_a_bad_header_is_ignored() -> None:
    task = make_task()
    first = attempt_from_request(task, Context(id="t1", args=[], kwargs={}, retries=0))
    assert (first.first_failed_at, first.requeues, first.redelivered) == (None, 0, False)
    odd = Context(id="t2", args=[], kwargs={}, retries=0, **{FIRST_FAILED_HEADER: "yesterday"})
    assert attempt_from_request(task, odd).first_failed_at is None


def test_a_named_exchange_is_kept_for_the_dead_letter() -> None:
    info = {"exchange": "tasks", "routing_key": "rk"}
    attempt = Attempt(task_name="t", task_id="1", delivery_info=info)
    assert attempt.routing() == {
        "queue": None,
        "exchange": "tasks",
        "routing_key": "rk",
        "priority": None,
    }


def test_resend_options_set_eta_retries_and_merge_headers() -> None:
    attempt = Attempt(
        task_name="t",
        task_id="1",
        options={"exchange": "tasks", "routing_key": "rk", "headers": {"a": 1}, "expires": 9},
    )
    eta = NOW + timedelta(seconds=5)
    options = attempt.resend_options(eta=eta, retries=2, headers={"b": 2})
    assert options == {
        "exchange": "tasks",
        "routing_key": "rk",
        "expires": 9,
        "headers": {"a": 1, "b": 2},
        "eta": eta,
        "retries": 2,
    }
    moved = attempt.resend_options(eta=eta, retries=2, headers={}, overrides={"queue": "other"})
    assert moved["queue"] == "other"
    assert "exchange" not in moved
    assert "routing_key" not in moved


@pytest.mark.parametrize(
    ("args", "kwargs", "inherited", "expected"),
    [
        (None, None, (("k", 1), {"x": 1}), (("k", 1), {"x": 1})),
        (("n", 2), None, (("k",), {}), (("n", 2), {})),
        # New positionals cover an inherited keyword: it is dropped (Celery #6494).
        (("n", 2), None, (("k",), {"step": 5, "x": 1}), (("n", 2), {"x": 1})),
        # New keywords replace inherited positionals by name, the rest stay in place.
        (None, {"step": 3}, (("k", 2), {}), (("k", 3), {})),
        (None, {"x": 1}, (("k", 2, "r"), {}), (("k", 2, "r"), {"x": 1})),
        ([], {}, (("k",), {"x": 1}), ((), {})),
    ],
)
def test_retry_arguments_replace_the_next_attempts(
    args: Any, kwargs: Any, inherited: tuple[Any, Any], expected: tuple[Any, Any]
) -> None:
    attempt = Attempt(task_name="t", task_id="1", args=inherited[0], kwargs=inherited[1])
    following = attempt.with_arguments(args, kwargs, run=body)
    assert (following.args, following.kwargs) == expected
    assert (following.task_id, following.retries) == ("1", 0)


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [("abc", None, "args='abc'"), (None, [1], "kwargs=[1]"), (None, {1: "x"}, "kwargs={1: 'x'}")],
)
def test_retry_arguments_that_cannot_be_sent_are_refused_by_name(
    args: Any, kwargs: Any, named: str
) -> None:
    attempt = Attempt(task_name="t", task_id="1")
    with pytest.raises(OutboxConfigError, match="retry\\(\\) arguments not accepted") as caught:
        attempt.with_arguments(args, kwargs, run=body)
    assert named in str(caught.value)
