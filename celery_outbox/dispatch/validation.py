"""What a dispatch may hold and when it may run, checked at the call site.

What a dispatched message may hold, checked at the call site.

A message the store cannot write, or a worker cannot run, fails here with a
:class:`~celery_outbox.exceptions.PayloadError` naming the value and what is accepted,
inside the caller's transaction, instead of later as a store error, a worker crash
or a redelivery loop.

Validate the timing options of a dispatch (countdown, eta, expires) at the call site.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta, tzinfo
from typing import Any

from celery.utils.time import maybe_make_aware

from celery_outbox.exceptions import PayloadError, ScheduleError
from celery_outbox.store.records import TASK_ID_MAX_LENGTH, TASK_NAME_MAX_LENGTH, NewMessage

# --- What a dispatched message may hold, checked at the call site.

#: Deepest nesting of lists, tuples, sets and dicts accepted in one argument. Celery's
#: prefork pool pickles each request, and pickle gives up around 500-1000 levels: a
#: deeper argument would crash the worker at every redelivery.
MAX_ARGUMENT_DEPTH = 100

#: Headers (and properties) holding a repr of the arguments, for display only: stored escaped.
REPR_HEADERS = ("argsrepr", "kwargsrepr")

_JSON_CONTENT_TYPE = "application/json"

_CONTAINERS = (dict, list, tuple, set, frozenset)

#: ``\u0000`` in JSON text, not preceded by an escaped backslash.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'[]{}"')))

_ONE_BRACKET = bytes.maketrans(b"{}", b"[]")

_SHOWN = 80


def storable_repr(text: str) -> str:
    """``text`` with NUL and lone surrogates backslash-escaped, as a database can store it."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def with_storable_reprs(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` (headers or properties) with storable ``argsrepr``/``kwargsrepr``."""
    stored = dict(fields)
    for name in REPR_HEADERS:
        if isinstance(stored.get(name), str):
            stored[name] = storable_repr(stored[name])
    return stored


def check_argument_depth(
    task_name: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    payload: str,
    content_type: str,
) -> None:
    """Refuse an argument nested deeper than :data:`MAX_ARGUMENT_DEPTH`.

    A JSON payload with no more brackets than the limit cannot hold such an argument,
    so the arguments are walked only when it has more (or is not JSON).

    Raises
    ------
    PayloadError
        Naming the argument and the limit.
    """
    # The body wraps each argument in two levels: [[args...], {kwargs...}, {embed}].
    if content_type == _JSON_CONTENT_TYPE and _json_depth_at_most(payload, MAX_ARGUMENT_DEPTH + 2):
        return
    for name, value in _arguments(args, kwargs):
        if _deeper_than(value, MAX_ARGUMENT_DEPTH):
            raise PayloadError(
                f"Cannot dispatch task {task_name!r}: argument {name} is nested more than "
                f"MAX_ARGUMENT_DEPTH={MAX_ARGUMENT_DEPTH} levels deep (lists, tuples, sets, "
                "dicts); workers could not hand it to their pool. Flatten it, or store it "
                "and pass a reference (an id)."
            )


def check_message(message: NewMessage, *, max_bytes: int | None) -> None:
    """Refuse a message the outbox table cannot store, or larger than ``max_bytes``.

    The task id and name must fit their columns; headers and options must be strict
    JSON (no NaN or infinity, no NUL, no lone surrogate); the whole row (payload,
    headers and options, id and name) must fit ``outbox_max_payload_bytes``.

    Raises
    ------
    PayloadError
        Naming the value and what is accepted.
    """
    _check_identifier(message.task_name, "task id", message.task_id, TASK_ID_MAX_LENGTH)
    _check_identifier(message.task_name, "task name", message.task_name, TASK_NAME_MAX_LENGTH)
    options_bytes = _options_bytes(message.task_name, message.options)
    if max_bytes is None:
        return
    payload_bytes = len(message.payload.encode("utf-8"))
    ids = len(message.task_id.encode("utf-8")) + len(message.task_name.encode("utf-8"))
    total = payload_bytes + options_bytes + ids
    if total > max_bytes:
        raise PayloadError(
            f"Cannot dispatch task {message.task_name!r}: its outbox row is {total} bytes "
            f"(payload {payload_bytes}, headers and options {options_bytes}, id and name "
            f"{ids}), above outbox_max_payload_bytes={max_bytes}. Pass a reference (an id) "
            "instead, and keep headers, argsrepr/kwargsrepr and shadow small."
        )


