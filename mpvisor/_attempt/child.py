"""What does an attempt process do, from its first instruction to `os._exit`?

Runs in the attempt process, after the launcher's set-up (`_launchers/local/forkserver.py`: own session,
parent-death signal, subreaper, oom score, fds) and with SIGTERM blocked (but while the target's module
is imported, `_ImportStop`, and while the target runs, `_call`). It owns the child's
half of the protocol: say hello, read the start message, adopt the parent's environment, import
the target (from what the fork server prepared, `_attempt/prepared.py`, when it could), report that it
is about to call it, call it, report how it ended, and (after an ending of the target's own)
wait for the non-daemon threads it left running, as a program does (`_wait_for_threads`). It
never returns: every path ends in `os._exit`.

| the target ... | the child sends | then exits with |
|---|---|---|
| returns an encodable value within `max_frame` | `Result(value)` | 0 |
| returns something msgpack cannot carry (whatever its hooks raise, `SystemExit` included), or too large | `Failure("fatal", ...)` naming the type / the size | 0 |
| returns a value whose encoding runs out of memory | `Failure("error", "the result ... cannot be sent ...: MemoryError")` | 0 |
| raises `Fail` / `Fatal` / `Canceled` | `Failure("fail"/"fatal"/"canceled")`; a `Canceled` that a SIGTERM raised (a SIGTERM pending before the call too) carries `exit_code=-15`, so the parent can tell one it did not send from a `Canceled` raised on purpose | 0 |
| raises anything else | `Failure("error", "Type: message", traceback)` | 0 |
| raises `BrokenPipeError` while its stdout or stderr is a pipe whose reader is gone (a pipeline whose `head -1` ended) | `Failure("fatal", "BrokenPipeError: ...: the pipe it wrote its output to has no reader left; not retried", traceback)`: no retry could write there | 0 |
| raises an exception whose `str()` raises | `Failure("error", "<Type: str() raised Other>", traceback)` | 0 |
| calls `sys.exit(n)` (n a nonzero int) | `Failure("error", "the target called sys.exit(n): its process exited with status S", S)` | S, the status the interpreter gives: n's low byte (255 for an int beyond 64 bits) |
| calls `sys.exit()` or `sys.exit(0)` | `Failure("error", "the target called sys.exit(0) instead of returning: ...", 0)` | 0 |
| calls `sys.exit("message")` (a code neither None nor an int) | `Failure("error", "SystemExit: message", 1)`, the message printed too, as the interpreter prints it | 1 |
| has a module that calls `sys.exit(...)` as it is imported | `Failure("error", "cannot import target ...: its module called sys.exit(...) as it was imported", S)`, a message printed | S, as above |
| cannot be imported | `Failure("fatal", "cannot import target ...")` | 0 |
| is asked to stop (SIGTERM) while its module is imported, or before it is called | the import interrupted, `Failure("canceled", "canceled before the target was called", -15)` | 0 |
| cannot be imported for want of memory or file descriptors | `Failure("error", "cannot import target ...")`: not a fault of the target, so retryable | 0 |
| is interrupted while it imports (`KeyboardInterrupt`: Ctrl-C) | `Failure("error", "cannot import target ...: KeyboardInterrupt", -2)`, retryable | death by SIGINT, as Python's |
| lets a `KeyboardInterrupt` escape (a SIGINT: Ctrl-C, `kill -INT`) | `Failure("error", "KeyboardInterrupt", -2, traceback)`: the exit code of the death that follows | death by SIGINT, as Python's |
| leaves so little memory that even its report cannot be built | `Failure("error", "MemoryError: ...")`, encoded when this module was imported | 0 |
| is not callable (`os:sep`) | `Failure("fatal", "target ... is not callable: it is str")` | 0 |
| cannot take the arguments given (the call's own `TypeError`, before any frame of the target ran) | `Failure("fatal", "target ... cannot take the arguments given: TypeError: ...")` | 0 |
| is a program (`CommandTask`) | `Calling`, then exec (as C's `execvp`: an executable text file without `#!` runs under `/bin/sh`); on exec failure `Failure("fatal")`, but `Failure("error")` for one a later attempt may pass (`_EXEC_TRANSIENT`: ETXTBSY, ENOMEM) | its status / 127 or 126 |
| has a limit its launcher cannot keep here (`cpus=` without a CPU controller: `refuse`) | `Failure("fatal", "cannot apply the limit ...")`, never imported | 0 |
| has a working directory that cannot be entered (missing, a file, not permitted) | `Failure("fatal", "cannot enter its working directory ...")`, never imported or executed | 0 |
| forks a process (`os.fork()`) that comes out of the target itself, by a return or an exception | nothing from that process: it is not the attempt (`_leave_forked`) | that process: 0 after a return, 1 after an exception (its traceback on stderr) |

Only a failed handshake (no start message could be read: nobody to report to) ends with a
status of mpvisor's own, 70. An exception's frames are cleared before it is described
(`_release_frames`): what a failed target held, a memory hog's buffers say, is freed first.
Whatever the target leaves behind is described and encoded under `_guarded` (below), so no
user code can make the report malformed or change that status.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # `signal`'s C module: a fork server imports no enum
import errno
import importlib
import os
import sys
import types
from collections.abc import Callable

from mpvisor import _platform
from mpvisor._attempt import context as _context
from mpvisor._attempt import prepared as _prepared
from mpvisor._model.errors import READER_GONE, Canceled, Fail, Fatal, file_name_hint
from mpvisor._model.payloads import check_value
from mpvisor._model.wire import (
    HEADER,
    OVERSIZE_HINT,
    Calling,
    Failure,
    Hello,
    Message,
    Progress,
    Ready,
    Result,
    Start,
    frame,
    pack,
    unpack,
    unpack_start,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a fork server does not)
if TYPE_CHECKING:
    from typing import Any, NoReturn, TypeVar

    T = TypeVar("T")

NOT_FOUND = 127  # a program that does not exist, as shells, `env` and `timeout` exit
# Characters of a progress or ready text reported from a process the target forked: at most 16
# KiB in UTF-8, a frame a Unix stream socket takes in one piece (one buffer of at most half its
# send buffer, 208 KiB by default), so frames of several processes never interleave.
DESCENDANT_TEXT = 4096
# A frame of at most this many bytes is written in one piece (as above): a signal handler of
# the target's that raises (`Canceled`, `KeyboardInterrupt`, an alarm's exception) runs before
# it or after it, never between two of its parts. A longer one is written with the handlers
# held (`_Channel.send_frame`, `_hold_handlers`).
ONE_PIECE = 4 * DESCENDANT_TEXT + 1024
NOT_EXECUTABLE = 126  # a program that exists but cannot be executed
_EXEC_TRANSIENT = frozenset({errno.ETXTBSY, errno.ENOMEM})  # an exec that may succeed on a later attempt
_SIGTERM_NUM = _signal.SIGTERM
_SIGTERM = (_SIGTERM_NUM,)  # plain ints for the C signal functions (`_platform`)
_SIG_BLOCK, _SIG_UNBLOCK = _signal.SIG_BLOCK, _signal.SIG_UNBLOCK
_ALL_SIGNALS = _signal.valid_signals()
# The system calls the child makes once the target has run, bound before any user code: a
# target that leaves `os` patched (a mock left in place, a green library's monkey-patching)
# cannot keep its attempt from reporting or from ending (every path ends in `_exit`). They are
# bound again as each attempt starts (`_bind_system_calls`), so what the process had set up
# before the attempt is kept: a wrapper of `os._exit` put in by an at-fork hook of the launcher's,
# a `preload` module or a `.pth` file (coverage.py's `patch = ["_exit", "fork"]`, which saves a
# forked process's measurements as it ends).
_exit, _write, _kill, _getpid = os._exit, os.write, os.kill, os.getpid
# Signals a command may inherit ignored from whoever started mpvisor, which it keeps ignored as
# the bare command would: SIGHUP under `nohup`, SIGINT and SIGQUIT for a background job of a
# shell without job control (`cmd &` in a script), SIGUSR1 and SIGUSR2 (`mpvisor run` passes them
# on, unless it found them ignored), SIGTTIN and SIGTTOU (the launcher ignores them itself).
# `kept_ignored` is what this process found.
INHERITABLE_IGNORES = (_signal.SIGHUP, _signal.SIGINT, _signal.SIGQUIT, _signal.SIGUSR1, _signal.SIGUSR2, _signal.SIGTTIN,
                       _signal.SIGTTOU)
kept_ignored: frozenset[int] = frozenset()
# What a program gets at its exec, unless kept ignored: the default action. CPython itself
# ignores SIGPIPE and SIGXFSZ at start-up (as `subprocess` does, they are restored), and the
# launcher ignores or handles the others.
_RESET_AT_EXEC = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP, _signal.SIGTSTP, _signal.SIGPIPE, _signal.SIGXFSZ)


def keep_inherited_ignores() -> frozenset[int]:
    """Note which of `INHERITABLE_IGNORES` this process started with ignored (call it before
    anything changes them: the launcher first thing, a fresh attempt interpreter too); they
    stay ignored in every attempt and its program."""
    global kept_ignored
    kept_ignored = frozenset(s for s in INHERITABLE_IGNORES if _signal.getsignal(s) == _signal.SIG_IGN)
    return kept_ignored


class _Channel:
    """The child's blocking end of the attempt socket (raw fd I/O: no socket object to set up).

    A frame is written whole under `sending`: a target may report progress from any of its
    threads, and a frame written in parts (a large one, or one that meets a full socket buffer)
    must not be cut into by another thread's, nor by the final report. Nothing follows the final
    report (`last_frame`) on the channel: a report a thread of the target sends afterwards (the
    attempt waits for its threads as it ends, `_wait_for_threads`) is dropped, at once.

    Nor may a signal cut into it. A report the main thread sends runs with the target's signal
    handlers live: a stop request's `Canceled` (or a Ctrl-C's `KeyboardInterrupt`, an alarm's
    exception of the target's own) raised between two parts of a frame left the rest unwritten,
    and the parent read the next frame, the final report, as the rest of this one: a target that
    caught `Canceled` and returned ended as "protocol error: truncated frame". A frame longer than
    `ONE_PIECE` is therefore written with the Python handlers held (`_hold_handlers`: blocking
    the signals in this thread would not do, as another thread of the target's takes them then,
    and the handler still runs here): each signal that came meanwhile is raised again, for its
    handler, once the frame is whole. A shorter frame goes in one write, which a signal either
    comes before (nothing written) or after."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        # (its `with` is never left with it held by a handler that raises: `interrupt_safe_lock`)
        self.sending = _platform.interrupt_safe_lock()
        self.ended = False  # the final report is sent: every later one is dropped
        os.register_at_fork(after_in_child=self._forked)  # a process the target forks has its own lock

    def _forked(self) -> None:
        self.sending = _platform.interrupt_safe_lock()  # held by another thread at the fork, it would never be released

    def send(self, message: Message) -> None:
        self.send_frame(pack(message.to_wire()))

    def send_frame(self, payload: bytes) -> None:
        data = frame(payload)
        with self.sending:
            if self.ended:
                return
            if len(data) <= ONE_PIECE:
                self._write(data)
                return
            held = _hold_handlers()
            try:
                self._write(data)
            finally:
                _release_handlers(held)

    def last_frame(self, payload: bytes) -> None:
        """Send the attempt's final report, once a frame another thread is writing is whole; a
        thread of the target that reports afterwards sends nothing (it waited until the process
        ended, which, now that the attempt waits for its threads, would be for ever)."""
        data = frame(payload)
        with self.sending:
            self.ended = True
            self._write(data)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[_write(self.fd, view) :]

    def read_exact(self, n: int) -> bytearray:
        """Exactly `n` bytes, read into one preallocated buffer (no chunk is copied twice)."""
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = os.readv(self.fd, [view[got:]])
            if not k:
                raise EOFError("the parent closed the attempt channel")
            got += k
        view.release()
        return buf

    def read_start(self) -> Start:
        (length,) = HEADER.unpack(self.read_exact(HEADER.size))
        return unpack_start(self.read_exact(length))


