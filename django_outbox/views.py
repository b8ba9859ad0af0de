"""The Prometheus metrics view (``django_outbox.urls``, path ``metrics/``).

Open only to a staff user holding ``django_outbox.view_outboxmessage``, or to a request
bearing ``Authorization: Bearer <DJANGO_OUTBOX_METRICS_TOKEN>`` (compared in constant
time). Anyone else: 401 (no credentials, or a wrong token) or 403 (signed in without
the permission). Never open by default: without the setting, only the permission opens it.

The page holds the outbox gauges of the project's Celery app
(:class:`~celery_outbox.metrics.OutboxCollector`, read from the store of every
``DJANGO_OUTBOX_DATABASES`` alias) and this process's counters (``prometheus_client``'s
default registry), or, when ``PROMETHEUS_MULTIPROC_DIR`` is set, every process's
counters summed (``MultiProcessCollector``).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable

from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from celery_outbox.metrics import OutboxCollector
from django_outbox.celery_app import project_app
from django_outbox.settings import settings

#: The permission that opens the view to a staff user.
PERMISSION = "django_outbox.view_outboxmessage"


def metrics(request: HttpRequest) -> HttpResponse:
    """The metrics in Prometheus' text format, to the permitted only (see the module)."""
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    return HttpResponse(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)


def scrape_registry() -> CollectorRegistry:
    """A registry of the outbox gauges and the counters (one process's, or all of them)."""
    registry = CollectorRegistry()
    registry.register(OutboxCollector(project_app()))
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(_DefaultRegistry())
    return registry


class _DefaultRegistry:
    """Serves ``prometheus_client``'s default registry inside another one."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """``None`` when ``request`` may read the metrics, else the response refusing it."""
    if _bearer_accepted(request.headers.get("Authorization", "")):
        return None
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        if user.is_staff and user.has_perm(PERMISSION):
            return None
        return HttpResponse("Forbidden: needs the outbox view permission.\n", status=403)
    refused = HttpResponse("Unauthorized: sign in or send the metrics token.\n", status=401)
    refused["WWW-Authenticate"] = 'Bearer realm="celery-outbox metrics"'
    return refused


def _bearer_accepted(header: str) -> bool:
    """Whether ``header`` is ``Bearer <DJANGO_OUTBOX_METRICS_TOKEN>`` (never without a token)."""
    token = settings.METRICS_TOKEN
    scheme, _, given = header.partition(" ")
    if not token or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())
