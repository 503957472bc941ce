"""Specs, defaults, configs, the restart decision table, outcomes and errors, without processes."""

from __future__ import annotations

import dataclasses
import random
import re
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpvisor._admission.config import ControllerConfig
from mpvisor._model import errors as _errors
from mpvisor._model.backoff import BackoffPolicy, JitterPolicy
from mpvisor._model.errors import ConfigError
from mpvisor._model.outcome import OutcomeKind, RejectionKind, TaskOutcome
from mpvisor._model.restart import (
    Action,
    AttemptResult,
    BackoffSource,
    RunAgain,
    RunNow,
    Stop,
    Streak,
    decide,
    ordinal,
)
from mpvisor._model.spec import (
    INHERIT,
    Limits,
    Resources,
    RestartIntensity,
    RestartKind,
    RestartPolicy,
    TaskDefaults,
    TaskSpec,
)
from mpvisor._model.work import CommandTask, TaskFn
from mpvisor._runtime.config import SupervisorConfig

pytestmark = pytest.mark.unit

TASK = TaskFn("job", "workers.basic:quick")
FIXED = BackoffPolicy.constant(0.25)

# --- specs ---------------------------------------------------------------------------------


def test_spec_constructors_set_their_restart_policy() -> None:
    """Once, restartable and periodic(every) give NEVER, ON_FAILURE and always(every)."""
    assert TaskSpec.once(TASK).restart == RestartPolicy.NEVER
    assert TaskSpec.restartable(TASK).restart == RestartPolicy.ON_FAILURE
    assert TaskSpec.periodic(TASK, 5).restart == RestartPolicy.always(5.0)
    assert TaskSpec.periodic(TASK, timedelta(seconds=2)).restart.interval == 2.0
    assert RestartPolicy.always().interval is None
    assert RestartPolicy.always(1).kind is RestartKind.ALWAYS


def test_spec_builders_return_new_specs_and_accessors_reflect_them() -> None:
    """Each `.with_*` returns a new spec, leaves the original alone, and reads back."""
    original = TaskSpec.once(TASK)
    built = (
        original.with_backoff(FIXED)
        .with_timeout(timedelta(seconds=3))
        .with_max_retries(2)
        .with_restart(RestartPolicy.ON_FAILURE)
    )
    assert (built.name, built.task, built.restart) == ("job", TASK, RestartPolicy.ON_FAILURE)
    assert (built.backoff, built.timeout, built.max_retries) == (FIXED, 3.0, 2)
    assert original == TaskSpec.once(TASK)
    assert original.restart == RestartPolicy.NEVER
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.timeout = 1.0  # type: ignore[misc]


def test_settings_never_given_read_inherit_and_explicit_values_read_back() -> None:
    """Unset backoff/timeout/max_retries read INHERIT; an explicit None or 0 reads back."""
    spec = TaskSpec.restartable(TASK)
    assert (spec.backoff, spec.timeout, spec.max_retries) == (INHERIT, INHERIT, INHERIT)
    assert repr(INHERIT) == "mpvisor.INHERIT"
    assert spec.with_timeout(None).timeout is None
    assert spec.with_timeout(0).timeout == 0.0
    assert spec.with_max_retries(None).max_retries is None
    assert spec.with_max_retries(0).max_retries == 0


def test_resolve_takes_defaults_only_for_inherited_settings() -> None:
    """TaskDefaults fill INHERIT settings; explicit None overrides; a 0 timeout is none."""
    defaults = TaskDefaults(backoff=FIXED, timeout=7, max_retries=3)
    inherited = TaskSpec.restartable(TASK).resolve(defaults)
    assert (inherited.backoff, inherited.timeout, inherited.max_retries) == (FIXED, 7.0, 3)
    assert (inherited.name, inherited.restart) == ("job", RestartPolicy.ON_FAILURE)
    explicit = TaskSpec.restartable(TASK).with_timeout(None).with_max_retries(None)
    resolved = explicit.with_backoff(BackoffPolicy.constant(1)).resolve(defaults)
    assert (resolved.backoff.first, resolved.timeout, resolved.max_retries) == (1.0, None, None)
    assert TaskSpec.once(TASK).with_timeout(0).resolve(defaults).timeout is None


def test_task_defaults_and_their_default_backoff() -> None:
    """TaskDefaults() is exponential(0.2, max=30) with EQUAL jitter and no restart."""
    defaults = TaskDefaults()
    expected = BackoffPolicy.exponential(0.2, max=30).with_jitter(JitterPolicy.EQUAL)
    assert (defaults.backoff, defaults.timeout, defaults.max_retries) == (expected, None, None)
    assert [f.name for f in dataclasses.fields(defaults)] == ["backoff", "timeout", "max_retries", "restart_intensity", "limits"]
    assert defaults.restart_intensity is None
    assert TaskDefaults(timeout=timedelta(milliseconds=300)).timeout == 0.3


