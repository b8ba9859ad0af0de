"""Smoke tests of the benchmark harness."""

from __future__ import annotations