def _bind_system_calls() -> None:
    """Bind the system calls the attempt ends with to `os`'s as they are now, as the attempt
    starts and before any of its user code runs."""
    global _exit, _write, _kill, _getpid
    _exit, _write, _kill, _getpid = os._exit, os.write, os.kill, os.getpid


def run(fd: int) -> NoReturn:
    """The attempt process's life, on the attempt socket `fd` (SIGTERM blocked on entry)."""
    _bind_system_calls()
    try:
        channel = _Channel(fd)
        channel.send(Hello(os.getpid()))
        start = channel.read_start()
    except BaseException:
        _exit(70)  # no parent to report to: the exit status speaks for us
    try:
        _adopt_environment(channel, start)
        if start.limits:
            _apply_limits(channel, start.limits)
        if start.kind == "cmd":
            _exec_command(channel, start)
        _run_target(channel, start)
    except MemoryError:  # so little memory left that the report itself could not be built
        _finish_out_of_memory(fd)


def _out_of_memory_frame() -> bytes:
    reason = "MemoryError: the attempt ran out of memory; not even its report could be built"
    return frame(pack(Failure("error", reason).to_wire()))


_OUT_OF_MEMORY_FRAME = _out_of_memory_frame()  # built while there is memory to build it


_came_while_held: list[int] = []


def _hold_handlers() -> dict[int, Any]:
    """Put `_note_held` in the place of every signal handler that is a Python function (the
    target's, the context's SIGTERM handler, Python's SIGINT handler), so that none runs, nor
    raises, in mpvisor's code until `_release_handlers`; what they were. Python runs a signal's
    handler in the main thread whichever thread the signal came to: outside the main thread
    (where handlers cannot be set) nothing needs holding, and nothing is."""
    held: dict[int, Any] = {}
    try:
        for signum in _ALL_SIGNALS:
            handler = _signal.getsignal(signum)
            if callable(handler) and handler is not _note_held:
                _signal.signal(signum, _note_held)
                held[signum] = handler
    except ValueError:  # not the main thread: the first `signal` call refused, nothing was set
        pass
    return held


def _note_held(signum: int, frame: object) -> None:
    _came_while_held.append(signum)


