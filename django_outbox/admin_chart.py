"""Bar charts of counts per hour, drawn by the server as inline SVG.

No script, no external asset, no style sheet: each bar carries a ``<title>`` (its hour and
count, shown as a tooltip and read by screen readers), the axes carry labels, and the
chart a ``<title>`` and ``<desc>``. Every text is escaped (``format_html``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_outbox.bounded_counts import HourCount

#: The drawing's size and its margins, in SVG units (pixels at 100 %).
WIDTH, HEIGHT = 720, 180
LEFT, RIGHT, TOP, BOTTOM = 56, 8, 12, 28
#: Hours between two labels of the time axis.
LABEL_EVERY = 3


def axis_top(largest: int) -> int:
    """The value at the top of the y axis: ``largest`` rounded up to 1, 2 or 5 times a
    power of ten (at least 1)."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= largest:
                return step * factor
        step *= 10


def _hour(value: HourCount) -> str:
    return date_format(timezone.localtime(value.start), "H:i")


def bar_title(value: HourCount, noun: str) -> str:
    """The tooltip of one bar: ``13:00-14:00: 12 dead letters`` (``about 12,000 ...`` when
    estimated)."""
    end = date_format(timezone.localtime(value.start + timedelta(hours=1)), "H:i")
    return f"{_hour(value)}-{end}: {value.count} {noun}"


def bar_chart(counts: Sequence[HourCount], *, title: str, noun: str, colour: str) -> SafeString:
    """An SVG bar chart of ``counts`` (one bar per hour, oldest first)."""
    top = axis_top(max((c.count.value for c in counts), default=0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(len(counts), 1)
    bars = []
    labels = []
    for index, value in enumerate(counts):
        height = plot_h * value.count.value / top
        x = LEFT + index * slot
        bars.append(
            (
                f"{x + 1:.1f}",
                f"{TOP + plot_h - height:.1f}",
                f"{max(slot - 2, 1):.1f}",
                f"{height:.1f}",
                colour,
                bar_title(value, noun),
            )
        )
        if index % LABEL_EVERY == 0:
            labels.append((f"{x + slot / 2:.1f}", f"{HEIGHT - 8}", _hour(value)))
    total = sum(c.count.value for c in counts)
    about = "" if all(c.count.exact for c in counts) else "about "
    desc = f"{about}{total:,} {noun} in the last {len(counts)} hours; the axis tops at {top:,}."
    return format_html(
        '<svg class="outbox-chart" xmlns="http://www.w3.org/2000/svg" role="img" '
        'viewBox="0 0 {w} {h}" width="{w}" height="{h}" font-family="sans-serif" '
        'font-size="11"><title>{title}</title><desc>{desc}</desc>'
        '<line x1="{left}" y1="{top_y}" x2="{left}" y2="{base}" stroke="#888"/>'
        '<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" stroke="#888"/>'
        '<text x="{ylabel_x}" y="{top_label_y}" text-anchor="end">{top_value}</text>'
        '<text x="{ylabel_x}" y="{base}" text-anchor="end">0</text>'
        "{bars}{labels}</svg>",
        w=WIDTH,
        h=HEIGHT,
        title=title,
        desc=desc,
        left=LEFT,
        right=WIDTH - RIGHT,
        top_y=TOP,
        base=TOP + plot_h,
        ylabel_x=LEFT - 6,
        top_label_y=TOP + 8,
        top_value=f"{top:,}",
        bars=format_html_join(
            "",
            '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>',
            bars,
        ),
        labels=format_html_join("", '<text x="{}" y="{}" text-anchor="middle">{}</text>', labels),
    )
