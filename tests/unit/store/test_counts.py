"""``celery_outbox.store.counts``: reading the planner's estimate and when to use it (the
stores' bounded counts on real databases: tests/contract/test_bounded_counts.py).
"""

from __future__ import annotations

import json

import pytest

from celery_outbox.store.counts import DUE_LATER, Count, bounded, explain_sql, plan_rows, status_is

PLAN = [{"Plan": {"Node Type": "Index Only Scan", "Plan Rows": 140012, "Plan Width": 4}}]


def test_the_explain_selects_the_matching_rows_of_the_table() -> None:
    sql = explain_sql('"celery_outbox_message"', status_is("failed"))

    assert sql == (
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM \"celery_outbox_message\" WHERE status = 'failed'"
    )
    assert "now()" in DUE_LATER


@pytest.mark.parametrize("explained", [PLAN, json.dumps(PLAN), json.dumps(PLAN).encode()])
def test_the_estimate_is_the_top_nodes_rows_as_json_text_or_decoded(explained: object) -> None:
    assert plan_rows(explained) == 140012


@pytest.mark.parametrize("explained", [[], "[]", [{"Plan": {}}], "not{"])
def test_anything_else_is_an_error_naming_it(explained: object) -> None:
    with pytest.raises(ValueError, match="not the output of EXPLAIN"):
        plan_rows(explained)


def test_a_count_within_the_bound_is_reported_without_asking_for_an_estimate() -> None:
    def never() -> int:
        raise AssertionError("estimated")

    assert bounded(10, 10, never) == Count(value=10)
    assert bounded(12345, None, never) == Count(value=12345)


def test_a_count_past_the_bound_is_the_estimate_when_above_it() -> None:
    assert bounded(11, 10, lambda: 5000) == Count(value=5000, exact=False)
    assert bounded(11, 10, lambda: 5000).least == 5000
    assert str(bounded(11, 10, lambda: 5000)) == "about 5,000"


@pytest.mark.parametrize("estimate", [3, 10, None])
def test_else_it_is_more_than_the_bound_and_a_gauge_reads_the_least_such_count(
    estimate: int | None,
) -> None:
    # No estimate (SQLite, MySQL), or one the count itself disproves: one policy for the
    # admin's pages ("more than 10") and the gauges (11).
    count = bounded(11, 10, lambda: estimate)
    assert count == Count(value=10, exact=False, lower_bound=True)
    assert (str(count), count.least) == ("more than 10", 11)
