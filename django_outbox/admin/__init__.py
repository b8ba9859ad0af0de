"""The Django admin of the outbox: one module per admin, and their base."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# Each module registers its admin with Django's site when imported (autodiscover
# imports this package).
from django_outbox.admin import (  # noqa: F401
    completed,
    dead_letters,
    messages,
    overview,
    workflows,
)

#: Names of the module ``django_outbox.admin`` this package replaced: importable from here, with a
#: warning, until a later release.
_MOVED_NAMES = {
    "CompletedTask": "django_outbox.admin.dead_letters",
    "CompletedTaskAdmin": "django_outbox.admin.dead_letters",
    "DEAD_LETTER_STATUSES": "django_outbox.admin.dead_letters",
    "DeadLetter": "django_outbox.admin.dead_letters",
    "DeadLetterAdmin": "django_outbox.admin.dead_letters",
    "DeadLetterQuerySet": "django_outbox.admin.dead_letters",
    "DeadLetterStatus": "django_outbox.admin.dead_letters",
    "LetterGroupKey": "django_outbox.admin.dead_letters",
    "OutboxMessage": "django_outbox.admin.dead_letters",
    "OutboxMessageAdmin": "django_outbox.admin.dead_letters",
    "OverviewAdmin": "django_outbox.admin.dead_letters",
    "RowAction": "django_outbox.admin.dead_letters",
    "RowActionsAdmin": "django_outbox.admin.dead_letters",
    "WorkflowAdmin": "django_outbox.admin.dead_letters",
    "admin": "django_outbox.admin.dead_letters",
    "admin_actions": "django_outbox.admin.dead_letters",
    "admin_link": "django_outbox.admin.dead_letters",
    "clipped": "django_outbox.admin.dead_letters",
    "discard_letters": "django_outbox.admin.dead_letters",
    "folded": "django_outbox.admin.dead_letters",
    "head": "django_outbox.admin.dead_letters",
    "instance_alias": "django_outbox.admin.dead_letters",
    "is_dead": "django_outbox.admin.dead_letters",
    "letter_workflow": "django_outbox.admin.dead_letters",
    "letters_url": "django_outbox.admin.dead_letters",
    "pretty_json": "django_outbox.admin.dead_letters",
    "recent_values_filter": "django_outbox.admin.dead_letters",
    "requeue_letters": "django_outbox.admin.dead_letters",
    "short_time": "django_outbox.admin.dead_letters",
    "task_row_link": "django_outbox.admin.dead_letters",
    "time_window_filter": "django_outbox.admin.dead_letters",
}
_warned: set[str] = set()


def __getattr__(name: str) -> Any:
    """A name of the former module ``django_outbox.admin``: from its new home, warning once."""
    home = _MOVED_NAMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"{__name__}.{name} moved to {home}.{name}: import it from there.",
            DeprecationWarning,
            stacklevel=2,
        )
    return getattr(importlib.import_module(home), name)
