"""mpvisor: supervise Python work in child processes.

Every public name is re-exported here; the modules behind them are private.
"""

from ._backoff import BackoffPolicy, JitterPolicy
from ._config import ControllerConfig, SupervisorConfig
from ._context import TaskContext, context
from ._errors import (
    AlreadyRunning,
    AlreadySubmitted,
    Canceled,
    CommandQueueFull,
    ConfigError,
    ControllerClosed,
    ControllerError,
    ControllerFull,
    ControllerNotConfigured,
    Fail,
    Fatal,
    GraceExceeded,
    MpvisorError,
    ShuttingDown,
    TaskAlreadyExists,
    TaskTerminationTimeout,
)
from ._events import Event, EventKind
from ._outcome import OutcomeKind, RejectionKind, TaskOutcome
from ._restart import BackoffSource
from ._spec import INHERIT, RestartPolicy, TaskDefaults, TaskSpec
from ._task import CommandTask, TaskFn
from ._writers import JsonLinesWriter, LogWriter

__all__ = (
    "INHERIT",
    "AlreadyRunning",
    "AlreadySubmitted",
    "BackoffPolicy",
    "BackoffSource",
    "Canceled",
    "CommandQueueFull",
    "CommandTask",
    "ConfigError",
    "ControllerClosed",
    "ControllerConfig",
    "ControllerError",
    "ControllerFull",
    "ControllerNotConfigured",
    "Event",
    "EventKind",
    "Fail",
    "Fatal",
    "GraceExceeded",
    "JitterPolicy",
    "JsonLinesWriter",
    "LogWriter",
    "MpvisorError",
    "OutcomeKind",
    "RejectionKind",
    "RestartPolicy",
    "ShuttingDown",
    "TaskAlreadyExists",
    "TaskContext",
    "TaskDefaults",
    "TaskFn",
    "TaskOutcome",
    "TaskSpec",
    "TaskTerminationTimeout",
    "context",
)
