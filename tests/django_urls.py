"""URLs for the Django tests: the admin, at ``/admin/``, and the app's URLs at ``/outbox/``."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("outbox/", include("django_outbox.urls")),
]
