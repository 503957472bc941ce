"""How does a frozen program (PyInstaller, cx_Freeze, Nuitka) start mpvisor's own processes?

mpvisor starts three kinds of process that run its own code: a launcher (the guardian and fork
server of every attempt), an attempt of `start_method="spawn"` (a fresh interpreter), and a slot
server. Each is `sys.executable` with arguments that say what to run (`_platform.interpreter_argv`).
A frozen program has no interpreter but itself, which runs its own main whatever it is given; so
there each is started as `PROGRAM --mpvisor-process ROLE ARGS...` (`_platform.own_process_argv`;
PROGRAM: `_platform.frozen_program`), and the program becomes ROLE when it calls `freeze_support()`
first thing in its main, as `multiprocessing.freeze_support()` lets a frozen program become
multiprocessing's workers:

    if __name__ == "__main__":
        mpvisor.freeze_support()
        main()

| ROLE | becomes |
|---|---|
| `launcher` | the fork server's `main` (`_launchers/local/forkserver.py`) |
| `attempt` | `spawn_main` (`_attempt/child.py`) |
| `cli` | the `mpvisor` command with ARGS, which must be `slots serve ...` (a slot server) |

Anywhere else (a program that is not frozen, or a frozen one not started so) it returns at
once. A frozen program that does not call it runs its own main in each such process; when that
main reaches mpvisor, the process says on stderr what to call and exits 1 instead of starting
another launcher (`own_process_argv`), and the program that started it reports those words.
"""

from __future__ import annotations

import sys

from mpvisor import _platform


def freeze_support() -> None:
    """In a frozen program that mpvisor started as one of its own processes: become that process
    (and never return); anywhere else, return at once. Call it first thing under `if __name__ ==
    "__main__":`, before the program does anything else (module docstring)."""
    argv = sys.argv
    if not _platform.frozen() or len(argv) < 3 or argv[1] != _platform.FROZEN_FLAG:
        return
    role, args = argv[2], argv[3:]
    sys.argv = [argv[0], *args]  # no longer marked: a launcher may start attempts of its own
    if role == "launcher":
        from mpvisor._launchers.local.forkserver import main

        main(args)
    elif role == "attempt":
        from mpvisor._attempt.child import spawn_main

        spawn_main(int(args[0]))
    elif role == "cli" and args[:2] == ["slots", "serve"]:  # the one command mpvisor starts so
        # The command table imports a command's module by its name, which a freezer does not
        # follow: the modules of the one command started this way (`slots serve`) are named here,
        # so that a frozen program holds them.
        from mpvisor._cli import serve, slots  # noqa: F401
        from mpvisor._cli.entry import cli

        cli()
    sys.exit(f"mpvisor.freeze_support(): {role!r} {' '.join(args[:2])!r} is no process mpvisor starts "
             "(from a newer or older mpvisor?)")
