"""The SVG bar charts of the overview page: scale, bars, labels, escaping (no database)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from celery_outbox.store.counts import Count
from django_outbox.admin.counts import HourCount, hour_starts
from django_outbox.admin.overview import HEIGHT, axis_top, bar_chart, bar_title

START = datetime(2026, 3, 4, 5, 0, tzinfo=timezone.utc)


@pytest.fixture(autouse=True)
def _utc(settings: object) -> None:
    settings.TIME_ZONE = "UTC"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("largest", "top"), [(0, 1), (1, 1), (2, 2), (3, 5), (7, 10), (11, 20), (20_001, 50_000)]
)
def test_the_axis_tops_at_one_two_or_five_times_a_power_of_ten(largest: int, top: int) -> None:
    assert axis_top(largest) == top


def test_a_bar_title_names_the_hour_and_the_count() -> None:
    assert bar_title(HourCount(start=START, count=Count(value=1234)), "dead letters") == (
        "05:00-06:00: 1,234 dead letters"
    )
    estimated = HourCount(start=START, count=Count(value=20_000, exact=False))
    assert bar_title(estimated, "published") == "05:00-06:00: about 20,000 published"


def test_one_bar_per_hour_scaled_to_the_axis() -> None:
    counts = [
        HourCount(start=START + timedelta(hours=h), count=Count(value=h % 5)) for h in range(24)
    ]
    svg = str(bar_chart(counts, title="Dead letters per hour", noun="dead letters", colour="#c00"))
    heights = [float(h) for h in re.findall(r'<rect [^>]*height="([0-9.]+)"', svg)]
    assert len(heights) == 24
    assert heights[0] == 0.0
    assert heights[4] == pytest.approx((HEIGHT - 40) * 4 / 5, abs=0.1)
    assert "<title>Dead letters per hour</title>" in svg
    assert "<desc>46 dead letters in the last 24 hours;" in svg
    assert svg.count('text-anchor="middle"') == 8  # a time label every third hour
    assert "<script" not in svg
    assert "href" not in svg


def test_texts_are_escaped() -> None:
    counts = [HourCount(start=START, count=Count(value=1))]
    svg = str(bar_chart(counts, title="<script>x</script>", noun="<b>n</b>", colour="red"))
    assert "<script>" not in svg
    assert "<b>" not in svg
    assert "&lt;script&gt;x&lt;/script&gt;" in svg


def test_an_empty_chart_draws_an_axis() -> None:
    svg = str(bar_chart([], title="t", noun="n", colour="red"))
    assert "<rect" not in svg
    assert "<line" in svg


def test_hour_starts_end_with_the_current_hour() -> None:
    starts = hour_starts(START + timedelta(minutes=59, seconds=3))
    assert len(starts) == 24
    assert starts[-1] == START
    assert starts[0] == START - timedelta(hours=23)
