"""How long does a task wait before its next retry?

Owns `BackoffPolicy` (validated, immutable) and the pure arithmetic over it: `base_delay` for
a retry index and `delay`, which applies the jitter with an injected `random.Random`. Which
retry index applies, and whether to retry at all, is decided in `_model/restart.py`; the runtime only
sleeps for the returned delay.

For retry index n (0 for the first retry of the current failure streak):
`base = min(first * factor**n, max)`, computed without overflow.

| `JitterPolicy` | delay |
|---|---|
| `NONE` | exactly `base` |
| `FULL` | uniform in [0, base] |
| `EQUAL` | uniform in [base/2, base] |
| `RANDOMIZED_BAND` | uniform in [first, min(3 * base, max)] |

Validation (`ConfigError`, a `ValueError`, naming field and value): delays finite and >= 0,
`factor` finite and >= 1, `first <= max` (also after `.with_max(cap)`).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from datetime import timedelta

from mpvisor._model import checks as _validate
from mpvisor._model.errors import ConfigError
from mpvisor._model.records import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # the caller injects its generator: `mpvisor check` never needs one
    import random

_EXACT_GROWTH_LIMIT = 700.0  # factor**n stays below e**700, well inside float range


class JitterPolicy(enum.Enum):
    """How a base delay is randomised."""

    NONE = "none"
    FULL = "full"
    EQUAL = "equal"
    RANDOMIZED_BAND = "randomized_band"


@record(frozen=True)
class BackoffPolicy:
    """Delays between retries: `first`, growing by `factor` per retry, capped at `max`, then
    spread by `jitter` (a `JitterPolicy`; `NONE` until `with_jitter` is called)."""

    first: float  # >= 0, <= max
    max: float
    factor: float  # finite, >= 1
    jitter: JitterPolicy = JitterPolicy.NONE

    def __post_init__(self) -> None:
        _set(self, "first", _seconds("first", self.first))
        _set(self, "max", _seconds("max", self.max))
        _set(self, "factor", _factor(self.factor))
        if not isinstance(self.jitter, JitterPolicy):
            raise ConfigError(f"jitter must be a JitterPolicy, got {self.jitter!r}")
        if self.first > self.max:
            raise ConfigError(f"first ({self.first!r}) must not exceed max ({self.max!r})")

    @classmethod
    def constant(cls, delay: float | timedelta) -> BackoffPolicy:
        """The same delay before every retry (`first = max = delay`)."""
        seconds = _seconds("delay", delay)
        return cls(first=seconds, max=seconds, factor=1.0)

    @classmethod
    def exponential(
        cls, first: float | timedelta, max: float | timedelta = 30.0, factor: float = 2.0
    ) -> BackoffPolicy:
        """`first`, then multiplied by `factor` per retry, capped at `max`."""
        return cls(first=_seconds("first", first), max=_seconds("max", max), factor=factor)

    def with_max(self, cap: float | timedelta) -> BackoffPolicy:
        """A copy capped at `cap` (which must not be below `first`)."""
        return dataclasses.replace(self, max=_seconds("max", cap))

    def with_jitter(self, jitter: JitterPolicy) -> BackoffPolicy:
        """A copy that randomises each delay with `jitter`."""
        return dataclasses.replace(self, jitter=jitter)


def base_delay(policy: BackoffPolicy, retry_index: int) -> float:
    """`min(first * factor**retry_index, max)`, without overflow for any index."""
    if retry_index < 0:
        raise ValueError(f"retry_index must be >= 0, got {retry_index!r}")
    first, cap, factor = policy.first, policy.max, policy.factor
    if first == 0 or factor == 1:
        return first
    # Work in logarithms so that no intermediate value overflows: the growth reaches the cap
    # once n * log(factor) >= log(cap) - log(first), and then the cap is the answer.
    growth = retry_index * math.log(factor)
    if growth >= math.log(cap) - math.log(first):
        return cap
    if growth < _EXACT_GROWTH_LIMIT:
        return min(first * factor**retry_index, cap)  # exact for the common cases
    return min(math.exp(math.log(first) + growth), cap)  # tiny `first`, huge growth


def delay(policy: BackoffPolicy, retry_index: int, rng: random.Random) -> float:
    """The jittered delay before retry `retry_index`, drawn from `rng`."""
    base = base_delay(policy, retry_index)
    match policy.jitter:
        case JitterPolicy.NONE:
            return base
        case JitterPolicy.FULL:
            return _uniform(rng, 0.0, base)
        case JitterPolicy.EQUAL:
            return _uniform(rng, base / 2, base)
        case JitterPolicy.RANDOMIZED_BAND:
            return _uniform(rng, policy.first, min(3 * base, policy.max))


def _uniform(rng: random.Random, low: float, high: float) -> float:
    # random.uniform may round a hair past `high`; the band is a promise, so clamp.
    return min(max(rng.uniform(low, high), low), high)


def _seconds(field: str, value: object) -> float:
    seconds = _validate.duration(field, value)
    assert seconds is not None  # allow_none is off
    return seconds


def _factor(value: object) -> float:
    factor = _validate.real(value)  # any real number (a `Fraction`, a `Decimal`), stored as a float
    if factor is None or not math.isfinite(factor) or factor < 1:
        raise ConfigError(f"factor must be a finite number >= 1, got {value!r}")
    return factor


def _set(obj: object, attr: str, value: object) -> None:
    object.__setattr__(obj, attr, value)
