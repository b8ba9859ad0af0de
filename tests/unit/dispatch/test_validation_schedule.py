"""The timing options of a dispatch (:mod:`celery_outbox.dispatch.validation`): a time that
cannot be
represented is refused by name at the call site, and naive datetimes are read in the
app's timezone, as Celery's worker reads them.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from celery_outbox import ScheduleError
from celery_outbox.dispatch.validation import as_datetime, check_schedule

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
PARIS = ZoneInfo("Europe/Paris")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("countdown", 10**12),
        ("countdown", float("inf")),
        ("countdown", float("nan")),
        ("countdown", "abc"),
        ("countdown", True),
        ("eta", "tomorrow"),
        ("expires", 10**12),
        ("expires", "soon"),
    ],
)
def test_unrepresentable_times_are_clear_errors(option: str, value: object) -> None:
    with pytest.raises(ScheduleError, match=f"{option}={value!r} is not accepted") as caught:
        check_schedule({option: value}, now=NOW, tz=timezone.utc)
    assert "between years 1 and 9999" in str(caught.value)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"countdown": None, "eta": None, "expires": None},
        {"countdown": -5},
        {"countdown": 2.5},
        {"eta": NOW + timedelta(days=1)},
        {"eta": "2030-01-02T03:04:05+00:00"},
        {"expires": 60},
        {"expires": NOW},
    ],
)
def test_representable_times_pass(options: dict[str, object]) -> None:
    check_schedule(options, now=NOW, tz=timezone.utc)


def test_a_countdown_past_year_9999_is_refused_even_when_finite() -> None:
    late = datetime(9999, 12, 31, tzinfo=timezone.utc)
    with pytest.raises(ScheduleError, match="countdown=86400"):
        check_schedule({"countdown": 86400}, now=late, tz=timezone.utc)


def test_a_naive_datetime_is_read_in_the_given_timezone() -> None:
    naive = datetime(2030, 6, 1, 12, 0)

    assert as_datetime("eta", naive, tz=PARIS) == datetime(2030, 6, 1, 12, 0, tzinfo=PARIS)
    assert as_datetime("eta", naive.isoformat(), tz=PARIS).utcoffset() == timedelta(hours=2)


def test_an_aware_datetime_keeps_its_offset() -> None:
    aware = datetime(2030, 6, 1, 12, 0, tzinfo=timezone.utc)
    assert as_datetime("eta", aware, tz=PARIS) == aware
    assert as_datetime("eta", aware.isoformat(), tz=PARIS) == aware
