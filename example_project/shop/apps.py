"""The shop app: connects the fail-over receiver when Django starts."""

from __future__ import annotations

from django.apps import AppConfig


class ShopConfig(AppConfig):
    """``INSTALLED_APPS = [..., "shop"]``."""

    name = "shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Fail a dead notification over to the next channel (see :mod:`shop.receivers`)."""
        from shop import receivers

        receivers.connect()
