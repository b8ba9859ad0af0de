"""Status values `completed` (dead letter) and `cancelled` (workflow); the workflow list's
index on creation (the admin orders by it, newest first)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_outbox', '0012_outbox_fillfactor'),
    ]

    operations = [
        migrations.AlterField(
            model_name='deadletter',
            name='status',
            field=models.CharField(choices=[('dead', 'dead'), ('requeued', 'requeued'), ('discarded', 'discarded'), ('completed', 'completed')], default='dead', max_length=16, verbose_name='status'),
        ),
        migrations.AlterField(
            model_name='workflow',
            name='status',
            field=models.CharField(choices=[('running', 'running'), ('succeeded', 'succeeded'), ('failed', 'failed'), ('cancelled', 'cancelled')], max_length=16, verbose_name='status'),
        ),
        migrations.AddIndex(
            model_name='workflow',
            index=models.Index(fields=['created_at', 'id'], name='outbox_workflow_created_idx'),
        ),
    ]
