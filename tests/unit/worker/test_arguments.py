"""The argument check before a task body runs (pure): what fits, what does not, and
what the error names.
"""

from __future__ import annotations

import random
import re
from datetime import datetime, timezone
from typing import Any

import pytest
from celery import Celery, Task

from celery_outbox import ArgumentsMismatch, OutboxTask
from celery_outbox.worker.arguments import check_arguments
from celery_outbox.worker.attempt import Attempt
from celery_outbox.worker.options import options_from_task
from celery_outbox.worker.policy import Outcome, decide


def charge(order_id: int, amount: int = 0, *, note: str = "") -> None:
    """A task body of the current version: ``order_id``, an optional amount and note."""


def bound(self: Task[Any, Any], key: str) -> None:
    """A bound task body."""


def make_task(body: Any, **attrs: Any) -> Task[Any, Any]:
    app = Celery("arguments", set_as_current=False)
    return app.task(base=OutboxTask, name="unit.charge", shared=False, **attrs)(body)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((7,), {}), ((7, 10), {}), ((7,), {"note": "x"}), ((), {"order_id": 7, "amount": 1})],
)
def test_arguments_that_fit_pass(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    check_arguments(make_task(charge), "id-1", args, kwargs)


@pytest.mark.parametrize(
    ("args", "kwargs", "why"),
    [
        pytest.param((7, 10, "extra"), {}, "too many positional arguments", id="extra-arg"),
        pytest.param((), {}, "missing a required argument: 'order_id'", id="missing"),
        pytest.param((7,), {"currency": "EUR"}, "unexpected keyword argument", id="renamed"),
    ],
)
def test_a_mismatch_names_the_task_the_message_and_the_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], why: str
) -> None:
    with pytest.raises(ArgumentsMismatch) as raised:
        check_arguments(make_task(charge), "id-2", args, kwargs)
    text = str(raised.value)
    assert "task 'unit.charge' [id-2]" in text
    assert "do not fit its signature (order_id: " in text
    assert f"args={args!r}" in text
    assert why in text
    assert isinstance(raised.value, TypeError)


def test_a_bound_task_is_checked_without_self() -> None:
    task = make_task(bound, bind=True)
    check_arguments(task, "id-3", ("k",), {})
    with pytest.raises(ArgumentsMismatch, match=re.escape("args=('k', 'old')")):
        check_arguments(task, "id-3", ("k", "old"), {})


def test_long_arguments_are_cut_in_the_message() -> None:
    with pytest.raises(ArgumentsMismatch) as raised:
        check_arguments(make_task(charge), "id-4", ("x" * 10_000, 1, 2), {})
    assert len(str(raised.value)) < 600


def test_typing_off_skips_the_check() -> None:
    check_arguments(make_task(charge, typing=False), "id-5", (1, 2, 3, 4), {})


def test_a_mismatch_is_never_retried_even_under_autoretry_for_exception() -> None:
    options = options_from_task(make_task(charge, autoretry_for=(Exception,)))
    attempt = Attempt(task_name="unit.charge", task_id="id-6")
    decision = decide(
        ArgumentsMismatch("x"),
        options,
        attempt,
        now=datetime(2026, 1, 1, tzinfo=timezone.utc),
        rng=random.Random(0),
    )
    assert decision.outcome is Outcome.NOT_RETRYABLE
