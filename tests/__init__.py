"""The celery-outbox test suite (STYLE.md section 7)."""

from __future__ import annotations
