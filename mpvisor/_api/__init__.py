"""How does user code drive a supervisor?

The public faces of a runtime: `supervisor` (`Supervisor`, its builder, `mpvisor.run`), `handle`
(`SupervisorHandle`) and `blocking` (the blocking facade).

May import: `_model`, `_attempt`, `_launchers/seam.py`, `_tasks`, `_admission`, `_runtime/runtime.py`, `_observe`, `_platform`.
"""