def _json_depth_at_most(text: str, limit: int) -> bool:
    """Whether the JSON document ``text`` nests at most ``limit`` arrays and objects deep."""
    if text.count("[") + text.count("{") <= limit:
        return True
    # Drop escapes, then everything but brackets and quotes, then what lay between quotes:
    # the brackets left are the document's structure.
    raw = text.encode("utf-8").replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = raw.translate(_ONE_BRACKET, _NOT_STRUCTURE).split(b'"')[::2]
    brackets = b"".join(kept)
    for _ in range(limit):  # each pass removes the innermost level everywhere
        brackets = brackets.replace(b"[]", b"")
        if not brackets:
            return True
    return False


def _arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    for position, value in enumerate(args):
        yield f"{position} (positional)", value
    for key, value in kwargs.items():
        yield repr(key), value


def _deeper_than(value: Any, limit: int) -> bool:
    # Level by level, without recursion. A container met again (shared, or a cycle
    # under pickle) is not walked twice: pickle writes it once too.
    level: list[Any] = [value]
    seen: set[int] = set()
    for _ in range(limit + 1):
        containers = [v for v in level if isinstance(v, _CONTAINERS) and id(v) not in seen]
        if not containers:
            return False
        seen.update(map(id, containers))
        level = [c for v in containers for c in (v.values() if isinstance(v, dict) else v)]
    return True


def _check_identifier(task_name: str, what: str, value: str, max_length: int) -> None:
    if not isinstance(value, str):
        problem: str | None = f"is a {type(value).__name__}, not a str"
    elif len(value) > max_length:
        problem = f"is {len(value)} characters long, above the column's {max_length}"
    else:
        problem = _text_problem(value)
    if problem:
        raise PayloadError(
            f"Cannot dispatch task {task_name!r}: its {what} {_shown(value)} {problem}. "
            f"Give a str of at most {max_length} characters, without NUL or lone surrogates."
        )


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate"
    return None


def _options_bytes(task_name: str, options: Mapping[str, Any]) -> int:
    """The size of ``options`` as stored (strict JSON, UTF-8), or a PayloadError naming why not."""
    size, problem = _json_size(options)
    if problem is None:
        return size
    named = [(f"header {k!r}", v) for k, v in (options.get("headers") or {}).items()]
    named += [(f"option {k!r}", v) for k, v in (options.get("properties") or {}).items()]
    named += [
        (f"option {k!r}", v) for k, v in options.items() if k not in ("headers", "properties")
    ]
    culprits = [(n, v, p) for n, v in named if (p := _json_size(v)[1])]
    name, value, problem = culprits[0] if culprits else ("headers and options", options, problem)
    raise PayloadError(
        f"Cannot dispatch task {task_name!r}: {name}={_shown(value)} cannot be stored: "
        f"{problem}. Headers and options must be JSON: str (without NUL or lone "
        "surrogates), int, finite float, bool, None, lists and dicts of those."
    )


def _json_size(value: Any) -> tuple[int, str | None]:
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        return 0, str(exc)
    if "\\u0000" in text and _JSON_NUL.search(text):
        return 0, "it contains a NUL character"
    try:
        return len(text.encode("utf-8")), None
    except UnicodeEncodeError:
        return 0, "it contains a lone surrogate"


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= _SHOWN else f"{shown[:_SHOWN]}... ({len(shown)} characters)"


# --- Validate the timing options of a dispatch (countdown, eta, expires) at the call site.

_ACCEPTED = {
    "countdown": "a finite number of seconds (negative means now)",
    "expires": "a finite number of seconds or a datetime",
    "eta": "a datetime or an ISO 8601 string",
}


def check_schedule(options: Mapping[str, Any], *, now: datetime, tz: tzinfo) -> None:
    """Raise :class:`ScheduleError` naming the option whose time cannot be represented.

    Naive datetimes are read in the app's timezone, as Celery reads them.
    """
    if options.get("countdown") is not None:
        _offset("countdown", options["countdown"], now)
    expires = options.get("expires")
    if expires is not None and not isinstance(expires, (datetime, str)):
        _offset("expires", expires, now)
    for name in ("eta", "expires"):
        value = options.get(name)
        if isinstance(value, (datetime, str)):
            as_datetime(name, value, tz=tz)


def as_datetime(name: str, value: datetime | str, *, tz: tzinfo) -> datetime:
    """``value`` as an aware datetime (naive ones in ``tz``); ``ScheduleError`` if not one."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise _error(name, value) from None
    # Naive: in the app's timezone, as Celery's worker reads a naive ETA.
    aware: datetime = maybe_make_aware(value, tz, naive_as_utc=False)
    return aware


def _offset(name: str, value: Any, now: datetime) -> datetime:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value):
        raise _error(name, value)
    try:
        return now + timedelta(seconds=value)
    except OverflowError:
        raise _error(name, value) from None


def _error(name: str, value: Any) -> ScheduleError:
    return ScheduleError(
        f"{name}={value!r} is not accepted: give {_ACCEPTED[name]} "
        "whose time lies between years 1 and 9999."
    )
