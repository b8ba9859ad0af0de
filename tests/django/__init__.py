"""pytest-django tests on PostgreSQL."""

from __future__ import annotations
