"""OutboxConfig: DESIGN.md defaults, and clear errors for bad values."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_outbox.config import DEFAULTS, OutboxConfig
from celery_outbox.exceptions import OutboxConfigError


def test_defaults_match_design() -> None:
    config = OutboxConfig.from_mapping({})
    assert config.sweep_interval == timedelta(seconds=5)
    assert config.sweep_batch_size == 500
    assert config.sweep_batch_bytes == 16 * 1024 * 1024
    assert config.publish_grace == timedelta(seconds=10)
    assert config.claim_lease == timedelta(seconds=60)
    assert config.publish_max_attempts == 20
    assert config.keep_published == timedelta(0)
    assert config.park_after == timedelta(seconds=30)
    assert config.max_deliveries == 5
    assert config.beat_schedule is True
    assert config.max_payload_bytes == 4 * 1024 * 1024
    assert config.store is None


def test_reads_celery_conf_and_django_namespace() -> None:
    app = Celery("t", set_as_current=False)
    app.conf.outbox_sweep_interval = 0.5
    assert OutboxConfig.from_celery(app).sweep_interval == timedelta(seconds=0.5)

    django_style = Celery("d", set_as_current=False)
    django_style.config_from_object(
        {"CELERY_OUTBOX_PARK_AFTER": 2.5, "CELERY_BROKER_URL": "memory://"}, namespace="CELERY"
    )
    assert OutboxConfig.from_celery(django_style).park_after == timedelta(seconds=2.5)


def test_none_payload_limit_means_no_limit() -> None:
    assert OutboxConfig.from_mapping({"outbox_max_payload_bytes": None}).max_payload_bytes is None


@pytest.mark.parametrize(
    ("key", "value", "accepted"),
    [
        ("outbox_sweep_interval", "5", "positive number of seconds"),
        ("outbox_sweep_interval", 0, "positive number of seconds"),
        ("outbox_claim_lease", float("nan"), "positive number of seconds"),
        ("outbox_publish_grace", -1, "seconds >= 0"),
        ("outbox_sweep_batch_size", 0, "positive integer"),
        ("outbox_sweep_batch_size", 2.5, "positive integer"),
        ("outbox_max_deliveries", True, "positive integer"),
        ("outbox_sweep_batch_bytes", 0, "from 65536 (64 KiB) to 4294967296 (4 GiB)"),
        ("outbox_sweep_batch_bytes", 2**40, "from 65536 (64 KiB) to 4294967296 (4 GiB)"),
        ("outbox_sweep_batch_bytes", 1e6, "integer number of bytes"),
        ("outbox_beat_schedule", "yes", "True or False"),
        ("outbox_store", "nodots", "dotted path"),
    ],
)
def test_bad_values_name_setting_value_and_accepted(key: str, value: Any, accepted: str) -> None:
    with pytest.raises(OutboxConfigError) as caught:
        OutboxConfig.from_mapping({key: value})
    message = str(caught.value)
    assert key in message
    assert repr(value) in message
    assert accepted in message


def test_every_setting_has_a_field() -> None:
    names = {key.removeprefix("outbox_") for key in DEFAULTS}
    assert names == set(OutboxConfig.__dataclass_fields__)
