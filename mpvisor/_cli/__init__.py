"""How does a shell drive mpvisor?

The `mpvisor` command: `main` (the command table and dispatch), `options` (what an option's
value means, the exit statuses and the lines printed, shared by every command), and one module
per command.

May import: `_model`, `_attempt`, `_launchers/seam.py`, `_tasks`, `_admission`, `_runtime/runtime.py`, `_observe`, `_api`, `_platform`.
"""
