"""The demo shop: orders, and their notifications failing over PUSH -> SMS -> messenger."""

from __future__ import annotations