def test_a_command_task_can_be_supervised() -> None:
    """A CommandTask is as valid a task as a TaskFn; anything else is refused."""
    assert TaskSpec.once(CommandTask("cmd", ["true"])).name == "cmd"
    with pytest.raises(TypeError, match="task must be"):
        TaskSpec.once("workers.basic:quick")  # type: ignore[arg-type]


# --- invalid settings ----------------------------------------------------------------------


def _builders() -> list[tuple[str, Any, str, str]]:
    nan, inf = float("nan"), float("inf")
    return [
        ("timeout-negative", lambda: TaskSpec.once(TASK).with_timeout(-1), "timeout", "-1"),
        ("timeout-nan", lambda: TaskSpec.once(TASK).with_timeout(nan), "timeout", "nan"),
        ("interval-inf", lambda: TaskSpec.periodic(TASK, inf), "every", "inf"),
        ("interval-negative", lambda: RestartPolicy.always(-2), "interval", "-2"),
        ("retries-negative", lambda: TaskSpec.once(TASK).with_max_retries(-1), "max_retries", "-1"),
        ("defaults-retries", lambda: TaskDefaults(max_retries=-1), "max_retries", "-1"),
        ("defaults-timeout", lambda: TaskDefaults(timeout=-3), "timeout", "-3"),
        ("grace-negative", lambda: SupervisorConfig(grace=-1), "grace", "-1"),
        ("grace-nan", lambda: SupervisorConfig(grace=nan), "grace", "nan"),
        ("grace-inf", lambda: SupervisorConfig(grace=inf), "grace", "inf"),
        ("kill-after", lambda: SupervisorConfig(timeout_kill_after=-1), "timeout_kill_after", "-1"),
        (
            "sub-timeout",
            lambda: SupervisorConfig(subscriber_shutdown_timeout=inf),
            "subscriber_shutdown_timeout",
            "inf",
        ),
        ("start-timeout-zero", lambda: SupervisorConfig(start_timeout=0), "start_timeout", "0"),
        ("bus-zero", lambda: SupervisorConfig(bus_capacity=0), "bus_capacity", "0"),
        ("registry-zero", lambda: SupervisorConfig(registry_capacity=0), "registry_capacity", "0"),
        ("frame-zero", lambda: SupervisorConfig(max_frame_bytes=0), "max_frame_bytes", "0"),
        ("frame-beyond-header", lambda: SupervisorConfig(max_frame_bytes=2**64), "max_frame_bytes", str(2**64)),
        ("concurrent-zero", lambda: SupervisorConfig(max_concurrent=0), "max_concurrent", "0"),
        ("preload-str", lambda: SupervisorConfig(preload="numpy"), "preload", "'numpy'"),  # type: ignore[arg-type]
        ("preload-bad", lambda: SupervisorConfig(preload=["a-b"]), "preload", "'a-b'"),
        ("start-method", lambda: SupervisorConfig(start_method="fork"), "start_method", "'fork'"),  # type: ignore[arg-type]
        ("capture", lambda: SupervisorConfig(capture_output=1), "capture_output", "1"),  # type: ignore[arg-type]
        ("seed", lambda: SupervisorConfig(seed=1.5), "seed", "1.5"),  # type: ignore[arg-type]
        ("controller-queue", lambda: ControllerConfig(queue_capacity=0), "queue_capacity", "0"),
        ("slot-queue", lambda: ControllerConfig(max_slot_queue=-1), "max_slot_queue", "-1"),
        ("memory-zero", lambda: TaskSpec.once(TASK).with_limits(memory=0), "memory", "0"),
        ("address-space-float", lambda: TaskSpec.once(TASK).with_limits(address_space=1.5), "address_space", "1.5"),  # type: ignore[arg-type]
        ("cpu-seconds-zero", lambda: TaskSpec.once(TASK).with_limits(cpu_seconds=0), "cpu_seconds", "0"),
        ("open-files-bool", lambda: TaskSpec.once(TASK).with_limits(open_files=True), "open_files", "True"),
        ("cpus-below-quota", lambda: TaskSpec.once(TASK).with_limits(cpus=0.001), "cpus", "0.001"),
        ("cpus-inf", lambda: TaskSpec.once(TASK).with_limits(cpus=inf), "cpus", "inf"),
        ("cpus-str", lambda: TaskSpec.once(TASK).with_limits(cpus="2"), "cpus", "'2'"),  # type: ignore[arg-type]
        # past what the kernel takes (they were accepted, then the attempt panicked or was refused)
        ("memory-over", lambda: TaskSpec.once(TASK).with_limits(memory=2**70), "memory", str(2**70)),
        ("memory-2**63", lambda: Limits(memory=2**63), "memory", str(2**63)),
        ("address-space-over", lambda: TaskSpec.once(TASK).with_limits(address_space=2**63), "address_space", str(2**63)),
        ("open-files-over", lambda: TaskSpec.once(TASK).with_limits(open_files=2**64), "open_files", str(2**64)),
        ("cpus-over", lambda: TaskSpec.once(TASK).with_limits(cpus=1e9), "cpus", "1000000000.0"),
        ("defaults-memory-over", lambda: TaskDefaults(limits=Limits(memory=2**64)), "memory", str(2**64)),
    ]


