"""Property tests of the random exponential windows (DESIGN.md "Retries")."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_outbox.backoff import BackoffPolicy
from celery_outbox.exceptions import OutboxConfigError

seconds = st.floats(min_value=0.001, max_value=10_000, allow_nan=False, allow_infinity=False)
retries = st.integers(min_value=0, max_value=10_000)


def policy(base: float, cap: float) -> BackoffPolicy:
    return BackoffPolicy(base=timedelta(seconds=base), cap=timedelta(seconds=cap))


def test_default_windows_are_designs() -> None:
    p = BackoffPolicy()
    expected = [(0, 1), (1, 2), (2, 4), (4, 8), (8, 16)]
    assert [p.window(r) for r in range(5)] == [
        (timedelta(seconds=lo), timedelta(seconds=hi)) for lo, hi in expected
    ]


def test_both_ends_capped() -> None:
    p = policy(1, 5)
    assert p.window(3) == (timedelta(seconds=4), timedelta(seconds=5))
    assert p.window(4) == (timedelta(seconds=5), timedelta(seconds=5))


@given(base=seconds, cap=seconds, retry=retries, seed=st.integers())
def test_every_wait_lies_in_its_window(base: float, cap: float, retry: int, seed: int) -> None:
    p = policy(base, cap)
    low, high = p.window(retry)
    assert timedelta(0) <= low <= high <= p.cap
    assert low <= p.delay_for(retry, rng=random.Random(seed)) <= high


@given(base=seconds, cap=seconds, retry=retries)
def test_window_edges_are_monotone(base: float, cap: float, retry: int) -> None:
    p = policy(base, cap)
    (low, high), (next_low, next_high) = p.window(retry), p.window(retry + 1)
    assert low <= next_low
    assert high <= next_high


@given(retry=st.integers(min_value=0, max_value=10**18))
def test_huge_retry_numbers_do_not_overflow(retry: int) -> None:
    low, high = policy(1, 300).window(retry)
    assert high <= timedelta(seconds=300)
    assert low <= high


@pytest.mark.parametrize("retry", [0, 1, 3])
def test_samples_cover_the_whole_window(retry: int) -> None:
    p = BackoffPolicy()
    low, high = p.window(retry)
    width = (high - low).total_seconds()
    rng = random.Random(7)
    fractions = [(p.delay_for(retry, rng=rng) - low).total_seconds() / width for _ in range(2000)]
    # Every tenth of the window is hit, not only its ends.
    assert {int(f * 10) for f in fractions if f < 1} == set(range(10))
    assert min(fractions) < 0.01
    assert max(fractions) > 0.99


def test_negative_retry_is_refused() -> None:
    with pytest.raises(ValueError, match="retry=-1"):
        BackoffPolicy().window(-1)


@pytest.mark.parametrize("bad", [timedelta(0), timedelta(seconds=-1), 1.0])
def test_bad_policy_values_are_named(bad: object) -> None:
    with pytest.raises(OutboxConfigError, match=r"BackoffPolicy\.base"):
        BackoffPolicy(base=bad)  # type: ignore[arg-type]
