"""Long text cut to a budget: the note says what was cut, and every celery-outbox log line
(message, traceback, chained exceptions) stays within its budgets (issue 43).
"""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest

from celery_outbox.exceptions import StoreError
from celery_outbox.long_text import (
    LOG_LINE_CHARS,
    LOG_TRACE_CHARS,
    LOG_VALUE_CHARS,
    BoundedLines,
    bounded,
    bounded_logger,
    loggable,
)

#: The exception message of issue 43.
HUGE = 9_000_000
#: What a note adds to a budget, at most.
NOTE = 200


def test_text_within_its_budget_is_kept_as_it_is() -> None:
    assert bounded("short", 10) == "short"
    assert bounded("x" * 10, 10) == "x" * 10


def test_text_over_its_budget_keeps_its_start_and_end_and_says_what_was_cut() -> None:
    text = "a" * 600 + "b" * 9_000 + "c" * 400
    cut = bounded(text, 1_000)
    assert cut.startswith("a" * 600 + "b" * 150 + " [...] " + "b" * 0 + "c")
    assert cut.endswith(
        "c" * 250 + " [celery-outbox cut 9,000 of 10,000 characters at [...]: the first 750 "
        "and the last 250 are kept]"
    )
    assert len(cut) < 1_000 + NOTE


def test_text_bounded_again_keeps_the_first_note() -> None:
    twice = bounded(bounded("x" * 9_000_000, 65_536), 8_192)
    assert "cut 8,934,464 of 9,000,000 characters" in twice
    assert "of 65,6" in twice  # and its own
    assert len(twice) < 8_192 + NOTE


def test_a_budget_too_small_to_keep_both_ends_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="limit=3"):
        bounded("text", 3)


def test_a_logged_value_is_its_repr_cut() -> None:
    assert loggable(("a", 1)) == "('a', 1)"
    assert len(loggable("y" * HUGE)) < LOG_VALUE_CHARS + NOTE


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A bounded logger writing through a plain formatter into a string."""
    logger = bounded_logger("tests.unit.test_long_text")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)
    logger.propagate = True


def test_a_huge_message_makes_one_bounded_line(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    logger.error("failed: %r and %s%%", "x" * HUGE, "done")
    (line,) = stream.getvalue().splitlines()
    assert line.startswith("ERROR failed: 'xxx")
    assert len(line) < LOG_LINE_CHARS + NOTE
    assert "and done% [celery-outbox cut" in line
    assert f"of {HUGE + 20:,} characters" in line


def test_a_traceback_chaining_a_huge_exception_is_bounded_line_by_line(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    # The worker logs a store error while handling the task's own failure: Python chains
    # the task's exception (9 MB here) into the traceback it prints.
    logger, stream = captured
    try:
        try:
            raise ValueError("x" * HUGE)
        except ValueError:
            raise StoreError("down")  # noqa: B904 (the implicit chain is the point)
    except StoreError:
        logger.exception("could not write the dead letter of t[1]")
    text = stream.getvalue()
    assert len(text) < LOG_TRACE_CHARS + LOG_LINE_CHARS + 4 * NOTE
    assert max(len(line) for line in text.splitlines()) < LOG_LINE_CHARS + NOTE
    assert "ValueError: xxx" in text  # the task's error is still named
    assert text.rstrip().endswith("celery_outbox.exceptions.StoreError: down")


def test_the_record_keeps_its_exception_for_error_trackers() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "m", (), None)
    try:
        raise ValueError("y" * 100_000)
    except ValueError:
        record.exc_info = sys.exc_info()
    BoundedLines().filter(record)
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], ValueError)
    assert record.exc_text is not None
    assert len(record.exc_text) < LOG_TRACE_CHARS + NOTE


def test_a_logger_carries_the_filter_once() -> None:
    first = bounded_logger("tests.unit.test_long_text.once")
    again = bounded_logger("tests.unit.test_long_text.once")
    assert first is again
    assert sum(isinstance(found, BoundedLines) for found in first.filters) == 1
