"""mpvisor: supervise Python work in child processes.

Every public name is re-exported here; the modules behind them are private. The names a target
uses inside an attempt (`context`, `Fail`, `Fatal`, `Canceled`, ...) are imported eagerly; the
parent-side runtime is imported on first use, so that the launcher (which imports mpvisor before
forking every attempt) stays small and each fork stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from ._backoff import BackoffPolicy, JitterPolicy
    from ._config import ControllerConfig, SupervisorConfig
    from ._events import Event, EventKind
    from ._handle import SupervisorHandle
    from ._metrics import PrometheusMetrics
    from ._outcome import OutcomeKind, RejectionKind, TaskOutcome
    from ._registry import TaskInfo, TaskWaiter
    from ._restart import BackoffSource
    from ._runtime import TaskId
    from ._slots import AdmissionPolicy, SlotStatus, SlotView
    from ._spec import INHERIT, RestartPolicy, TaskDefaults, TaskSpec
    from ._submission import ControllerSnapshot, ControllerSpec, PreparedSubmission
    from ._supervisor import Supervisor, SupervisorBuilder, run
    from ._task import CommandTask, TaskFn
    from ._writers import JsonLinesWriter, LogWriter

_LAZY = {
    "BackoffPolicy": "._backoff",
    "JitterPolicy": "._backoff",
    "ControllerConfig": "._config",
    "SupervisorConfig": "._config",
    "Event": "._events",
    "EventKind": "._events",
    "OutcomeKind": "._outcome",
    "RejectionKind": "._outcome",
    "TaskOutcome": "._outcome",
    "BackoffSource": "._restart",
    "INHERIT": "._spec",
    "RestartPolicy": "._spec",
    "TaskDefaults": "._spec",
    "TaskSpec": "._spec",
    "CommandTask": "._task",
    "TaskFn": "._task",
    "JsonLinesWriter": "._writers",
    "LogWriter": "._writers",
    "PrometheusMetrics": "._metrics",
    "TaskId": "._runtime",
    "TaskInfo": "._registry",
    "TaskWaiter": "._registry",
    "SupervisorHandle": "._handle",
    "Supervisor": "._supervisor",
    "SupervisorBuilder": "._supervisor",
    "run": "._supervisor",
    "ControllerSnapshot": "._submission",
    "ControllerSpec": "._submission",
    "PreparedSubmission": "._submission",
    "AdmissionPolicy": "._slots",
    "SlotStatus": "._slots",
    "SlotView": "._slots",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mpvisor' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = (
    "INHERIT",
    "AdmissionPolicy",
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
    "ControllerSnapshot",
    "ControllerSpec",
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
    "PreparedSubmission",
    "PrometheusMetrics",
    "RejectionKind",
    "RestartPolicy",
    "ShuttingDown",
    "SlotStatus",
    "SlotView",
    "Supervisor",
    "SupervisorBuilder",
    "SupervisorConfig",
    "SupervisorHandle",
    "TaskAlreadyExists",
    "TaskContext",
    "TaskDefaults",
    "TaskFn",
    "TaskId",
    "TaskInfo",
    "TaskOutcome",
    "TaskSpec",
    "TaskTerminationTimeout",
    "TaskWaiter",
    "context",
    "run",
)
