"""How does a task file keep services up? (start order, readiness, liveness, log files, control, reload)

A *service run* is a long-lived `mpvisor run --file` whose tasks are services: each may come
`after` others and starts only once those are ready; it may say when it is ready (a Python
target's `mpvisor.context().ready()`, a program's `READY=1` on systemd's notify socket, or a
probe: TCP, a command, a file; or, for a one-shot task, its success), be checked while it runs (a health probe, a watchdog), write its
output to rotated log files, and be controlled from another shell (`mpvisor status`, `stop`,
`start`, `restart`, `logs`, `reload`).

| module | question it answers | pure? |
|---|---|---|
| `settings` | what a service's settings are (the values the task file and the Python API build) | yes |
| `graph` | in which order do services start and stop, who is blocked, what changed on reload | yes |
| `probes` | is this TCP port, command or file ready / healthy now | I/O |
| `notify` | systemd's notify protocol: a socket per attempt, and mpvisor's own notifications | I/O |
| `logfiles` | a task's output in files: rotation by size and day, gzip, reopen, a full disk | I/O (a thread) |
| `control` | the run's control socket: who may ask, what they may ask, and the answers | I/O |
| `startup_signals` | a signal the run handles that comes while it starts up (SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT): remembered, then handled once the run can | signals |
| `manager` | one service run: the shell that wires all of the above to a runtime | I/O |

May import: `_model`, `_attempt`, `_launchers`, `_tasks`, `_admission`, `_runtime`, `_observe`, `_api`, `_platform`.
"""
