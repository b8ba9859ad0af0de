"""Reliability tests: kill processes, stop servers, feed bad input; count every task."""

from __future__ import annotations
