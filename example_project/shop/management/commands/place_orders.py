"""``python manage.py place_orders N``: place N orders, each with its notification."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from shop import services
from shop.customers import customer


class Command(BaseCommand):
    """Place orders for made-up customers (some have no push device or a bad number)."""

    help = "Place N orders; each dispatches its push notification in the same transaction."

    def add_arguments(self, parser: CommandParser) -> None:
        """``N`` and ``--batch``."""
        parser.add_argument("count", type=int, help="how many orders")
        parser.add_argument("--batch", default="", help="label the orders (the demo's run id)")

    def handle(self, *args: Any, count: int, batch: str, **options: Any) -> None:
        """Place the orders, one transaction each."""
        for index in range(count):
            who = customer(index)
            services.place_order(
                customer=who.name,
                phone=who.phone,
                total=who.total,
                items=who.items,
                device=who.device,
                batch=batch,
            )
        self.stdout.write(self.style.SUCCESS(f"Placed {count} order(s)."))
