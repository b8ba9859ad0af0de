"""Long text cut to a budget, saying what was cut: in dead letters and in log lines.

A task raising ``ValueError("x" * 9_000_000)`` made an 18 MB dead letter MariaDB refused,
and a 9 MB log line on every put-back of its message (issue 43). Text over its budget
keeps its start and its end, with a note between them of how much was cut of how much.

Every celery-outbox logger carries :class:`BoundedLines` (made with
:func:`bounded_logger`): whatever a line quotes (an exception, arguments, a driver's
message), its message and each line of its traceback stay within
:data:`LOG_LINE_CHARS`, and its whole traceback within :data:`LOG_TRACE_CHARS`.
"""

from __future__ import annotations

import logging

#: Most characters of a log line's message, and of each line of its traceback.
LOG_LINE_CHARS = 4_000
#: Most characters of a log line's whole traceback (its chained exceptions included).
LOG_TRACE_CHARS = 16_000
#: Most characters a log line quotes of one value (:func:`loggable`).
LOG_VALUE_CHARS = 1_000
#: What stands where :func:`bounded` cut a text.
CUT_MARK = " [...] "


def bounded(text: str, limit: int) -> str:
    """``text``, or its first three quarters of ``limit`` and its last quarter joined by
    :data:`CUT_MARK`, followed by a note of how many characters were cut of how many.

    The note comes last so that a text bounded again (a letter carried in a message
    header) keeps the first note in its own last quarter.

    Raises
    ------
    ValueError
        ``limit`` is below 4 (nothing of the text would be kept at one end).
    """
    if limit < 4:
        raise ValueError(f"bounded(): limit={limit!r}; give at least 4 characters")
    if len(text) <= limit:
        return text
    tail = limit // 4
    head = limit - tail
    note = (
        f" [celery-outbox cut {len(text) - limit:,} of {len(text):,} characters at "
        f"{CUT_MARK.strip()}: the first {head:,} and the last {tail:,} are kept]"
    )
    return text[:head] + CUT_MARK + text[-tail:] + note


def loggable(value: object) -> str:
    """``repr(value)`` as a log line quotes it (:data:`LOG_VALUE_CHARS` at most)."""
    return bounded(repr(value), LOG_VALUE_CHARS)


def bounded_trace(text: str) -> str:
    """A formatted traceback with each line, and the whole, within the log's budgets."""
    lines = [bounded(line, LOG_LINE_CHARS) for line in text.split("\n")]
    return bounded("\n".join(lines), LOG_TRACE_CHARS)


class BoundedLines(logging.Filter):
    """Cut a record's message and traceback to the log's budgets, before any handler.

    The record's ``exc_info`` stays as it is (error trackers read the exception from it);
    its ``exc_text``, which formatters print, is set to the bounded traceback.
    """

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if len(message) > LOG_LINE_CHARS:
            record.msg = bounded(message, LOG_LINE_CHARS)
            record.args = ()
        if record.exc_info and not record.exc_text:
            record.exc_text = bounded_trace(self._formatter.formatException(record.exc_info))
        return True


def bounded_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``, carrying :class:`BoundedLines` (once)."""
    logger = logging.getLogger(name)
    if not any(isinstance(found, BoundedLines) for found in logger.filters):
        logger.addFilter(BoundedLines())
    return logger