@pytest.mark.parametrize(
    ("build", "field", "value"), [b[1:] for b in _builders()], ids=[b[0] for b in _builders()]
)
def test_invalid_settings_fail_at_once_naming_field_and_value(
    build: Any, field: str, value: str
) -> None:
    """Bad durations, capacities and limits raise ValueError naming field and value."""
    with pytest.raises(ValueError) as caught:
        build()
    assert field in str(caught.value)
    assert value in str(caught.value)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("build", "said"), [
    (lambda: TaskSpec.periodic(TASK, 0), "every must be a finite number of seconds > 0, got 0"),
    (lambda: TaskSpec.periodic(TASK, timedelta(0)), "every must be a finite number of seconds > 0"),
    (lambda: TaskSpec.periodic(TASK, -1), "every must be a finite number of seconds > 0, got -1"),
    (lambda: RestartIntensity(3, -1), "within must be a finite number of seconds > 0, got -1"),
    (lambda: RestartIntensity(3, 0), "within must be a finite number of seconds > 0, got 0"),
    (lambda: ControllerConfig(wait_timeout=-1), "wait_timeout must be a finite number of seconds > 0, got -1"),
    (lambda: ControllerConfig(wait_timeout=1), "wait_timeout bounds the wait for a shared slot's lease, and these slots "
                                               "are not shared (leases=None)"),
    (lambda: SupervisorConfig(start_timeout=-1), "start_timeout must be a finite number of seconds > 0, got -1"),
    (lambda: Limits(cpu_seconds=-1), "cpu_seconds must be a finite number of seconds > 0, got -1"),
    (lambda: SupervisorConfig(grace=-1), "grace must be a finite number of seconds >= 0, got -1"),
    (lambda: ControllerConfig(lease_ttl=-1), "lease_ttl must be at least 2 and at most 86400 seconds (a day), got -1"),
    (lambda: ControllerConfig(lease_ttl=float("nan")), "lease_ttl must be at least 2 and at most 86400 seconds (a day), got nan"),
    (lambda: ControllerConfig(lease_ttl=timedelta(seconds=-5)), "lease_ttl must be at least 2 and at most 86400 seconds"),
])
def test_a_refused_duration_states_its_fields_own_rule(build: Any, said: str) -> None:
    """A duration that must be > 0 says so for a negative value too (not 'non-negative'), and
    periodic refuses every=0 as `--every 0` and a task file's `every = 0` are."""
    with pytest.raises(ConfigError) as caught:
        build()
    assert said in str(caught.value)


@pytest.mark.timeout(10)
def test_a_size_is_any_whole_number_and_a_value_too_large_is_said_so_shortened() -> None:
    """A size takes a whole number of any type, stored as a plain int (`Decimal("1E+9")`,
    `Fraction(2048, 2)`, as it takes `1e9`), and refuses a fraction of a byte naming the field;
    a number of seconds past a float's range (`10**400`) is said to be too large, not shown
    whole (401 digits) and not called infinite; nor is a size's."""
    from decimal import Decimal
    from fractions import Fraction

    limits = Limits(memory=Decimal("1E+9"), address_space=Fraction(2048, 2))  # type: ignore[arg-type]
    assert (type(limits.memory), limits.memory, type(limits.address_space), limits.address_space) == (int, 10**9, int, 1024)
    with pytest.raises(ConfigError) as fraction:
        Limits(memory=Decimal("0.5"))  # type: ignore[arg-type]
    assert str(fraction.value) == "memory must be a whole number of bytes from 1 to 2**63 - 1, got Decimal('0.5')"
    with pytest.raises(ConfigError) as huge:
        TaskSpec.once(TASK).with_limits(cpu_seconds=10**400)
    assert str(huge.value) == ("cpu_seconds must be a finite number of seconds > 0, got a number too large: "
                               f"{'1' + '0' * 59}… (401 characters)"), huge.value
    with pytest.raises(ConfigError) as big:
        TaskSpec.once(TASK).with_limits(memory=10**400)
    assert str(big.value) == f"memory must be a whole number of bytes from 1 to 2**63 - 1, got {'1' + '0' * 59}… (401 characters)"


