"""What does every `mpvisor` command owe the shell, whatever it runs? (usage errors, output that cannot be written)

Two conventions hold for every command, before any of them imports the runtime (so `mpvisor
--version` imports this and `main` alone):

- a usage error is one line on stderr naming the option and the value, and status 2
  (`UsageParser`);
- output that cannot be written is never a traceback (`guarded_output`, below): the command does
  not succeed, and one line says which stream and why; but a command whose reader went away (a
  pipe's: `mpvisor status | head -1`, `mpvisor run --events json ... | head -2`) ends by SIGPIPE
  without a word about it, as `ps`, `yes` and `tail -f` do, once it has done what it must (a run
  stops its tasks first: `when_reader_gone`). `take_stdout` keeps stdout for machine-readable
  output and points fd 1 at stderr, under the same guard; `write_line` writes one line and
  flushes it.

The tasks inherit stderr and write to it directly, so a task may leave a line there without its
newline. mpvisor's own lines on stderr still start a line of their own where that can be seen:
on a regular file, the guard reads the byte before the shared offset back before each line it
starts, and writes a newline first if it is not one (`_LineStart`; a task writing between that
look and the line, at the same moment, can still meet it: nothing orders two writers of one
file). A terminal or a pipe cannot
be read back: there mpvisor's line follows on, as a program's after another in a shell; but
after mpvisor's own line redrawn in place (`--progress`'s bar, `\r...` without a newline), its
next line starts one of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import shlex
import signal
import stat
import sys
import threading

from mpvisor._cli.statuses import FAILED, USAGE_ERROR

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mpvisor --version does not)
if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterator
    from typing import IO, Any, NoReturn


def _columns() -> int:
    """The terminal's width as `shutil.get_terminal_size()` finds it (`$COLUMNS`, else the width
    of stdout's terminal, else 80), without importing `shutil` (and the compression modules it
    imports) into every command for it."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, as wide as the terminal (`_columns`)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


class RawDescriptionHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """argparse's, for a description or epilog already laid out, as wide as the terminal."""


def guess(word: str, known: list[str], outer: list[str]) -> str | None:
    """The option `word` (an unknown one) was likely meant as (pure): one it begins, first of
    the command's `known` options, then of `mpvisor`'s own (`outer`: `--ver` is `--version`'s
    start, not `--every` misspelt), else one it adds words to (`stem`), else the closest by
    spelling; None for none close enough."""
    name = word.partition("=")[0]
    if not name.startswith("--"):
        return None
    begun = [option for option in (*known, *outer) if option.startswith(name)]
    if begun:
        return begun[0]
    if (stemmed := stem(name, [*known, *outer])) is not None:
        return stemmed
    from difflib import get_close_matches  # on this error's path only

    close = get_close_matches(name, [*known, *outer], n=1, cutoff=0.8)
    return close[0] if close else None


def stem(word: str, names: list[str]) -> str | None:
    """The longest of `names` that `word` adds words to, after a `-` or `_` (pure):
    `--cpu-time` meant `--cpu`, a task file's `cpu_seconds` its `cpu` (the Python API's name
    for that limit); None for none."""
    found = [name for name in names if word.startswith((f"{name}-", f"{name}_"))]
    return max(found, key=len) if found else None


def abbreviated(word: str, names: list[str]) -> str | None:
    """The one of `names` that `word` shortens by leaving letters out, its first kept (pure): a
    task file's `cmd` meant `command`, not `cwd`, the closest by spelling; None for none, or
    for more than one."""
    def leaves_out(name: str) -> bool:
        letters = iter(name)
        return all(letter in letters for letter in word)

    found = [name for name in names if len(word) > 1 and len(name) > len(word) and name[0] == word[0] and leaves_out(name)]
    return found[0] if len(found) == 1 else None


def closest_choice(word: str, choices: list[str]) -> str | None:
    """The choice a misspelt `word` likely meant (pure): one that differs only in case, else the
    closest by spelling, case aside (`webservr` meant `WebServer`); None for none close enough.
    The one mechanism behind every "did you mean" of the command line and of a task file."""
    lowered: dict[str, str] = {}
    for choice in choices:
        lowered.setdefault(choice.lower(), choice)
    if word.lower() in lowered:
        return lowered[word.lower()]
    from difflib import get_close_matches  # on this error's path only

    close = get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


