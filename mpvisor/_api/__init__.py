"""How does user code drive a supervisor?

The public faces of a runtime: `supervisor` (`Supervisor`, its builder, `Supervisor.run`), `run`
(`mpvisor.run`, which starts the launcher before it imports the runtime), `handle`
(`SupervisorHandle`) and `blocking` (the blocking facade); and `session`, the one path by which
`Supervisor.run` and the CLI's commands run their work (the commands' interface to a runtime).

May import: `_model`, `_attempt`, `_launchers`, `_tasks`, `_admission`, `_runtime`, `_observe`, `_platform`.
"""
