"""What can go wrong, and who says so?

Two families live here and never mix:

| family | base | raised by | meaning |
|---|---|---|---|
| mpvisor's own errors | `MpvisorError` | the parent-side API | a management call could not be honoured |
| a target's verdicts | `Fail`, `Fatal` (`Exception`), `Canceled` (`BaseException`) | user code in the child | how an attempt ended |

Every `MpvisorError` carries its fields and a stable `label` (a lower-case string that never
changes between releases, safe for metrics and logs). The verdicts are not `MpvisorError`s: they
travel from the child to the parent as text inside a frame, never as pickled objects. Every class
still pickles to an equal copy (fields included) for callers who send errors elsewhere: a class
whose constructor takes fields rather than a message says how in `__reduce__`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mpvisor --version does not)
if TYPE_CHECKING:
    from typing import Any


# What a handle's call (a prepared submission's too) made on another event loop than the
# supervisor's raises (`RuntimeError`).
WRONG_LOOP = ("this supervisor is bound to the event loop it was served on: call its handle there (from another "
              "thread, with asyncio.run_coroutine_threadsafe(..., that loop)), or use serve_blocking(), whose "
              "handle may be called from any thread")

# What an attempt's reason adds when it ended writing to a pipe whose reader is gone (a program's
# SIGPIPE death, a Python target's escaped `BrokenPipeError`): it is final.
READER_GONE = "the pipe it wrote its output to has no reader left; not retried"


class MpvisorError(Exception):
    """Base class of every error mpvisor itself raises (never of a target's `Fail`, `Fatal` or
    `Canceled`). `label` is a stable lower-case name of the class, for metrics and logs."""

    label = "mpvisor_error"


class ConfigError(MpvisorError, ValueError):
    """An invalid setting; raised at once by constructors and by the first management call
    (for a `preload` module that failed in the launcher)."""

    label = "config_error"


class ShuttingDown(MpvisorError):
    """Raised by a `SupervisorHandle` management call (`add`, `remove`, `cancel`, `watch`, ...)
    made after shutdown began, and by a non-empty `Supervisor.run` then."""

    label = "shutting_down"


class AlreadyRunning(MpvisorError):
    """Raised by a second `Supervisor.run` on the same supervisor (`run` is single-shot)."""

    label = "already_running"


class TaskAlreadyExists(MpvisorError):
    """Raised by `add` (and by a `run` batch) for a name that a registered task (also one being
    removed) already uses, or that a batch gives twice (`twice`); the rejected task never runs.
    `name` is that name; `removing`, that the registered task is being removed (its name is free
    once its cleanup is done: `cancel` returns then)."""

    label = "task_already_exists"

    def __init__(self, name: str, twice: bool = False, removing: bool = False) -> None:
        if twice:
            message = f"the batch names a task {name!r} twice"
        elif removing:
            message = (f"a task named {name!r} is already registered: it is being removed, and its name is "
                       "free once its cleanup is done (cancel() returns then)")
        else:
            message = f"a task named {name!r} is already registered"
        super().__init__(message)
        self.name = name
        self.twice = twice
        self.removing = removing

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.name, self.twice, self.removing), self.__dict__


class CommandQueueFull(MpvisorError):
    """Raised by a `try_*` management call (`try_add`, `try_remove`, `try_cancel`, ...) that found
    the command queue full; the waiting form would have waited for space instead."""

    label = "command_queue_full"


class TaskTerminationTimeout(MpvisorError):
    """Raised by `cancel_with_timeout` (and the by-name form) when terminal cleanup of task `id`
    took longer than `timeout` seconds; the removal goes on."""

    label = "task_termination_timeout"

    def __init__(self, id: int, timeout: float) -> None:
        super().__init__(f"task {id} was not cleaned up within {timeout} s (its removal goes on)")
        self.id = id
        self.timeout = timeout

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.id, self.timeout), self.__dict__


class GraceExceeded(MpvisorError):
    """Raised by `shutdown()` (`run` returns the outcomes instead, those tasks' `FORCE_ABORTED`;
    `mpvisor.run`'s `KeyboardInterrupt` has it as its `__context__`) when it had to kill the process trees of the tasks
    named in `stuck` (sorted) because they did not stop within `grace` seconds, or, `at_once`,
    because a SIGINT during the shutdown (under `run`; a Ctrl-C that interrupted a blocking
    handle's shutdown) asked for every tree to be killed without waiting. Where they were not
    all killed alike (tasks with graces of their own, `TaskSpec.with_grace`, or some killed by
    their grace before a SIGINT killed the others at once), `how` says, by name, how each was
    (`grace` is then the longest of theirs). The shutdown is complete when it is raised."""

    label = "grace_exceeded"

    def __init__(self, grace: float, stuck: list[str], at_once: bool = False, how: dict[str, str] | None = None) -> None:
        super().__init__(
            f"{len(stuck)} task(s) were killed: {', '.join(f'{name} ({how[name]})' for name in stuck)}" if how else
            f"{len(stuck)} task(s) were killed at once (a SIGINT during the shutdown), without waiting for the grace "
            f"window of {grace} s: {', '.join(stuck)}" if at_once else
            f"{len(stuck)} task(s) did not stop within the grace window of {grace} s "
            f"and were killed: {', '.join(stuck)}"
        )
        self.grace = grace
        self.stuck = stuck
        self.at_once = at_once
        self.how = how

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.grace, self.stuck, self.at_once, self.how), self.__dict__


class ControllerError(MpvisorError):
    """Base class of the errors raised by the controller calls (`submit*`, `prepare_submission`,
    `controller_snapshot`)."""

    label = "controller_error"


class ControllerNotConfigured(ControllerError):
    """Raised by a controller call on a supervisor built without `with_controller`."""

    label = "controller_not_configured"

    def __init__(self) -> None:
        super().__init__("no controller is configured: use Supervisor.builder().with_controller(...)")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (), self.__dict__


class ControllerFull(ControllerError):
    """Raised by `try_submit` and `try_submit_and_watch` (also of a `PreparedSubmission`) that
    found the controller's command queue full."""

    label = "controller_full"


class ControllerClosed(ControllerError):
    """Raised by a submission (`submit*`, also of a `PreparedSubmission`) after shutdown began."""

    label = "controller_closed"


class AlreadySubmitted(ControllerError):
    """Raised by a second use of a `PreparedSubmission` (it is single-use)."""

    label = "already_submitted"


# --- a target's verdicts (raised in the child, by user code) ---------------------------------


def _exit_code(value: object) -> int | None:
    """A verdict's `exit_code`: None, or an int that a 64-bit signed integer holds (what the
    outcome carries); anything else raises at the `Fail(...)`/`Fatal(...)` that gave it."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"exit_code must be an int or None, got {value!r}")
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"exit_code must fit in 64 bits (-2**63 to 2**63 - 1), got {value!r}")
    return value


class Fail(Exception):
    """Raised by a target: this attempt failed and may be retried (as its restart policy says).

    `reason` becomes the outcome's reason; `exit_code`, if given (an int), its exit code."""

    def __init__(self, reason: str, exit_code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = _exit_code(exit_code)


class Fatal(Exception):
    """Raised by a target: a permanent failure, never retried (the outcome is `FATAL`).

    `reason` becomes the outcome's reason; `exit_code`, if given (an int), its exit code."""

    def __init__(self, reason: str, exit_code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = _exit_code(exit_code)


class Canceled(BaseException):
    """Raised inside an attempt that was asked to stop (or by a target that cancels itself).

    A `BaseException`, so that `except Exception:` does not swallow it."""


def file_name_hint(target: str) -> str:
    """What a target whose module is a file's name (`jobs.py:run`) is told besides, by the
    attempt that found no such module and by `mpvisor check`: the module's name it likely meant
    (`jobs:run`); "" for any other target."""
    module, _, qualname = target.partition(":")
    if not module.endswith(".py"):
        return ""
    return f" (a file's name? a target names its module, as import does: '{module[:-3]}:{qualname}')"