def test_a_zero_max_slot_queue_is_valid() -> None:
    """A `max_slot_queue` of 0 is accepted."""
    assert ControllerConfig(max_slot_queue=0).max_slot_queue == 0


class _Index:
    """An integer that is no int, as numpy's are: it has `__index__` alone."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"_Index({self.value})"


@pytest.mark.timeout(10)
def test_numbers_of_any_type_are_taken_and_stored_as_plain_ints_and_floats() -> None:
    """An integer setting takes any integer type (numpy's: `__index__`), a duration or a number
    of CPUs any real number (`Fraction`, `Decimal`); each is stored as a plain int or float, and
    what is refused (a bool, a str, one out of range) is still named with its value."""
    from decimal import Decimal
    from fractions import Fraction

    config = SupervisorConfig(max_concurrent=_Index(2), grace=Fraction(1, 2), start_timeout=Decimal("1.5"))
    assert (type(config.max_concurrent), config.max_concurrent, type(config.grace), config.grace) == (int, 2, float, 0.5)
    assert (type(config.start_timeout), config.start_timeout) == (float, 1.5)
    controller = ControllerConfig(max_slot_queue=_Index(3), lease_ttl=Decimal(60))
    assert (type(controller.max_slot_queue), controller.max_slot_queue, controller.lease_ttl) == (int, 3, 60.0)
    limits = Limits(memory=_Index(2**20), cpus=Fraction(3, 2))
    assert (type(limits.memory), limits.memory, type(limits.cpus), limits.cpus) == (int, 2**20, float, 1.5)
    assert type(TaskSpec.once(TASK).with_max_retries(_Index(0)).max_retries) is int
    assert type(SupervisorConfig(seed=_Index(7)).seed) is int
    assert type(BackoffPolicy.exponential(Fraction(1, 10), max=Decimal(5), factor=Fraction(3, 2)).factor) is float
    for build, said in [
        (lambda: SupervisorConfig(max_concurrent=_Index(0)), "max_concurrent must be a positive integer, got _Index(0)"),
        (lambda: ControllerConfig(max_slot_queue=_Index(-1)), "max_slot_queue must be a non-negative integer, got _Index(-1)"),
        (lambda: SupervisorConfig(max_concurrent=True), "max_concurrent must be a positive integer, got True"),
        (lambda: SupervisorConfig(grace=Decimal("NaN")), "grace must be a finite number of seconds >= 0, got Decimal('NaN')"),
        (lambda: SupervisorConfig(grace=Decimal("sNaN")), "grace must be a finite number of seconds >= 0, got Decimal('sNaN')"),
        (lambda: SupervisorConfig(grace=Fraction(-1, 2)), "grace must be a finite number of seconds >= 0, got Fraction(-1, 2)"),
        (lambda: SupervisorConfig(grace="1"), "grace must be a number of seconds or a timedelta, got '1'"),
        (lambda: SupervisorConfig(grace=1j), "grace must be a number of seconds or a timedelta, got 1j"),
        (lambda: ControllerConfig(lease_ttl=Fraction(1)), "lease_ttl must be at least 2 and at most 86400 seconds (a day), got Fraction(1, 1)"),
    ]:
        with pytest.raises(ConfigError) as caught:
            build()
        assert str(caught.value) == said


def test_config_errors_are_value_errors() -> None:
    """ConfigError is both an MpvisorError and a ValueError."""
    with pytest.raises(ConfigError):
        SupervisorConfig(bus_capacity=0)
    assert issubclass(ConfigError, ValueError)


# --- configs -------------------------------------------------------------------------------


def test_supervisor_config_defaults() -> None:
    """SupervisorConfig() has the documented defaults."""
    config = SupervisorConfig()
    assert dataclasses.asdict(config) == {
        "grace": 60.0,
        "subscriber_shutdown_timeout": 5.0,
        "max_concurrent": None,
        "bus_capacity": 1024,
        "registry_capacity": 1024,
        "max_frame_bytes": 64 * 1024 * 1024,
        "timeout_kill_after": 1.0,
        "start_timeout": 30.0,
        "preload": (),
        "start_method": "launcher",
        "capture_output": False,
        "seed": None,
        "launcher": None,
        "stdin": "null",
        "isolation": "none",
    }


def test_supervisor_config_normalises_its_values() -> None:
    """Durations become float seconds (timedelta accepted) and preload a tuple."""
    config = SupervisorConfig(
        grace=timedelta(seconds=2), start_timeout=1, preload=["json", "os.path"]
    )
    assert (config.grace, config.start_timeout, config.preload) == (2.0, 1.0, ("json", "os.path"))
    assert isinstance(config.start_timeout, float)
    assert SupervisorConfig(start_method="spawn", seed=7).seed == 7
    assert dataclasses.replace(config, grace=3).grace == 3.0


def test_controller_config_defaults() -> None:
    """ControllerConfig() has queue_capacity 1024 and max_slot_queue 100."""
    config = ControllerConfig()
    assert (config.queue_capacity, config.max_slot_queue) == (1024, 100)


# --- the restart decision ------------------------------------------------------------------

NEVER, ON_FAILURE = RestartPolicy.NEVER, RestartPolicy.ON_FAILURE
ALWAYS, EVERY_5 = RestartPolicy.always(), RestartPolicy.always(5)
R = AttemptResult
FAILED, CANCELED, FATAL = OutcomeKind.FAILED, OutcomeKind.CANCELED, OutcomeKind.FATAL
RETRY = RunAgain(0.25, BackoffSource.FAILURE)


@pytest.mark.parametrize(
    ("policy", "result", "expected"),
    [
        (NEVER, R.SUCCEEDED, Stop(OutcomeKind.COMPLETED)),
        (NEVER, R.FAILED, Stop(FAILED, "why")),
        (NEVER, R.TIMED_OUT, Stop(FAILED, "why")),
        (NEVER, R.FATAL, Stop(FATAL, "why")),
        (NEVER, R.CANCELED, Stop(CANCELED, "why")),
        (ON_FAILURE, R.SUCCEEDED, Stop(OutcomeKind.COMPLETED)),
        (ON_FAILURE, R.FAILED, RETRY),
        (ON_FAILURE, R.TIMED_OUT, RETRY),
        (ON_FAILURE, R.FATAL, Stop(FATAL, "why")),
        (ON_FAILURE, R.CANCELED, Stop(CANCELED, "why")),
        (ALWAYS, R.SUCCEEDED, RunNow()),
        (ALWAYS, R.FAILED, RETRY),
        (ALWAYS, R.TIMED_OUT, RETRY),
        (ALWAYS, R.FATAL, Stop(FATAL, "why")),
        (ALWAYS, R.CANCELED, Stop(CANCELED, "why")),
        (EVERY_5, R.SUCCEEDED, RunAgain(5.0, BackoffSource.SUCCESS)),
        (EVERY_5, R.FAILED, RETRY),
        (EVERY_5, R.TIMED_OUT, RETRY),
        (EVERY_5, R.FATAL, Stop(FATAL, "why")),
        (EVERY_5, R.CANCELED, Stop(CANCELED, "why")),
    ],
)
def test_the_restart_decision_table(
    policy: RestartPolicy, result: AttemptResult, expected: object
) -> None:
    """Each restart policy and attempt result gives the action of `_model.restart.decide`'s table."""
    action, _ = decide(
        policy,
        result,
        Streak(),
        max_retries=None,
        backoff=FIXED,
        rng=random.Random(0),
        reason="why",
    )
    assert action == expected


def _run(
    policy: RestartPolicy, results: list[AttemptResult], max_retries: int | None
) -> list[Action]:
    """Feed attempt results through `decide`, carrying the streak, and collect the actions."""
    streak, actions, rng = Streak(), list[Action](), random.Random(0)
    backoff = BackoffPolicy.exponential(1, max=100)
    for result in results:
        action, streak = decide(
            policy, result, streak, max_retries=max_retries, backoff=backoff, rng=rng, reason="boom"
        )
        actions.append(action)
    return actions


@pytest.mark.parametrize(("max_retries", "attempts"), [(0, 1), (1, 2), (3, 4)])
def test_max_retries_counts_retries_after_the_first_failure(
    max_retries: int, attempts: int
) -> None:
    """`max_retries` n allows n + 1 attempts, then stops with the retry-limit reason."""
    actions = _run(ON_FAILURE, [R.FAILED] * attempts, max_retries)
    assert all(isinstance(a, RunAgain) for a in actions[:-1])
    assert actions[-1] == Stop(
        FAILED, f"retry limit reached after {max_retries} of {max_retries} retries: boom"
    )


def test_backoff_grows_with_the_streak_and_a_success_resets_it() -> None:
    """The retry index counts the current failure streak and a success resets it to 0."""
    results = [R.FAILED, R.TIMED_OUT, R.FAILED, R.SUCCEEDED, R.FAILED, R.FAILED]
    actions = _run(RestartPolicy.always(2), results, max_retries=3)
    delays = [a.delay for a in actions if isinstance(a, RunAgain)]
    assert delays == [1.0, 2.0, 4.0, 2.0, 1.0, 2.0]
    assert actions[3] == RunAgain(2.0, BackoffSource.SUCCESS)


def test_the_streak_resets_so_the_limit_applies_per_streak() -> None:
    """A success between failures gives the task a fresh set of retries."""
    results = [R.FAILED, R.FAILED, R.SUCCEEDED, R.FAILED, R.FAILED]
    actions = _run(RestartPolicy.always(), results, max_retries=1)
    assert actions[1] == Stop(FAILED, "retry limit reached after 1 of 1 retries: boom")
    _, streak = decide(
        ALWAYS, R.SUCCEEDED, Streak(4), max_retries=1, backoff=FIXED, rng=random.Random(0)
    )
    assert streak == Streak(0)
    assert _run(ALWAYS, results[2:], max_retries=1)[-1] == Stop(
        FAILED, "retry limit reached after 1 of 1 retries: boom"
    )


def test_a_once_task_reason_never_carries_the_retry_limit_prefix() -> None:
    """A `once` task's failure keeps the plain reason, whatever max_retries is."""
    for max_retries in (None, 0, 3):
        assert _run(NEVER, [R.FAILED], max_retries) == [Stop(FAILED, "boom")]


def test_unlimited_retries_never_stop_on_failures() -> None:
    """With max_retries None, a failure streak of any length keeps retrying, capped at max."""
    actions = _run(ON_FAILURE, [R.FAILED] * 50, None)
    assert all(isinstance(a, RunAgain) for a in actions)
    assert actions[-1] == RunAgain(100.0, BackoffSource.FAILURE)


def test_backoff_source_labels() -> None:
    """BackoffSource labels are the lower-case names."""
    assert [s.label for s in BackoffSource] == ["success", "failure"]


# --- outcomes and errors -------------------------------------------------------------------


def test_outcome_rejection_and_error_labels_are_stable() -> None:
    """Outcome, rejection and error labels are stable; the error hierarchy and fields."""
    assert {k.label for k in OutcomeKind} == {f"outcome_{k.name.lower()}" for k in OutcomeKind}
    assert OutcomeKind.FORCE_ABORTED.label == "outcome_force_aborted"
    assert [k.label for k in RejectionKind] == [
        "already_exists", "batch_rejected", "slot_busy", "queue_full", "superseded_by_replace",
        "removed_from_queue", "controller_shutting_down", "admission_failed", "dependency_failed",
    ]  # fmt: skip
    labels: dict[type[_errors.MpvisorError], str] = {
        _errors.MpvisorError: "mpvisor_error",
        _errors.ConfigError: "config_error",
        _errors.ShuttingDown: "shutting_down",
        _errors.AlreadyRunning: "already_running",
        _errors.TaskAlreadyExists: "task_already_exists",
        _errors.CommandQueueFull: "command_queue_full",
        _errors.TaskTerminationTimeout: "task_termination_timeout",
        _errors.GraceExceeded: "grace_exceeded",
        _errors.ControllerError: "controller_error",
        _errors.ControllerNotConfigured: "controller_not_configured",
        _errors.ControllerFull: "controller_full",
        _errors.ControllerClosed: "controller_closed",
        _errors.AlreadySubmitted: "already_submitted",
    }
    assert {error: error.label for error in labels} == labels
    assert all(issubclass(error, _errors.MpvisorError) for error in labels)
    controller = [
        label for error, label in labels.items() if issubclass(error, _errors.ControllerError)
    ]
    assert controller == [
        "controller_error", "controller_not_configured", "controller_full", "controller_closed",
        "already_submitted",
    ]  # fmt: skip
    assert issubclass(_errors.ConfigError, ValueError)
    for verdict in (_errors.Fail, _errors.Fatal, _errors.Canceled):
        assert not issubclass(verdict, _errors.MpvisorError)
    assert issubclass(_errors.Fail, Exception) and issubclass(_errors.Fatal, Exception)
    assert not issubclass(_errors.Canceled, Exception) and issubclass(
        _errors.Canceled, BaseException
    )


def test_error_fields() -> None:
    """Errors carry their fields."""
    assert _errors.TaskAlreadyExists("n").name == "n" and not _errors.TaskAlreadyExists("n").twice
    timeout = _errors.TaskTerminationTimeout(4, 1.5)
    assert (timeout.id, timeout.timeout) == (4, 1.5)
    grace = _errors.GraceExceeded(2.0, ["a", "b"])
    assert (grace.grace, grace.stuck) == (2.0, ["a", "b"])
    assert (_errors.Fail("x", exit_code=3).exit_code, _errors.Fatal("y").reason) == (3, "y")
    assert _errors.Fatal("z", exit_code=-(2**63)).exit_code == -(2**63)


@pytest.mark.parametrize("verdict", [_errors.Fail, _errors.Fatal])
@pytest.mark.parametrize("code, error", [("3", TypeError), (1.5, TypeError), (True, TypeError),
                                         (2**63, ValueError), (-(2**63) - 1, ValueError)])
def test_a_verdicts_exit_code_is_checked_where_it_is_raised(verdict: type[Exception], code: object,
                                                             error: type[Exception]) -> None:
    """An exit code the outcome could not carry is refused by the constructor, naming the field and
    the value (the target's own line raises), instead of being dropped on the way."""
    with pytest.raises(error, match=rf"exit_code must .*, got {re.escape(repr(code))}$"):
        verdict("x", exit_code=code)


def test_task_outcome_helpers() -> None:
    """TaskOutcome: is_success only for COMPLETED, label from its kind, and the rejected helper."""
    done = TaskOutcome(OutcomeKind.COMPLETED, value=[1], attempts=1, duration=0.5)
    assert done.is_success() and done.label == "outcome_completed"
    assert not any(
        TaskOutcome(k).is_success()
        for k in OutcomeKind
        if k not in (OutcomeKind.COMPLETED, OutcomeKind.REJECTED)
    )
    rejected = TaskOutcome.rejected(RejectionKind.SLOT_BUSY, "slot s is busy")
    assert (rejected.kind, rejected.rejection, rejected.reason) == (
        OutcomeKind.REJECTED,
        RejectionKind.SLOT_BUSY,
        "slot s is busy",
    )
    assert (rejected.attempts, rejected.duration, rejected.label) == (0, None, "outcome_rejected")
    assert not rejected.is_success()
    with pytest.raises(ValueError, match="rejection"):
        TaskOutcome(OutcomeKind.REJECTED)


# --- restart intensity ------------------------------------------------------------------------------


def _intensity_model(times: list[float], max_restarts: int, within: float) -> int | None:
    """The index of the first restart that would exceed the intensity (a plain reference)."""
    kept: list[float] = []
    for i, now in enumerate(times):
        kept = [t for t in kept if t > now - within]
        if len(kept) >= max_restarts:
            return i
        kept.append(now)
    return None


@pytest.mark.parametrize("max_restarts", [0, 1, 2, 3])
@pytest.mark.parametrize("within", [0.5, 1.0, 2.5])
@pytest.mark.parametrize("gaps", [(0.1,) * 8, (0.6,) * 8, (0.1, 0.9, 0.1, 0.9, 0.1, 0.9, 0.1, 0.9), (1.0, 0.2, 0.2, 3.0, 0.1, 0.1, 0.1, 0.1)])
@pytest.mark.parametrize("result", [AttemptResult.FAILED, AttemptResult.TIMED_OUT, AttemptResult.SUCCEEDED])
def test_restart_intensity_stops_at_the_first_restart_over_the_window(max_restarts, within, gaps, result) -> None:
    """Against a plain model, for failures and (with always()) successes: the first restart
    that would make more than `max_restarts` inside `within` s stops FAILED, whatever the retry
    budget, with a reason naming the count, the window and the bound."""
    from mpvisor._model.spec import RestartIntensity

    policy = RestartPolicy.always(None) if result is AttemptResult.SUCCEEDED else RestartPolicy.ON_FAILURE
    intensity = RestartIntensity(max_restarts, within)
    times = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    expected = _intensity_model(times, max_restarts, within)
    streak = Streak()
    stopped_at = None
    for i, now in enumerate(times):
        action, streak = decide(policy, result, streak, max_retries=None, backoff=BackoffPolicy.constant(0.0),
                                rng=random.Random(1), reason="boom", intensity=intensity, now=now)
        if isinstance(action, Stop):
            assert action.outcome_kind is OutcomeKind.FAILED
            assert action.reason.startswith(f"restart intensity exceeded: a {ordinal(max_restarts + 1)} restart within {within:g} s (at most {max_restarts})")
            assert action.reason.endswith(": boom") if result is not AttemptResult.SUCCEEDED else True
            stopped_at = i
            break
        assert len(streak.restarts) <= max_restarts
    assert stopped_at == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0.01, 2.0)), min_size=1, max_size=20),
       st.integers(0, 3), st.sampled_from([0.5, 1.0, 2.5]))
