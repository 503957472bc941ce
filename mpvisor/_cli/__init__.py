"""How does a shell drive mpvisor?

The `mpvisor` command: `entry` (the executable: a run's launcher started first, the exit without
teardown; as a PID namespace's init, `pid1`, which stays behind to reap and pass signals on), `main` (the table of commands and the dispatch), `statuses` (every exit
status), `options` (what an option's value means and the lines printed, shared by every
command), one module per command (`run`, `check`, `slots`, `serve`, `doctor`, and the control commands
`status`, `stop`, `start`, `restart`, `logs`, `reload`, which share `runs`), and task files
(`taskfile`: text to specs, pure but for reading the file; `batchview`: what a file's run shows, pure; `filerun`: its run), and `frozen` (`mpvisor.freeze_support()`: a frozen program becomes the process mpvisor started it as).

May import: `_model`, `_attempt`, `_launchers`, `_tasks`, `_admission`, `_runtime`, `_observe`, `_api`, `_services`, `_platform`.
"""
