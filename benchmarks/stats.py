"""Rounds, medians and percentiles."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def median(values: Sequence[float]) -> float:
    """The median (0.0 for no values)."""
    return statistics.median(values) if values else 0.0


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` percentile by nearest rank (0.0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


def ratio(ours: float, theirs: float) -> float:
    """``ours / theirs`` (0.0 when ``theirs`` is 0)."""
    return ours / theirs if theirs else 0.0
