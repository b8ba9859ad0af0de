"""The ``results`` column of a chord join: one slot per header step, "not in" kept apart
from "returned ``None``".
"""

from __future__ import annotations

import json

import pytest

from celery_outbox.store.records import empty_parts, part_results, with_part


def test_an_empty_join_has_a_null_slot_per_step() -> None:
    assert json.loads(empty_parts(3)) == [None, None, None]
    assert part_results(empty_parts(0)) == []


def test_a_part_fills_its_slot_and_a_none_result_counts_as_in() -> None:
    parts = with_part(empty_parts(3), 2, '"c"')
    assert parts is not None
    parts = with_part(parts, 0, None)
    assert parts is not None

    assert part_results(parts) == [None, None, '"c"']
    assert with_part(parts, 0, '"again"') is None  # step 0 is in, though its result is None
    assert with_part(parts, 2, '"again"') is None


@pytest.mark.parametrize("index", [-1, 3, 10])
def test_an_index_outside_the_header_raises(index: int) -> None:
    with pytest.raises(IndexError, match="outside a header of 3 steps"):
        with_part(empty_parts(3), index, None)
