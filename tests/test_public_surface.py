"""The public surface: every contract name is importable from `mpvisor` and `__all__` agrees."""

from __future__ import annotations

import subprocess
import sys

import mpvisor

CONTRACT = {
    # SPEC §2, §3.1, §3.2, §3.3, §3.4, §3.5, §4, §5, and the blocking convenience of §3.2
    "context", "TaskContext", "Canceled", "Fail", "Fatal",
    "TaskFn", "CommandTask", "TaskSpec", "RestartPolicy", "BackoffPolicy", "JitterPolicy",
    "TaskDefaults", "INHERIT", "SupervisorConfig", "Supervisor", "SupervisorBuilder",
    "SupervisorHandle", "TaskWaiter", "TaskInfo", "run",
    "TaskOutcome", "OutcomeKind", "RejectionKind",
    "MpvisorError", "ConfigError", "ShuttingDown", "AlreadyRunning", "TaskAlreadyExists",
    "CommandQueueFull", "TaskTerminationTimeout", "GraceExceeded", "ControllerError",
    "ControllerNotConfigured", "ControllerFull", "ControllerClosed", "AlreadySubmitted",
    "Event", "EventKind", "BackoffSource", "LogWriter", "JsonLinesWriter",
    "ControllerConfig", "ControllerSpec", "AdmissionPolicy", "PreparedSubmission",
    "ControllerSnapshot", "SlotView", "SlotStatus", "PrometheusMetrics", "TaskId",
}


def test_the_public_surface_matches_all():
    """PRC-19: every contract name is importable, and `__all__` is exactly the public surface."""
    assert isinstance(mpvisor.__all__, tuple)
    assert len(set(mpvisor.__all__)) == len(mpvisor.__all__)
    assert set(mpvisor.__all__) >= CONTRACT
    for name in mpvisor.__all__:
        assert getattr(mpvisor, name) is not None, name
    public = {n for n in dir(mpvisor) if not n.startswith("_")} - {"annotations", "importlib", "TYPE_CHECKING", "Any"}
    assert public == set(mpvisor.__all__)


def test_importing_mpvisor_is_light():
    """The launcher imports mpvisor before forking every attempt: the package must not pull in
    the parent-side runtime (asyncio, logging, threading) until it is used."""
    code = "import sys, mpvisor; print(' '.join(m for m in ('asyncio', 'logging', 'psutil') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": ":".join(p for p in sys.path if p)})
    assert out.stdout.strip() == ""
