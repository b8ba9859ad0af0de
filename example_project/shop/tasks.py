"""One ``OutboxTask`` per notification channel.

A provider error is retried on random exponential windows (short waits ride on a Celery
ETA, waits above ``outbox_park_after`` are parked in the outbox table); a permanent error
(an invalid phone number, no push device) is in ``dont_autoretry_for`` and goes straight
to the dead letters. When a
channel's task becomes a dead letter, :mod:`shop.receivers` dispatches the next channel.

The three fulfilment steps (:mod:`shop.fulfilment`) are atomic ``OutboxTask`` s.
"""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from celery_outbox import OutboxTask
from shop import fulfilment, services
from shop.provider import PermanentError, ProviderError


class ChannelTask(OutboxTask):
    """What the three channel tasks share (Celery's option names and units)."""

    autoretry_for = (ProviderError,)
    dont_autoretry_for = (PermanentError,)
    max_retries = settings.SHOP_MAX_RETRIES
    retry_backoff = settings.SHOP_RETRY_BACKOFF
    retry_backoff_max = 60.0


@shared_task(name="shop.send_push", base=ChannelTask, bind=True)
def send_push(self: ChannelTask, notification_id: int) -> None:
    """Send an order's push notification."""
    services.deliver(notification_id)


@shared_task(name="shop.send_sms", base=ChannelTask, bind=True)
def send_sms(self: ChannelTask, notification_id: int) -> None:
    """Send an order's notification by SMS."""
    services.deliver(notification_id)


@shared_task(name="shop.send_messenger", base=ChannelTask, bind=True)
def send_messenger(self: ChannelTask, notification_id: int) -> None:
    """Send an order's notification through a messenger app."""
    services.deliver(notification_id)


#: The task of each channel.
CHANNEL_TASKS = {"push": send_push, "sms": send_sms, "messenger": send_messenger}


class FulfilmentTask(OutboxTask):
    """The fulfilment steps: atomic (their ORM writes commit with the step, exactly once).

    The carrier's outages are retried with enough budget to outlast the demo's: waits are
    capped at ``retry_backoff_max``, so the workflow resumes soon after the carrier is back.
    """

    atomic = True
    autoretry_for = (ProviderError,)
    max_retries = settings.SHOP_FULFILMENT_MAX_RETRIES
    retry_backoff = settings.SHOP_RETRY_BACKOFF
    retry_backoff_max = 2.0


@shared_task(name="shop.reserve_stock", base=FulfilmentTask)
def reserve_stock(order_id: int) -> None:
    """The fulfilment's first step: reserve the order's stock."""
    fulfilment.reserve(order_id)


@shared_task(name="shop.pack_item", base=FulfilmentTask)
def pack_item(order_id: int, item_id: int) -> int:
    """One header step of the fulfilment's chord: pack one item."""
    return fulfilment.pack(order_id, item_id)


@shared_task(name="shop.ship", base=FulfilmentTask, bind=True)
def ship(self: FulfilmentTask, packed: list[int], order_id: int) -> str:
    """The chord's body: ship the order once every item is packed (``packed``: header order)."""
    return fulfilment.dispatch(packed, order_id, attempt=self.request.retries)
