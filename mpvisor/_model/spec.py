"""How is a task to be supervised?

Owns the immutable description of a supervised task: `RestartPolicy`, `TaskDefaults`,
`TaskSpec` (a task plus its restart policy and, optionally, backoff, timeout and retry limit)
and `ResolvedSpec`, the concrete settings the runtime uses. What happens after an attempt is
decided in `_model/restart.py`; the work itself is described in `_model/work.py`.

| setting | given on the spec | never given |
|---|---|---|
| restart | always (every constructor sets it) | — |
| backoff | that `BackoffPolicy` | `INHERIT` → `TaskDefaults.backoff` at add/submit time |
| timeout | seconds; `None` or `0` = no timeout | `INHERIT` → `TaskDefaults.timeout` |
| max_retries | n >= 0; `None` = unlimited | `INHERIT` → `TaskDefaults.max_retries` |
| resources | `Resources` (placement on a cluster launcher) | `None`: the launcher's default |
| restart intensity | `RestartIntensity(max_restarts, within)`; `None` = no bound | `INHERIT` → `TaskDefaults.restart_intensity` |
| limits | `Limits(memory, cpu_seconds, open_files, address_space, cpus)`; `None` = none | `INHERIT` → `TaskDefaults.limits` |

| constructor | restart policy |
|---|---|
| `TaskSpec.once(task)` | `RestartPolicy.NEVER` |
| `TaskSpec.restartable(task)` | `RestartPolicy.ON_FAILURE` |
| `TaskSpec.periodic(task, every)` | `RestartPolicy.always(every)` (`every` finite, > 0) |

A timeout of 0 is kept on the spec as given and resolves to "no timeout". An interval of 0
reruns at once but still schedules (and publishes) a zero delay; `always()` with no interval
reruns with no delay event at all.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, ClassVar, Final, Literal, TypeAlias, TypeVar

from mpvisor._model import checks as _validate
from mpvisor._model.backoff import BackoffPolicy, JitterPolicy
from mpvisor._model.errors import ConfigError
from mpvisor._model.records import record
from mpvisor._model.work import CommandTask, TaskFn


class _Inherit(enum.Enum):
    """The type of `INHERIT`: a one-member enum, so type checkers can narrow on it."""

    INHERIT = "INHERIT"

    def __repr__(self) -> str:
        return "mpvisor.INHERIT"


INHERIT: Final = _Inherit.INHERIT
"""A setting not given on the spec: it takes the `TaskDefaults` value when added."""

Inherit: TypeAlias = Literal[_Inherit.INHERIT]
Task: TypeAlias = TaskFn | CommandTask


class RestartKind(enum.Enum):
    """When a task runs again: never, after failures, or always."""

    NEVER = "never"
    ON_FAILURE = "on_failure"
    ALWAYS = "always"


@record(frozen=True)
class RestartPolicy:
    """When a task runs again; fatal errors and cancellation always stop it.

    `RestartPolicy.NEVER`, `RestartPolicy.ON_FAILURE` or `RestartPolicy.always(interval)`; `kind`
    is its `RestartKind`, `interval` (only for `ALWAYS`) the wait after a success (`None`: at
    once). The interval starts when a successful attempt ends; it is not a wall-clock schedule.
    """

    NEVER: ClassVar[RestartPolicy]
    ON_FAILURE: ClassVar[RestartPolicy]

    kind: RestartKind
    interval: float | None = None  # only for ALWAYS: the wait after a success; None = at once

    def __post_init__(self) -> None:
        if not isinstance(self.kind, RestartKind):
            raise TypeError(f"kind must be a RestartKind, got {self.kind!r}")
        interval = _validate.duration("interval", self.interval, allow_none=True)
        if interval is not None and self.kind is not RestartKind.ALWAYS:
            raise ValueError(f"interval is only valid for always(), got {self.interval!r}")
        object.__setattr__(self, "interval", interval)

    @classmethod
    def always(cls, interval: float | timedelta | None = None) -> RestartPolicy:
        """Run again after every success (after `interval`, if given) and retry failures."""
        return cls(RestartKind.ALWAYS, _validate.duration("interval", interval, allow_none=True))

    def __repr__(self) -> str:
        if self.kind is RestartKind.ALWAYS:
            return f"RestartPolicy.always(interval={self.interval!r})"
        return f"RestartPolicy.{self.kind.name}"


RestartPolicy.NEVER = RestartPolicy(RestartKind.NEVER)
RestartPolicy.ON_FAILURE = RestartPolicy(RestartKind.ON_FAILURE)


@record(frozen=True, init=False)
class RestartIntensity:
    """At most `max_restarts` restarts (an int >= 0) within any `within` seconds (> 0), as
    Erlang/OTP's intensity and period: one more restart inside that sliding window ends the task
    `FAILED`, whatever its retry budget. Every restart counts (after a failure, and, for
    `always()`, after a success)."""

    max_restarts: int
    within: float

    def __init__(self, max_restarts: int, within: float | timedelta) -> None:
        object.__setattr__(self, "max_restarts", _validate.non_negative_int("max_restarts", max_restarts))
        object.__setattr__(self, "within", _validate.duration("within", within, allow_zero=False))


@record(frozen=True, init=False)
class Limits:
    """Resource limits of each attempt, each `None` when not limited:

    - `memory`: bytes (a whole number from 1 to 2**63 - 1: an int, or a number with no
      fraction, `1e9` or `Decimal("1E+9")`, stored as the int; `1.5` is refused) of *resident* memory of the attempt's whole
      tree, kept by the launcher with the strongest mechanism the host allows (a memory cgroup
      per attempt, else a watcher of the tree's proportional sets, which is soft: `mpvisor
      doctor` says which);
    - `address_space`: bytes (as `memory`) of address space of each process (`RLIMIT_AS`, set
      in the child: what `memory` meant before, for programs that must never map more);
    - `cpu_seconds`: CPU time, > 0, of the attempt's whole tree, counted by the launcher (a v2
      cgroup per attempt, else its accounting of the tree); `open_files`: descriptors, an int
      from 1 to 2**63 - 1, of each process (`RLIMIT_NOFILE`; over the process's hard limit, the
      attempt is refused when it starts: `FATAL`);
    - `cpus`: at most this many CPUs' worth of time (from 0.01 to 100000; 1.5 = one and a half CPUs), for
      the whole tree, kept by the kernel's CPU controller in a cgroup of the attempt's own (v2
      `cpu.max`, v1 `cpu.cfs_quota_us`): the tree is slowed down, never ended. Where no CPU
      controller may be used, the attempt is refused: it ends `FATAL` (`cannot apply the limit
      cpus=...`), as `mpvisor doctor` foretells.

    An attempt that runs into one of the others ends as a retryable failure whose reason starts
    with the limit (`memory limit exceeded (512 MiB, cgroup v1): ...`, `address space limit
    exceeded (1 GiB)`, `cpu limit exceeded (10 s, cgroup v2 cpu.stat)`, `open files limit
    exceeded (64)`), and its outcome's `limit` names it. A value out of those ranges raises
    `ConfigError` (a `ValueError`) naming the field: the bounds are what the kernel takes, so a
    limit accepted here is never refused as a number when it is applied."""

    memory: int | None
    cpu_seconds: float | None
    open_files: int | None
    address_space: int | None
    cpus: float | None

    def __init__(self, memory: int | None = None, cpu_seconds: float | None = None,
                 open_files: int | None = None, address_space: int | None = None, cpus: float | None = None) -> None:
        object.__setattr__(self, "memory", _validate.size("memory", memory, allow_none=True))
        object.__setattr__(self, "cpu_seconds", _validate.duration("cpu_seconds", cpu_seconds, allow_none=True, allow_zero=False))
        object.__setattr__(self, "open_files", _validate.positive_int("open_files", open_files, allow_none=True,
                                                                      most=_validate.MOST_LIMIT))
        object.__setattr__(self, "address_space", _validate.size("address_space", address_space, allow_none=True))
        object.__setattr__(self, "cpus", _validate.cpus("cpus", cpus, allow_none=True))

    def to_wire(self) -> dict[str, Any]:
        """The limits as the start message carries them (the child sets `as`, `nofile`; the
        launcher keeps `memory`, `cpu` and `cpus`)."""
        return {"memory": self.memory, "cpu": self.cpu_seconds, "nofile": self.open_files, "as": self.address_space,
                "cpus": self.cpus}


DEFAULT_BACKOFF: Final = BackoffPolicy.exponential(0.2, max=30.0).with_jitter(JitterPolicy.EQUAL)


@record(frozen=True, init=False)
class TaskDefaults:
    """The settings a spec inherits for what it does not give (never its restart policy).

    `backoff` (default: exponential from 0.2 s up to 30 s, EQUAL jitter), `timeout` (seconds;
    default `None`, no timeout), `max_retries` (default `None`, unlimited) and
    `restart_intensity` (a `RestartIntensity`, default `None`: no bound) and `limits` (`Limits`,
    default `None`). They are fixed for a
    supervisor's life (`SupervisorBuilder.with_task_defaults`, `Supervisor(task_defaults=...)`):
    this is where a supervisor-wide default goes.
    """

    backoff: BackoffPolicy
    timeout: float | None  # None = no timeout
    max_retries: int | None  # None = unlimited
    restart_intensity: RestartIntensity | None  # None = no bound
    limits: Limits | None  # None = no limit

    def __init__(
        self,
        backoff: BackoffPolicy = DEFAULT_BACKOFF,
        timeout: float | timedelta | None = None,
        max_retries: int | None = None,
        restart_intensity: RestartIntensity | None = None,
        limits: Limits | None = None,
    ) -> None:
        object.__setattr__(self, "backoff", _checked_backoff(backoff))
        object.__setattr__(self, "timeout", _validate.duration("timeout", timeout, allow_none=True))
        object.__setattr__(
            self,
            "max_retries",
            _validate.non_negative_int("max_retries", max_retries, allow_none=True),
        )
        object.__setattr__(self, "restart_intensity", _checked_intensity(restart_intensity))
        object.__setattr__(self, "limits", _checked_limits(limits))


@record(frozen=True, init=False)
class Resources:
    """What one attempt of a task needs where it is placed: `num_cpus` (a number >= 0),
    `memory` (bytes, an int >= 1) and custom `resources` (name -> amount >= 0), each `None` /
    empty when not asked for. A launcher that places attempts on a cluster (`mpvisor.ray`)
    reserves them per attempt; the local launcher accepts them and ignores them (every attempt
    runs on this machine, bounded only by `SupervisorConfig.max_concurrent`)."""

    num_cpus: float | None
    memory: int | None
    resources: Mapping[str, float]

    def __init__(
        self,
        num_cpus: float | None = None,
        memory: int | None = None,
        resources: Mapping[str, float] | None = None,
    ) -> None:
        object.__setattr__(self, "num_cpus", _amount("num_cpus", num_cpus))
        object.__setattr__(self, "memory", _validate.positive_int("memory", memory, allow_none=True))
        if resources is None:
            resources = {}
        if not isinstance(resources, Mapping):
            raise ConfigError(f"resources must be a mapping of resource names to amounts, got {resources!r}")
        checked: dict[str, float] = {}
        for key, amount in resources.items():
            if not isinstance(key, str) or not key:
                raise ConfigError(f"resources keys must be non-empty strings, got {key!r}")
            if key in ("CPU", "memory"):
                raise ConfigError(f"resources[{key!r}]: give it as num_cpus / memory, not as a custom resource")
            if key == "GPU":
                raise ConfigError("resources['GPU']: mpvisor has no field for GPUs yet, so a task cannot "
                                  "ask for one (Ray takes GPUs as num_gpus, not as a custom resource)")
            value = _amount(f"resources[{key!r}]", amount)
            assert value is not None
            checked[key] = value
        object.__setattr__(self, "resources", types.MappingProxyType(checked))

    def __hash__(self) -> int:
        return hash((self.num_cpus, self.memory, tuple(sorted(self.resources.items()))))

    def __repr__(self) -> str:
        return f"Resources(num_cpus={self.num_cpus!r}, memory={self.memory!r}, resources={dict(self.resources)!r})"


def _amount(field: str, value: object) -> float | None:
    if value is None:
        return None
    amount = _validate.real(value)  # any real number, stored as a float
    if amount is None or not math.isfinite(amount) or amount < 0:
        raise ConfigError(f"{field} must be a finite number >= 0, got {value!r}")
    return amount


@record(frozen=True)
class ResolvedSpec:
    """A spec with every inherited setting filled in: what the runtime runs."""

    task: Task
    restart: RestartPolicy
    backoff: BackoffPolicy
    timeout: float | None  # None = no timeout (also when 0 was given)
    max_retries: int | None  # None = unlimited
    resources: Resources | None = None  # None: the launcher's default placement
    restart_intensity: RestartIntensity | None = None  # None = no bound
    limits: Limits | None = None  # None = no limit
    start_timeout: float | None = None  # None = the supervisor's `start_timeout`
    timeout_includes_start: bool = False  # the timeout runs from the process's start, not from the call
    grace: float | None = None  # None = the supervisor's `grace`

    @property
    def name(self) -> str:
        return self.task.name


@record(frozen=True)
class TaskSpec:
    """A task and how to supervise it. Builders return a new spec.

    `task`: the `TaskFn` or `CommandTask`; `restart`: its `RestartPolicy` (set by every
    constructor, never inherited); `backoff`, `timeout` (seconds; `None` or 0 = none) and
    `max_retries` (retries after the first failed attempt; `None` = unlimited) read `INHERIT`
    unless given, and then take the supervisor's `TaskDefaults` when the task is added or
    submitted. An explicit `None` overrides the default (`backoff` is always a `BackoffPolicy`,
    `with_backoff(None)` a `TypeError`). `resources` (`with_resources`) is what
    each attempt needs where a cluster launcher places it. `timeout` runs from the call of the
    target, or, with `timeout_includes_start` (`with_timeout(..., include_start=True)`, what
    `mpvisor run --timeout` means), from its process's start, bounding the whole attempt;
    `start_timeout` (`with_start_timeout`) bounds its start-up alone (`None`: the supervisor's);
    `grace` (`with_grace`) is how long its attempt has to stop once asked, before its tree is
    killed (`None`: the supervisor's).
    """

    task: Task
    restart: RestartPolicy
    backoff: BackoffPolicy | Inherit = INHERIT
    timeout: float | Inherit | None = INHERIT  # None or 0 = no timeout
    max_retries: int | Inherit | None = INHERIT  # None = unlimited
    resources: Resources | None = None
    restart_intensity: RestartIntensity | Inherit | None = INHERIT  # None = no bound
    limits: Limits | Inherit | None = INHERIT  # None = no limit
    start_timeout: float | None = None  # > 0; None = SupervisorConfig.start_timeout
    timeout_includes_start: bool = False  # the timeout bounds the whole attempt, start-up and import included
    grace: float | None = None  # >= 0; None = SupervisorConfig.grace

    def __post_init__(self) -> None:
        if not isinstance(self.task, (TaskFn, CommandTask)):
            raise TypeError(f"task must be a TaskFn or CommandTask, got {self.task!r}")
        if not isinstance(self.restart, RestartPolicy):
            raise TypeError(f"restart must be a RestartPolicy, got {self.restart!r}")
        if self.backoff is not INHERIT:
            _checked_backoff(self.backoff)
        if self.timeout is not INHERIT:
            timeout = _validate.duration("timeout", self.timeout, allow_none=True)
            object.__setattr__(self, "timeout", timeout)
        if self.max_retries is not INHERIT:  # stored as checked: a plain int, whatever integer type it came as
            object.__setattr__(self, "max_retries", _validate.non_negative_int("max_retries", self.max_retries, allow_none=True))
        if self.resources is not None and not isinstance(self.resources, Resources):
            raise TypeError(f"resources must be a Resources, got {self.resources!r}")
        if self.restart_intensity is not INHERIT:
            _checked_intensity(self.restart_intensity)
        if self.limits is not INHERIT:
            _checked_limits(self.limits)
        if self.start_timeout is not None:
            object.__setattr__(self, "start_timeout", _validate.duration("start_timeout", self.start_timeout, allow_zero=False))
        if not isinstance(self.timeout_includes_start, bool):
            raise TypeError(f"timeout_includes_start must be a bool, got {self.timeout_includes_start!r}")
        if self.grace is not None:
            object.__setattr__(self, "grace", _validate.duration("grace", self.grace))

    @classmethod
    def once(cls, task: Task) -> TaskSpec:
        """Run one attempt; stop after it, whatever its result."""
        return cls(task, RestartPolicy.NEVER)

    @classmethod
    def restartable(cls, task: Task) -> TaskSpec:
        """Retry failures after a backoff; stop after a success."""
        return cls(task, RestartPolicy.ON_FAILURE)

    @classmethod
    def periodic(cls, task: Task, every: float | timedelta) -> TaskSpec:
        """Run again `every` seconds (> 0) after each success; retry failures after a backoff."""
        interval = _validate.duration("every", every, allow_zero=False)  # as `--every` and a task file's `every`
        return cls(task, RestartPolicy.always(interval))

    @property
    def name(self) -> str:
        """The task's name (`task.name`)."""
        return self.task.name

    def with_backoff(self, backoff: BackoffPolicy) -> TaskSpec:
        """The same spec with the delays between retries given by `backoff`."""
        return dataclasses.replace(self, backoff=backoff)

    def with_timeout(self, timeout: float | timedelta | None, *, include_start: bool = False) -> TaskSpec:
        """The same spec with a per-attempt timeout (`None` or 0: none). It runs from the call of
        the target, or with `include_start` from its process's start (the whole attempt: process
        start, handshake and import included, as `mpvisor run --timeout`; not the time its start
        request waited for the launcher, behind a burst of others, which `start_timeout`
        bounds); past it the attempt is stopped and is a retryable failure, `timed out`."""
        seconds = _validate.duration("timeout", timeout, allow_none=True)
        if not isinstance(include_start, bool):
            raise TypeError(f"include_start must be a bool, got {include_start!r}")
        return dataclasses.replace(self, timeout=seconds, timeout_includes_start=include_start)

    def with_start_timeout(self, start_timeout: float | timedelta | None) -> TaskSpec:
        """The same spec with its own bound on each attempt's start-up (process start,
        handshake, import of the target; > 0), instead of `SupervisorConfig.start_timeout`
        (`None`); past it the tree is killed and the attempt is a retryable failure, `start-up
        timed out`."""
        seconds = _validate.duration("start_timeout", start_timeout, allow_none=True, allow_zero=False)
        return dataclasses.replace(self, start_timeout=seconds)

    def with_grace(self, grace: float | timedelta | None) -> TaskSpec:
        """The same spec with its own grace window (>= 0; `None`: `SupervisorConfig.grace`): once
        its attempt is asked to stop (a removal, a shutdown, a replacement), how long it has
        before its tree is killed and it ends `FORCE_ABORTED`. A timeout's stop keeps
        `SupervisorConfig.timeout_kill_after`."""
        seconds = _validate.duration("grace", grace, allow_none=True)
        return dataclasses.replace(self, grace=seconds)

    def with_max_retries(self, max_retries: int | None) -> TaskSpec:
        """The same spec allowing `max_retries` retries in a failure streak (3 allows at most 4
        attempts, 0 allows one; `None`: unlimited); a success resets the count."""
        return dataclasses.replace(self, max_retries=max_retries)

    def with_resources(
        self,
        num_cpus: float | Resources | None = None,
        memory: int | None = None,
        resources: Mapping[str, float] | None = None,
    ) -> TaskSpec:
        """The same spec asking, for each attempt, `num_cpus` CPUs, `memory` bytes and custom
        `resources` where it is placed (see `Resources`: a cluster launcher such as
        `mpvisor.ray.RayLauncher` reserves them; the local launcher ignores them); or given a
        `Resources` alone, those."""
        if isinstance(num_cpus, Resources):
            return dataclasses.replace(self, resources=_alone("with_resources", num_cpus, memory, resources))
        return dataclasses.replace(self, resources=Resources(num_cpus, memory, resources))

    def with_restart_intensity(self, max_restarts: int | RestartIntensity | None,
                               within_seconds: float | timedelta | None = None) -> TaskSpec:
        """The same spec ending `FAILED` (`restart intensity exceeded ...`) on a restart that
        would make more than `max_restarts` within `within_seconds` (a sliding window), whatever
        its retry budget (see `RestartIntensity`, which may be given alone instead);
        `with_restart_intensity(None)`: no bound, whatever the supervisor's `TaskDefaults` say."""
        if isinstance(max_restarts, RestartIntensity):
            return dataclasses.replace(self, restart_intensity=_alone("with_restart_intensity", max_restarts, within_seconds))
        if max_restarts is None and within_seconds is None:
            return dataclasses.replace(self, restart_intensity=None)
        intensity = RestartIntensity(max_restarts, within_seconds)  # type: ignore[arg-type]  # it names a None it refuses
        return dataclasses.replace(self, restart_intensity=intensity)

    def with_limits(self, memory: int | Limits | None = None, cpu_seconds: float | None = None,
                    open_files: int | None = None, address_space: int | None = None,
                    cpus: float | None = None) -> TaskSpec:
        """The same spec with resource limits for each attempt (see `Limits`, which may be given
        alone instead; `cpus` is enforced, unlike `with_resources(num_cpus=)`, which only
        reserves where it is placed)."""
        if isinstance(memory, Limits):
            return dataclasses.replace(self, limits=_alone("with_limits", memory, cpu_seconds, open_files, address_space, cpus))
        return dataclasses.replace(self, limits=Limits(memory, cpu_seconds, open_files, address_space, cpus))

    def with_restart(self, restart: RestartPolicy) -> TaskSpec:
        """The same spec with another `RestartPolicy`."""
        return dataclasses.replace(self, restart=restart)

    def resolve(self, defaults: TaskDefaults) -> ResolvedSpec:
        """Fill every `INHERIT` setting from `defaults` (at add or submit time)."""
        backoff = defaults.backoff if self.backoff is INHERIT else self.backoff
        timeout = defaults.timeout if self.timeout is INHERIT else self.timeout
        retries = defaults.max_retries if self.max_retries is INHERIT else self.max_retries
        intensity = defaults.restart_intensity if self.restart_intensity is INHERIT else self.restart_intensity
        limits = defaults.limits if self.limits is INHERIT else self.limits
        return ResolvedSpec(self.task, self.restart, backoff, timeout or None, retries, self.resources, intensity, limits,
                            self.start_timeout, self.timeout_includes_start, self.grace)


R = TypeVar("R")


def _alone(method: str, record: R, *others: object) -> R:
    """A `with_*` builder's whole record (`with_limits(Limits(...))`), given without the fields
    it already holds: another argument beside it is a `TypeError`, naming the builder."""
    if any(other is not None for other in others):
        raise TypeError(f"{method}() takes a {type(record).__name__} alone, or its fields as arguments, not both")
    return record


def _checked_intensity(intensity: object) -> RestartIntensity | None:
    if intensity is not None and not isinstance(intensity, RestartIntensity):
        raise TypeError(f"restart_intensity must be a RestartIntensity or None, got {intensity!r}")
    return intensity


def _checked_limits(limits: object) -> Limits | None:
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be a Limits or None, got {limits!r}")
    return limits


def _checked_backoff(backoff: object) -> BackoffPolicy:
    if not isinstance(backoff, BackoffPolicy):
        raise TypeError(f"backoff must be a BackoffPolicy, got {backoff!r}")
    return backoff
