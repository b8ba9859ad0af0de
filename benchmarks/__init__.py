"""Benchmarks of celery-outbox against plain Celery and django-celery-outbox.

Run everything with ``python -m benchmarks`` (see ``docs/benchmarks.md``). These are
programs, never timed tests: every number is a ratio measured within one run.
"""

from __future__ import annotations
