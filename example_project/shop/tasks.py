"""One ``OutboxTask`` per notification channel.

A provider error is retried on random exponential windows (short waits ride on a Celery
ETA, waits above ``outbox_park_after`` are parked in the outbox table); a permanent error
(an invalid phone number, no push device) is in ``dont_autoretry_for`` and goes straight
to the dead letters. When a
channel's task becomes a dead letter, :mod:`shop.receivers` dispatches the next channel.
"""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from celery_outbox import OutboxTask
from shop import services
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
