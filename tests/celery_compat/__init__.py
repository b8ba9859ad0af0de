"""Celery's own integration tests, run with ``OutboxTask`` as every task's class (issue 22)."""