def _release_handlers(held: dict[int, Any]) -> None:
    """Give back what `_hold_handlers` held, then raise again each signal that came meanwhile,
    for its own handler."""
    for signum, handler in held.items():
        _signal.signal(signum, handler)
    came = list(dict.fromkeys(_came_while_held))
    _came_while_held.clear()
    for signum in came:
        if signum in held:
            _signal.raise_signal(signum)


def _finish_out_of_memory(fd: int) -> NoReturn:
    """Send the report built in advance and end with 0. Nothing here allocates: the frame is
    small enough that one write sends it (a slice is made only if one did not)."""
    try:
        sent = 0
        while sent < len(_OUT_OF_MEMORY_FRAME):
            sent += _write(fd, _OUT_OF_MEMORY_FRAME[sent:] if sent else _OUT_OF_MEMORY_FRAME)
    except BaseException:
        pass  # the channel is gone: the status speaks
    _exit(0)


def refuse(fd: int, reason: str) -> NoReturn:
    """The life of an attempt its launcher cannot start as asked (a limit it cannot keep here):
    the handshake, then a permanent failure saying why; the target is never imported."""
    _bind_system_calls()
    try:
        channel = _Channel(fd)
        channel.send(Hello(os.getpid()))
        channel.read_start()
    except BaseException:
        _exit(70)
    _finish(channel, Failure("fatal", reason))


def spawn_main(fd: int) -> NoReturn:
    """Entry point of a `start_method="spawn"` attempt: a fresh interpreter exec'd by the launcher."""
    _platform.signal_mask(_SIG_BLOCK, _SIGTERM)
    keep_inherited_ignores()  # the launcher's kept ignores came through the exec, ignored
    os.set_inheritable(fd, False)
    run(fd)


def _apply_limits(channel: _Channel, limits: dict[str, Any]) -> None:
    """`setrlimit` the attempt's limits before the target is imported (a program inherits them
    across the exec): address space, open files. A limit that cannot be set is a permanent
    failure. (`memory` and `cpu`, the tree's resident memory and CPU time, are the launcher's: it
    put this process in its cgroups, or watches its tree.)"""
    import resource

    for key, name, which in (("as", "address_space", resource.RLIMIT_AS), ("nofile", "open_files", resource.RLIMIT_NOFILE)):
        value = limits.get(key)
        if not value:
            continue
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError) as exc:
            hard = resource.getrlimit(which)[1]
            if 0 <= hard < value:  # the kernel's words ("not allowed to raise maximum limit") name no remedy
                why = f" (over this process's hard limit, {hard}{_why_not_raised(which, value)})"
            else:
                why = f": {_describe(exc)}"
            _finish(channel, Failure("fatal", f"cannot apply the limit {name}={value}{why}"))


def _why_not_raised(which: int, value: int) -> str:
    """Why a hard limit was not raised to `value`, as the rest of the parenthesis that names the
    hard limit: past the kernel's ceiling on open files (`fs.nr_open`), which no process may
    pass, else for want of CAP_SYS_RESOURCE."""
    import resource

    if which == resource.RLIMIT_NOFILE:
        try:
            with open("/proc/sys/fs/nr_open", "rb") as file:
                ceiling = int(file.read())
        except (OSError, ValueError):
            ceiling = -1
        if 0 <= ceiling < value:
            return f", and over the kernel's ceiling, fs.nr_open = {ceiling}, which no process may pass"
    return ": raising it takes CAP_SYS_RESOURCE, which root has on most hosts"


def _adopt_environment(channel: _Channel, start: Start) -> None:
    """Take the parent's environment, working directory and `sys.path` as they were at the start
    request. Each is `None` when it equals what the launcher started with (the usual case). A
    working directory that cannot be entered (missing, not a directory, not permitted) ends the
    attempt `FATAL` before anything of it runs, as `subprocess` refuses such a `cwd`."""
    if start.env is not None:
        env = os.environ
        for key in [k for k in env if k not in start.env]:
            del env[key]
        for key, value in start.env.items():
            if env.get(key) != value:
                env[key] = value
    if start.cwd is not None:
        try:
            os.chdir(start.cwd)
        except OSError as exc:
            _finish(channel, Failure("fatal", f"cannot enter its working directory {start.cwd!r}: "
                                              f"{exc.strerror or exc} ({_type_name(exc)})"))
    if start.path is not None:
        sys.path[:] = start.path
    if start.sys_argv is not None:  # the parent's, not the launcher's: what a script's top level parses
        sys.argv = list(start.sys_argv)


def _exec_command(channel: _Channel, start: Start) -> NoReturn:
    channel.send(Calling())
    if _signal.SIGTERM in _signal.sigpending():
        _finish(channel, Failure("canceled", "canceled before the program was started", -_SIGTERM_NUM))
    for signum in _RESET_AT_EXEC:
        _signal.signal(signum, _signal.SIG_IGN if signum in kept_ignored else _signal.SIG_DFL)
    if start.stop_signal not in (_SIGTERM_NUM, _signal.SIGKILL):
        # its stop signal is never kept ignored, as SIGTERM never is: else asking it to stop would do nothing
        _signal.signal(start.stop_signal, _signal.SIG_DFL)
    _flush_std()
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, _SIGTERM)
    env = dict(os.environ)
    env.pop("", None)  # `env '=x' mpvisor run ...`: an entry with no name, which `execve` takes and `os.execve` refuses
    try:
        _exec(start.argv, env)
    except OSError as exc:  # as a shell, `env` or `timeout` say it: 127 not found, 126 found but not executable
        _signal.pthread_sigmask(_signal.SIG_BLOCK, _SIGTERM)
        code = NOT_FOUND if exc.errno == errno.ENOENT else NOT_EXECUTABLE
        # a program being written as it is started (a build or a deploy that copies it; ETXTBSY),
        # or a host out of memory for the exec, may start on a later attempt: a retryable failure
        kind = "error" if exc.errno in _EXEC_TRANSIENT else "fatal"
        # (a failed exec only) a byte that is not UTF-8 shown as `\xe9`, as a program's name shows it
        from mpvisor._model.checks import quoted

        failure = Failure(kind, f"cannot execute {quoted(start.argv[0])}: {_exec_error(start.argv[0], exc)}",
                          exit_code=code)
        _finish(channel, failure, status=code)


def _exec_error(program: str, exc: OSError) -> str:
    """Why `program` could not be executed, in the words bash uses: `execve` says EACCES
    (Permission denied) of a directory, even to root, where bash says "Is a directory"; and
    ENOENT (No such file or directory) of a program that is there but whose `#!` interpreter
    (or a binary's loader) is not, where bash says "required file not found": the interpreter
    is named, and a carriage return after it (a file saved with Windows line endings) said. A
    shell's builtin given as a program is said to be one (`_shell_words`)."""
    if exc.errno == errno.EACCES and "/" in program and os.path.isdir(program):
        return os.strerror(errno.EISDIR)
    if exc.errno == errno.EACCES and program in _BUILTINS:  # `.`: each `$PATH` directory's `.` is one
        return (exc.strerror or str(exc)) + _shell_words(program, None)
    if exc.errno == errno.ENOENT:
        import shutil

        found = program if "/" in program else shutil.which(program, path=os.environ.get("PATH", os.defpath))
        try:
            with open(found or "", "rb") as file:
                head = file.read(256)
        except OSError:  # not there (or not readable): a shell's words given as a program are said so
            return (exc.strerror or str(exc)) + _shell_words(program, found)
        if head.startswith(b"#!"):
            interpreter = head[2:].partition(b"\n")[0].lstrip(b" \t").split(b" ")[0].split(b"\t")[0]
            name, carriage = os.fsdecode(interpreter.rstrip(b"\r")), interpreter.endswith(b"\r")
            said = f"its interpreter {name!r} (its #! line) was not found"
            return said + (", a carriage return after it: Windows line endings" if carriage else "")
        return "required file not found (its interpreter or loader)"
    return exc.strerror or str(exc)


