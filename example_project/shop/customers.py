"""Made-up customers for ``place_orders`` and the demo.

Every fourth customer has no push device (push fails for good: straight to SMS); every
eighth of them also has a number no SMS or messenger can reach (undeliverable). Orders
hold one to four items.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

_NAMES = (
    "Ada",
    "Grace",
    "Linus",
    "Guido",
    "Barbara",
    "Ken",
    "Margaret",
    "Dennis",
    "Frances",
    "Edsger",
    "Radia",
    "Alan",
)
_PRODUCTS = ("mug", "t-shirt", "sticker", "notebook", "hoodie", "cap")


@dataclass(frozen=True, kw_only=True)
class Customer:
    """Who orders, with the number the SMS and messenger channels use."""

    name: str
    phone: str
    device: str
    total: Decimal
    #: What the customer orders: one to four SKUs.
    items: tuple[str, ...]


def customer(index: int) -> Customer:
    """The ``index``-th made-up customer (deterministic)."""
    phone = f"06-12-{index:02d} (call me)" if index % 8 == 5 else f"+3361234{index:04d}"
    device = "" if index % 4 == 1 else f"device-{index:04d}"
    return Customer(
        name=f"{_NAMES[index % len(_NAMES)]} #{index}",
        phone=phone,
        device=device,
        total=Decimal(10 + (index * 7) % 90) + Decimal("0.99"),
        items=tuple(_PRODUCTS[(index + n) % len(_PRODUCTS)] for n in range(1 + index % 4)),
    )
