"""Dead letters escaped so every store can hold them; originals kept and restored."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any

from celery_outbox.dead_letters import (
    ARGUMENTS_KEY,
    INCOMPLETE_KEY,
    ORIGINAL_KEY,
    escape_letter,
    is_incomplete,
    minimal_letter,
    original_arguments,
    storable_json,
    storable_text,
    within_budget,
)
from celery_outbox.exceptions import StoreDataError
from celery_outbox.store.records import NewDeadLetter

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def letter(**fields: Any) -> NewDeadLetter:
    values: dict[str, Any] = {
        "task_id": "id-1",
        "task_name": "shop.send",
        "args": [1, "a"],
        "kwargs": {"k": 2.5},
        "options": {"queue": "q"},
        "exception_type": "builtins.ValueError",
        "exception_message": "boom",
        "traceback": "Traceback ...",
        "retries": 0,
        "first_failed_at": NOW,
        "failed_at": NOW,
        **fields,
    }
    return NewDeadLetter(**values)


def test_storable_text_escapes_nul_and_lone_surrogates_only() -> None:
    assert storable_text("a\x00b") == "a\\u0000b"
    assert storable_text("x\ud800y") == "x\\ud800y"
    assert storable_text("héllo 🎉") == "héllo 🎉"


def test_storable_json_turns_non_finite_floats_into_text() -> None:
    value = {"n": math.nan, "i": [math.inf, -math.inf, 1.5], "s\x00": "\udc80"}
    assert storable_json(value) == {
        "n": "NaN",
        "i": ["Infinity", "-Infinity", 1.5],
        "s\\u0000": "\\udc80",
    }
    json.dumps(storable_json(value), allow_nan=False).encode("utf-8")  # strict JSON, UTF-8


def test_a_clean_letter_is_unchanged() -> None:
    clean = letter()
    assert escape_letter(clean) is clean


def test_escaped_fields_keep_their_originals_as_text() -> None:
    bad = letter(args=[math.nan, "\ud800"], kwargs={"x": math.inf}, exception_message="nul\x00")
    escaped = escape_letter(bad)
    assert escaped.args == ["NaN", "\\ud800"]
    assert escaped.kwargs == {"x": "Infinity"}
    assert escaped.exception_message == "nul\\u0000"
    assert escaped.options["queue"] == "q"
    original = escaped.options["original"]
    assert set(original) == {"args", "kwargs", "exception_message"}
    assert json.loads(original["exception_message"]) == "nul\x00"
    args, kwargs = original_arguments(escaped.args, escaped.kwargs, escaped.options)
    assert math.isnan(args[0])
    assert args[1] == "\ud800"
    assert kwargs == {"x": math.inf}
    json.dumps(escaped.options, allow_nan=False).encode("utf-8")


def test_original_arguments_of_a_letter_never_escaped_are_its_own() -> None:
    assert original_arguments([1], {"a": 2}, {"queue": "q"}) == ([1], {"a": 2})


def test_the_minimal_letter_keeps_task_id_and_reason_and_is_incomplete() -> None:
    full = escape_letter(letter(task_name="t" * 300, args=["x" * 10_000]))
    minimal = minimal_letter(full, StoreDataError("value too long"))
    assert (minimal.args, minimal.kwargs, minimal.traceback) == ([], {}, "")
    assert minimal.task_id == "id-1"
    assert len(minimal.task_name) == 255
    assert "value too long" in minimal.exception_message
    assert "builtins.ValueError: boom" in minimal.exception_message
    assert is_incomplete(minimal.options)
    assert not is_incomplete(full.options)


def test_a_letter_within_its_budget_or_without_one_is_unchanged() -> None:
    small = letter()
    assert within_budget(small, max_bytes=1_000) is small
    huge = letter(args=["x" * 100_000])
    assert within_budget(huge, max_bytes=None) is huge


def test_arguments_over_the_budget_are_left_out_keeping_their_ends_to_read() -> None:
    huge = letter(args=["é" * 60_000, 1], kwargs={"k": "end"}, options={"queue": "q"})
    cut = within_budget(huge, max_bytes=100_000)  # 60,000 x 6 bytes of JSON escapes
    assert (cut.args, cut.kwargs) == ([], {})
    assert (cut.exception_message, cut.traceback) == ("boom", "Traceback ...")  # kept
    assert is_incomplete(cut.options)  # never requeued without its arguments
    original = cut.options[ORIGINAL_KEY]
    reason = original[INCOMPLETE_KEY]
    assert "were 360,039 bytes of JSON, above outbox_max_payload_bytes=100,000" in reason
    kept = original[ARGUMENTS_KEY]
    assert kept.startswith('[["\\u00e9')  # ASCII JSON: storable anywhere
    assert '1], {"k": "end"}] [celery-outbox cut 294,487 of 360,023 characters' in kept
    assert len(kept) < 70_000
