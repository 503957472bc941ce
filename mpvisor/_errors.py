"""What can go wrong, and who says so?

Two families live here and never mix:

| family | base | raised by | meaning |
|---|---|---|---|
| mpvisor's own errors | `MpvisorError` | the parent-side API | a management call could not be honoured |
| a target's verdicts | `Fail`, `Fatal` (`Exception`), `Canceled` (`BaseException`) | user code in the child | how an attempt ended |

Every `MpvisorError` carries its fields and a stable `label` (a lower-case string that never
changes between releases, safe for metrics and logs). The verdicts are not `MpvisorError`s: they
travel from the child to the parent as text inside a frame, never as pickled objects.
"""

from __future__ import annotations


class MpvisorError(Exception):
    """Base class of every error mpvisor itself raises."""

    label = "mpvisor_error"


class ConfigError(MpvisorError, ValueError):
    """An invalid setting; raised at once by constructors and by the first management call
    (for a `preload` module that failed in the launcher)."""

    label = "config_error"


class ShuttingDown(MpvisorError):
    """A management call after shutdown began."""

    label = "shutting_down"


class AlreadyRunning(MpvisorError):
    """A second `Supervisor.run` on the same supervisor."""

    label = "already_running"


class TaskAlreadyExists(MpvisorError):
    """`add` of a name that a registered task (also one being removed) already uses."""

    label = "task_already_exists"

    def __init__(self, name: str) -> None:
        super().__init__(f"a task named {name!r} is already registered")
        self.name = name


class CommandQueueFull(MpvisorError):
    """A `try_*` management call found the command queue full."""

    label = "command_queue_full"


class TaskTerminationTimeout(MpvisorError):
    """`cancel_with_timeout` gave up waiting for terminal cleanup (the removal goes on)."""

    label = "task_termination_timeout"

    def __init__(self, id: int, timeout: float) -> None:
        super().__init__(f"task {id} was not cleaned up within {timeout} s (its removal goes on)")
        self.id = id
        self.timeout = timeout


class GraceExceeded(MpvisorError):
    """Shutdown had to kill the trees of `stuck` tasks after `grace` seconds."""

    label = "grace_exceeded"

    def __init__(self, grace: float, stuck: list[str]) -> None:
        super().__init__(
            f"{len(stuck)} task(s) did not stop within the grace window of {grace} s "
            f"and were killed: {', '.join(stuck)}"
        )
        self.grace = grace
        self.stuck = stuck


class ControllerError(MpvisorError):
    """Base class of the controller's errors."""

    label = "controller_error"


class ControllerNotConfigured(ControllerError):
    """A controller call on a supervisor built without `with_controller`."""

    label = "controller_not_configured"

    def __init__(self) -> None:
        super().__init__("no controller is configured: use Supervisor.builder().with_controller(...)")


class ControllerFull(ControllerError):
    """A `try_submit*` call found the controller's command queue full."""

    label = "controller_full"


class ControllerClosed(ControllerError):
    """A submission after shutdown began."""

    label = "controller_closed"


class AlreadySubmitted(ControllerError):
    """A second use of a `PreparedSubmission`."""

    label = "already_submitted"


# --- a target's verdicts (raised in the child, by user code) ---------------------------------


class Fail(Exception):
    """Raised by a target: this attempt failed and may be retried."""

    def __init__(self, reason: str, exit_code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code


class Fatal(Exception):
    """Raised by a target: a permanent failure, never retried."""

    def __init__(self, reason: str, exit_code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code


class Canceled(BaseException):
    """Raised inside an attempt that was asked to stop (or by a target that cancels itself).

    A `BaseException`, so that `except Exception:` does not swallow it."""
