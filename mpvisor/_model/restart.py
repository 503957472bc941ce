"""When does a task run again?

Owns the pure decision taken after each attempt ends: run again after a delay, run again at
once, or stop with an outcome. It does no I/O and keeps no state: the failure streak goes in
and comes out as a `Streak` value, and jitter draws from the caller's `random.Random`. The
runtime applies the returned action (sleeps, publishes `BACKOFF_SCHEDULED`, starts the next
attempt, or finishes the task).

| attempt ended | `NEVER` (once) | `ON_FAILURE` (restartable) | `ALWAYS(interval)` |
|---|---|---|---|
| `SUCCEEDED` | Stop(COMPLETED) | Stop(COMPLETED) | RunAgain(interval, SUCCESS); RunNow if no interval (or 0) |
| `FAILED` / `TIMED_OUT` | Stop(FAILED, reason) | RunAgain(backoff, FAILURE) or limit | RunAgain(backoff, FAILURE) or limit |
| `FATAL` | Stop(FATAL, reason) | Stop(FATAL, reason) | Stop(FATAL, reason) |
| `CANCELED` | Stop(CANCELED, reason) | Stop(CANCELED, reason) | Stop(CANCELED, reason) |

"limit": once a streak of failures has used `max_retries` retries (None = unlimited), the next
failure stops with Stop(FAILED, "retry limit reached after M of M retries: <last error>").
A success resets the streak; the backoff's retry index is the streak's failures minus 1.

Restart intensity (`RestartIntensity(max_restarts, within)`): every decision to run again after
a failure, and every RunNow after a success (`always()` without an interval, or `always(0)`: nothing else bounds
how fast it loops), is a restart, stamped `now` (the caller's monotonic clock) in
`Streak.restarts`; a restart that would make more than `max_restarts` inside the sliding window
`(now - within, now]` stops instead with Stop(FAILED, "restart intensity exceeded: a 4th restart within 10 s (at most
3): <last reason>", the restart refused, which does not run), whatever the retry budget. A periodic task's next run after a success (its interval)
is its schedule, not a restart: it is not counted. Successes do not clear the window.
"""

from __future__ import annotations

import enum
from typing import TypeAlias

from mpvisor._model.backoff import BackoffPolicy, delay
from mpvisor._model.outcome import OutcomeKind
from mpvisor._model.records import record
from mpvisor._model.spec import RestartIntensity, RestartKind, RestartPolicy

# The caller injects its generator. A launcher imports this module for its attempts
# (`_attempt/prepared.py`), and `random`, once imported, reseeds its generator in every process
# forked afterwards: each attempt would pay for that (ARCHITECTURE.md, "What a fork costs").
TYPE_CHECKING = False
if TYPE_CHECKING:
    import random


class AttemptResult(enum.Enum):
    """How one attempt ended, as far as the restart decision cares."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # retryable
    FATAL = "fatal"
    CANCELED = "canceled"
    TIMED_OUT = "timed_out"  # retryable


class BackoffSource(enum.Enum):
    """What a scheduled delay follows: a success (an interval) or a failure (a backoff)."""

    SUCCESS = "success"
    FAILURE = "failure"

    @property
    def label(self) -> str:
        """The stable lower-case name (`"failure"`, ...), as metrics and JSON lines show it."""
        return self.name.lower()


@record(frozen=True)
class Streak:
    """Consecutive failed attempts since the last success (or the start), and the times of the
    restarts still inside the restart-intensity window (oldest first)."""

    failures: int = 0  # >= 0
    restarts: tuple[float, ...] = ()


@record(frozen=True)
class RunAgain:
    """Start the next attempt after `delay` seconds (published as `BACKOFF_SCHEDULED`)."""

    delay: float
    source: BackoffSource


@record(frozen=True)
class RunNow:
    """Start the next attempt at once, with no `BACKOFF_SCHEDULED` event."""


@record(frozen=True)
class Stop:
    """The task is over: finish it with this outcome kind and reason."""

    outcome_kind: OutcomeKind
    reason: str | None = None


Action: TypeAlias = RunAgain | RunNow | Stop


def decide(
    policy: RestartPolicy,
    result: AttemptResult,
    streak: Streak,
    *,
    max_retries: int | None,
    backoff: BackoffPolicy,
    rng: random.Random,
    reason: str | None = None,
    intensity: RestartIntensity | None = None,
    now: float = 0.0,
) -> tuple[Action, Streak]:
    """What to do after an attempt ended with `result`, and the streak that follows it."""
    match result:
        case AttemptResult.SUCCEEDED:
            action = _after_success(policy)
            if isinstance(action, RunAgain):  # a periodic task's next run is its schedule, not a restart
                return action, Streak(0, streak.restarts)
            return _bounded(action, Streak(0, streak.restarts), intensity, now, reason)
        case AttemptResult.FATAL:
            return Stop(OutcomeKind.FATAL, reason), streak
        case AttemptResult.CANCELED:
            return Stop(OutcomeKind.CANCELED, reason), streak
        case AttemptResult.FAILED | AttemptResult.TIMED_OUT:
            failed = Streak(streak.failures + 1, streak.restarts)
            action = _after_failure(policy, failed, max_retries, backoff, rng, reason)
            return _bounded(action, failed, intensity, now, reason)
    raise AssertionError(f"unknown attempt result {result!r}")


def _bounded(action: Action, streak: Streak, intensity: RestartIntensity | None, now: float,
             reason: str | None) -> tuple[Action, Streak]:
    """Apply the restart intensity to a decision to run again (a Stop passes unchanged)."""
    if isinstance(action, Stop) or intensity is None:
        return action, streak
    recent = tuple(t for t in streak.restarts if t > now - intensity.within)
    if len(recent) >= intensity.max_restarts:
        last = f": {reason}" if reason else ""
        why = (f"restart intensity exceeded: a {ordinal(len(recent) + 1)} restart within {intensity.within:g} s "
               f"(at most {intensity.max_restarts}){last}")  # the one refused: it does not run
        return Stop(OutcomeKind.FAILED, why), Streak(streak.failures, recent)
    return action, Streak(streak.failures, (*recent, now))


def ordinal(n: int) -> str:
    """`1st`, `2nd`, `3rd`, `4th`, ..., `11th`, `12th`, `13th`, ..., `21st` (pure)."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _after_success(policy: RestartPolicy) -> Action:
    if policy.kind is not RestartKind.ALWAYS:
        return Stop(OutcomeKind.COMPLETED)
    if not policy.interval:  # `always(0)` runs again at once, as `always()` does: a restart
        return RunNow()
    return RunAgain(policy.interval, BackoffSource.SUCCESS)


def _after_failure(
    policy: RestartPolicy,
    streak: Streak,
    max_retries: int | None,
    backoff: BackoffPolicy,
    rng: random.Random,
    reason: str | None,
) -> Action:
    if policy.kind is RestartKind.NEVER:
        return Stop(OutcomeKind.FAILED, reason)
    retries_used = streak.failures - 1
    if max_retries is not None and retries_used >= max_retries:
        last = reason if reason is not None else "no reason given"
        limit = f"retry limit reached after {max_retries} of {max_retries} retries: {last}"
        return Stop(OutcomeKind.FAILED, limit)
    return RunAgain(delay(backoff, retries_used, rng), BackoffSource.FAILURE)
