"""The store seam's shared rules (:mod:`celery_outbox.store.base`): the byte budget of a
claim, when a failed row gives up, and which on-commit publishers share a batch.

The stores themselves are held to :class:`~celery_outbox.store.base.OutboxStore`'s
contract by ``tests/contract``.
"""

from __future__ import annotations

import functools
from datetime import datetime, timezone

import pytest

from celery_outbox.store.base import publisher_key, within_budget

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("sizes", "budget", "taken"),
    [
        ([], 10, 0),
        ([5], 1, 1),
        ([5, 5], 0, 1),  # never empty because of the budget
        ([4, 4, 4], 8, 2),
        ([4, 4, 4], 9, 3),
        ([4, 4], None, 2),
    ],
)
def test_within_budget(sizes: list[int], budget: int | None, taken: int) -> None:
    assert within_budget(sizes, budget) == taken


def test_within_budget_reads_no_size_past_the_cut() -> None:
    read: list[int] = []

    def sizes() -> object:
        for size in (10, 10, 10, 10):
            read.append(size)
            yield size

    assert within_budget(sizes(), 10) == 1  # type: ignore[arg-type]
    assert len(read) == 2  # the row that would exceed the budget, and no further


def publish(messages: object, alias: str | None = None, *, tag: str = "") -> None:
    """A publisher callback (never called here)."""


def other(messages: object) -> None:
    """Another publisher callback."""


def test_equal_partials_share_a_batch_and_different_ones_do_not() -> None:
    key = publisher_key(functools.partial(publish, alias="a", tag="x"))

    assert key == publisher_key(functools.partial(publish, alias="a", tag="x"))
    assert key != publisher_key(functools.partial(publish, alias="b", tag="x"))
    assert key != publisher_key(functools.partial(publish, "a", tag="x"))
    assert key != publisher_key(functools.partial(other))
    hash(key)


def test_a_plain_callable_is_its_own_key() -> None:
    assert publisher_key(publish) is publish


def test_a_partial_with_unhashable_arguments_gets_its_own_batch() -> None:
    unhashable = functools.partial(publish, ["a"])

    assert publisher_key(unhashable) is unhashable
    assert publisher_key(unhashable) != publisher_key(functools.partial(publish, ["a"]))
