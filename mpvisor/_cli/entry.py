"""Where does the `mpvisor` executable start, and how does it end?

`cli` is the console script (and `python -m mpvisor`). It is imported before anything heavy:

0. It first gives SIGINT its default action, so that a Ctrl-C before `main` takes it ends the
   command by SIGINT, silently, as it ends a bare command (not as a `KeyboardInterrupt`
   traceback from an import); a run (here or on Ray) takes the signals it passes on or acts on
   (SIGUSR1, SIGUSR2, SIGQUIT) at once, so that one that comes while it starts up is handled once it can
   (`_services/startup_signals.py`), not a death; then it unblocks every signal (a mask inherited from whoever
   started it would keep its SIGTERM pending forever), and notes the fds above 2 it inherited, which `mpvisor run` passes
   on to its command. As PID 1 of a PID namespace (a container's entry point) it forks first: PID 1 stays behind
   as the namespace's init, reaping every orphan and passing signals on, and the child runs
   the command (`_cli/pid1.py`).
1. `mpvisor run` (without `--ray`, `--help`) will need a launcher: `cli` refuses a host where
   none can serve (one line, status 1: `_platform.require_supported`'s reasons), then starts it first
   (`_launchers/local/early.py`), so its interpreter starts and imports while this process
   imports the command and the runtime; the run's supervisor takes it over if it is the one
   it would start (its stdout and stderr the files the run's are by then: stderr for stdout
   where the run keeps stdout for its own output).
2. `main` (`_cli/main.py`) runs the command: its exit status, or it dies by a signal. What
   escapes it is a bug, its traceback printed, but for a thread the host refused to start (a
   limit on processes): one line naming the limit, status 1. Before
   anything else, `mpvisor run --file` takes SIGHUP (`_services/startup_signals.py`): one that comes
   while the run starts up is a reload once it can reload, not the end of the run.
3. It imports with the garbage collector off. Importing the command and the runtime creates
   some hundred thousand objects and almost no garbage, and the collections they set off cost
   a run about a tenth of its start-up. Once the command's modules are imported (`main` calls
   back before the command runs), what was imported is frozen out of every later collection
   (`gc.freeze`) and the collector is on again, as in any program: a run that lasts days
   collects its cycles as usual, without walking the modules' objects each time.
4. It ends as a short-lived command should: the exit handlers run and the standard streams are
   flushed, then the process exits without tearing the interpreter down module by module (that
   finalization costs a run tens of milliseconds and does nothing a command needs: every file
   and socket of the run is closed, every process reaped, by then). An early launcher nobody
   took is ended first.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module, loaded at start-up (`signal` would import `enum` into `--version`)
import atexit
import gc
import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mpvisor --version does not)
if TYPE_CHECKING:
    from typing import NoReturn


def cli() -> NoReturn:
    _quiet_sigint()  # before a SIGINT pending in the inherited mask can come in (`_unblock_signals`)
    argv = sys.argv[1:]
    runs = _needs_a_launcher(argv)
    file_run = _is_a_run(argv) and _runs_a_file(argv)
    if _is_a_run(argv):  # a SIGUSR1 now, or one pending in the inherited mask, is the run's, not a death
        from mpvisor._services import startup_signals

        startup_signals.hold(_HELD + ((_SIGHUP,) if file_run else ()))  # (not one found ignored: below)
    _unblock_signals()
    inherited = _inherited_fds()  # before anything is opened: what the bare command would inherit
    if inherited:
        from mpvisor import _platform

        _platform.inherited_fds = inherited[: _platform.MAX_PASSED_FDS]
    # perhaps Python's own (PEP 538): `_platform.COERCED_LOCALES`, spelt out so that a run whose
    # LC_CTYPE is another does not import `_platform` here (`--version` does not)
    if os.environ.get("LC_CTYPE") in ("C.UTF-8", "C.utf8", "UTF-8"):
        from mpvisor import _platform

        _platform.undo_locale_coercion()  # before anything is started: the command gets what mpvisor got
    if os.getpid() == 1:  # a PID namespace's init: PID 1 stays behind to reap and pass signals on
        from mpvisor._cli import pid1

        pid1.become_init()
    gc.disable()  # until the command's modules are imported (`_imported`)
    if runs:
        _refuse_an_unsupported_host()  # before a launcher starts: one line, status 1
        from mpvisor._launchers.local import early

        early.start_early(stdout_to_stderr=_keeps_stdout(argv))  # first: it inherits SIGHUP as given
    if file_run:  # a SIGHUP is a reload under nohup too, once a launcher took it as given (ignored)
        startup_signals.hold((_SIGHUP,), even_ignored=True)
    try:
        from mpvisor._cli.main import main

        status = main(argv, imported=_imported)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except KeyboardInterrupt:  # a Ctrl-C as the command ends (`main` took it from its start): its death
        status = -_SIGINT
    except BaseException as exc:  # a bug: its traceback, as the interpreter would print it
        status = _unexpected(exc)
    started = sys.modules.get("mpvisor._launchers.local.early")  # imported: it may have started one
    if started is not None:
        started.discard()
    _exit(status)


def _inherited_fds() -> tuple[int, ...]:
    """The fds above 2 this process was started with that stay open across an exec (a shell's
    `exec 3>file`, make's jobserver pipes, a `flock` fd): `mpvisor run` passes
    them on to its command at the same numbers, as the bare command would have them."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return ()
    found = []
    for name in names:
        fd = int(name)
        try:
            if fd > 2 and os.get_inheritable(fd):
                found.append(fd)
        except OSError:
            continue  # the listing's own fd, closed by now
    return tuple(sorted(found))


_SIGINT = 2  # signal.SIGINT, without importing `signal` (and `enum`) into `--version`
_SIGHUP = _signal.SIGHUP
# What a run passes on (`mpvisor run`: to its command) or acts on (a file's run: SIGUSR1 reopens
# its logs, SIGQUIT quits), held from the start (`_services/startup_signals.py`)
_HELD = (_signal.SIGUSR1, _signal.SIGUSR2, _signal.SIGQUIT)


def _quiet_sigint() -> None:
    """Until `main` takes SIGINT (`main.interruptible`), a Ctrl-C ends the command at once by
    SIGINT, as it ends a bare command, rather than as a `KeyboardInterrupt` traceback from
    whatever was being imported. (SIGINT found ignored, in a shell's background job, stays so.)"""
    if _signal.getsignal(_SIGINT) is _signal.default_int_handler:
        _signal.signal(_SIGINT, _signal.SIG_DFL)


def _unblock_signals() -> None:
    """Block no signal: a mask inherited from whoever started `mpvisor` (a program that blocked
    signals in the thread that forked it) would leave a SIGTERM, SIGINT or SIGHUP pending
    forever, and the run would never stop. (The launcher clears its own mask too: the library's
    runs have one.)"""
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())


