"""Argument types of the subcommands: every number checked against a range, by argparse.

A value out of range is an ``ArgumentTypeError``, which ``manage.py`` reports as
``argument --NAME: 'VALUE' is not accepted: give <range>.`` (a ``CommandError`` under
``call_command``): never a traceback, never a silent clamp to the nearest accepted value.
"""

from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Callable

from celery_outbox.config import Rule


def seconds(rule: Rule) -> Callable[[str], float]:
    """An argparse type reading a number of seconds that ``rule`` accepts."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not rule.accepts(value):
            raise ArgumentTypeError(f"{text!r} is not accepted: give {rule.accepted}.")
        return value

    return parse


def count(rule: Rule) -> Callable[[str], int]:
    """An argparse type reading an integer that ``rule`` accepts."""

    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:
            value = None
        if value is None or not rule.accepts(value):
            raise ArgumentTypeError(f"{text!r} is not accepted: give {rule.accepted}.")
        return value

    return parse
