"""How does this machine start, signal and reap attempt processes?

The default launcher: `client` (the parent's `LauncherClient`, a `Launcher`), `channel` (one
attempt's socket and pipes in the parent), `control` (the messages between the parent and the
fork server), `forkserver` (the single-threaded process every attempt is forked from), `guardian`
(its parent, which outlives it to kill orphans), `terminal` (an attempt as a terminal's
foreground job: job control), `lines` (captured output as lines), `early` (how a launcher is
started, and started before the runtime is imported by `mpvisor run` and `mpvisor.run`) and
`leftovers` (the attempt cgroups a killed fork server left, killed and removed by the next).

May import: `_model`, `_attempt`, `_launchers.seam`, `_platform`.
"""
