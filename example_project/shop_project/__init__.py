"""The demo shop's Django project; importing it loads the Celery app (as Celery's docs do)."""

from __future__ import annotations

from shop_project.celery import app as celery_app

__all__ = ["celery_app"]