def _unexpected(exc: BaseException) -> int:
    """Status 1 for what escaped the command: a thread the host refused to start (a limit on
    processes, wherever the command meant to start one), memory it could not have (a limit
    on address space too small for the interpreter) or a file it could not open (an open-file
    limit too low for its start-up) is one line naming the limit; anything else is a bug, whose
    traceback is printed as the interpreter would print it."""
    from mpvisor import _platform

    short_of_files = isinstance(exc, OSError) and exc.errno in (_EMFILE, _ENFILE)
    if _platform.thread_refused(exc) or isinstance(exc, MemoryError) or short_of_files:
        if short_of_files:
            said = _out_of_files(exc)
            _quiet_teardown()  # what the failed start-up leaves half made, collected on the way out, says nothing more
        else:
            said = _platform.start_error(exc) if not isinstance(exc, MemoryError) else _out_of_memory()
        try:
            os.write(2, f"mpvisor: {said}\n".encode())
        except OSError:
            pass  # no stderr to say it on: the status says it failed
    else:
        import traceback

        traceback.print_exc()
    return 1


_EMFILE, _ENFILE = 24, 23  # errno's, without importing it here


def _out_of_files(exc: BaseException) -> str:
    """What an `EMFILE` (or `ENFILE`) that escaped the command means: an open-file limit too low
    for mpvisor's own start-up (`ulimit -n 7`), where a socket of its event loop, or a module it
    imports, could not be opened."""
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    if isinstance(exc, OSError) and exc.errno == _ENFILE:
        return f"cannot go on: {why} (the host's limit on open files, fs.file-max, is reached)"
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError):
        return f"cannot go on: {why} (mpvisor is at its open-file limit, ulimit -n: raise it)"
    return f"cannot go on: {why} (mpvisor is at its open-file limit ({soft}, ulimit -n): raise it)"