def test_a_periodic_tasks_runs_after_a_success_are_its_schedule_not_restarts(runs, max_restarts, within) -> None:
    """With `always(interval)`, only the runs after a failure count against the intensity: a task
    that never fails runs on, however short its interval (it ended FAILED, `restart intensity
    exceeded`, without a single failure)."""
    from mpvisor._model.spec import RestartIntensity

    policy = RestartPolicy.always(0.1)
    intensity = RestartIntensity(max_restarts, within)
    now, streak, failure_times = 0.0, Streak(), []
    for ok, gap in runs:
        now += gap
        if not ok:
            failure_times.append(now)
    first_over = _intensity_model(failure_times, max_restarts, within)
    now, stopped = 0.0, None
    for ok, gap in runs:
        now += gap
        result = AttemptResult.SUCCEEDED if ok else AttemptResult.FAILED
        action, streak = decide(policy, result, streak, max_retries=None, backoff=BackoffPolicy.constant(0.0),
                                rng=random.Random(1), reason="boom", intensity=intensity, now=now)
        if ok:
            assert action == RunAgain(0.1, BackoffSource.SUCCESS)
        if isinstance(action, Stop):
            stopped = now
            break
    expected = None if first_over is None else failure_times[first_over]
    assert stopped == expected


def test_always_with_a_zero_interval_reruns_at_once_and_its_reruns_are_restarts() -> None:
    """`always(0)` reruns at once after a success, as `always()` does, so the restart intensity
    bounds it: a zero interval is no schedule that would exempt the loop from it."""
    intensity = RestartIntensity(2, 10.0)
    for policy in (RestartPolicy.always(), RestartPolicy.always(0), RestartPolicy.always(timedelta(0))):
        streak, actions = Streak(), []
        for now in (1.0, 2.0, 3.0):
            action, streak = decide(policy, AttemptResult.SUCCEEDED, streak, max_retries=None, backoff=FIXED,
                                    rng=random.Random(1), intensity=intensity, now=now)
            actions.append(action)
        assert actions[:2] == [RunNow(), RunNow()], policy
        assert isinstance(actions[2], Stop) and actions[2].outcome_kind is OutcomeKind.FAILED, policy
        assert actions[2].reason == "restart intensity exceeded: a 3rd restart within 10 s (at most 2)", policy


