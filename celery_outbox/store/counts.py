"""Bounded counts, one policy for every surface: exact up to a bound, an estimate above it.

A metrics scrape reads its counts every few seconds and an admin page on every view, so
their cost must not grow with the table: each count reads at most ``bound + 1`` index
entries (``SELECT count(*) FROM (SELECT 1 ... LIMIT bound + 1)``). A count beyond the
bound is replaced by PostgreSQL's planner estimate of the same rows (``EXPLAIN``: the
table's statistics, as fresh as its last ``ANALYZE``) when that estimate is above the
bound, else it is reported as a lower bound, "more than ``bound``" (:func:`bounded`).
The caller chooses the bound: the gauges count exactly (no bound) on databases without
an estimate (SQLite, MySQL/MariaDB); the admin's pages bound every database.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Counts a metrics scrape makes exactly (a scrape comes every few seconds); above it,
#: the planner's estimate.
SCRAPE_EXACT_UP_TO = 1_000
#: The ``WHERE`` of an estimate of the parked rows: those due later (pending rows are
#: the only ones with a due time ahead, in practice).
DUE_LATER = "available_at > now()"


def status_is(status: str) -> str:
    """The ``WHERE`` of an estimate of the rows of one status (a library constant)."""
    return f"status = '{status}'"


def explain_sql(table: str, where: str) -> str:
    """The ``EXPLAIN`` whose top node estimates the rows of ``table`` matching ``where``.

    ``where`` is SQL written by this library (statuses, ``now()``), never user input.
    """
    return f"EXPLAIN (FORMAT JSON) SELECT 1 FROM {table} WHERE {where}"


def plan_rows(explained: Any) -> int:
    """The estimated rows of the top node of ``EXPLAIN (FORMAT JSON)`` output (the JSON
    text, or the list a driver decoded it into).

    Raises
    ------
    ValueError
        ``explained`` is not such an output.
    """
    try:
        plans = json.loads(explained) if isinstance(explained, str | bytes) else explained
        return int(plans[0]["Plan"]["Plan Rows"])
    except (LookupError, TypeError, ValueError) as exc:
        raise ValueError(f"not the output of EXPLAIN (FORMAT JSON): {explained!r}") from exc


@dataclass(frozen=True, kw_only=True)
class Count:
    """A number of rows: ``exact``, an estimate, or (``lower_bound``) more than ``value``."""

    value: int
    exact: bool = True
    lower_bound: bool = False

    def __str__(self) -> str:
        if self.exact:
            return f"{self.value:,}"
        return f"more than {self.value:,}" if self.lower_bound else f"about {self.value:,}"

    @property
    def least(self) -> int:
        """The count as one number (a gauge's): ``value``, or ``value + 1`` for "more than"."""
        return self.value + 1 if self.lower_bound else self.value


def bounded(counted: int, bound: int | None, estimate: Callable[[], int | None]) -> Count:
    """The count to report of rows counted up to ``bound + 1``: ``counted`` when it is
    within the bound (or there is none); else ``estimate()`` when it is above the bound,
    else "more than ``bound``" (no estimate, or one the count already disproves).
    """
    if bound is None or counted <= bound:
        return Count(value=counted)
    estimated = estimate()
    if estimated is None or estimated <= bound:
        return Count(value=bound, exact=False, lower_bound=True)
    return Count(value=estimated, exact=False)