def hints(words: list[str], known: list[str], outer: list[str]) -> str:
    """What an unknown-arguments error adds in brackets (pure): `did you mean --timeout?` for
    the command's own options, and for `mpvisor`'s own given after the command, where it goes
    (`--version is an option of mpvisor itself: mpvisor --version`); empty for no guess."""
    guesses = dict.fromkeys(option for option in (guess(word, known, outer) for word in words) if option)
    mine = [option for option in guesses if option not in outer]
    said = [f"did you mean {', '.join(mine)}?"] if mine else []
    said += [f"{option} is an option of mpvisor itself: mpvisor {option}" for option in guesses if option in outer]
    return "; ".join(said)


# What a positional's error says when the word looks like a program's name given without `--`
# (`mpvisor run ls -la`): the words after it are then the program's, not misspelt options.
LIKELY_PROGRAM = "a program? put -- before it"


def file_meant(word: str) -> str | None:
    """What a file's name given where a command's or a target's is expected likely meant: a task
    file's run (`mpvisor tasks.toml`, `mpvisor run tasks.toml`), or a Python file's function or
    the file as a program (`mpvisor run ./jobs.py`); None for any other word. Pure."""
    if word.lower().endswith(".toml"):
        return f"a task file? mpvisor run --file {shlex.quote(word)}"
    if word.endswith(".py"):
        module = word.rpartition("/")[2][:-3] or "MODULE"
        return (f"a Python file? a function of it: mpvisor run {module}:FUNCTION, from its directory; or the file "
                f"as a program: mpvisor run -- python3 {shlex.quote(word)} ...")
    return None


