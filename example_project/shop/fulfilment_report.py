"""How a batch's fulfilment workflows went, read from the database.

``Workflow`` rows (``django_outbox``) give each workflow's status; the shop's own rows give
the proof that every step's effect happened exactly once: each order reserved once, each
item packed once, one shipment per order, holding its items in the chord header's order.
``ship``'s retries (carrier outages and failures) are kept on each shipment; the retries
parked in the outbox are the fulfilment steps' outbox rows with a retry number >= 1 (the
shorter waits ride on a broker ETA and leave no row).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Count

from django_outbox.models import OutboxMessage, Workflow
from shop.models import Order, OrderItem, Shipment

#: ``Workflow.status`` values, in the order the demo shows them.
STATUSES = ("succeeded", "running", "failed")
#: The names of the fulfilment steps' tasks.
STEP_TASKS = ("shop.reserve_stock", "shop.pack_item", "shop.ship")


@dataclass(frozen=True, kw_only=True)
class Fulfilment:
    """The fulfilment workflows of a batch, and the effects of their steps."""

    orders: int
    #: Workflows by status (``succeeded``, ``running``, ``failed``).
    workflows: dict[str, int]
    items: int
    #: Orders whose stock was reserved exactly once.
    reserved_once: int
    #: Items packed exactly once.
    packed_once: int
    #: Orders with exactly one shipment, listing their items in the header's order.
    shipped_once: int
    #: Effects recorded more than once (reservations, packings, shipments): 0.
    duplicates: int
    #: Retries of the ``ship`` steps before the carrier took their order.
    ship_retries: int
    #: Retries of fulfilment steps that waited in the outbox table.
    parked_retries: int

    @property
    def exactly_once(self) -> bool:
        """Every step of every order's fulfilment took effect exactly once."""
        return (
            self.reserved_once == self.shipped_once == self.orders
            and self.packed_once == self.items
            and self.duplicates == 0
        )


def workflow_counts(batch: str) -> dict[str, int]:
    """The batch's fulfilment workflows by status (cheap enough for the live progress)."""
    roots = Order.objects.filter(batch=batch).values("fulfilment_id")
    counts = Counter(Workflow.objects.filter(root_id__in=roots).values_list("status", flat=True))
    return {status: counts.get(status, 0) for status in STATUSES}


def fulfilment(batch: str) -> Fulfilment:
    """The batch's fulfilment, counted from the database."""
    orders = Order.objects.filter(batch=batch).annotate(shipped=Count("shipments"))
    items = OrderItem.objects.filter(order__batch=batch)
    in_order = _items_in_order(batch)
    shipments = _shipments(batch)
    roots = set(orders.values_list("fulfilment_id", flat=True))
    return Fulfilment(
        orders=orders.count(),
        workflows=workflow_counts(batch),
        items=items.count(),
        reserved_once=orders.filter(reservations=1).count(),
        packed_once=items.filter(packings=1).count(),
        shipped_once=sum(
            1
            for order_id, packed in shipments.items()
            if [items for items, _ in packed] == [in_order.get(order_id)]
        ),
        duplicates=_extra(orders.values_list("reservations", flat=True))
        + _extra(items.values_list("packings", flat=True))
        + _extra(orders.values_list("shipped", flat=True)),
        ship_retries=sum(retries for packed in shipments.values() for _, retries in packed),
        parked_retries=_parked_retries(roots),
    )


def _items_in_order(batch: str) -> dict[int, list[int]]:
    """Each order's item ids in the order its chord header packs them."""
    by_order: dict[int, list[int]] = {}
    for order_id, item_id in (
        OrderItem.objects.filter(order__batch=batch).order_by("pk").values_list("order_id", "pk")
    ):
        by_order.setdefault(order_id, []).append(item_id)
    return by_order


def _shipments(batch: str) -> dict[int, list[tuple[list[int], int]]]:
    """Each order's shipments: the item ids each one recorded, and its ``ship`` retries."""
    by_order: dict[int, list[tuple[list[int], int]]] = {}
    for order_id, packed, retries in Shipment.objects.filter(order__batch=batch).values_list(
        "order_id", "packed_items", "retries"
    ):
        by_order.setdefault(order_id, []).append((list(packed), retries))
    return by_order


def _extra(times: Iterable[int]) -> int:
    """How many times past the first the effects counted in ``times`` happened."""
    return sum(max(n - 1, 0) for n in times)


def _parked_retries(roots: set[str]) -> int:
    """Outbox rows of retries (retry number >= 1) of the steps of the workflows ``roots``."""
    rows = OutboxMessage.objects.filter(task_name__in=STEP_TASKS).values_list("options", flat=True)
    return sum(1 for options in rows if _is_retry_of(options, roots))


def _is_retry_of(options: Any, roots: set[str]) -> bool:
    headers = (options or {}).get("headers") or {}
    return headers.get("root_id") in roots and int(headers.get("retries") or 0) >= 1
