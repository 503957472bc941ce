"""Backoff arithmetic, jitter bands and validation, checked without any process."""

from __future__ import annotations

import random
import time
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpvisor._model.backoff import BackoffPolicy, JitterPolicy, base_delay, delay
from mpvisor._model.errors import ConfigError

pytestmark = pytest.mark.unit


def test_backoff_arithmetic() -> None:
    """Exponential doubles from `first` and stops at `max`, without overflow."""
    policy = BackoffPolicy.exponential(0.1)
    assert [base_delay(policy, n) for n in (0, 1, 2)] == [0.1, 0.2, 0.4]
    assert base_delay(policy, 20) == 30.0
    started = time.monotonic()
    assert base_delay(policy, 10**6) == 30.0
    assert base_delay(policy, 10**18) == 30.0
    assert time.monotonic() - started < 1.0
    assert base_delay(policy.with_max(10), 10) == 10.0


def test_constant_backoff_is_the_same_delay_every_time() -> None:
    """`constant(0.5)` has first = max = 0.5; RANDOMIZED_BAND gives exactly 0.5."""
    policy = BackoffPolicy.constant(0.5)
    assert (policy.first, policy.max) == (0.5, 0.5)
    assert [base_delay(policy, n) for n in (0, 1, 7, 10**6)] == [0.5] * 4
    band = policy.with_jitter(JitterPolicy.RANDOMIZED_BAND)
    rng = random.Random(1)
    assert {delay(band, n, rng) for n in range(20)} == {0.5}
    with pytest.raises(ValueError, match=r"first \(0\.5\).*max \(0\.1\)"):
        policy.with_max(0.1)


def test_constructors_start_without_jitter_until_asked() -> None:
    """`constant` and `exponential` use JitterPolicy.NONE until `.with_jitter`."""
    assert BackoffPolicy.constant(1).jitter is JitterPolicy.NONE
    assert BackoffPolicy.exponential(1).jitter is JitterPolicy.NONE
    jittered = BackoffPolicy.exponential(1).with_jitter(JitterPolicy.FULL)
    assert jittered.jitter is JitterPolicy.FULL
    assert (jittered.first, jittered.max, jittered.factor) == (1.0, 30.0, 2.0)


def test_durations_accept_timedelta_and_are_stored_as_float() -> None:
    """Delays may be given as a timedelta and read back as float seconds."""
    policy = BackoffPolicy.exponential(timedelta(milliseconds=250), max=timedelta(seconds=2))
    assert (policy.first, policy.max) == (0.25, 2.0)
    assert BackoffPolicy.constant(timedelta(seconds=3)).first == 3.0


def test_a_tiny_first_with_a_huge_range_never_overflows() -> None:
    """Growth far beyond float range is capped at `max`, never an OverflowError."""
    policy = BackoffPolicy(first=1e-300, max=1e300, factor=10.0)
    assert base_delay(policy, 500) == pytest.approx(1e200)
    assert base_delay(policy, 600) == 1e300
    assert base_delay(BackoffPolicy(first=1e-300, max=1e300, factor=1e300), 2) == 1e300


_first = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
_factor = st.floats(min_value=1.0, max_value=1e6, allow_nan=False)
_extra = st.floats(min_value=0.0, max_value=1e9, allow_nan=False)
_index = st.integers(min_value=0, max_value=10**9)


@given(_first, _factor, _extra, _index, st.integers(min_value=0, max_value=2**32))
def test_jitter_stays_in_its_band(
    first: float, factor: float, extra: float, index: int, seed: int
) -> None:
    """NONE is the base; FULL, EQUAL and RANDOMIZED_BAND stay in their bands."""
    policy = BackoffPolicy(first=first, max=first + extra, factor=factor)
    base = base_delay(policy, index)
    assert first <= base <= policy.max
    rng = random.Random(seed)
    assert delay(policy, index, rng) == base
    assert 0.0 <= delay(policy.with_jitter(JitterPolicy.FULL), index, rng) <= base
    assert base / 2 <= delay(policy.with_jitter(JitterPolicy.EQUAL), index, rng) <= base
    band = delay(policy.with_jitter(JitterPolicy.RANDOMIZED_BAND), index, rng)
    assert first <= band <= min(3 * base, policy.max)


@pytest.mark.parametrize("jitter", list(JitterPolicy))
def test_a_zero_base_stays_zero_under_every_jitter(jitter: JitterPolicy) -> None:
    """A zero base gives a zero delay whatever the jitter."""
    policy = BackoffPolicy.constant(0).with_jitter(jitter)
    assert delay(policy, 5, random.Random(0)) == 0.0


def test_the_same_seed_gives_the_same_delays() -> None:
    """Jitter draws only from the injected generator, so a seed repeats the delays."""
    policy = BackoffPolicy.exponential(0.1).with_jitter(JitterPolicy.FULL)
    first_run = [delay(policy, n, random.Random(7)) for n in range(5)]
    second_run = [delay(policy, n, random.Random(7)) for n in range(5)]
    assert first_run == second_run


@pytest.mark.parametrize("factor", [0.5, 0, -1, float("nan"), float("inf"), True, "2"])
def test_invalid_factor_is_refused(factor: object) -> None:
    """A factor below 1, NaN, infinite or not a number raises naming factor and value."""
    with pytest.raises(ValueError) as caught:
        BackoffPolicy.exponential(0.1, factor=factor)  # type: ignore[arg-type]
    assert "factor" in str(caught.value)
    assert repr(factor) in str(caught.value)


@pytest.mark.parametrize(
    ("build", "field", "value"),
    [
        (lambda: BackoffPolicy.exponential(-1), "first", "-1"),
        (lambda: BackoffPolicy.exponential(float("nan")), "first", "nan"),
        (lambda: BackoffPolicy.exponential(0.1, max=float("inf")), "max", "inf"),
        (lambda: BackoffPolicy.constant(-0.5), "delay", "-0.5"),
        (lambda: BackoffPolicy.exponential(5, max=1), "first", "5.0"),
        (lambda: BackoffPolicy.exponential(1).with_max(0.5), "max", "0.5"),
        (lambda: BackoffPolicy.exponential(1).with_max(-2), "max", "-2"),
    ],
    ids=[
        "negative",
        "nan",
        "inf-max",
        "negative-constant",
        "first-above-max",
        "cap-below",
        "neg-cap",
    ],
)
def test_invalid_backoff_is_refused(build: object, field: str, value: str) -> None:
    """Negative or non-finite delays and first > max raise ConfigError naming them."""
    with pytest.raises(ConfigError) as caught:
        build()  # type: ignore[operator]
    assert field in str(caught.value)
    assert value in str(caught.value)


def test_invalid_jitter_is_refused() -> None:
    """A jitter that is not a JitterPolicy is refused naming the value."""
    with pytest.raises(ValueError, match=r"jitter.*'full'"):
        BackoffPolicy.exponential(1).with_jitter("full")  # type: ignore[arg-type]
