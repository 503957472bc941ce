"""What are the supervisor's limits?

Owns `SupervisorConfig` (the controller's, `ControllerConfig`, is `_admission/config.py`): immutable, validated at
construction, so that a bad setting fails at once with a `ConfigError` (a `ValueError`) naming
the field and the value. Durations are stored as float seconds (a `timedelta` is accepted).

| field | default | refused |
|---|---|---|
| `grace`, `subscriber_shutdown_timeout`, `timeout_kill_after` | 60.0, 5.0, 1.0 | negative, NaN, inf |
| `start_timeout` | 30.0 | also 0 |
| `max_concurrent` | None (no bound) | 0 or negative |
| `bus_capacity`, `registry_capacity` | 1024 | 0 or negative |
| `max_frame_bytes` | 64 MiB | 0 or negative, above 2**32 - 1 (what a frame's 4-byte length can say) |
| `preload` | () | not a list/tuple of dotted module names |
| `start_method` | "launcher" | anything but "launcher" or "spawn" |
| `capture_output` | False | not a bool |
| `seed` | None | not an integer (any integer type, kept as an int) |
| `launcher` | None (the local fork server) | not callable |
| `stdin` | "null" | anything but "null" or "inherit" |
| `isolation` | "none" | anything but "none" or "cgroup" |
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Literal, TypeAlias

from mpvisor._model import checks as _validate
from mpvisor._model.errors import ConfigError
from mpvisor._model.records import record
from mpvisor._model.wire import MAX_FRAME

if TYPE_CHECKING:
    from mpvisor._launchers.seam import LauncherFactory

StartMethod: TypeAlias = Literal["launcher", "spawn"]
Stdin: TypeAlias = Literal["null", "inherit"]
Isolation: TypeAlias = Literal["none", "cgroup"]
_START_METHODS = ("launcher", "spawn")


@record(frozen=True, init=False)
class SupervisorConfig:
    """The supervisor's settings; invalid values raise `ConfigError` naming the field.

    Durations are seconds (a `timedelta` is accepted too).

    | field | default | meaning |
    |---|---|---|
    | `grace` | 60.0 | after a removal, replace or shutdown asks an attempt to stop, how long before its tree is killed |
    | `subscriber_shutdown_timeout` | 5.0 | how long shutdown waits for subscribers to drain |
    | `max_concurrent` | None | at most this many attempt processes alive at once (None: no limit) |
    | `bus_capacity` | 1024 | events buffered per `handle.events()` iterator before it loses events |
    | `registry_capacity` | 1024 | management commands queued before `add`, `remove`, ... wait (`try_*` raise `CommandQueueFull`) |
    | `max_frame_bytes` | 64 MiB | largest message from a child (a larger result is a permanent failure) |
    | `timeout_kill_after` | 1.0 | after an attempt's timeout asks it to stop, how long before its tree is killed |
    | `start_timeout` | 30.0 | > 0: process start, handshake and import of the target |
    | `preload` | () | modules the launcher imports once, before forking attempts |
    | `start_method` | "launcher" | "launcher" (fork from a pre-started launcher) or "spawn" (a fresh interpreter per Python attempt) |
    | `capture_output` | False | send attempts' stdout/stderr lines as `ATTEMPT_OUTPUT` events |
    | `seed` | None | seed each task's jitter from it and the task name, so delays repeat |
    | `launcher` | None | where attempts run: None for this machine (a local fork server), or `mpvisor.ray.RayLauncher(...)` for a Ray cluster |
    | `stdin` | "null" | what attempts read: "null" (`/dev/null`), or "inherit" (this process's stdin; when it is a terminal and this process its foreground, one attempt at a time is the terminal's foreground job: Ctrl-C, Ctrl-Z, `fg` and `bg` reach it as they would the bare command). A Ray launcher's attempts always read /dev/null |
    | `isolation` | "none" | "cgroup": every attempt gets a cgroup of its own (v2, where the kernel has `cgroup.kill`), so that its tree kill is one atomic `cgroup.kill` that catches `setsid` and double-forked descendants, and a later launcher kills what a launcher killed with its guardian left there; "none": only memory-limited attempts get cgroups (`mpvisor doctor` shows what this host allows) |
    """

    grace: float  # cooperative stop -> tree kill, on removal and shutdown
    subscriber_shutdown_timeout: float
    max_concurrent: int | None  # live attempt processes at once; None = unbounded
    bus_capacity: int
    registry_capacity: int
    max_frame_bytes: int
    timeout_kill_after: float  # attempt timeout -> tree kill
    start_timeout: float  # > 0: process start, handshake and import
    preload: tuple[str, ...]  # modules the launcher imports before forking
    start_method: StartMethod
    capture_output: bool
    seed: int | None
    launcher: LauncherFactory | None  # None: the local fork server
    stdin: Stdin  # "null": /dev/null; "inherit": this process's stdin (a terminal's foreground job)
    isolation: Isolation  # "none", or "cgroup": every attempt in a cgroup of its own for its tree kill

    def __init__(
        self,
        grace: float | timedelta = 60.0,
        subscriber_shutdown_timeout: float | timedelta = 5.0,
        max_concurrent: int | None = None,
        bus_capacity: int = 1024,
        registry_capacity: int = 1024,
        max_frame_bytes: int = 64 * 1024 * 1024,
        timeout_kill_after: float | timedelta = 1.0,
        start_timeout: float | timedelta = 30.0,
        preload: list[str] | tuple[str, ...] = (),
        start_method: StartMethod = "launcher",
        capture_output: bool = False,
        seed: int | None = None,
        launcher: LauncherFactory | None = None,
        stdin: Stdin = "null",
        isolation: Isolation = "none",
    ) -> None:
        _set(self, "grace", _seconds("grace", grace))
        _set(
            self,
            "subscriber_shutdown_timeout",
            _seconds("subscriber_shutdown_timeout", subscriber_shutdown_timeout),
        )
        _set(
            self,
            "max_concurrent",
            _validate.positive_int("max_concurrent", max_concurrent, allow_none=True),
        )
        _set(self, "bus_capacity", _validate.positive_int("bus_capacity", bus_capacity))
        _set(
            self,
            "registry_capacity",
            _validate.positive_int("registry_capacity", registry_capacity),
        )
        _set(self, "max_frame_bytes", _validate.positive_int("max_frame_bytes", max_frame_bytes, most=MAX_FRAME))
        _set(self, "timeout_kill_after", _seconds("timeout_kill_after", timeout_kill_after))
        _set(self, "start_timeout", _seconds("start_timeout", start_timeout, allow_zero=False))
        _set(self, "preload", _checked_preload(preload))
        _set(self, "start_method", _checked_start_method(start_method))
        _set(self, "capture_output", _checked_bool("capture_output", capture_output))
        _set(self, "seed", _checked_seed(seed))
        if launcher is not None and not callable(launcher):
            raise ConfigError(f"launcher must be a launcher such as mpvisor.ray.RayLauncher(...), got {launcher!r}")
        _set(self, "launcher", launcher)
        if stdin not in ("null", "inherit"):
            raise ConfigError(f"stdin must be 'null' or 'inherit', got {stdin!r}")
        _set(self, "stdin", stdin)
        if isolation not in ("none", "cgroup"):
            raise ConfigError(f"isolation must be 'none' or 'cgroup', got {isolation!r}")
        _set(self, "isolation", isolation)


def _seconds(field: str, value: object, *, allow_zero: bool = True) -> float:
    seconds = _validate.duration(field, value, allow_zero=allow_zero)
    assert seconds is not None  # allow_none is off
    return seconds


def _checked_preload(preload: object) -> tuple[str, ...]:
    if isinstance(preload, str) or not isinstance(preload, (list, tuple)):
        raise ConfigError(f"preload must be a list or tuple of module names, got {preload!r}")
    for module in preload:
        if not isinstance(module, str) or not all(p.isidentifier() for p in module.split(".")):
            raise ConfigError(f"preload entries must be dotted module names, got {module!r}")
    return tuple(preload)


def _checked_start_method(start_method: object) -> StartMethod:
    if start_method == "launcher":
        return "launcher"
    if start_method == "spawn":
        return "spawn"
    raise ConfigError(f"start_method must be one of {_START_METHODS}, got {start_method!r}")


def _checked_bool(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{field} must be a bool, got {value!r}")
    return value


def _checked_seed(seed: object) -> int | None:
    if seed is None:
        return None
    number = _validate.whole(seed)  # any integer type (numpy's), stored as an int
    if number is None:
        raise ConfigError(f"seed must be an int or None, got {seed!r}")
    return number


def _set(obj: object, attr: str, value: object) -> None:
    object.__setattr__(obj, attr, value)
