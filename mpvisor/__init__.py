"""mpvisor: supervise Python work in child processes.

Every public name is re-exported here; the modules behind them are private. The names a target
uses inside an attempt (`context`, `Fail`, `Fatal`, `Canceled`, ...) are imported eagerly; the
parent-side runtime is imported on first use, so that the launcher (which imports mpvisor before
forking every attempt) stays small and each fork stays cheap; that first use imports with the
garbage collector paused (the collector is left as the program had it). Every public class and function
reports `__module__ == "mpvisor"` (so `help()`, reprs and tracebacks say `mpvisor.ShuttingDown`),
set here once its private module is loaded.
"""

from __future__ import annotations

import gc as _gc
import importlib
import sys as _sys
import types as _types

from mpvisor import _model
from mpvisor._attempt.context import TaskContext, context
from mpvisor._model.errors import (
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
from mpvisor._version import __version__ as __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mpvisor --version does not)
if TYPE_CHECKING:
    from typing import Any

    from mpvisor._admission.config import ControllerConfig
    from mpvisor._admission.slots import AdmissionPolicy, SlotStatus, SlotView
    from mpvisor._admission.submission import ControllerSnapshot, ControllerSpec, PreparedSubmission
    from mpvisor._api.blocking import (
        BlockingEvents,
        BlockingHandle,
        BlockingPreparedSubmission,
        BlockingWaiter,
    )
    from mpvisor._api.handle import SupervisorHandle
    from mpvisor._api.run import run
    from mpvisor._api.supervisor import Supervisor, SupervisorBuilder
    from mpvisor._cli.frozen import freeze_support
    from mpvisor._model.backoff import BackoffPolicy, JitterPolicy
    from mpvisor._model.events import Event, EventKind
    from mpvisor._model.identity import TaskId
    from mpvisor._model.outcome import OutcomeKind, RejectionKind, TaskOutcome
    from mpvisor._model.restart import BackoffSource
    from mpvisor._model.spec import (
        INHERIT,
        Limits,
        Resources,
        RestartIntensity,
        RestartPolicy,
        TaskDefaults,
        TaskSpec,
    )
    from mpvisor._model.work import CommandTask, TaskFn
    from mpvisor._observe.metrics import PrometheusMetrics
    from mpvisor._observe.progress import ProgressReport, drive_progress_bars, progress_reports
    from mpvisor._observe.writers import JsonLinesWriter, LogWriter
    from mpvisor._runtime.bus import EventStream, Subscriber
    from mpvisor._runtime.config import SupervisorConfig
    from mpvisor._tasks.registry import TaskInfo, TaskWaiter


_LAZY = {
    **{name: "._model." + module for name, module in _model.PUBLIC.items()},
    "ControllerConfig": "._admission.config",
    "SupervisorConfig": "._runtime.config",
    "ProgressReport": "._observe.progress",
    "drive_progress_bars": "._observe.progress",
    "progress_reports": "._observe.progress",
    "JsonLinesWriter": "._observe.writers",
    "LogWriter": "._observe.writers",
    "PrometheusMetrics": "._observe.metrics",
    "TaskInfo": "._tasks.registry",
    "TaskWaiter": "._tasks.registry",
    "SupervisorHandle": "._api.handle",
    "BlockingHandle": "._api.blocking",
    "BlockingWaiter": "._api.blocking",
    "BlockingEvents": "._api.blocking",
    "BlockingPreparedSubmission": "._api.blocking",
    "EventStream": "._runtime.bus",
    "Subscriber": "._runtime.bus",
    "Supervisor": "._api.supervisor",
    "SupervisorBuilder": "._api.supervisor",
    "run": "._api.run",
    "freeze_support": "._cli.frozen",
    "ControllerSnapshot": "._admission.submission",
    "ControllerSpec": "._admission.submission",
    "PreparedSubmission": "._admission.submission",
    "AdmissionPolicy": "._admission.slots",
    "SlotStatus": "._admission.slots",
    "SlotView": "._admission.slots",
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
    # The first name loads the parent's modules (asyncio with them): some hundred thousand
    # objects and next to no garbage, and the collections that would set off are about a tenth
    # of the import's time, wasted. So the collector is paused meanwhile, then left as it was.
    collecting = _gc.isenabled()
    _gc.disable()
    try:
        value = getattr(importlib.import_module(module, __name__), name)
    finally:
        if collecting:
            _gc.enable()
    _claim_loaded()
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _imported_by_name() -> None:
    """Never called: its imports name the modules that `__getattr__` imports by name, for a
    freezer that puts in a program only the modules it sees imported where code can run (Nuitka,
    which leaves out the `TYPE_CHECKING` block)."""
    from mpvisor._admission import config, slots, submission  # noqa: F401
    from mpvisor._api import blocking, handle, run, supervisor  # noqa: F401
    from mpvisor._cli import frozen  # noqa: F401
    from mpvisor._model import backoff, events, identity, outcome, restart, spec, work  # noqa: F401
    from mpvisor._observe import metrics, progress, writers  # noqa: F401
    from mpvisor._runtime import bus  # noqa: F401
    from mpvisor._runtime import config as runtime_config  # noqa: F401
    from mpvisor._tasks import registry  # noqa: F401


__all__ = (
    "INHERIT",
    "AdmissionPolicy",
    "AlreadyRunning",
    "AlreadySubmitted",
    "BackoffPolicy",
    "BackoffSource",
    "BlockingEvents",
    "BlockingHandle",
    "BlockingPreparedSubmission",
    "BlockingWaiter",
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
    "EventStream",
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
    "Subscriber",
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
    "freeze_support",
    "progress_reports",
    "run",
)

for _name in __all__:
    if _name not in _LAZY:
        _claim(globals()[_name])
del _name