def test_restart_intensity_is_validated_and_inherited() -> None:
    """Bad values name the field; a spec inherits the default unless it gives its own (or None)."""
    from mpvisor._model.spec import RestartIntensity

    with pytest.raises(ConfigError, match="max_restarts"):
        RestartIntensity(-1, 1.0)
    with pytest.raises(ConfigError, match="within"):
        RestartIntensity(3, 0)
    with pytest.raises(TypeError, match="restart_intensity"):
        TaskDefaults(restart_intensity=(3, 1.0))  # type: ignore[arg-type]
    defaults = TaskDefaults(restart_intensity=RestartIntensity(5, 60))
    spec = TaskSpec.restartable(TaskFn("t", "workers.basic:quick"))
    assert spec.resolve(defaults).restart_intensity == RestartIntensity(5, 60)
    assert spec.with_restart_intensity(2, 10).resolve(defaults).restart_intensity == RestartIntensity(2, 10.0)
    assert dataclasses.replace(spec, restart_intensity=None).resolve(defaults).restart_intensity is None
    assert spec.with_restart_intensity(None).resolve(defaults).restart_intensity is None  # as `with_timeout(None)`
    with pytest.raises(ConfigError, match="within must be a number of seconds or a timedelta, got None"):
        spec.with_restart_intensity(3)
    with pytest.raises(ConfigError, match="max_restarts must be a non-negative integer, got None"):
        spec.with_restart_intensity(None, 10)


