"""One contract suite run against every store."""

from __future__ import annotations