# Shell builtins a program is mistaken for (`mpvisor run -- source env.sh`): no file has their name
_BUILTINS = frozenset({".", "source", "cd", "export", "alias", "unalias", "set", "unset", "ulimit", "umask",
                       "exec", "eval", "shopt", "declare", "local", "readonly", "trap", "wait", "jobs", "fg", "bg"})


def _shell_words(program: str, found: str | None) -> str:
    """What a program that was not found adds when it is a shell's words, not a program: a
    command line in one word (`mpvisor run -- 'make && make install'`: spaces, `&&`, `|`, `;`,
    `$`, a redirection; a path with a space whose first word is a file, `'./deploy.sh prod'`),
    or a shell builtin (`source`, `cd`, `export`): to run it in a shell. `found`: where `$PATH`
    has a file of that name (nothing to add then)."""
    line = " (a shell command line given as one word? run it in a shell: sh -c '...')"
    if "/" in program:  # a path with a space in it may be a file's name: said only when its first word is one
        first = program.split()[0] if program.split() else ""
        return line if first != program and os.path.exists(first) else ""
    if found is not None:
        return ""
    if program in _BUILTINS:
        return f" ({program!r} is a shell builtin, not a program: run it in a shell, sh -c '...')"
    return line if any(c in program for c in " \t|&;<>$`(){}*?") else ""


def _exec(argv: list[str], env: dict[str, str]) -> NoReturn:
    """Exec `argv` as C's `execvp` does (and so `env`, `timeout`, `nohup`, a shell): looked up on
    `$PATH` unless it names a path, and a file that is executable but has no `#!` line nor a
    binary format the kernel knows (ENOEXEC) is run by `/bin/sh` as a script, unless it looks
    like a binary (ELF's magic, or a NUL in its first line), which stays "cannot execute" (126),
    as bash says it."""
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        if exc.errno != errno.ENOEXEC:
            raise
        import shutil

        path = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", os.defpath))
        if path is None or _looks_binary(path):
            raise
        os.execve("/bin/sh", ["sh", path, *argv[1:]], env)


def _looks_binary(path: str) -> bool:
    try:
        with open(path, "rb") as file:
            head = file.read(80)
    except OSError:
        return True
    return head.startswith(b"\x7fELF") or b"\0" in head.partition(b"\n")[0]


class _StoppedImporting(BaseException):
    """Raised in the target's import by a stop request (SIGTERM) that came while it ran."""


