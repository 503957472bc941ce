"""How does a shell drive mpvisor?

The `mpvisor` command: `main` (the command table and dispatch), `options` (what an option's
value means, the exit statuses and the lines printed, shared by every command), and one module
per command.

May import: `_model`, `_attempt`, `_launchers`, `_tasks`, `_admission`, `_runtime`, `_observe`, `_api`, `_platform`.
"""
