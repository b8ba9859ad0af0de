"""The pure parts of the overview: why a parked row waits, and a group action's key."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.http import QueryDict

from django_outbox.admin.actions import LetterGroupKey
from django_outbox.admin.overview import duration_text, park_reason


@pytest.mark.parametrize(
    ("attempts", "error", "options", "reason"),
    [
        (
            2,
            "ConnectionError: refused\nmore",
            {},
            "publish failed 2 time(s): ConnectionError: refused",
        ),
        (
            0,
            "",
            {"headers": {"retries": 3, "outbox_first_failed_at": "2026-03-04T05:06:07"}},
            "retry 3 of a failed task, failing since 2026-03-04T05:06:07",
        ),
        (0, "", {"headers": {"retries": 1}}, "retry 1 of a failed task"),
        (
            0,
            "",
            {"headers": {"retries": 2, "outbox_retry_reason": "TimeoutError: slow"}},
            "retry 2 of a failed task (TimeoutError: slow)",
        ),
        (0, "", {"headers": {"retries": 0}}, "countdown or ETA given at dispatch"),
        (0, "", {"headers": "not a mapping"}, "countdown or ETA given at dispatch"),
        (0, "", None, "countdown or ETA given at dispatch"),
    ],
)
def test_park_reason(attempts: int, error: str, options: object, reason: str) -> None:
    assert park_reason(attempts, error, options) == reason


def test_a_group_key_is_read_from_the_request() -> None:
    key = LetterGroupKey.parse(QueryDict("task=shop.pay&exception=shop.Declined&upto=12"))
    assert key == LetterGroupKey(task_name="shop.pay", exception_type="shop.Declined", upto=12)


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("exception=E&upto=1", "task=''"),
        ("task=T&upto=1", "exception=''"),
        ("task=T&exception=E&upto=many", "upto='many'"),
        ("task=T&exception=E", "upto=''"),
    ],
)
def test_a_bad_group_key_names_the_value(query: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        LetterGroupKey.parse(QueryDict(query))


@pytest.mark.parametrize(
    ("age", "text"),
    [
        (None, "-"),
        (timedelta(0), "0 s"),
        (timedelta(seconds=-3), "0 s"),
        (timedelta(seconds=42.9), "42 s"),
        (timedelta(seconds=303), "5 min 3 s"),
        (timedelta(hours=2, minutes=4, seconds=9), "2 h 4 min"),
        (timedelta(hours=1, seconds=5), "1 h"),
        (timedelta(days=3, hours=2, minutes=5), "3 d 2 h"),
    ],
)
def test_duration_text_keeps_two_units(age: timedelta | None, text: str) -> None:
    assert duration_text(age) == text
