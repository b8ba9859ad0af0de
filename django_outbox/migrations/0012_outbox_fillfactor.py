"""PostgreSQL: half of each page of the outbox table kept free, so a claim's lease is an
update on the row's own page (celery_outbox.store.schema). Nothing on other databases."""

from collections.abc import Callable
from typing import Any

from django.db import migrations

from celery_outbox.store.schema import RESET_FILLFACTOR, SET_FILLFACTOR


def _run(statement: str) -> Callable[[Any, Any], None]:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(statement, params=None)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ('django_outbox', '0011_workflow_root_indexes'),
    ]

    operations = [
        migrations.RunPython(_run(SET_FILLFACTOR), _run(RESET_FILLFACTOR), elidable=False),
    ]
