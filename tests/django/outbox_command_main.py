"""``python -m tests.django.outbox_command_main outbox relay ...``: a ``manage.py`` for tests.

Django's settings come from ``DJANGO_SETTINGS_MODULE`` (``tests.django.db_settings``, which
reads the database from ``OUTBOX_DJANGO_DB_URL``).
"""

from __future__ import annotations

import sys

from django.core.management import execute_from_command_line

if __name__ == "__main__":
    execute_from_command_line(["manage.py", *sys.argv[1:]])
