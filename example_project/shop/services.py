"""What the shop does: place orders (and start their fulfilment), deliver notifications,
fail over to the next channel.

The view, the ``place_orders`` command and the demo all go through these functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from functools import cache

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from kombu.utils.uuid import uuid

from django_outbox.models import DeadLetter
from shop import fulfilment
from shop.models import Channel, Notification, Order, OrderItem, next_channel
from shop.provider import FakeProvider


@cache
def provider() -> FakeProvider:
    """The fake provider configured by ``settings.SHOP_PROVIDER``."""
    return FakeProvider.from_settings(settings.SHOP_PROVIDER)


def place_order(
    *,
    customer: str,
    phone: str,
    total: Decimal,
    items: Sequence[str],
    device: str = "",
    batch: str = "",
) -> Order:
    """Write the order and its items, dispatch its push notification and start its
    fulfilment workflow (:mod:`shop.fulfilment`), in one transaction.

    The outbox rows commit (or roll back) with the order, and are published right after
    COMMIT: no order without its notification and fulfilment, neither about a rolled-back
    order.

    Raises
    ------
    ValueError
        When ``items`` is empty (there would be nothing to pack).
    """
    if not items:
        raise ValueError("An order needs at least one item.")
    with transaction.atomic():
        order = Order.objects.create(
            customer=customer, phone=phone, total=total, device=device, batch=batch
        )
        OrderItem.objects.bulk_create(OrderItem(order=order, sku=sku) for sku in items)
        notify(order, Channel.PUSH)
        fulfilment.start(order)
    return order


def notify(order: Order, channel: str) -> Notification:
    """Dispatch ``channel``'s task for ``order``; call inside a transaction."""
    from shop.tasks import CHANNEL_TASKS

    # The task id is ours to choose, so the notification row can name it up front.
    note = Notification.objects.create(order=order, channel=channel, task_id=uuid())
    # An outbox row in the caller's transaction, published right after COMMIT.
    CHANNEL_TASKS[channel].apply_async((note.pk,), task_id=note.task_id)
    return note


def deliver(notification_id: int) -> None:
    """Send one notification (one attempt). Raises the provider's error on failure.

    Idempotent: a notification already delivered is not sent again, so a duplicate
    delivery of the task message (at-least-once) sends nothing twice.
    """
    note = Notification.objects.select_related("order").get(pk=notification_id)
    if note.status == Notification.Status.DELIVERED:
        return
    Notification.objects.filter(pk=note.pk).update(attempts=F("attempts") + 1)
    recipient = note.order.device if note.channel == Channel.PUSH else note.order.phone
    text = f"Order #{note.order_id} is confirmed: {note.order.total} EUR."
    provider().send(note.channel, recipient, text, key=f"{note.pk}:{note.attempts + 1}")
    Notification.objects.filter(pk=note.pk).update(
        status=Notification.Status.DELIVERED, delivered_at=timezone.now()
    )


def fail_over(letter_id: int) -> Notification | None:
    """Mark a dead-lettered notification ``dead`` and dispatch the next channel.

    Both happen in one transaction; dispatching twice for one order and channel is
    impossible (the next channel's row exists already), so running this again after a
    redelivery does nothing. Returns the new notification, if any.
    """
    letter = DeadLetter.objects.get(pk=letter_id)
    with transaction.atomic():
        note = Notification.objects.select_related("order").get(pk=letter.args[0])
        Notification.objects.filter(pk=note.pk).exclude(
            status=Notification.Status.DELIVERED
        ).update(
            status=Notification.Status.DEAD,
            dead_letter_id=letter_id,
            last_error=f"{letter.exception_type}: {letter.exception_message}",
        )
        channel = next_channel(note.channel)
        if channel is None or note.order.notifications.filter(channel=channel).exists():
            return None
        return notify(note.order, channel)
