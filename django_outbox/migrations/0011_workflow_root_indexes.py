"""PostgreSQL: the indexes finding a workflow's pending steps and dead letters by its root
id (a no-op on other databases; see ``celery_outbox.store.schema``).

Partial expression indexes: the pending outbox rows by ``options #> '{headers,root_id}'``
and the dead letters with a canvas by ``options #> '{canvas,root_id}'``. They are not in
the models' ``Meta.indexes``: Django would then warn on MySQL/MariaDB at every migrate
(models.W037/W043) and try to build the index there without its condition. Built
``CONCURRENTLY`` (outbox writes go on meanwhile), so this migration is not atomic; an
invalid index a failed build left is dropped first. The SQL is a copy of
``celery_outbox.store.schema`` (a test checks they are equal), kept here so this migration
never changes.
"""

from django.db import migrations

DROP = [
    "DROP INDEX CONCURRENTLY IF EXISTS celery_outbox_pending_root_idx",
    "DROP INDEX CONCURRENTLY IF EXISTS celery_outbox_dl_root_idx",
]
CREATE = [
    "CREATE INDEX CONCURRENTLY celery_outbox_pending_root_idx ON celery_outbox_message "
    "((options #> '{headers,root_id}')) WHERE status = 'pending'",
    "CREATE INDEX CONCURRENTLY celery_outbox_dl_root_idx ON celery_outbox_deadletter "
    "((options #> '{canvas,root_id}')) WHERE options ? 'canvas'",
]


def add_indexes(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return
    for statement in DROP + CREATE:
        schema_editor.execute(statement, params=None)


def drop_indexes(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        for statement in DROP:
            schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):

    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ('django_outbox', '0010_overview'),
    ]

    operations = [
        migrations.RunPython(add_indexes, drop_indexes, atomic=False, elidable=False),
    ]
