"""Bounded counts: exact up to a bound, PostgreSQL's planner estimate above it.

A metrics scrape reads its counts every few seconds, so their cost must not grow with
the table: each count reads at most ``bound + 1`` index entries (``SELECT count(*) FROM
(SELECT 1 ... LIMIT bound + 1)``). A count that reaches the bound is replaced by the
planner's estimate of the same rows (``EXPLAIN``: the table's statistics, as fresh as
its last ``ANALYZE``), never less than ``bound + 1``. Databases without a usable
estimate (SQLite, MySQL/MariaDB) count exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

#: Counts a page of the admin makes exactly; above it, the planner's estimate.
EXACT_UP_TO = 10_000
#: Counts a metrics scrape makes exactly (a scrape comes every few seconds: a tenth of
#: the admin's bound); above it, the planner's estimate.
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


def settled(counted: int, bound: int | None, estimate: Callable[[], int]) -> int:
    """The count to report: ``counted`` when it is below the bound (or there is none),
    else ``estimate()``, never below ``bound + 1``.
    """
    if bound is None or counted <= bound:
        return counted
    return max(bound + 1, estimate())
