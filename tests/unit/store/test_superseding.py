"""The rule of :mod:`celery_outbox.store.superseding`: which pending row a dispatch replaces."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest

from celery_outbox._compat import REPLACED_TASK_NESTING
from celery_outbox.store.records import NewMessage, StoredMessage
from celery_outbox.store.superseding import generation, superseding

NOW = datetime(2031, 6, 1, tzinfo=timezone.utc)


def message(task_id: str = "t", **headers: Any) -> NewMessage:
    return NewMessage(
        task_id=task_id,
        task_name="tests.task",
        payload="[[], {}, {}]",
        options={"headers": headers},
        available_at=NOW,
    )


def row(**headers: Any) -> StoredMessage:
    return StoredMessage.written(message(**headers), 1)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, 0),
        ({"headers": None}, 0),
        ({"headers": "not a mapping"}, 0),
        ({"headers": {REPLACED_TASK_NESTING: 3}}, 3),
        ({"headers": {REPLACED_TASK_NESTING: "3"}}, 0),
        ({"headers": {REPLACED_TASK_NESTING: True}}, 0),
    ],
)
def test_generation_reads_celerys_header_and_nothing_else(
    options: dict[str, Any], expected: int
) -> None:
    assert generation(options) == expected


def test_a_first_generation_dispatch_outside_a_run_of_its_id_supersedes_nothing() -> None:
    assert superseding(message(**{REPLACED_TASK_NESTING: 0}), running_task_id=None) is None
    assert superseding(message(), running_task_id="other") is None


def test_a_run_of_the_id_supersedes_whatever_row_is_pending() -> None:
    rule = superseding(message("t"), running_task_id="t")

    assert rule is not None
    assert rule(row(**{REPLACED_TASK_NESTING: 0}))
    assert rule(row(**{REPLACED_TASK_NESTING: 5}))


def test_a_replacement_supersedes_only_an_earlier_generation() -> None:
    rule = superseding(message(**{REPLACED_TASK_NESTING: 2}), running_task_id="another")

    assert rule is not None
    assert rule(row())
    assert rule(row(**{REPLACED_TASK_NESTING: 1}))
    assert not rule(row(**{REPLACED_TASK_NESTING: 2}))  # the same call, sent twice
    assert not rule(row(**{REPLACED_TASK_NESTING: 3}))


def test_the_rule_never_looks_at_anything_but_the_generation() -> None:
    rule = superseding(message(**{REPLACED_TASK_NESTING: 1}), running_task_id=None)
    older = replace(row(), task_name="tests.other", payload="[[1], {}, {}]")

    assert rule is not None
    assert rule(older)
