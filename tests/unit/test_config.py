"""OutboxConfig: DESIGN.md defaults, and clear errors for bad values."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_outbox.config import DEFAULTS, RULES, OutboxConfig, setting_errors
from celery_outbox.exceptions import OutboxConfigError
from celery_outbox.state import reset


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
    assert config.retry_queue is None
    assert config.store_requeues == 60  # about an hour of put-backs (1 s doubling to 60 s)


def test_reads_celery_conf_and_django_namespace() -> None:
    app = Celery("t", set_as_current=False)
    app.conf.outbox_sweep_interval = 0.5
    assert OutboxConfig.from_celery(app).sweep_interval == timedelta(seconds=0.5)

    django_style = Celery("d", set_as_current=False)
    django_style.config_from_object(
        {"CELERY_OUTBOX_PARK_AFTER": 2.5, "CELERY_BROKER_URL": "memory://"}, namespace="CELERY"
    )
    assert OutboxConfig.from_celery(django_style).park_after == timedelta(seconds=2.5)


def test_retry_queue_is_read_as_given() -> None:
    assert OutboxConfig.from_mapping({"outbox_retry_queue": "retries"}).retry_queue == "retries"


def test_none_payload_limit_means_no_limit() -> None:
    assert OutboxConfig.from_mapping({"outbox_max_payload_bytes": None}).max_payload_bytes is None


@pytest.mark.parametrize(
    ("key", "value", "accepted"),
    [
        ("outbox_sweep_interval", "5", "0.1 to 86400 seconds"),
        ("outbox_sweep_interval", 0, "0.1 to 86400 seconds"),
        ("outbox_claim_lease", float("nan"), "1 to 86400 seconds"),
        ("outbox_publish_grace", -1, "0, or 0.001 to 3600 seconds"),
        ("outbox_sweep_batch_size", 0, "an integer from 1 to 10000 rows"),
        ("outbox_sweep_batch_size", 2.5, "an integer from 1 to 10000 rows"),
        ("outbox_max_deliveries", True, "an integer from 1 to 1000 deliveries"),
        ("outbox_sweep_batch_bytes", 0, "an integer from 65536 to 4294967296 bytes"),
        ("outbox_sweep_batch_bytes", 2**40, "an integer from 65536 to 4294967296 bytes"),
        ("outbox_sweep_batch_bytes", 1e6, "an integer from 65536 to 4294967296 bytes"),
        ("outbox_beat_schedule", "yes", "True or False"),
        ("outbox_store", "nodots", "dotted path"),
        ("outbox_retry_queue", "", "None, or a queue name"),
        ("outbox_retry_queue", 7, "None, or a queue name"),
        ("outbox_store_requeues", 0, "an integer from 1 to 10000 put-backs"),
        ("outbox_store_requeues", "60", "an integer from 1 to 10000 put-backs"),
        ("outbox_store_requeues", None, "an integer from 1 to 10000 put-backs"),
    ],
)
def test_bad_values_name_setting_value_and_accepted(key: str, value: Any, accepted: str) -> None:
    with pytest.raises(OutboxConfigError) as caught:
        OutboxConfig.from_mapping({key: value})
    message = str(caught.value)
    assert key in message
    assert repr(value) in message
    assert accepted in message


def test_at_run_time_bad_settings_read_again_give_the_defaults() -> None:
    app = Celery("config-at-run-time", set_as_current=False)
    app.conf.outbox_store_requeues = 3
    assert OutboxConfig.at_run_time(app).store_requeues == 3
    app.conf.outbox_store_requeues = -1
    reset(app)  # read again, as after celery_outbox.state.reset
    with pytest.raises(OutboxConfigError, match="outbox_store_requeues"):
        OutboxConfig.from_celery(app)
    assert OutboxConfig.at_run_time(app).store_requeues == 60
    app.close()


def test_every_setting_has_a_field() -> None:
    names = {key.removeprefix("outbox_") for key in DEFAULTS}
    assert names == set(OutboxConfig.__dataclass_fields__)


@pytest.mark.parametrize(
    ("key", "value", "accepted"),
    [
        # issue 13 #9: each passed before and failed later (or crashed the check itself).
        ("outbox_claim_lease", 1e13, "1 to 86400 seconds"),
        ("outbox_keep_published", 1e13, "0, or 0.001 to 315360000 seconds"),
        ("outbox_park_after", 1e300, "0, or 0.001 to 86400 seconds"),
        ("outbox_publish_timeout", 1e300, "0.01 to 300 seconds"),
        ("outbox_sweep_interval", 1e-9, "0.1 to 86400 seconds"),
        ("outbox_publish_grace", 1e-9, "0, or 0.001 to 3600 seconds"),
        ("outbox_sweep_batch_size", 10**9, "an integer from 1 to 10000 rows"),
        ("outbox_max_payload_bytes", 2**40, "None, or an integer from 1 to 1073741824 bytes"),
        ("outbox_publish_max_attempts", 10**6, "an integer from 1 to 10000 attempts"),
    ],
)
def test_every_setting_has_an_upper_bound_and_no_tiny_duration_rounds_to_zero(
    key: str, value: Any, accepted: str
) -> None:
    with pytest.raises(OutboxConfigError) as caught:
        OutboxConfig.from_mapping({key: value})
    assert f"{key}={value!r} is not accepted: give {accepted}." in str(caught.value)


def test_the_ends_of_each_range_are_accepted() -> None:
    config = OutboxConfig.from_mapping(
        {"outbox_sweep_interval": 0.1, "outbox_publish_grace": 0.001, "outbox_claim_lease": 86400}
    )
    assert config.publish_grace == timedelta(milliseconds=1)
    assert config.sweep_interval == timedelta(milliseconds=100)


def test_every_bad_setting_is_reported_at_once() -> None:
    bad = {"outbox_sweep_interval": 1e-9, "outbox_claim_lease": 1e300, "outbox_beat_schedule": 1}
    assert set(setting_errors(bad)) == set(bad)
    with pytest.raises(OutboxConfigError) as caught:
        OutboxConfig.from_mapping(bad)
    assert all(f"{key}=" in str(caught.value) for key in bad)


def test_every_setting_has_a_rule_and_its_default_is_accepted() -> None:
    assert set(RULES) == set(DEFAULTS)
    assert setting_errors(DEFAULTS) == {}
