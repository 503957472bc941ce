"""What does an `mpvisor` command exit with? Every status, defined once.

`TABLE` is the table users read (docs/outcomes.md shows it row for row, and a test holds the two
equal); the names below it are what the commands return. `exit_status` maps one outcome to its
status by the rows, in order: a last attempt that ran out of its timeout or of its start-up limit
(`TaskOutcome.timed_out`) is 124 whatever its exit code. A command
that was interrupted, or a run of one task that died by signal N (`exit_status(..., dies=True)`),
returns `-N`: `main` then dies by that signal, as `timeout(1)` does (after which a shell sees
128 + N), without dumping a core of its own.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mpvisor --version does not)

if TYPE_CHECKING:  # imported by every command, `--version` too: the model only where it is used
    from mpvisor._model.outcome import RejectionKind, TaskOutcome

OK = 0
FAILED = 1  # any failure no other row names
USAGE_ERROR = 2  # one line naming the option and the value; nothing ran
SLOT_BUSY = 3
QUEUE_FULL = 4
SUPERSEDED = 5
REPLACED = 6
LEASE_LOST = 7
RESERVED = range(3, 10)  # admission and lease results (3..7), and room for more (8..9)
REFUSED = FAILED  # a run's control socket answered a request with an error (`status`, `stop`, ...)
NO_RUN = 10  # no run of a task file is live (or none by the FILE or name given)
SEVERAL_RUNS = 11  # several runs are live and the command named none
TIMED_OUT = 124  # as timeout(1)

TABLE: tuple[tuple[str, str], ...] = (
    ("0", "the outcome is `COMPLETED`"),
    ("7", "`--slot ... --slots URL`: the slot's lease could not be renewed in time (the store unreachable for half of `--lease-ttl`, or `mpvisor` paused), so the task's tree was stopped before the lease could expire (the outcome is `FATAL`, `lease lost: ...`, "
     "with what the last renewal that did not get through met: `(last try: cannot connect: Connection refused ...)`, "
     "`(last try: no answer in time)`)"),
    ("124", "the last attempt timed out (`--timeout`), or its start-up did (`--start-timeout`: `start-up timed out "
            "...`), as `timeout(1)` does"),
    ("1", "`--slot`: the task's exit code was one of 3..9, the statuses that say the slot's answer (a deploy that "
          "exits 3 is not taken for a busy slot); the outcome line says the code"),
    ("1..255", "the task's exit code, when it is in 1..255"),
    ("127", "the COMMAND was not found, as `env`, `timeout` and `nohup` say it (the outcome is `FATAL`, exit code 127)"),
    ("126", "the COMMAND was found but cannot be executed (likewise, exit code 126)"),
    ("death by signal N", "the task died by signal N (not by a limit of its own), and `mpvisor` dies by it too, "
                          "as `timeout(1)` does, without dumping a core of its own: a shell sees 128+N, restores "
                          "the terminal's modes as it does for the bare command, and `xargs` or `make` stop as they "
                          "would (in a task file, and for a limit of the task's, 128+N)"),
    ("1", "any other failure (exit code 0, none or out of range; `FATAL`, `CANCELED`, ...), or what mpvisor meant to write on stdout or stderr could not be written"),
    ("2", "a usage error: one line naming the option and the value, and nothing ran"),
    ("death by SIGINT / SIGTERM / SIGHUP", "interrupted: the task was shut down gracefully, then `mpvisor` died by the signal that interrupted it (a shell sees 130 / 143 / 129; likewise for SIGALRM, SIGPWR and the other signals whose default action would have ended it at once)"),
    ("3", "`--slot ... --policy drop`: the slot is busy, or its store (the slot server too) did not answer (a drop "
          "does not wait); or, with `--wait-timeout`, it stayed busy that long; or the run is nested in an attempt "
          "of the slot's owner, and would wait for itself; nothing ran"),
    ("4", "`--slot`: the slot's queue is full (1000 runs already wait in it, on the slot server or in a `--slots` store); nothing ran"),
    ("5", "`--slot`: superseded by a `--policy replace` while queued, or replaced before its task's first attempt "
          "started; nothing ran"),
    ("6", "`--slot`: a `--policy replace` run stopped this run's task, which had started"),
    ("8..9", "reserved"),
    ("1", "`status`, `stop`, `start`, `restart`, `logs`, `reload`: the run refused the request (an unknown task, a reload refused, ...) or could not be asked; each line of its error on stderr"),
    ("10", "`status`, `stop`, `start`, `restart`, `logs`, `reload`: no run of a task file is live (none by the `FILE` or `--name` given)"),
    ("11", "`status`, `stop`, `start`, `restart`, `logs`, `reload`: several runs are live and none was named; they are listed"),
    ("death by SIGPIPE", "the pipe a command wrote to had no reader left (`mpvisor status | head -1`, once `head` "
                         "has its line; `mpvisor run --events json ... | head -2`), and it ended as `ps` or `yes` ends "
                         "there, without a word about the pipe, whatever it was to exit with (a shell sees 141); `run` "
                         "first stops its tasks as a SIGTERM would (their trees ended and reaped, the outcome line "
                         "printed), `logs -f` ends at its next look"),
)

# A submission its slot refused, by its `RejectionKind`'s value: the status
_REFUSALS: dict[str, int] = {"slot_busy": SLOT_BUSY, "queue_full": QUEUE_FULL, "superseded_by_replace": SUPERSEDED}


def refused(rejection: RejectionKind | None) -> tuple[int, str] | None:
    """The status and the words for a submission its slot refused; None for any other outcome."""
    if rejection is None or rejection.value not in _REFUSALS:
        return None
    return _REFUSALS[rejection.value], rejection.words


def exit_status(outcome: TaskOutcome, interrupted_by: int | None = None, *, slotted: bool = False,
                dies: bool = False) -> int:
    """The process exit status for a task's outcome (pure; `TABLE`'s rows in order).

    `interrupted_by` is the signal that interrupted `mpvisor run`: its 128 + N wins over the
    outcome (the CLI then dies by that signal, and 128 + N is the fallback if it cannot).
    `slotted`: the task had a slot, whose answers are 3..9 (`RESERVED`): its own exit code there
    is 1, so that a script's `case` never takes a failed task for the slot's answer. `dies`:
    the status of one command's run, which dies by the signal its task died by (`-N`), as
    `timeout(1)` does, unless one of its own limits killed it (128 + N, as in a task file)."""
    if interrupted_by is not None:
        return 128 + interrupted_by
    if outcome.is_success():
        return OK
    if outcome.lease_lost:
        return LEASE_LOST
    if outcome.timed_out:
        return TIMED_OUT
    code = outcome.exit_code
    if slotted and code in RESERVED:
        return FAILED
    if code is not None and 1 <= code <= 255:
        return code
    if code is not None and -64 <= code < 0:
        return code if dies and outcome.limit is None else 128 - code
    return FAILED
