"""What does a running supervisor own, and how does it shut down?

Owns `config` (`SupervisorConfig`), `bus` (events published and delivered) and `runtime` (the
one place that wires registry, controller, launcher and bus, and runs shutdown).

May import: `_model`, `_attempt`, `_launchers`, `_tasks`, `_admission`, `_platform`.
"""
