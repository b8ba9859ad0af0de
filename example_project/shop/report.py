"""Counts of one batch of orders, read from the database (the demo's progress and summary).

Everything is scoped to the notifications of the batch's orders and their task ids, so
a database holding other orders gives the same numbers.

What is measured
----------------
retries
    Runs of a notification task after its first (``attempts - 1`` per notification).
parked retries
    Retries whose wait exceeded ``outbox_park_after``: each is a row in the outbox
    table carrying the task's id and a retry number >= 1 in its headers. The other
    retries rode on a broker ETA and never touched the table.
publish latency
    For the rows written by a dispatch (an order's push, a fail-over's next channel):
    from the row's ``created_at`` (written inside the dispatching transaction, just
    before its COMMIT) to its ``published_at`` (the on-commit publisher marked it after
    the broker took the message). Needs ``outbox_keep_published`` > 0 so published rows
    stay in the table.
parked lag
    For parked retries: from ``available_at`` (when the retry was due) to
    ``published_at`` (when the sweeper published it); bounded by the sweep interval.
fulfilment
    The orders' fulfilment workflows and their steps' effects
    (:mod:`shop.fulfilment_report`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from django.db.models import Sum
from django.utils import timezone

from django_outbox.models import DeadLetter, OutboxMessage
from shop.fulfilment_report import Fulfilment, fulfilment, workflow_counts
from shop.models import CHANNELS, Channel, Notification, Order


@dataclass(frozen=True, kw_only=True)
class Progress:
    """Where a batch stands while the worker is busy."""

    orders: int
    settled: int
    by_channel: dict[str, dict[str, int]]
    attempts: int
    dead_letters: int
    parked_waiting: int
    #: The fulfilment workflows by status (``succeeded``, ``running``, ``failed``).
    workflows: dict[str, int]

    @property
    def done(self) -> bool:
        """Every order settled (delivered on some channel, or dead on all of them) and
        its fulfilment workflow finished.
        """
        return (
            self.orders > 0
            and self.settled == self.orders
            and sum(self.workflows.values()) == self.orders
            and not self.workflows["running"]
        )


@dataclass(frozen=True, kw_only=True)
class Summary:
    """The demo's final numbers (see the module docstring for what each one measures)."""

    orders: int
    delivered: dict[str, int]
    undeliverable: int
    notifications: int
    attempts: int
    retries: int
    parked_retries: int
    eta_retries: int
    dead_letters: int
    dead_letters_by_exception: dict[str, int]
    publish_latency_ms: dict[str, float | int] = field(default_factory=dict)
    parked_lag_ms: dict[str, float | int] = field(default_factory=dict)
    fulfilment: Fulfilment

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (``demo.py --json``)."""
        data = asdict(self)
        data["fulfilment"]["exactly_once"] = self.fulfilment.exactly_once
        return data


def progress(batch: str) -> Progress:
    """The current state of ``batch``."""
    notes = Notification.objects.filter(order__batch=batch)
    by_channel = {
        channel.value: {status.value: 0 for status in Notification.Status} for channel in CHANNELS
    }
    for channel, status in notes.values_list("channel", "status"):
        by_channel[channel][status] += 1
    task_ids = list(notes.values_list("task_id", flat=True))
    return Progress(
        orders=Order.objects.filter(batch=batch).count(),
        settled=settled_orders(batch),
        by_channel=by_channel,
        attempts=notes.aggregate(n=Sum("attempts"))["n"] or 0,
        dead_letters=DeadLetter.objects.filter(task_id__in=task_ids).count(),
        parked_waiting=OutboxMessage.objects.filter(
            task_id__in=task_ids, status="pending", available_at__gt=timezone.now()
        ).count(),
        workflows=workflow_counts(batch),
    )


def settled_orders(batch: str) -> int:
    """Orders delivered on some channel, or whose last channel is dead."""
    notes = Notification.objects.filter(order__batch=batch)
    delivered = notes.filter(status=Notification.Status.DELIVERED)
    last_dead = notes.filter(channel=CHANNELS[-1], status=Notification.Status.DEAD)
    return len(
        set(delivered.values_list("order_id", flat=True))
        | set(last_dead.values_list("order_id", flat=True))
    )


def summarise(batch: str) -> Summary:
    """The final numbers of ``batch``, counted from the database."""
    notes = Notification.objects.filter(order__batch=batch)
    task_ids = list(notes.values_list("task_id", flat=True))
    letters = DeadLetter.objects.filter(task_id__in=task_ids)
    rows = list(
        OutboxMessage.objects.filter(task_id__in=task_ids).values_list(
            "options", "created_at", "available_at", "published_at"
        )
    )
    attempts = [n for n in notes.values_list("attempts", flat=True) if n > 0]
    retries = sum(attempts) - len(attempts)
    parked = [row for row in rows if _retry_number(row[0]) >= 1]
    dispatched = [row for row in rows if _retry_number(row[0]) == 0]
    orders = Order.objects.filter(batch=batch).count()
    delivered = Counter(
        notes.filter(status=Notification.Status.DELIVERED).values_list("channel", flat=True)
    )
    return Summary(
        orders=orders,
        delivered={channel.value: delivered.get(channel.value, 0) for channel in CHANNELS},
        undeliverable=notes.filter(
            channel=Channel.MESSENGER, status=Notification.Status.DEAD
        ).count(),
        notifications=len(task_ids),
        attempts=sum(attempts),
        retries=retries,
        parked_retries=len(parked),
        eta_retries=retries - len(parked),
        dead_letters=letters.count(),
        dead_letters_by_exception=dict(
            Counter(
                path.rsplit(".", 1)[-1] for path in letters.values_list("exception_type", flat=True)
            )
        ),
        publish_latency_ms=percentiles([r[3] - r[1] for r in dispatched if r[3] is not None]),
        parked_lag_ms=percentiles([r[3] - r[2] for r in parked if r[3] is not None]),
        fulfilment=fulfilment(batch),
    )


def percentiles(durations: Sequence[timedelta]) -> dict[str, float | int]:
    """``count``, ``p50``, ``p99`` and ``max`` of ``durations`` in milliseconds (nearest rank)."""
    values = sorted(d.total_seconds() * 1000 for d in durations)
    if not values:
        return {"count": 0}

    def rank(p: float) -> float:
        return round(values[max(math.ceil(p / 100 * len(values)) - 1, 0)], 1)

    return {"count": len(values), "p50": rank(50), "p99": rank(99), "max": round(values[-1], 1)}


def _retry_number(options: Any) -> int:
    headers = (options or {}).get("headers") or {}
    return int(headers.get("retries") or 0)
