"""Management commands of the outbox app."""

from __future__ import annotations