class _ImportStop:
    """SIGTERM while the target's module is imported: the import is user code, which may run for
    long (a big module, a model loaded at its top), so a stop request (a cancel, a timeout that
    bounds start-up, the shutdown after a Ctrl-C) interrupts it, as it would interrupt the target,
    rather than wait for its end (up to the grace, then a kill). Raises `_StoppedImporting` once,
    and only while `open`; a request outside that window is only recorded (`requested`), and
    the attempt then ends before the target is called, as for a request pending at the call.

    The interpreter runs the handler wherever the import's code is at that moment, and that may
    be code whose exceptions go nowhere (a weakref's callback: importlib's module locks have one;
    a `__del__`): there the exception is swallowed, and `swallowed` lets the attempt's
    unraisable hook send the request again (`_context.on_unraisable`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.open = False
        self.requested = False
        self.raised: _StoppedImporting | None = None  # on its way (not swallowed)

    def on_sigterm(self, signum: int, frame: Any) -> None:
        if os.getpid() != self.pid:  # a process the module forked as it was imported
            _context.die_by_sigterm()
            return
        self.requested = True
        if not self.open or self.raised is not None:
            return
        if _context.in_unraisable_hook(frame):  # (a SIGTERM sent meanwhile)
            _context.resend_sigterm()
            return
        error = self.raised = _StoppedImporting()
        raise error

    def swallowed(self, error: BaseException) -> bool:
        if error is not self.raised or not self.open:
            return False
        self.raised = None
        return True


def _import_stoppably(start: Start, stop: _ImportStop) -> Any:
    """`_import_target`, with SIGTERM unblocked and handled by `stop` while it runs. A module
    that puts a handler of its own in `stop`'s place as it is imported still has a SIGTERM
    recorded: the interpreter writes every signal it handles to the wake-up fd, read here after
    the import (with no descriptor left for it, the import runs with SIGTERM blocked, as the
    target's stop request is then read when the import ends)."""
    try:
        woken, wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return _import_target(start)
    previous = _platform.set_wakeup_fd(wake)
    _platform.set_signal_handler(_SIGTERM_NUM, stop.on_sigterm)
    _context.hold_unraisable()
    _context.swallowed = stop.swallowed
    try:
        stop.open = True
        _platform.signal_mask(_SIG_UNBLOCK, _SIGTERM)
        return _import_target(start)
    finally:
        stop.open = False
        _platform.signal_mask(_SIG_BLOCK, _SIGTERM)
        _context.swallowed = None
        _platform.set_wakeup_fd(previous)
        try:
            stop.requested |= bytes((_SIGTERM_NUM,)) in os.read(woken, 512)
        except OSError:
            pass  # nothing written: no signal came
        os.close(woken)
        os.close(wake)


_STOPPED_BEFORE_THE_CALL = Failure("canceled", "canceled before the target was called", -_SIGTERM_NUM)


def _run_target(channel: _Channel, start: Start) -> NoReturn:
    stop = _ImportStop(_getpid())
    try:
        target = _import_stoppably(start, stop)
    except _StoppedImporting:
        _finish(channel, _STOPPED_BEFORE_THE_CALL)
    except _context.UnguardedMainScript:
        _finish(channel, Failure("fatal", _unguarded_reason(start)))
    except SystemExit as exc:  # the module ended the program as it was imported: said, then ended as Python ends it
        status = _sys_exit_status(exc)
        reason = f"cannot import target {start.target!r}: its module called {_exit_call(exc)} as it was imported"
        _finish(channel, Failure("error", reason, status), status=status)
    except BaseException as exc:
        _release_frames(exc)
        if stop.requested:  # what the import raised once a stop interrupted it: the stop's
            _finish(channel, _STOPPED_BEFORE_THE_CALL)
        reason = f"cannot import target {start.target!r}: {_describe(exc)}{_file_name_hint(start.target, exc)}"
        # interrupted (Ctrl-C while it imported): no fault of the target's, and the attempt dies
        # by SIGINT as Python does, as it would once the target was called (`_call`)
        interrupted = isinstance(exc, KeyboardInterrupt)
        kind = "error" if interrupted else _kind_of_failing(exc)
        _finish(channel, Failure(kind, reason, -_signal.SIGINT if interrupted else None,
                                 _traceback(exc, _IMPORT_MACHINERY)),
                die_by=_signal.SIGINT if interrupted else 0)
    if not callable(target):
        reason = f"target {start.target!r} is not callable: it is {_type_name(target)}"
        _finish(channel, Failure("fatal", reason))
    args, kwargs = unpack(start.call)
    most = start.max_frame // 8  # characters of a report's text: at most half the frame in UTF-8
    attempt = _getpid()

    def cut(text: str) -> str:
        """A report's text, cut to fit the frame; in a process the target forked (a fork pool's
        worker), which shares the channel with the attempt but not its lock, to a length that
        the kernel writes in one piece (`DESCENDANT_TEXT`), so that no other process's frame
        can come in between its parts."""
        return _cut(_text(text), most if os.getpid() == attempt else min(most, DESCENDANT_TEXT))

    if stop.requested:  # a stop that came as the import ended, or that the module's code caught
        _finish(channel, _STOPPED_BEFORE_THE_CALL)
    ctx = _context.TaskContext(
        start.task, start.id, start.attempt,  # a text as `_text` makes it: a lone surrogate is escaped, never an error
        lambda d, t, m: channel.send(Progress(d, t, None if m is None else cut(m))),
        lambda status: channel.send(Ready(None if status is None else cut(status))),
    )
    _context._install(ctx)
    channel.send(Calling())
    if _SIGTERM_NUM in _platform.pending_signals():
        _finish(channel, _STOPPED_BEFORE_THE_CALL)
    _platform.set_signal_handler(_SIGTERM_NUM, ctx._on_sigterm)
    _context.hold_unraisable()
    _context.swallowed = ctx._swallowed
    # a process the target forks dies by SIGTERM from its first instruction on, as without mpvisor
    os.register_at_fork(before=ctx._before_fork, after_in_parent=ctx._after_fork_in_parent, after_in_child=ctx._forked)
    ending, die_by = _call(target, args, kwargs, ctx, start.target)
    if _getpid() != attempt:  # (bound before any user code: a target may leave `os` patched)
        _leave_forked(ending, die_by)
    _finish(channel, ending, max_frame=start.max_frame, die_by=die_by,
            status=ending.status if isinstance(ending, _Exited) else 0,
            threads=not ctx.cancelled and not die_by)  # ended of its own accord: as a program ends


def _file_name_hint(target: str, exc: BaseException) -> str:
    """What an import of `jobs.py:run` that found no module `jobs.py` says besides: the module's
    name it likely meant (`jobs:run`): a file's name given for its module's."""
    if not isinstance(exc, ModuleNotFoundError) or exc.name != target.partition(":")[0]:
        return ""
    return file_name_hint(target)


def _import_target(start: Start) -> Any:
    """The target, its module imported with `importing_target` set: a supervisor that module (or
    one it imports) starts on import is refused (`UnguardedMainScript`), as it would start another
    in each of its own attempts, without end."""
    module_name, _, qualname = start.target.partition(":")
    _context.importing_target = True
    try:
        prepared = start.path is None and start.cwd is None  # (the launcher prepares for its own path and directory)
        if module_name == "__main__" and start.main_path is not None:
            module = _prepared.import_main_script(start.main_path) if prepared else None
            if module is None:
                module = _import_main_script(start.main_path)
        elif module_name == "__main__" and _platform.frozen():
            # A frozen program's main is no file to import: it is this process's `__main__`, which
            # the launcher (the program itself, started again) ran up to `mpvisor.freeze_support()`.
            module = sys.modules["__main__"]
        elif module_name == "__main__":  # this process's own `__main__` is not the parent's
            raise ImportError(
                "the target is defined in `__main__`, but the main program (`python -c`, a script read from stdin, "
                "the interactive interpreter, a notebook) has no file the attempt can import: define targets in a "
                "file or a module"
            )
        else:
            module = _prepared.import_module(module_name) if prepared else None
            if module is None:
                module = importlib.import_module(module_name)
    finally:
        _context.importing_target = False
    obj: Any = module
    for part in qualname.split("."):
        if obj is module and not hasattr(obj, part):
            if module_name == "__main__" and start.main_path is not None:
                raise AttributeError(_not_in_main_script(start.main_path, part))
            if module_name == "__main__" and _platform.frozen():
                raise AttributeError(
                    f"the frozen program's main defines no {part!r} before it calls mpvisor.freeze_support(), which is "
                    "as far as a launcher runs it: define targets at the main script's top level, or in a module")
            if _ran_with_dash_m(module, start):
                raise AttributeError(_not_in_main_script(module_name, part, ran="module"))
        obj = getattr(obj, part)
    return obj


def _ran_with_dash_m(module: Any, start: Start) -> bool:
    """Whether `module` is the one the parent program runs as `__main__` with `python -m` (its
    target is then named by the module's own name, and `sys.argv[0]` is the module's file)."""
    def same() -> bool:
        argv0, file = (start.sys_argv or [""])[0], getattr(module, "__file__", None)
        return bool(argv0) and isinstance(file, str) and os.path.realpath(argv0) == os.path.realpath(file)

    return _guarded(same, lambda _: False)


def _not_in_main_script(where: str, name: str, ran: str = "script") -> str:
    """Why the parent's `__main__` had `name` and the script (or the module run with `python -m`),
    as the attempt imports it, has not: defined where only the running program defines it (under
    the `if __name__ == "__main__":` guard, at the prompt of `python -i`, by `exec`), or gone from
    the file since."""
    if ran == "module":
        return (f"the main module {where!r} (python -m) defines no {name!r} when the attempt imports it (as "
                f"{where!r}: its `if __name__ == \"__main__\":` block does not run): a target defined in that block or "
                "by `exec` is not there; define it at the module's top level")
    return (f"the main script {where!r} defines no {name!r} when the attempt imports it (as `__mp_main__`: its "
            "`if __name__ == \"__main__\":` block does not run): a target defined in that block, at the prompt of "
            "`python -i` or by `exec` is not there; define it at the script's top level, or in a module")


def _import_main_script(path: str) -> Any:
    """Import the parent's `__main__` script as `__mp_main__`, as multiprocessing's spawn does
    (its loader given, so that a script without the `.py` suffix loads too); the `__main__.py`
    of a zip archive run as a program (a zipapp: `ARCHIVE/__main__.py`) from that archive."""
    import importlib.machinery
    import importlib.util

    if not os.path.isfile(path):
        if os.path.isfile(os.path.dirname(path)):
            return _import_zipped_main(path)
        raise ImportError(f"the main script {path!r} is not here: a target defined in it is loaded from that path, "
                          "which must exist where the attempt runs (on a Ray node too: define targets in a module "
                          "to ship them with runtime_env)")
    loader = importlib.machinery.SourceFileLoader("__mp_main__", path)
    spec = importlib.util.spec_from_file_location("__mp_main__", path, loader=loader)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the main script {path!r}")
    module = importlib.util.module_from_spec(spec)
    _prepared.as_main(module)
    spec.loader.exec_module(module)
    return module


def _import_zipped_main(path: str) -> Any:
    """Import a zip archive's `__main__` (`path` is `ARCHIVE/__main__.py`, as the parent's
    `__file__` says it) as `__mp_main__`, with the archive's `zipimporter` as its loader (so that
    a supervisor it starts inside the attempt finds it again)."""
    import zipimport

    archive, name = os.path.split(path)
    try:
        importer = zipimport.zipimporter(archive)
        code = importer.get_code(name.partition(".")[0])
    except (zipimport.ZipImportError, OSError) as exc:
        raise ImportError(f"cannot load the main script {path!r} from its zip archive: {exc}") from None
    module = types.ModuleType("__mp_main__")
    module.__file__ = path
    module.__loader__ = importer
    _prepared.as_main(module)
    exec(code, module.__dict__)
    return module


def _unguarded_reason(start: Start) -> str:
    module_name = start.target.partition(":")[0]
    if module_name == "__main__" and start.main_path is not None:
        return (
            f"the script {start.main_path!r} starts a supervisor when it is imported: its start-up "
            f'code must sit under `if __name__ == "__main__":` (target {start.target!r})'
        )
    return (
        f"the module {module_name!r} (or one it imports) starts a supervisor on import, so each attempt "
        f'would start another: move that into a function or under `if __name__ == "__main__":`'
    )


def _call(target: Any, args: list[Any], kwargs: dict[str, Any], ctx: _context.TaskContext,
          name: str) -> tuple[Message, int]:
    """Call the target; how it ended, as the report to send (described with `_describe` and
    `_traceback`, which never raise, whatever the exception's own hooks do), and the signal the
    attempt then dies by (0: none): SIGINT after a `KeyboardInterrupt` escaped the target, as
    Python itself dies after Ctrl-C. A `TypeError` of the call itself, before any frame of the
    target ran (the arguments do not fit its signature: `missing 1 required positional
    argument`), is `fatal`, as a target that is not callable is: every attempt would be called
    with the same arguments."""
    try:
        try:
            _platform.signal_mask(_SIG_UNBLOCK, _SIGTERM)
            value = target(*args, **kwargs)
            if isinstance(value, types.CoroutineType):
                value = _run_async(value, ctx)
        finally:
            _platform.signal_mask(_SIG_BLOCK, _SIGTERM)
            _hold_handlers()  # for good: no handler of the target's runs, nor raises, in what reports its end
        return Result(value), 0
    except Canceled:  # by a SIGTERM (the parent's, or one it did not send: exit_code says so), or raised on purpose
        return Failure("canceled", "the attempt was canceled", -_SIGTERM_NUM if ctx.cancelled else None), 0
    except (Fail, Fatal) as exc:
        return _verdict(exc), 0
    except SystemExit as exc:
        status = _sys_exit_status(exc)  # a message printed, as the interpreter prints it
        said = _exit_message(exc)
        if said is not None:
            reason = f"SystemExit: {said}"
        elif status == 0:
            reason = f"the target called {_exit_call(exc)} instead of returning: its process exited with status 0 and no result"
        else:
            reason = f"the target called {_exit_call(exc)}: its process exited with status {status}"
        return _Exited("error", reason, status), 0
    except KeyboardInterrupt as exc:
        _release_frames(exc)
        return Failure("error", _describe(exc), -_signal.SIGINT, _traceback(exc, _MPVISOR)), _signal.SIGINT
    except BaseException as exc:
        refused = (isinstance(exc, TypeError) and exc.__traceback__ is not None and exc.__traceback__.tb_next is None
                   and not _binds(target, args, kwargs))
        _release_frames(exc)
        if refused:  # raised by the call in this frame: no frame of the target's ever ran
            return Failure("fatal", f"target {name!r} cannot take the arguments given: {_describe(exc)}"), 0
        if isinstance(exc, BrokenPipeError) and _output_has_no_reader():
            return Failure("fatal", f"{_describe(exc)}: {READER_GONE}", None, _traceback(exc, _MPVISOR)), 0
        return Failure("error", _describe(exc), None, _traceback(exc, _MPVISOR)), 0


def _binds(target: Any, args: list[Any], kwargs: dict[str, Any]) -> bool:
    """Whether the arguments fit `target`'s signature, asked of a call whose `TypeError` came
    with no frame of the target's: a Python function's frame would be there had it run, but a
    builtin's body has none (`len(5)`: `object of type 'int' has no len()`), so its signature
    decides. False when it cannot be read (then the frameless `TypeError` is the call's own)."""
    if hasattr(target, "__code__"):  # a Python function: the missing frame says enough
        return False
    import inspect  # here: only a failed call of a callable without Python code pays for it

    try:
        inspect.signature(target).bind(*args, **kwargs)
    except BaseException:
        return False
    return True


def _output_has_no_reader() -> bool:
    """Whether this attempt's stdout or stderr is a pipe or socket whose reader is gone (a
    pipeline that ended: `mpvisor run pkg.mod:fn 2>&1 | head -1`), asked of a target that let a
    `BrokenPipeError` escape: a program would have died by SIGPIPE there. A read end closed by
    every process never opens again, so no retry could write there either: `fatal`, as the
    launcher makes such a program's death."""
    return _platform.output_reader_gone()


def _run_async(coro: Any, ctx: _context.TaskContext) -> Any:
    """Run an `async def` target's coroutine to completion; its cancellation by a stop request
    is `Canceled`. A `CancelledError` nobody here asked for (a future the target awaited was
    canceled by other code) is an error of the target's, as a sync target's
    `concurrent.futures.CancelledError` is: it says where it came from, and may be retried."""
    import asyncio

    async def awaiting_the_target() -> Any:  # its frame ends the head a traceback leaves out (`_traceback`)
        task = asyncio.current_task()
        assert task is not None
        ctx._bind_async(asyncio.get_running_loop(), task)
        return await coro

    try:
        return asyncio.run(awaiting_the_target())  # on the policy's loop: uvloop's, where the program set it
    except asyncio.CancelledError:
        if not ctx.cancelled:
            raise
        raise Canceled() from None


# --- turning the target's ending into the report ------------------------------------------------
#
# Whatever the target left behind may run user code while it is described or encoded: a value's
# `__index__`, `__len__` or `items()`, an exception's `__str__`, a traceback's `__notes__`. Each
# such step runs under `_guarded`, which catches anything (`SystemExit` and `KeyboardInterrupt`
# included) and substitutes a fallback built from type names and constants only, so that the
# report is always well-formed and the child always ends with the status the table above says.



def _guarded(step: Callable[[], T], fallback: Callable[[BaseException], T]) -> T:
    """`step()`, or `fallback(problem)` if the step raised anything at all."""
    try:
        return step()
    except BaseException as problem:
        return fallback(problem)


def _type_name(obj: object) -> str:
    """The name of `obj`'s type (a str whatever a metaclass does; 'object' if even that fails)."""
    return _guarded(lambda: _text(type(obj).__name__), lambda _: "object")


def _text(value: object) -> str:
    """`value` as a plain str that msgpack can encode (a lone surrogate is backslash-escaped)."""
    text = str.__str__(value) if isinstance(value, str) else str(value)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _describe(exc: BaseException) -> str:
    """`Type: message` for an exception (`Type` alone without a message, as Python's traceback
    says it), or `<Type: str() raised Other>` when it cannot say."""
    name = _type_name(exc)

    def said() -> str:
        message = _text(str(exc))
        return f"{name}: {message}" if message else name

    return _guarded(said, lambda p: f"<{name}: str() raised {_type_name(p)}>")


_MPVISOR = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)  # mpvisor's own frames
# importlib's own frames: its directory (none where the standard library is built into the program,
# as cx_Freeze builds it: its modules have no `__file__`) and its frozen modules
_IMPORTLIB = getattr(importlib, "__file__", None)
_IMPORT_MACHINERY = (*_MPVISOR, *([os.path.dirname(os.path.abspath(_IMPORTLIB)) + os.sep] if _IMPORTLIB else []),
                     "<frozen importlib.")
