"""The relay's NOTIFY on PostgreSQL: a trigger on the outbox table (celery_outbox.store.base).

Nothing on other databases: their relay polls.
"""

from collections.abc import Callable, Sequence
from typing import Any

from django.db import migrations

from celery_outbox.store.base import CREATE_TRIGGER, DROP_TRIGGER


def _run(statements: Sequence[str]) -> Callable[[Any, Any], None]:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        for statement in statements:
            schema_editor.execute(statement, params=None)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ('django_outbox', '0007_outboxmessage_cancel_permission'),
    ]

    operations = [
        migrations.RunPython(_run(CREATE_TRIGGER), _run(DROP_TRIGGER), elidable=False),
    ]
