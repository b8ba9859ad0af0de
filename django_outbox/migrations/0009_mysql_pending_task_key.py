"""MySQL/MariaDB: the unique key over pending task ids (a no-op on other databases).

PostgreSQL and SQLite have it since 0001, as the partial unique index
``celery_outbox_pending_task_uniq``; MySQL and MariaDB have no partial indexes, so it is a
unique index of that name over a generated column, ``pending_task_id`` (the task id while
the row is pending, NULL otherwise). The SQL is a copy of
``celery_outbox.store.schema.mysql_add_pending_key()`` (a test checks they are equal), kept
here so this migration never changes.
"""

from django.db import migrations

ADD_KEY = (
    "ALTER TABLE celery_outbox_message "
    "ADD COLUMN pending_task_id varchar(255) GENERATED ALWAYS AS "
    "(CASE WHEN status = 'pending' THEN task_id END) VIRTUAL, "
    "ADD UNIQUE INDEX celery_outbox_pending_task_uniq (pending_task_id)"
)
DROP_KEY = (
    "ALTER TABLE celery_outbox_message "
    "DROP INDEX celery_outbox_pending_task_uniq, DROP COLUMN pending_task_id"
)
DUPLICATES = (
    "SELECT task_id FROM celery_outbox_message WHERE status = 'pending' "
    "GROUP BY task_id HAVING COUNT(*) > 1 ORDER BY task_id LIMIT 20"
)


def add_key(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "mysql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(DUPLICATES)
        twice = [task_id for (task_id,) in cursor.fetchall()]
    if twice:
        raise RuntimeError(
            "celery-outbox: cannot add the unique key celery_outbox_pending_task_uniq on "
            f"celery_outbox_message: these task ids have more than one pending row: {twice} "
            "(written by concurrent dispatches before the key existed). Let the sweeper "
            "publish them (`manage.py outbox sweep`), or delete the extra rows, then migrate "
            "again."
        )
    schema_editor.execute(ADD_KEY)


def drop_key(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute(DROP_KEY)


class Migration(migrations.Migration):

    dependencies = [
        ('django_outbox', '0008_notify_trigger'),
    ]

    operations = [
        migrations.RunPython(add_key, drop_key, atomic=False, elidable=False),
    ]
