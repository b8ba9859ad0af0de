"""The ``outbox`` command."""

from __future__ import annotations