@pytest.mark.parametrize("n, text", [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"),
                                     (13, "13th"), (21, "21st"), (22, "22nd"), (101, "101st"), (111, "111th")])
def test_the_refused_restart_is_named_by_its_ordinal(n, text):
    """`restart intensity exceeded: a 4th restart within 10 s (at most 3)`: 3 restarts ran."""
    assert ordinal(n) == text


def test_a_with_builder_takes_its_whole_record_alone() -> None:
    """`with_limits(Limits(memory=...))`, the record the docs name beside the builder, was taken
    for `memory` and refused: `memory must be an integer ..., got Limits(...)`. Each of
    `with_limits`, `with_restart_intensity` and `with_resources` takes its record alone now;
    the record and a field beside it are a `TypeError` naming the builder."""
    limits = Limits(memory=2**20, cpus=1.5)
    intensity = RestartIntensity(3, 10)
    resources = Resources(num_cpus=2)
    spec = TaskSpec.once(TASK)
    assert spec.with_limits(limits).limits == limits == spec.with_limits(memory=2**20, cpus=1.5).limits
    assert spec.with_restart_intensity(intensity).restart_intensity == intensity == spec.with_restart_intensity(3, 10).restart_intensity
    assert spec.with_resources(resources).resources == resources == spec.with_resources(num_cpus=2).resources
    with pytest.raises(TypeError, match=r"^with_limits\(\) takes a Limits alone, or its fields as arguments, not both$"):
        spec.with_limits(limits, cpus=2)
    with pytest.raises(TypeError, match=r"^with_restart_intensity\(\) takes a RestartIntensity alone"):
        spec.with_restart_intensity(intensity, 5)
    with pytest.raises(TypeError, match=r"^with_resources\(\) takes a Resources alone"):
        spec.with_resources(resources, memory=1)