# The frame of mpvisor's coroutine that awaits an `async def` target: it and what is ahead of it
# (mpvisor's, and the loop's that ran it: `asyncio.run`, `run_until_complete`, uvloop's) are left
# out of a traceback's head. The loop's frames below the target's (a `wait_for` that raised, a
# `TaskGroup`'s exit) are the user's story: kept.
_AWAITING = (_run_async.__code__.co_filename, "awaiting_the_target")


def _traceback(exc: BaseException, hide: tuple[str, ...] = ()) -> str | None:
    """The formatted traceback of `exc`, or as much of it as can be formatted (`None` if the
    `traceback` module itself cannot be imported: out of file descriptors, say). `hide`: the
    frames of files starting so are left out (mpvisor's, which called the target; for an import,
    importlib's too), and so are the loop's frames that ran an `async def` target (`asyncio.run`,
    `run_until_complete`: `_AWAITING` and what is ahead of it), so that what is left is the user's
    code, as `python script.py` or `python -m` shows it; `None` when nothing but the exception's
    one line would be left (the reason says it)."""
    traceback = _guarded(lambda: _standard_module("traceback"), lambda _: None)
    if traceback is None:
        return None
    for lazy in _FORMATTING_IMPORTS:
        try:
            _standard_module(lazy)
        except BaseException:
            pass  # formatting meets the same problem, and falls back as below
    if hide:
        def users() -> str | None:
            found = traceback.TracebackException.from_exception(exc)
            frames = list(found.stack)
            awaiting = [i for i, frame in enumerate(frames) if (frame.filename, frame.name) == _AWAITING]
            del frames[:awaiting[0] + 1 if awaiting else 0]  # what ran a coroutine target: mpvisor, the loop
            while frames and frames[0].filename.startswith(hide):
                del frames[0]  # what called the target: mpvisor
            found.stack = traceback.StackSummary.from_list(
                [frame for frame in frames if not frame.filename.startswith(hide)])
            _name_main_classes_as_main(found)
            text = _text("".join(found.format()))
            return text if found.stack or text.count("\n") > 1 else None  # no frame, one line: the reason's
        return _guarded(users, lambda _: _traceback(exc))

    def frames_only(problem: BaseException) -> str | None:
        def frames() -> str:
            text = _text("".join(traceback.format_tb(exc.__traceback__)))
            return f"Traceback (most recent call last):\n{text}{_describe(exc)}\n" + (
                f"(the full traceback could not be formatted: {_describe(problem)})\n")
        return _guarded(frames, lambda _: None)

    return _guarded(lambda: _text("".join(traceback.format_exception(exc))), frames_only)


