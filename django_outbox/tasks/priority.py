"""Django's task priority (-100 … 100, higher runs first) as a Celery message priority.

The range is mapped linearly onto the broker's ten levels, 0 … 9, and rounded half up
(Django's default 0 is 5 on RabbitMQ). RabbitMQ runs higher numbers first (the queue
needs ``x-max-priority``); Redis runs *lower* numbers first (kombu reads its priority
lists 0, 3, 6, 9 in that order, and a message without a priority is 0), so on Redis the
scale is turned over: Django 100 → 0, Django 0 → 4, Django -100 → 9.
"""

from __future__ import annotations

import math

from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY

#: The highest Celery message priority (RabbitMQ's and kombu's Redis range is 0 … 9).
BROKER_MAX_PRIORITY = 9
#: Broker URL schemes whose transport runs lower priority numbers first.
LOW_FIRST_SCHEMES = frozenset({"redis", "rediss", "redis+socket", "sentinel"})


def broker_priority(priority: int, *, low_first: bool) -> int:
    """The Celery ``priority`` of a Django task of ``priority``.

    Parameters
    ----------
    priority
        Django's, -100 … 100 (validated by the backend before this is called).
    low_first
        Whether the broker runs lower numbers first (Redis).
    """
    span = TASK_MAX_PRIORITY - TASK_MIN_PRIORITY
    level = math.floor((priority - TASK_MIN_PRIORITY) * BROKER_MAX_PRIORITY / span + 0.5)
    return BROKER_MAX_PRIORITY - level if low_first else level


def runs_low_first(broker_url: str | None) -> bool:
    """Whether the broker of ``broker_url`` runs lower priority numbers first."""
    scheme = (broker_url or "amqp://").partition("://")[0].lower()
    return scheme in LOW_FIRST_SCHEMES