class UsageParser(argparse.ArgumentParser):
    """Usage errors are one line on stderr, `<prog>: error: <message>`, and status 2.

    A word that starts with `-` and a digit or a dot (`-1/5`, `-1:5`, `-5M`, `-.5`) is a value,
    never an option (no option of mpvisor looks like that), so `--intensity -1/5` reaches its
    parser and is refused naming the option and the value, as `--grace -1` is; argparse alone
    takes only plain negative numbers for values. An option left without its value says how to
    give one that starts with `-` (`--slot=-x`).

    A word that is no option of the command's is named before any positional's bad value: in
    `mpvisor run --timout 5 -- true` the error is the misspelt `--timout` (and the option it
    resembles), not the `5` it left behind as a TARGET. But a TARGET that looks like a program's
    name (`mpvisor run ls -la`, `LIKELY_PROGRAM`) is named first when none of the unknown words
    resembles an option of the command's: they are the program's (`-la`), and the error says to
    put `--` before it.

    An option is spelt out whole: argparse would take any unambiguous beginning of one
    (`--ever 5` for `--every 5`, a task that then runs forever), and a beginning that is
    unambiguous today is ambiguous once another option starts with it, which would break a
    script that used it. A beginning is refused as a misspelling is, naming the option meant."""

    def __init__(self, *args: Any, outer_options: tuple[str, ...] = (), **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-[\d.]")
        self._bad_positional: str | None = None  # a positional's refused value, said after unknown words
        self._bad_word: str | None = None  # ... and the word it was
        self.outer_options = outer_options  # `mpvisor`'s own options (`--version`), for a command's parser

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def knows(self, word: str) -> bool:
        """Whether `word` (`--opt` or `--opt=VALUE`) is one of this parser's options."""
        return word.partition("=")[0] in self._option_string_actions

    def _programs_words(self, args: Any, extras: list[str]) -> bool:
        """Whether the unknown `extras` are the words of a program given without `--` (`mpvisor
        run ls -la`): the refused positional looks like a program's name (`LIKELY_PROGRAM`), every
        unknown word comes after it, and none resembles an option (`hints`)."""
        word = self._bad_word
        if self._bad_positional is None or LIKELY_PROGRAM not in self._bad_positional or word is None:
            return False
        given = list(args) if args is not None else sys.argv[1:]
        if word not in given or any(w in given[:given.index(word)] for w in extras if w.startswith("-")):
            return False
        known = [option for option in self._option_string_actions if option.startswith("--")]
        return not hints(extras, known, [option for option in self.outer_options if option not in known])

    def unrecognized(self, words: list[str]) -> NoReturn:
        """The usage error for words that are none of this parser's options or arguments, with
        the option a misspelt one resembles (`--timout`: did you mean --timeout?), or, for one of
        `mpvisor`'s own options given after the command, where it goes (`hints`)."""
        known = [option for option in self._option_string_actions if option.startswith("--")]
        said = hints(words, known, [option for option in self.outer_options if option not in known])
        self.error(f"unrecognized arguments: {' '.join(words)}{f' ({said})' if said else ''}")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._bad_positional = self._bad_word = None
        namespace, extras = super().parse_known_args(args, namespace)
        if self._bad_positional is not None:  # what came of an unknown word is not the error to say
            if any(word.startswith("-") for word in extras) and not self._programs_words(args, extras):
                self.unrecognized(extras)
            self.error(self._bad_positional)
        return namespace, extras

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        if action.option_strings:
            return super()._get_value(action, arg_string)
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:  # said once parsing has seen every word (`parse_known_args`)
            if self._bad_positional is None:
                self._bad_positional = str(exc)  # the first one, as argparse would have said it
                self._bad_word = arg_string
            return arg_string

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's check of a value against its choices (a command's name, `--events`), which
        names the choice a misspelt one resembles, as an unknown option does: `mpvisor rnu`,
        `invalid choice: 'rnu' (did you mean run? choose from 'run', 'check', ...)`."""
        choices = action.choices
        if choices is None or value in choices or not isinstance(value, str):
            return super()._check_value(action, value)
        names = [str(choice) for choice in choices]
        meant = closest_choice(value, names)
        listed = ", ".join(repr(name) for name in names)
        hint = f"did you mean {meant}? " if meant is not None else ""
        if "run" in names and file_meant(value) is not None:  # `mpvisor tasks.toml`: a command's name expected
            hint = f"{file_meant(value)}; "
        raise argparse.ArgumentError(action, f"invalid choice: {value!r} ({hint}choose from {listed})")

    def _match_argument(self, action: argparse.Action, arg_strings_pattern: str) -> int:
        try:
            return super()._match_argument(action, arg_strings_pattern)
        except argparse.ArgumentError as exc:  # `--slot -x`: argparse took -x for an option ("O")
            if action.nargs is not None or not action.option_strings or not arg_strings_pattern.startswith("O"):
                raise
            hint = f"a value that starts with '-' is written {action.option_strings[-1]}=VALUE"
            raise argparse.ArgumentError(action, f"{exc.message} ({hint})") from None

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # Python 3.11's argparse drops a value that is exactly "--" (`--backoff=--`) and hands
        # the option an empty list, unchecked; the text "--" is the value, and its type decides.
        if action.nargs is None and arg_strings == ["--"] and action.option_strings:
            return self._get_value(action, "--")
        return super()._get_values(action, arg_strings)


# --- output that cannot be written ------------------------------------------------------------------
#
# One mechanism for every command: under `guarded_output` (main's), sys.stdout, sys.stderr and
# the stdout `take_stdout` keeps are `_Guarded` streams. A write or flush that fails (a full
# disk, a closed descriptor, a reader that went away: ENOSPC, EBADF, EPIPE, EIO...) is recorded
# once per stream and never raised, whichever thread wrote; what was pending is dropped (its
# descriptor is pointed at /dev/null), so nothing fails again at exit. `account_output` turns a
# success into `FAILED` once anything was lost; `settle_output` also says, in one line on stderr
# (if stderr can still be written), which stream could not be written and why. A reader that
# went away is no such error: the pipeline ended, and `settle_output` ends the command by
# SIGPIPE, without a word (below), once it has done what it must (`when_reader_gone`).

CLOSED_AT_START = "it was closed when mpvisor started"


class _Lost:
    """What could not be written, by stream: the first reason for each, and the streams whose
    reader went away; and whom to tell, once, that a stream's reader went away (`when_reader_gone`)."""

    def __init__(self) -> None:
        self.why: dict[str, str] = {}
        self.gone: set[str] = set()  # the streams whose reader went away (EPIPE of mpvisor's own output)
        self.held: set[int] = set()  # standard fds closed at start, now held open on /dev/null
        self.streams: list[_Guarded] = []  # the guarded streams to flush at the end
        self.on_reader_gone: Callable[[], None] | None = None
        self.lock = threading.Lock()

    def note(self, label: str, why: str, *, reader_gone: bool = False) -> None:
        with self.lock:
            self.why.setdefault(label, why)
            if reader_gone:
                self.gone.add(label)
            told = self.on_reader_gone if reader_gone else None
            if told is not None:
                self.on_reader_gone = None
        if told is not None:
            told()

    def note_error(self, label: str, exc: OSError, *, relayed: bool = False) -> None:
        if relayed and exc.errno == errno.EPIPE:
            return  # a program's own lines, whose reader went away: the program meets it (SIGPIPE), as it would here
        self.note(label, exc.strerror or str(exc), reader_gone=exc.errno == errno.EPIPE)