def _name_main_classes_as_main(found: Any) -> None:
    """Name an exception class of the main script as the script's own traceback names it: the
    attempt imports the script as `__mp_main__`, so its classes' module is that, which a
    traceback writes before the class's name (`__mp_main__.QuotaError: ...`), where `python
    script.py` writes none (`QuotaError: ...`), as for any class of `__main__`. Every exception
    of the chain and of a group is named so (CPython 3.13 keeps the module's name, earlier
    versions the class: a stand-in of the same name then, but for a `SyntaxError`, which is
    formatted from the class itself)."""
    seen: set[int] = set()
    todo = [found]
    while todo:
        exception = todo.pop()
        if exception is None or id(exception) in seen:
            continue
        seen.add(id(exception))
        if getattr(exception, "exc_type_module", None) == "__mp_main__":
            exception.exc_type_module = "__main__"
        else:
            cls = vars(exception).get("exc_type")
            if isinstance(cls, type) and cls.__module__ == "__mp_main__" and not issubclass(cls, SyntaxError):
                exception.exc_type = type(cls.__name__, (), {"__qualname__": cls.__qualname__, "__module__": "__main__"})
        todo += [exception.__cause__, exception.__context__, *(getattr(exception, "exceptions", None) or ())]


# What formatting a traceback imports when it first needs it, not with `traceback` itself: so
# from the target's `sys.path`, where a module of the user's of that name came first and the
# traceback was lost (a user's `tokenize.py` from CPython 3.13, whose `linecache` imports it so;
# `ast`, for the carets, and `unicodedata`, for a line that is not ASCII, on every version).
_FORMATTING_IMPORTS = ("tokenize", "ast", "unicodedata")


