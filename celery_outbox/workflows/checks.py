"""A warning, in development, for a canvas whose steps are not all atomic ``OutboxTask`` s.

Such a canvas is allowed: each step keeps the promises of its kind (docs/workflows.md).
But a reader of ``chain(a.s(), b.s())`` may believe every step exactly once; so while
warnings are enabled (:func:`enable`: Django's ``DEBUG``, or Python's development mode
``-X dev``), the first dispatch of each canvas shape (its task names in order) warns once
with :class:`NonDurableStepWarning`, naming the steps and what they get instead.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery, Task

from celery_outbox.dispatch.target import is_atomic

#: Whether the warnings are on; Django's app config points it at ``settings.DEBUG``.
_enabled: Callable[[], bool] = lambda: bool(sys.flags.dev_mode)  # noqa: E731
_warned: set[tuple[str, ...]] = set()
_lock = threading.Lock()


class NonDurableStepWarning(UserWarning):
    """A canvas has steps that are not atomic ``OutboxTask`` s (at least once, or Celery's)."""


def enable(when: Callable[[], bool]) -> None:
    """Warn while ``when()`` is true (read at each new canvas shape)."""
    global _enabled
    _enabled = when


def warn_once(
    app: Celery, names: Sequence[str], is_step_task: Callable[[Task[Any, Any] | None], bool]
) -> bool:
    """Warn about the canvas of tasks ``names`` (in order) once per shape, when enabled
    and some of them are not atomic ``OutboxTask`` s; whether it warned.
    """
    shape = tuple(names)
    if shape in _warned or not _enabled():
        return False
    loose = []
    plain = []
    for name in dict.fromkeys(shape):
        task = app.tasks.get(name)
        if task is None or not is_step_task(task):
            plain.append(name)
        elif not is_atomic(task):
            loose.append(name)
    with _lock:
        if shape in _warned:
            return False
        _warned.add(shape)
    if not loose and not plain:
        return False
    parts = []
    if loose:
        parts.append(f"{', '.join(loose)} (not atomic: run at least once)")
    if plain:
        parts.append(f"{', '.join(plain)} (not OutboxTasks: Celery's own behaviour)")
    warnings.warn(
        f"celery-outbox: the canvas {' → '.join(shape)} has steps without exactly-once "
        f"effects: {'; '.join(parts)}. See docs/workflows.md.",
        NonDurableStepWarning,
        stacklevel=4,
    )
    return True