_LOST = _Lost()


class _LineStart:
    """Whether a write to `fd`, a stream the tasks inherit and write to directly, would land in
    the middle of a line one of them left unfinished. Read from the file itself: the byte just
    before the offset `fd` shares with the tasks (where the last write through it, mpvisor's or
    a task's, ended), through a descriptor of its own opened for reading. Only a regular file
    can be read back: on a terminal or a pipe (or a file mpvisor may not read) the answer is
    always no, and the line is glued as after a program run by a shell."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.reader: int | None = None
        self.looked = False  # whether `reader` was tried

    def mid_line(self) -> bool:
        if not self.looked:
            self.looked = True
            self.reader = self._open_reader()
        if self.reader is None:
            return False
        try:
            end = os.lseek(self.fd, 0, os.SEEK_CUR)  # where the last write through it ended
            return end > 0 and os.pread(self.reader, 1, end - 1) not in (b"\n", b"")
        except OSError:
            return False

    def _open_reader(self) -> int | None:
        try:
            if not stat.S_ISREG(os.fstat(self.fd).st_mode):
                return None
            return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None


class _Guarded:
    """A text stream whose write errors are recorded in `_LOST`, never raised. `inner` None: the
    stream was closed at start (writing to it loses the text; writing nothing loses nothing). A
    character the stream's encoding lacks (PYTHONIOENCODING=ascii) is written escaped (`\\xe9`)."""

    def __init__(self, inner: IO[str] | None, label: str, fd: int, *, shared: bool = False) -> None:
        self.inner = inner
        self.label = label  # "stdout" or "stderr": where the text was meant to go
        self.fd = fd
        self.failed = inner is None
        self.line_start: _LineStart | None = _LineStart(fd) if shared else None  # the tasks write here too
        self.at_line_start = True  # what this stream was given so far ends a line
        self.redrawn = False  # the last text given was a line redrawn in place (`\r...`, `--progress`'s bar)
        # one write at a time: its look at what the stream was given, and the text it then writes
        # (the bar and the event log write from threads of their own; reentrant, for a signal's)
        self._order = threading.RLock()

    def end_redrawn(self) -> None:
        """End the line redrawn in place if it is still the last text given (`--progress`'s bar
        at its task's end): a line of mpvisor's written after it started a line of its own and
        ended it, and a second newline would show as an empty line. The look and the newline
        are one step: the bar's thread looked, the event log's wrote its line meanwhile, and the
        bar's newline then came after it, an empty line all the same."""
        with self._order:
            if self.redrawn:
                self.write("\n")

    def write(self, text: str) -> int:
        with self._order:
            return self._write(text)

    def _write(self, text: str) -> int:
        if self.inner is None:
            if text:
                _LOST.note(self.label, CLOSED_AT_START)
        elif not self.failed:
            try:
                if self.redrawn and text[:1] not in ("", "\r", "\n"):
                    text = "\n" + text  # mpvisor's own bar left the line: its other lines start their own
                elif self.line_start is not None and self.at_line_start and text:
                    self.inner.flush()  # its own text first: the file ends as the tasks left it
                    if self.line_start.mid_line():
                        text = "\n" + text  # a task left a line unfinished: mpvisor's starts a new one
                if text:
                    self.at_line_start = text.endswith("\n")
                    self.redrawn = text.startswith("\r") and not self.at_line_start
                try:
                    return self.inner.write(text)
                except UnicodeEncodeError:  # a character its encoding lacks: escaped, as on stderr
                    encoding = getattr(self.inner, "encoding", None) or "utf-8"
                    return self.inner.write(text.encode(encoding, "backslashreplace").decode(encoding))
            except OSError as exc:
                self.lose(exc)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.inner is not None and not self.failed:
            try:
                self.inner.flush()
            except OSError as exc:
                self.lose(exc)

    def lose(self, exc: OSError, *, relayed: bool = False) -> None:
        """Record `exc` for this stream and drop what is pending (its fd now leads to /dev/null).
        `relayed`: what failed was a program's own output that mpvisor writes for it (a Ray
        attempt's lines): a reader gone is then the program's to meet, as it would be writing
        there itself (the launcher sends it SIGPIPE), neither the run's reason to stop nor a
        loss of its own to say."""
        self.failed = True
        _LOST.note_error(self.label, exc, relayed=relayed)
        if self.inner is None:
            return
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self.inner.fileno())
            finally:
                os.close(null)
            self.inner.flush()
        except (OSError, ValueError):
            pass

    def fileno(self) -> int:
        return self.inner.fileno() if self.inner is not None else self.fd

    def isatty(self) -> bool:
        return self.inner is not None and not self.failed and self.inner.isatty()

    def __getattr__(self, name: str) -> Any:  # encoding, errors, buffer...: the inner stream's
        inner = self.__dict__.get("inner")
        if inner is None:
            if name == "encoding":
                return "utf-8"
            raise AttributeError(name)
        return getattr(inner, name)

    def __repr__(self) -> str:
        return f"<guarded {self.label} failed={self.failed}>"


