"""Unit tests: no I/O."""

from __future__ import annotations
