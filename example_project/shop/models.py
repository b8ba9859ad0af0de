"""Orders, their items and shipment, and the notifications sent about them."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Order(models.Model):
    """An order; placing it dispatches its first notification in the same transaction."""

    customer = models.CharField(max_length=100)
    phone = models.CharField(max_length=32)
    #: The customer's push device token; empty when the app is not installed.
    device = models.CharField(max_length=64, blank=True, default="")
    total = models.DecimalField(max_digits=10, decimal_places=2)
    #: Orders placed together (one run of ``place_orders`` or of the demo).
    batch = models.CharField(max_length=32, blank=True, default="", db_index=True)
    created_at = models.DateTimeField(default=timezone.now)
    #: The root id of the order's fulfilment workflow (``django_outbox``'s ``Workflow``).
    fulfilment_id = models.CharField(max_length=255, blank=True, default="", db_index=True)
    #: Times the fulfilment's ``reserve_stock`` step committed (exactly once: 1).
    reservations = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"Order #{self.pk} for {self.customer}"


class OrderItem(models.Model):
    """One line of an order, packed by its own step of the fulfilment chord."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="items")
    sku = models.CharField(max_length=64)
    #: Times the item's ``pack_item`` step committed (exactly once: 1).
    packings = models.PositiveIntegerField(default=0)
    packed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.sku} of order #{self.order_id}"


class Shipment(models.Model):
    """An order handed to the carrier: the fulfilment's last step (the chord's body).

    No unique constraint on ``order`` on purpose: a second shipment would be a visible
    duplicate (the demo counts them), not an error that hides it.
    """

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="shipments")
    #: The pack steps' results (item ids), in the chord header's order.
    packed_items = models.JSONField(default=list)
    tracking = models.CharField(max_length=64)
    #: Retries the ``ship`` step needed before the carrier took the order.
    retries = models.PositiveIntegerField(default=0)
    shipped_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"Shipment {self.tracking} of order #{self.order_id}"


class Channel(models.TextChoices):
    """Notification channels, in fail-over order."""

    PUSH = "push", "push"
    SMS = "sms", "SMS"
    MESSENGER = "messenger", "messenger"


#: The order in which channels are tried.
CHANNELS: tuple[Channel, ...] = (Channel.PUSH, Channel.SMS, Channel.MESSENGER)


def next_channel(channel: str) -> Channel | None:
    """The channel tried after ``channel`` failed for good, or ``None`` after the last."""
    index = CHANNELS.index(Channel(channel))
    return CHANNELS[index + 1] if index + 1 < len(CHANNELS) else None


class Notification(models.Model):
    """One channel's attempt to tell a customer about an order.

    ``queued`` when dispatched, ``delivered`` when the provider accepted it, ``dead`` when
    its task became a dead letter (then the next channel gets its own row).
    """

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        DELIVERED = "delivered", "delivered"
        DEAD = "dead", "dead"

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="notifications")
    channel = models.CharField(max_length=16, choices=Channel.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    #: Runs of the task (the first attempt and every retry).
    attempts = models.PositiveIntegerField(default=0)
    #: The Celery task id: the same across retries, and the outbox row's ``task_id``.
    task_id = models.CharField(max_length=255, unique=True)
    dead_letter_id = models.BigIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["order", "channel"], name="shop_one_per_channel"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} for order #{self.order_id} ({self.status})"
