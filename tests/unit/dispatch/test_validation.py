"""What a dispatched message may hold (:mod:`celery_outbox.dispatch.validation`): each refusal names
the value and what is accepted; storable reprs escape what a database cannot hold.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest

from celery_outbox import PayloadError
from celery_outbox.dispatch.validation import (
    MAX_ARGUMENT_DEPTH,
    check_argument_depth,
    check_message,
    storable_repr,
    with_storable_reprs,
)
from celery_outbox.store.records import NewMessage

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
PICKLE = "application/x-python-serialize"


def nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def check_json(*args: Any, **kwargs: Any) -> None:
    payload = json.dumps([list(args), kwargs, {}])
    check_argument_depth("t.x", args, kwargs, payload=payload, content_type="application/json")


# -- argument depth ---------------------------------------------------------------------
def test_depth_limit_counts_structure_not_brackets_in_strings() -> None:
    check_json("[" * 5000, {"]]": '\\"[[' * 500}, [list(range(3))] * 1000, nested(100))
    with pytest.raises(PayloadError, match=r"argument 1 \(positional\).*MAX_ARGUMENT_DEPTH=100"):
        check_json("[" * 5000, ({"k": nested(100)},))


def test_a_keyword_argument_too_deep_is_named() -> None:
    with pytest.raises(PayloadError, match=r"argument 'deep' is nested more than"):
        check_json(1, deep={"a": nested(MAX_ARGUMENT_DEPTH)})


def test_depth_limit_applies_to_binary_serializers() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    # pickle writes a cycle once: no deeper than itself
    check_argument_depth("t.x", (cycle, nested(100)), {}, payload="", content_type=PICKLE)
    with pytest.raises(PayloadError, match=r"argument 0 \(positional\).*MAX_ARGUMENT_DEPTH=100"):
        check_argument_depth("t.x", (nested(101),), {}, payload="", content_type=PICKLE)


def test_sets_and_tuples_count_as_levels() -> None:
    value: object = 0
    for level in range(MAX_ARGUMENT_DEPTH + 1):
        value = (value,) if level % 2 else frozenset({value})
    with pytest.raises(PayloadError):
        check_argument_depth("t.x", (value,), {}, payload="", content_type=PICKLE)


# -- the row ------------------------------------------------------------------------------
def new_message(**changes: Any) -> NewMessage:
    base = NewMessage(
        task_id="id-1",
        task_name="t.x",
        payload="[[1], {}, {}]",
        options={"headers": {"lang": "py"}, "content_type": "application/json"},
        available_at=NOW,
    )
    return replace(base, **changes)


def test_a_plain_message_passes() -> None:
    check_message(new_message(), max_bytes=None)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"task_id": "x" * 256}, "task id 'xxx"),
        ({"task_id": "a\x00b"}, "contains a NUL character"),
        ({"task_id": 7}, "task id 7 is a int, not a str"),
        ({"task_name": "t" * 256}, "256 characters long, above the column's 255"),
        ({"task_name": "t.\udc80"}, "contains a lone surrogate"),
    ],
)
def test_an_identifier_the_column_cannot_hold_is_refused(
    changes: dict[str, Any], says: str
) -> None:
    with pytest.raises(PayloadError, match="Give a str of at most 255 characters") as caught:
        check_message(new_message(**changes), max_bytes=None)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"headers": {"ratio": float("nan")}}, "header 'ratio'=nan"),
        ({"headers": {"who": "a\x00"}}, "header 'who'='a\\x00'"),
        ({"properties": {"when": NOW}}, "option 'when'="),
        ({"priority": float("inf")}, "option 'priority'=inf"),
    ],
)
def test_options_that_are_not_strict_json_are_named(options: dict[str, Any], named: str) -> None:
    with pytest.raises(PayloadError, match="Headers and options must be JSON") as caught:
        check_message(new_message(options=options), max_bytes=None)
    assert named in str(caught.value)


def test_an_escaped_nul_in_a_header_is_text_not_a_nul() -> None:
    check_message(new_message(options={"headers": {"path": "C:\\u0000"}}), max_bytes=None)


def test_the_whole_row_counts_towards_the_limit() -> None:
    message = new_message()
    size = (
        len(message.payload)
        + len(json.dumps(message.options, ensure_ascii=False).encode())
        + len("id-1t.x")
    )

    check_message(message, max_bytes=size)
    with pytest.raises(PayloadError, match=rf"row is {size} bytes .*max_payload_bytes={size - 1}"):
        check_message(message, max_bytes=size - 1)


# -- reprs --------------------------------------------------------------------------------
def test_storable_repr_escapes_nul_and_lone_surrogates_only() -> None:
    assert storable_repr("plain é") == "plain é"
    assert storable_repr("a\x00b") == "a\\x00b"
    assert storable_repr("a\udc80b") == "a\\udc80b"


def test_only_the_repr_headers_are_made_storable() -> None:
    fields = {"argsrepr": "(\x00,)", "kwargsrepr": "{}", "other": "\x00", "n": 1}

    stored = with_storable_reprs(fields)

    assert stored == {"argsrepr": "(\\x00,)", "kwargsrepr": "{}", "other": "\x00", "n": 1}
    assert fields["argsrepr"] == "(\x00,)"  # the caller's mapping is left alone
