"""Subcommands of ``manage.py outbox``, one small module each.

A subcommand is a module of this package defining ``HELP`` (one line),
``add_arguments(parser)`` and ``handle(command, options)``; adding a module adds the
subcommand. Modules whose name starts with ``_`` are helpers.
"""

from __future__ import annotations

import importlib
import pkgutil
from argparse import ArgumentParser
from typing import Any, Protocol

from django.core.management.base import BaseCommand


class Subcommand(Protocol):
    """What a subcommand module provides."""

    HELP: str

    def add_arguments(self, parser: ArgumentParser) -> None: ...

    def handle(self, command: BaseCommand, options: dict[str, Any]) -> None: ...


def subcommands() -> dict[str, Subcommand]:
    """Every subcommand module of this package, by name, sorted."""
    names = sorted(info.name for info in pkgutil.iter_modules(__path__))
    found: dict[str, Subcommand] = {}
    for name in names:
        if not name.startswith("_"):
            found[name] = importlib.import_module(f"{__name__}.{name}")
    return found