def when_reader_gone(callback: Callable[[], None]) -> None:
    """Call `callback` once, from whichever thread wrote, when a guarded stream is found to have no
    reader left (EPIPE: a pipe whose reader exited, as `head` does): a run then stops its tasks
    (their trees ended and reaped) rather than going on with nobody to write for, and
    `settle_output` ends it by SIGPIPE, as a program writing to such a pipe ends. Other failures
    (a full disk, a closed descriptor) are only recorded, and the run goes on."""
    _LOST.on_reader_gone = callback


def watch_reader(stream: IO[str], loop: asyncio.AbstractEventLoop) -> None:
    """Find out at once, not at the next write, that the pipe `stream` writes to lost its reader
    (a run's `--events json` stream, whose next event may be hours away: `... | head -2` must
    not keep a service run going that long once `head` exited, as `tail -f | head -2` does not):
    the loop watches its descriptor, whose write end epoll reports when the read end closes
    (EPOLLERR, which selectors report as readable), and that is then what a failed write would
    have been (`when_reader_gone`). Nothing for a file or a terminal; a socket that turns out to
    be readable instead (its peer sent something) is not watched any more."""
    fd = stream.fileno() if isinstance(stream, _Guarded) and stream.inner is not None else -1
    try:
        kind = os.fstat(fd).st_mode if fd >= 0 else 0
    except OSError:
        return
    if not (stat.S_ISFIFO(kind) or stat.S_ISSOCK(kind)):
        return

    def woken() -> None:
        loop.remove_reader(fd)
        from mpvisor import _platform  # (a run imports it anyway; `--version` does not import this)

        try:
            gone = _platform.other_end_closed(fd)
        except (OSError, ValueError):
            return
        if gone:
            stream.lose(OSError(errno.EPIPE, os.strerror(errno.EPIPE)))  # type: ignore[attr-defined]

    try:
        loop.add_reader(fd, woken)
    except (OSError, ValueError):  # a descriptor epoll cannot watch: found at the next write, as before
        pass


def lose_output(stream: IO[str], exc: OSError) -> None:
    """A write to `stream` that bypassed it (`os.write` on its fd) failed: record it likewise."""
    if isinstance(stream, _Guarded):
        stream.lose(exc)
    else:
        _LOST.note_error(_label_of(stream), exc)


def give_up_output(stream: IO[str], why: str) -> None:
    """Some of what was meant for `stream` will never be written (a thread is still blocked
    writing it): record `why` as a loss, and never flush `stream` again (it would block too)."""
    if isinstance(stream, _Guarded):
        stream.failed = True
    _LOST.note(_label_of(stream), why)


def _label_of(stream: IO[str]) -> str:
    if isinstance(stream, _Guarded):
        return stream.label
    return "stderr" if stream is sys.__stderr__ else "stdout"


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def guarded_output() -> Iterator[None]:
    """While it lasts, sys.stdout and sys.stderr are guarded; standard fds closed at start are
    held on /dev/null (a closed stdout is still recorded as lost when something is written)."""
    _LOST.why.clear()
    _LOST.gone.clear()
    _LOST.streams.clear()
    _LOST.held.clear()
    _LOST.on_reader_gone = None
    if not all(_is_open(fd) for fd in (0, 1, 2)):  # rare, so imported only then (`--version` imports no _platform)
        from mpvisor import _platform

        _LOST.held.update(_platform.hold_standard_fds())
    saved = sys.stdout, sys.stderr
    guards = [_Guarded(None if 1 in _LOST.held else sys.stdout, "stdout", 1),
              _Guarded(None if 2 in _LOST.held else sys.stderr, "stderr", 2, shared=True)]
    _LOST.streams.extend(guards)
    sys.stdout, sys.stderr = guards[0], guards[1]
    try:
        yield
    finally:
        for stream in list(_LOST.streams):
            stream.flush()
        sys.stdout, sys.stderr = saved


