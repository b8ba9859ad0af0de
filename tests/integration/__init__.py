"""End-to-end tests against real databases, brokers and workers."""

from __future__ import annotations
