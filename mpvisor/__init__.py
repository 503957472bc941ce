"""mpvisor: supervise Python work in child processes.

Every public name is re-exported here; the modules behind them are private. The names a target
uses inside an attempt (`context`, `Fail`, `Fatal`, `Canceled`, ...) are imported eagerly; the
parent-side runtime is imported on first use, so that the launcher (which imports mpvisor before
forking every attempt) stays small and each fork stays cheap. Every public class and function
reports `__module__ == "mpvisor"` (so `help()`, reprs and tracebacks say `mpvisor.ShuttingDown`),
set here once its private module is loaded.
"""

from __future__ import annotations

import importlib
import sys as _sys
import types as _types
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
    from ._identity import TaskId
    from ._metrics import PrometheusMetrics
    from ._outcome import OutcomeKind, RejectionKind, TaskOutcome
    from ._progress import ProgressReport, drive_progress_bars, progress_reports
    from ._registry import TaskInfo, TaskWaiter
    from ._restart import BackoffSource
    from ._slots import AdmissionPolicy, SlotStatus, SlotView
    from ._spec import (
        INHERIT,
        Limits,
        Resources,
        RestartIntensity,
        RestartPolicy,
        TaskDefaults,
        TaskSpec,
    )
    from ._submission import ControllerSnapshot, ControllerSpec, PreparedSubmission
    from ._supervisor import Supervisor, SupervisorBuilder, run
    from ._task import CommandTask, TaskFn
    from ._writers import JsonLinesWriter, LogWriter

__version__ = "0.1.0"  # the one place the version is written; pyproject.toml reads it from here

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
    "ProgressReport": "._progress",
    "drive_progress_bars": "._progress",
    "progress_reports": "._progress",
    "BackoffSource": "._restart",
    "INHERIT": "._spec",
    "Limits": "._spec",
    "Resources": "._spec",
    "RestartIntensity": "._spec",
    "RestartPolicy": "._spec",
    "TaskDefaults": "._spec",
    "TaskSpec": "._spec",
    "CommandTask": "._task",
    "TaskFn": "._task",
    "JsonLinesWriter": "._writers",
    "LogWriter": "._writers",
    "PrometheusMetrics": "._metrics",
    "TaskId": "._identity",
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


def _claim(value: object) -> None:
    """Make a public class or function say `mpvisor.X` (in `help()`, reprs and tracebacks) rather
    than the private module it is defined in. `__qualname__` is kept, so `mpvisor.X` is what
    pickle looks up, and it finds the same object."""
    if isinstance(value, (type, _types.FunctionType)):
        module = getattr(value, "__module__", None)
        if isinstance(module, str) and module.startswith(__name__ + "."):
            value.__module__ = __name__


def _claim_loaded() -> None:
    """`_claim` the lazy names whose private module is already imported: the parent-side modules
    import each other, so the first `mpvisor.X` typically loads (and claims) them all."""
    for name, module in _LAZY.items():
        loaded = _sys.modules.get(__name__ + module)
        if loaded is not None:
            _claim(getattr(loaded, name))


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mpvisor' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    _claim_loaded()
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
    "Limits",
    "LogWriter",
    "MpvisorError",
    "OutcomeKind",
    "PreparedSubmission",
    "ProgressReport",
    "PrometheusMetrics",
    "RejectionKind",
    "Resources",
    "RestartIntensity",
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
    "drive_progress_bars",
    "progress_reports",
    "run",
)

for _name in __all__:
    if _name not in _LAZY:
        _claim(globals()[_name])
del _name
