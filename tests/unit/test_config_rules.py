"""The rules of the ``outbox_*`` settings (:mod:`celery_outbox.config`): what each kind
accepts, how it says so, and what it converts a value to. The table of settings using
them is checked in ``test_config.py``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from celery_outbox.config import SHORTEST, Count, DottedPath, Flag, QueueName, Seconds
from celery_outbox.exceptions import OutboxConfigError

WAIT = Seconds(minimum=SHORTEST, maximum=3600)
ZERO_OR_WAIT = Seconds(minimum=1, maximum=86400, zero=True)
ROWS = Count(minimum=1, maximum=10_000, unit="rows")
MAYBE_BYTES = Count(minimum=1024, maximum=2**30, unit="bytes", none=True)
STORE = DottedPath(example="myproject.outbox.make_store")


def test_accepted_says_the_range_in_plain_numbers() -> None:
    assert WAIT.accepted == "0.001 to 3600 seconds"
    assert ZERO_OR_WAIT.accepted == "0, or 1 to 86400 seconds"
    assert Seconds(minimum=0.5, maximum=1e6).accepted == "0.5 to 1000000 seconds"
    assert ROWS.accepted == "an integer from 1 to 10000 rows"
    assert MAYBE_BYTES.accepted == "None, or an integer from 1024 to 1073741824 bytes"
    assert Flag().accepted == "True or False"
    assert STORE.accepted == "None, or a dotted path such as 'myproject.outbox.make_store'"
    assert QueueName().accepted == "None, or a queue name such as 'retries'"


@pytest.mark.parametrize(
    ("rule", "good", "bad"),
    [
        (WAIT, [SHORTEST, 1, 2.5, 3600], [0, 0.0005, 3600.5, -1, True, "1", None, float("nan")]),
        (ZERO_OR_WAIT, [0, 0.0, 1, 86400], [0.5, float("inf"), 1e13, False]),
        (ROWS, [1, 10_000], [0, 10_001, 1.0, True, None, "5"]),
        (MAYBE_BYTES, [None, 1024, 2**30], [1023, 2**30 + 1, 2048.0, False]),
        (Flag(), [True, False], [0, 1, "true", None]),
        (STORE, [None, "a.b", "pkg.mod.factory"], ["", "plain", ".", "...", 42, b"a.b"]),
        (QueueName(), [None, "retries", "a.b-c"], ["", " retries", "retries ", 5, b"q", True]),
    ],
)
def test_each_rule_accepts_its_range_and_nothing_else(
    rule: Any, good: list[Any], bad: list[Any]
) -> None:
    assert [v for v in good if not rule.accepts(v)] == []
    assert [v for v in bad if rule.accepts(v)] == []


def test_seconds_become_a_timedelta() -> None:
    assert WAIT.parse("outbox_x", 2.5) == timedelta(seconds=2.5)
    assert WAIT.parse("outbox_x", SHORTEST) == timedelta(milliseconds=1)
    assert ZERO_OR_WAIT.parse("outbox_x", 0) == timedelta(0)


def test_other_rules_keep_the_value() -> None:
    assert ROWS.parse("outbox_x", 5) == 5
    assert MAYBE_BYTES.parse("outbox_x", None) is None
    assert Flag().parse("outbox_x", False) is False
    assert STORE.parse("outbox_x", "a.b") == "a.b"
    assert QueueName().parse("outbox_x", "retries") == "retries"


def test_a_refused_value_is_named_with_the_setting_and_the_range() -> None:
    with pytest.raises(OutboxConfigError) as caught:
        WAIT.parse("outbox_publish_timeout", 1e13)
    assert str(caught.value) == (
        "outbox_publish_timeout=10000000000000.0 is not accepted: give 0.001 to 3600 seconds."
    )