def account_output(status: int) -> int:
    """`status`, or `FAILED` instead of a success once some output could not be written (every
    guarded stream is flushed first, so that a failure still pending shows)."""
    for stream in list(_LOST.streams):
        stream.flush()
    return FAILED if status == 0 and _LOST.why else status


def settled_status(status: int) -> int:
    """What `settle_output` ends the command with, without a word: `account_output`'s status, or
    `-SIGPIPE` once a stream's reader went away (a status already a death by a signal stays)."""
    status = account_output(status)
    if _LOST.gone:
        return status if status < 0 else -signal.SIGPIPE
    return status


def settle_output(status: int) -> int:
    """`account_output`, and one line on stderr for each other stream that could not be
    written (none when stderr itself cannot be); or, for a command whose stdout or stderr lost
    its reader, `-SIGPIPE` and no line, whatever it was to exit with: the reader had what it
    wanted (`mpvisor status | head -1`), and the command ends as a program killed by its write
    there would, as `ps | head -1` ends, so that the shell says nothing and a pipeline under
    `set -o pipefail` fails as it would with `ps` (one already dying by a signal, a Ctrl-C, dies
    by that one)."""
    status = settled_status(status)
    if _LOST.gone:
        return status
    if "stderr" not in _LOST.why:
        for label, why in _LOST.why.items():
            sys.stderr.write(f"mpvisor: cannot write to {label}: {why}\n")
        sys.stderr.flush()
    return status


def take_stdout() -> IO[str]:
    """Keep stdout for machine-readable output and send fd 1 to stderr, so that what the tasks
    (and this process) print there goes to stderr; before the launcher starts, so every attempt
    inherits that. The stream kept is guarded (`guarded_output`): a stdout that is full, closed
    or gone is recorded, never raised; one closed at start is written to nowhere."""
    try:
        kept: IO[str] | None = None if 1 in _LOST.held else os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    except OSError:  # fd 1 is closed (outside `guarded_output`, which would hold it)
        kept = None
    machine = _Guarded(kept, "stdout", kept.fileno() if kept is not None else 1)
    _LOST.streams.append(machine)
    os.dup2(2, 1)
    if isinstance(sys.stdout, _Guarded):  # fd 1 is stderr's now, and so is what is printed there
        sys.stdout.label = "stderr"
        if sys.stdout.inner is None and 2 not in _LOST.held:  # stdout was closed, stderr was not
            sys.stdout.inner = os.fdopen(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
            sys.stdout.failed = False
    return machine  # type: ignore[return-value]  # a text stream in everything a writer uses


def redraws(stream: IO[str]) -> bool:
    """Whether `stream` is a terminal that can be drawn on in place (`--progress`'s bar, `--file`'s
    live table): not one whose `TERM` is `dumb` (Emacs's shell, an editor's terminal pane), or
    unset or empty (`env -i`, a terminal no program told its type), which cannot take the
    escape codes that move the cursor and clear a line. There mpvisor writes plain lines, as to
    a pipe or a file."""
    return stream.isatty() and os.environ.get("TERM", "") not in ("", "dumb")


def write_line(stream: IO[str], text: str) -> None:
    """Write one line and flush it. On a guarded stream (`take_stdout`'s, and sys.stdout and
    sys.stderr under `guarded_output`) a failure is recorded, and the run does not succeed."""
    stream.write(f"{text}\n")
    stream.flush()


def aligned(rows: list[list[str]], *, least: dict[str, int] | None = None, right: tuple[str, ...] = ()) -> list[str]:
    """The lines of a table (pure): `rows[0]` is the header; columns two spaces apart, each as
    wide as its widest cell in terminal columns (a wide character, CJK, takes two; at least
    `least[header]`), those whose header is in `right` aligned right; the last column is not
    padded, and no line ends in spaces."""
    from mpvisor._observe.progress import columns_of  # not at the top: `run` never draws a table

    least = least or {}
    header = rows[0]
    widths = [max(least.get(name, 0), *(columns_of(row[i]) for row in rows)) for i, name in enumerate(header[:-1])]

    def pad(cell: str, width: int, name: str) -> str:
        room = " " * (width - columns_of(cell))
        return room + cell if name in right else cell + room

    return ["  ".join([*(pad(cell, width, name) for cell, width, name in zip(row, widths, header, strict=False)),
                       row[-1]]).rstrip()
            for row in rows]