def _standard_module(name: str) -> Any:
    """The standard library's module `name`, imported from the standard library's directories
    alone: the target's directory is on `sys.path` first (the run's working directory, as under
    `python -m`), where a `traceback.py` of the user's (or a `linecache.py`, a `tokenize.py`)
    would otherwise be imported in its place, and a failed target's traceback be lost."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    standard = getattr(os, "__file__", None)  # none where the standard library is built in (cx_Freeze)
    if standard is None:
        return importlib.import_module(name)
    standard = os.path.dirname(standard)
    saved = sys.path[:]
    sys.path[:] = [standard, os.path.join(standard, "lib-dynload")]
    try:
        return importlib.import_module(name)
    except ImportError:
        pass  # a standard library not in a directory (a zip of it): as sys.path finds it, then
    finally:
        sys.path[:] = saved
    return importlib.import_module(name)


def _release_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames `exc`'s traceback holds (and its chain's), as
    `traceback.clear_frames` does, without importing anything: a target that raised
    `MemoryError` holding its buffers lets them go before its report is built. The traceback's
    file names and line numbers stay (they are the code's, not the frame's)."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        tb = current.__traceback__
        while tb is not None:
            try:
                tb.tb_frame.clear()
            except RuntimeError:
                pass  # a frame still running (ours, the one that caught it)
            tb = tb.tb_next
        pending += (current.__cause__, current.__context__)


def _kind_of_failing(exc: BaseException) -> str:
    """`"fatal"` for a step that fails by its own nature (an import error, a value msgpack
    cannot carry), but `"error"` (retryable) when it ran out of memory or of file descriptors:
    that is the attempt's circumstances, maybe its limit, not the target's fault."""
    exhausted = isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE))
    return "error" if exhausted else "fatal"


def _verdict(exc: Fail | Fatal) -> Failure:
    """The report of a `Fail` or `Fatal` the target raised (its reason made a plain str)."""
    kind = "fail" if isinstance(exc, Fail) else "fatal"
    name = _type_name(exc)
    reason = _guarded(lambda: _text(exc.reason), lambda p: f"<{name}: its reason raised {_type_name(p)}>")
    return Failure(kind, reason, _exit_code(exc.exit_code), _traceback(exc, _MPVISOR))


def _exit_code(code: object) -> int | None:
    """An exit code given to `Fail`/`Fatal`: kept if it is a plain int msgpack can carry."""
    return code if type(code) is int and -(2**63) <= code < 2**63 else None


class _Exited(Failure):
    """The report of a target's own `sys.exit(...)`: a failure (no result came) whose reason says
    what the target called, after which the attempt exits with its `exit_code`, the status the
    interpreter gives (`_sys_exit_status`), what the interpreter prints for it printed already.
    Without it the parent, seeing a status and no report, could only guess at `os._exit`."""

    @property
    def status(self) -> int:
        return self.exit_code or 0


def _exit_message(exc: SystemExit) -> str | None:
    """The message of a `sys.exit("...")` (its code neither None nor an int), as the interpreter
    prints it; None for a status, or a code whose `str()` raises."""
    code = exc.code
    if code is None or isinstance(code, int):
        return None
    return _guarded(lambda: _text(code), lambda _: None)


def _exit_call(exc: SystemExit) -> str:
    """The call that raised `exc`, as written: `sys.exit()`, `sys.exit(3)`, `sys.exit('message')`
    (a long one cut); `sys.exit(...)` for a code whose `repr()` raises."""
    code = exc.code

    def written() -> str:
        if code is None:
            return "sys.exit()"
        if isinstance(code, int):
            return f"sys.exit({code!r})" if type(code) is bool else f"sys.exit({int.__repr__(code)})"
        return f"sys.exit({_cut(_text(repr(code)), _EXIT_CODE_TEXT)})"

    return _guarded(written, lambda _: "sys.exit(...)")


_EXIT_CODE_TEXT = 200  # characters of a sys.exit's code that a reason names (the message is printed whole)


def _sys_exit_status(exc: SystemExit) -> int:
    """The status the interpreter ends with on an uncaught `SystemExit`: `None` is 0, an int its
    low byte (one beyond 64 bits, which the interpreter cannot read, -1: 255), anything else 1,
    printed to stderr first, as the interpreter prints it."""
    code = exc.code

    def status() -> int:
        if code is None:
            return 0
        if isinstance(code, int):
            value = int.__int__(code)
            return (value if -(2**63) <= value < 2**63 else -1) & 0xFF
        print(_text(code), file=sys.stderr)
        return 1

    return _guarded(status, lambda _: 1)


def _finish(channel: _Channel, message: Message, *, max_frame: int = 0, status: int = 0, die_by: int = 0,
            threads: bool = False) -> NoReturn:
    """Send the attempt's one report, flush the user's streams, and end with `os._exit` (or,
    with `die_by`, by that signal: the report stands whatever the status); with `threads`, once
    the target's threads have ended (`_wait_for_threads`). No signal handler of the target's
    (one its module set as it was imported, too) runs meanwhile: `_hold_handlers`."""
    _hold_handlers()
    payload = _encode_report(message, max_frame)
    try:
        channel.last_frame(payload)
    except BaseException:
        pass  # the channel is gone (the parent, or the target closed it): the status speaks
    if threads:
        _wait_for_threads()
    _end(status, die_by)


def _wait_for_threads() -> None:
    """Wait, as the interpreter does before a program ends (and `multiprocessing`'s processes
    too), for every non-daemon thread the target or its module started that still runs: it
    ended with `os._exit` at once, and a thread's work (an upload it had queued) was lost under
    an outcome that said COMPLETED. The interpreter's own wait (`threading._shutdown`, which
    `multiprocessing` calls as its processes end) first tells idle pools to end (an executor
    never shut down), then joins. Processes the target left running are not waited for (a
    `multiprocessing.Process` it did not join, as a program's exit would): the tree's cleanup
    ends them once this process has ended. The report is sent first: the parent has it however
    long the threads take (the attempt's timeout still bounds them). A SIGTERM or SIGINT
    meanwhile ends the process at once, by its default action, as it would end the program's
    wait."""
    threading = sys.modules.get("threading")
    if threading is None:
        return
    me = threading.current_thread()
    others = _guarded(lambda: [t for t in threading.enumerate() if t is not me and not t.daemon], lambda _: [])
    if not others:
        return
    for signum in (_SIGTERM_NUM, _signal.SIGINT):
        _platform.set_signal_handler(signum, _signal.SIG_DFL)
    _platform.signal_mask(_SIG_UNBLOCK, (_SIGTERM_NUM, _signal.SIGINT))
    _guarded(threading._shutdown, lambda _: None)


def _leave_forked(ending: Message, die_by: int) -> NoReturn:
    """The end of a process the target forked (`os.fork()`) that came out of the target, by a
    return or an exception, where it should have ended with `os._exit`: it is not the attempt,
    so it reports nothing (its report would have been taken for the attempt's, and the
    attempt's own lost), and it ends as a Python program does: 0 after a return; after an
    exception, its traceback on stderr and 1 (by SIGINT after a `KeyboardInterrupt`)."""
    status = 0
    if isinstance(ending, _Exited):  # its sys.exit: the interpreter's status, what it prints printed
        status = ending.status
    elif isinstance(ending, Failure):
        status = 1
        text = ending.traceback or ending.reason
        _guarded(lambda: sys.stderr.write(text if text.endswith("\n") else text + "\n"), lambda _: 0)
    _end(status, die_by)


def _end(status: int, die_by: int) -> NoReturn:
    """Flush the user's streams and end with `os._exit(status)`, or by the signal `die_by`."""
    _flush_std()
    if die_by:
        _platform.set_signal_handler(die_by, _signal.SIG_DFL)
        _platform.signal_mask(_SIG_UNBLOCK, (die_by,))
        _kill(_getpid(), die_by)
    _exit(status)


def _encode_report(message: Message, max_frame: int) -> bytes:
    """The report's msgpack bytes; never raises. A value that cannot be encoded, however it
    refuses, is the permanent failure naming its type."""
    if isinstance(message, Result):
        def refused(problem: BaseException) -> bytes:
            reason = f"the result of type {_type_name(message.value)} cannot be sent as msgpack: {_describe(problem)}"
            return pack(Failure(_kind_of_failing(problem), reason).to_wire())

        def encoded() -> bytes:
            check_value(message.value, "the result")
            return pack(message.to_wire())

        payload = _guarded(encoded, refused)
        if max_frame and len(payload) > max_frame:
            reason = f"result too large: {len(payload)} bytes, over max_frame_bytes={max_frame}; {OVERSIZE_HINT}"
            return pack(Failure("fatal", reason).to_wire())
        return payload
    payload = pack(message.to_wire())  # every field was made plain by `_text` / `_exit_code`
    if max_frame and len(payload) > max_frame and isinstance(message, Failure):
        most = max_frame // 16  # characters of each text: at most a quarter of the frame in UTF-8 both
        cut = message._replace(reason=_cut(message.reason, most),
                               traceback=None if message.traceback is None else _cut(message.traceback, most))
        payload = pack(cut.to_wire())
    return payload


def _cut(text: str, most: int) -> str:
    """`text`, or its first `most` characters, an ellipsis and how long it is in all."""
    return text if len(text) <= most else f"{text[:most]}… ({len(text)} characters)"


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            pass
