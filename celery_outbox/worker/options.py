"""A task's retry options, read with Celery's meanings and checked before any failure.

``OutboxTask`` keeps Celery's option names and units (seconds). They are read here, in
one place: when the worker starts (:func:`check_tasks`, from a worker boot step), at
each dispatch (once per task class, :func:`checked_options`) and when a task fails
(:func:`options_from_task`, and :func:`with_retry_arguments` for ``retry()``'s own).
A bad value is an :class:`OutboxConfigError` naming the task, the option, the value
and what is accepted.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from celery import Celery, Task

from celery_outbox.backoff import BackoffPolicy
from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig, QueueName
from celery_outbox.exceptions import OutboxConfigError

#: Shortest duration an option takes, in seconds (a shorter wait is a hot retry loop).
MIN_SECONDS = 0.001
#: Longest duration an option takes, in seconds (one year).
MAX_SECONDS = 365 * 24 * 3600.0
#: The ``retry_kwargs`` keys OutboxTask reads (Celery's autoretry passes them to retry()).
RETRY_KWARGS = frozenset({"max_retries", "countdown"})

_EXCEPTIONS = "a tuple of exception classes, such as (ConnectionError, TimeoutError)"
_SECONDS = f"a number of seconds from {MIN_SECONDS:g} to {MAX_SECONDS:.0f}"


@dataclass(frozen=True, kw_only=True)
class RetryOptions:
    """A task's retry options in Python units.

    ``fixed_delay`` is set when ``retry_backoff`` is off (Celery's ``False``): every
    retry then waits exactly that long instead of on ``policy``'s windows.
    ``retry_queue`` is the task's own queue for its retries (``None``: the setting
    ``outbox_retry_queue`` decides).
    """

    autoretry_for: tuple[type[BaseException], ...]
    dont_autoretry_for: tuple[type[BaseException], ...]
    max_retries: int | None
    policy: BackoffPolicy
    jitter: bool = True
    fixed_delay: timedelta | None = None
    max_elapsed: timedelta | None = None
    retry_queue: str | None = None


class _Reader:
    """Reads one task's options, collecting every problem instead of stopping at one."""

    def __init__(self, task: Task[Any, Any]) -> None:
        self.task = task
        self.problems: list[str] = []

    def refuse(self, option: str, value: Any, accepted: str) -> None:
        self.problems.append(f"{option}={value!r} is not accepted: give {accepted}")

    def seconds(self, option: str, value: Any, *, minimum: float = MIN_SECONDS) -> timedelta:
        if _is_number(value) and minimum <= value <= MAX_SECONDS:
            return timedelta(seconds=float(value))
        self.refuse(option, value, f"a number of seconds from {minimum:g} to {MAX_SECONDS:.0f}")
        return timedelta(seconds=1)

    def retries(self, option: str, value: Any) -> int | None:
        if value is None or _is_retries(value):
            return value  # type: ignore[no-any-return]
        self.refuse(option, value, "a whole number >= 0, or None for no limit")
        return 0

    def exceptions(self, option: str, value: Any) -> tuple[type[BaseException], ...]:
        if value is None:
            return ()
        if _is_exception_class(value):
            return (value,)
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            self.refuse(option, value, _EXCEPTIONS)
            return ()
        items = tuple(value)
        bad = [item for item in items if not _is_exception_class(item)]
        if bad:
            self.refuse(option, value, f"{_EXCEPTIONS} (not {bad[0]!r})")
        return tuple(item for item in items if _is_exception_class(item))

    def flag(self, option: str, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        self.refuse(option, value, "True or False")
        return True

    def queue(self, option: str, value: Any) -> str | None:
        rule = QueueName()
        if rule.accepts(value):
            return value  # type: ignore[no-any-return]
        self.refuse(option, value, rule.accepted)
        return None

    def attr(self, name: str, default: Any = None) -> Any:
        return getattr(self.task, name, default)

    def fail_if_any(self) -> None:
        if self.problems:
            raise OutboxConfigError(
                f"Task {self.task.name!r} has retry options celery-outbox does not accept: "
                + "; ".join(self.problems)
                + "."
            )


def options_from_task(task: Task[Any, Any]) -> RetryOptions:
    """Read Celery's retry options off ``task`` (seconds) into :class:`RetryOptions`.

    ``retry_backoff``: ``True`` is a base of 1 s, a number is the base in seconds, and
    ``False`` (or ``0``/``None``) means no backoff: each retry waits ``countdown`` from
    ``retry_kwargs``, else ``default_retry_delay``, as in Celery. ``retry_jitter=False``
    waits the top of each window. ``retry_kwargs`` may hold ``max_retries`` and
    ``countdown``. ``retry_queue`` is ``None`` or a queue name.

    Raises
    ------
    OutboxConfigError
        Naming the task and every option with a value it does not accept.
    """
    read = _Reader(task)
    retry_kwargs = _retry_kwargs(read)
    max_retries = read.retries("max_retries", read.attr("max_retries"))
    if "max_retries" in retry_kwargs:
        max_retries = read.retries("retry_kwargs['max_retries']", retry_kwargs["max_retries"])
    options = RetryOptions(
        autoretry_for=read.exceptions("autoretry_for", read.attr("autoretry_for")),
        dont_autoretry_for=read.exceptions("dont_autoretry_for", read.attr("dont_autoretry_for")),
        max_retries=max_retries,
        policy=BackoffPolicy(
            base=_backoff_base(read),
            cap=read.seconds("retry_backoff_max", read.attr("retry_backoff_max")),
        ),
        jitter=read.flag("retry_jitter", read.attr("retry_jitter", True)),
        fixed_delay=_fixed_delay(read, retry_kwargs),
        max_elapsed=_max_elapsed(read),
        retry_queue=read.queue("retry_queue", read.attr("retry_queue")),
    )
    read.fail_if_any()
    return options


def with_retry_arguments(
    options: RetryOptions,
    *,
    countdown: Any,
    eta: Any,
    max_retries: Any,
    clock: Callable[[], datetime] = utcnow,
) -> tuple[RetryOptions, float | None]:
    """``options`` with ``retry(max_retries=...)`` applied, and the wait ``retry()`` asked
    for in seconds (from ``countdown`` or ``eta``; ``None``: the task's own waits).

    An ``eta`` is an instant: its wait is measured on ``clock``, read only then (the
    worker passes the database's clock, which parked due times are on).

    Raises
    ------
    OutboxConfigError
        Naming the ``retry()`` argument that is not accepted.
    """
    problems = []
    if max_retries is not None and not _is_retries(max_retries):
        problems.append(f"max_retries={max_retries!r} (give a whole number >= 0)")
    if isinstance(eta, datetime) and eta.tzinfo is not None:
        countdown = (eta - clock()).total_seconds()
    elif eta is not None:
        problems.append(f"eta={eta!r} (give an aware datetime)")
    if countdown is not None and not _is_number(countdown):
        problems.append(f"countdown={countdown!r} (give a number of seconds)")
    if problems:
        raise OutboxConfigError(f"retry() arguments not accepted: {', '.join(problems)}.")
    if max_retries is not None:
        options = replace(options, max_retries=max_retries)
    return options, None if countdown is None else float(countdown)


def _backoff_base(read: _Reader) -> timedelta:
    value = read.attr("retry_backoff")
    if value is True:
        return timedelta(seconds=1)  # Celery's meaning of True: a factor of 1 s
    if _backoff_off(value):
        return timedelta(seconds=1)  # unused: the fixed delay applies
    if _is_number(value) and MIN_SECONDS <= value <= MAX_SECONDS:
        return timedelta(seconds=float(value))
    read.refuse(
        "retry_backoff",
        value,
        f"True (1 s), False (a fixed default_retry_delay) or {_SECONDS}",
    )
    return timedelta(seconds=1)


def _backoff_off(value: Any) -> bool:
    return value is None or value is False or (_is_number(value) and value == 0)


def _fixed_delay(read: _Reader, retry_kwargs: dict[str, Any]) -> timedelta | None:
    delay = read.seconds("default_retry_delay", read.attr("default_retry_delay"), minimum=0.0)
    if "countdown" in retry_kwargs:
        delay = read.seconds("retry_kwargs['countdown']", retry_kwargs["countdown"], minimum=0.0)
    return delay if _backoff_off(read.attr("retry_backoff")) else None


def _max_elapsed(read: _Reader) -> timedelta | None:
    value = read.attr("retry_max_elapsed")
    return None if value is None else read.seconds("retry_max_elapsed", value)


def _retry_kwargs(read: _Reader) -> dict[str, Any]:
    value = read.attr("retry_kwargs")
    if not value:
        return {}
    if not isinstance(value, dict) or not set(value) <= RETRY_KWARGS:
        read.refuse("retry_kwargs", value, "a dict with only 'max_retries' and 'countdown'")
        return {}
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_retries(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_exception_class(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseException)


_checked: weakref.WeakKeyDictionary[type, RetryOptions] = weakref.WeakKeyDictionary()


def checked_options(task: Task[Any, Any]) -> RetryOptions:
    """:func:`options_from_task`, read once per task class (for every dispatch).

    Raises
    ------
    OutboxConfigError
        As :func:`options_from_task`; nothing is cached then, so it raises every time.
    """
    cls = type(task)
    options = _checked.get(cls)
    if options is None:
        options = _checked[cls] = options_from_task(task)
    return options


def check_tasks(app: Celery, tasks: Iterable[Task[Any, Any]]) -> None:
    """Check the ``outbox_*`` settings of ``app``, then the retry options of each of
    ``tasks``, reporting all bad ones.

    Raises
    ------
    OutboxConfigError
        One message listing each task whose options are not accepted.
    """
    OutboxConfig.from_celery(app)  # the outbox_* settings a failing task reads too
    problems = []
    for task in tasks:
        try:
            options_from_task(task)
        except OutboxConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise OutboxConfigError("\n".join(problems))
