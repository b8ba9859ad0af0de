"""An order's fulfilment: a durable workflow of three atomic steps.

``reserve_stock`` → a chord of one ``pack_item`` per item → ``ship`` (the chord's body,
given the pack results in the header's order). The canvas is dispatched in the
transaction that creates the order (:func:`start`); each step is an atomic ``OutboxTask``
(:mod:`shop.tasks`), so its writes below commit together with its ``CompletedTask`` row
and its successors' outbox rows: each effect happens exactly once, however often a step
is delivered or retried. ``ship`` calls the carrier through the flaky fake provider
(channel ``carrier``), so its outages and failures make it retry.
"""

from __future__ import annotations

from django.db.models import F
from django.utils import timezone
from kombu.utils.uuid import uuid

from shop.models import Order, OrderItem, Shipment

#: The fake provider's channel the carrier answers on (outages: ``<outage_dir>/carrier.down``).
CARRIER = "carrier"


def start(order: Order) -> str:
    """Dispatch ``order``'s fulfilment workflow; call inside the transaction creating it.

    Returns the workflow's root id (the ``reserve_stock`` task id), kept on the order as
    ``fulfilment_id`` so the ``Workflow`` row can be found.
    """
    from celery import chain, chord

    from shop.tasks import pack_item, reserve_stock, ship

    root_id = uuid()
    Order.objects.filter(pk=order.pk).update(fulfilment_id=root_id)
    items = order.items.order_by("pk").values_list("pk", flat=True)
    chain(
        reserve_stock.si(order.pk).set(task_id=root_id),
        chord([pack_item.si(order.pk, item_id) for item_id in items], ship.s(order.pk)),
    ).apply_async()
    return root_id


def reserve(order_id: int) -> None:
    """Reserve the stock of an order's items (the demo only counts that it happened)."""
    Order.objects.filter(pk=order_id).update(reservations=F("reservations") + 1)


def pack(order_id: int, item_id: int) -> int:
    """Pack one item; returns its id (the chord collects them for :func:`dispatch`)."""
    OrderItem.objects.filter(pk=item_id, order_id=order_id).update(
        packings=F("packings") + 1, packed_at=timezone.now()
    )
    return item_id


def dispatch(packed: list[int], order_id: int, *, attempt: int) -> str:
    """Hand the packed order to the carrier and record the shipment; returns its tracking id.

    ``attempt`` is the step's retry number (0 for its first run), kept on the shipment.

    Raises the provider's error when the carrier fails this attempt (the step retries;
    its transaction, and so the shipment row, rolls back).
    """
    from shop.services import provider

    order = Order.objects.get(pk=order_id)
    tracking = f"TRK-{order_id:06d}"
    text = f"Pick up {len(packed)} parcel(s) for {order.customer}: {tracking}"
    provider().send(CARRIER, order.customer, text, key=f"ship:{order_id}:{attempt}")
    Shipment.objects.create(order=order, packed_items=packed, tracking=tracking, retries=attempt)
    return tracking