def _quiet_teardown() -> None:
    """No second word after the one line: what a start-up that failed half-way leaves (an event
    loop without its sockets, a coroutine never awaited) is collected on the way out, and would
    print an ignored exception and a RuntimeWarning there."""
    import warnings

    warnings.simplefilter("ignore")
    sys.unraisablehook = lambda unraisable: None


def _out_of_memory() -> str:
    """What a `MemoryError` that escaped the command means: the host, or a limit on this
    process's address space (`ulimit -v`, too small for the interpreter and its modules), left
    it too little memory."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        soft = -1 if soft == resource.RLIM_INFINITY else soft
    except (ImportError, MemoryError, OSError):
        soft = -1
    if soft < 0:
        return "out of memory before the command could run"
    return f"out of memory before the command could run: its address space is limited to {soft // 1024} KiB (ulimit -v)"


def _imported() -> None:
    """The command's modules are imported: keep them out of the collections to come, and collect
    again. (Called once; an error before it leaves the collector off for a command that is
    about to end.)"""
    gc.freeze()
    gc.enable()


def _refuse_an_unsupported_host() -> None:
    """Exit 1 with one line saying why, where `serve()` would raise its `RuntimeError`: not
    Linux >= 5.3, or a /proc of another PID namespace (`unshare --pid --fork` without
    `--mount-proc`), where mpvisor would measure and kill by pids that name other processes."""
    from mpvisor import _platform

    problem = _platform.unsupported_reason() or _platform.proc_problem()
    if problem is not None:
        try:
            os.write(2, f"mpvisor: {problem}\n".encode())
        except OSError:
            pass  # no stderr to say it on: the status says it failed
        _exit(1)


def _is_a_run(argv: list[str]) -> bool:
    """`mpvisor run ...`, here or on Ray, not asking for help."""
    own = argv[: argv.index("--")] if "--" in argv else argv
    return bool(own) and own[0] == "run" and not any(word in ("-h", "--help", "--version") for word in own)


def _needs_a_launcher(argv: list[str]) -> bool:
    """`mpvisor run ...` that runs here: not on Ray, not asking for help."""
    own = argv[: argv.index("--")] if "--" in argv else argv
    return _is_a_run(argv) and not any(word == "--ray" or word.startswith("--ray=") for word in own)


def _runs_a_file(argv: list[str]) -> bool:
    """`mpvisor run --file ...` (a guess from the words: `run` releases SIGHUP when it is not)."""
    own = argv[: argv.index("--")] if "--" in argv else argv
    return "--file" in own or any(w.startswith("--file=") for w in own)


def _keeps_stdout(argv: list[str]) -> bool:
    """Whether `mpvisor run` will keep stdout for itself and give its tasks stderr there: a file,
    a Python target, or `--events json` (a guess from the words: a wrong one only means the early
    launcher is not taken, since `early.take` checks what fd 1 is by then)."""
    own = argv[: argv.index("--")] if "--" in argv else argv
    return "--" not in argv or "--file" in own or any(w.startswith("--file=") for w in own) or \
        "json" in own or "--events=json" in own


def _exit(status: int) -> NoReturn:
    """Exit with `status`, or die by signal N for `-N` (128 + N should it not end the process)."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    if status < 0:
        _signal.signal(-status, _signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status & 0xFF if status >= 0 else 128 - status)
