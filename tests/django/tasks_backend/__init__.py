"""Tests of the ``django.tasks`` backend (``django_outbox.tasks``)."""
