"""URLs of the benchmark processes: the admin (timed by ``--only admin_pages``)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
