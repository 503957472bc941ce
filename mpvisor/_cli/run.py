"""`mpvisor run`: how does a shell supervise one task (or a task file's tasks, `--file`)?

    mpvisor run [OPTIONS] TARGET [ARG...]      # TARGET is "package.module:function"
    mpvisor run [OPTIONS] -- COMMAND [ARG...]
    mpvisor run --file FILE [--grace S] [--events E] [--progress] [--ray A]

This module declares the options and runs one task; a task file is run by `filerun`. The option
values, the spec they describe and the lines printed are `options`', the statuses `statuses`'.

ARGs are JSON literals; a bare word is a string, unless it reads as a number. A text meant as
JSON that does not parse is a usage error: one that starts with `{`, `[` or `"`, or that
Python's `float()` reads as a number (`01`, `+1`, `1_000`, and `nan`, `inf`, `Infinity` in any
spelling: JSON has no such numbers, and a word meant as a number is not silently a string). So
`2024-01-01`, `1.2.3` and `hello` are strings, `'"nan"'` is the string nan, and `nan` is
refused with `'nan' reads as a number, and JSON has no NaN; quote it ('"nan"') for the string`.

The outcome is printed on stderr in one line, `mpvisor: <task>: <kind> reason=... exit_code=...
attempts=...`, where `<kind>` is the outcome kind's lower-case name (`completed`, `failed`, ...;
the `outcome_*` labels are what JSON events and metrics carry). A Python target whose final
outcome is a failure by an exception it did not catch has that traceback printed just before,
as `python script.py` would print it (a `Fail` or `Fatal` is its own verdict, its reason the
message: no traceback; a failed import's is the user's frames alone, or none when the module is
not there; `--events log` logs each failed attempt's); `--quiet` prints neither.

stdout is reserved for machine-readable output. For a Python TARGET it is one line of JSON, the
return value, printed when the outcome is `COMPLETED` (so `v=$(mpvisor run pkg.mod:fn 3)`
works): bytes as a base64 string, NaN and infinities as the strings `"NaN"`, `"Infinity"`,
`"-Infinity"`, bytes dict keys as base64 strings; what the target prints goes to stderr. A
COMMAND's stdout is its own. With `--events json`, stdout carries the events only (one JSON line
each, as `JsonLinesWriter` writes them; no value line), and the target's stdout goes to stderr.
Either way the CLI moves its own stdout to stderr before the launcher starts, so every attempt
inherits that. `--progress` shows the task's progress on stderr (done/total, rate, ETA,
attempt): a bar redrawn in place on a terminal, a plain line at most every 2 s otherwise, and
each attempt's last report at its end (`ProgressBar`).

With `--slot NAME`, the task is a submission to a controller whose slots are shared with every
mpvisor process of this user on this host (`ControllerConfig(leases="local")`): it runs only
while it holds the slot's lease, which it takes once the launcher is ready and gives back once
its tree is reaped.

| `--slot` | what happens |
|---|---|
| the slot is free | runs at once |
| busy, `--policy queue` (default) | says on stderr that it waits (position, the owner), then runs |
| busy, `--policy drop` | exits 3, nothing ran (also when the slot's store, the slot server too, does not answer: a drop does not wait) |
| queue full | exits 4 |
| replaced in the queue by a `--policy replace`, or granted the slot and replaced before its first attempt started | exits 5, nothing ran |
| a `--policy replace` arrives while it runs | its task is stopped as on Ctrl-C (grace, then a tree kill); exits 6 |
| busy past `--wait-timeout SECONDS` | leaves the queue; exits 3, nothing ran (as `--policy drop` would at once) |
| `--slots URL`: the lease cannot be renewed in time (the store unreachable for more than half of `--lease-ttl`, or this process paused) | the launcher stops the task's tree (SIGTERM, then a kill, all before the lease can expire); exits 7 |
| Ctrl-C / SIGTERM while queued | leaves the queue (`left the queue`; or, when the store could not be told, says so and when its place lapses), then dies by the signal |
| Ctrl-C / SIGTERM while it runs | as without `--slot`; the lease is released once the tree is gone |
| it is SIGKILLed | the server releases the lease once this process and its launcher (which outlives every tree it forked) are gone; with `--slots URL`, the lease expires a TTL after its last renewal (the launcher, seeing this process gone, has killed the tree by then) |

Interruption: the first SIGINT, SIGTERM or SIGHUP (or SIGALRM, SIGPWR and the other signals
that would end mpvisor at once: `STOPPING_SIGNALS`) asks the task to stop (a COMMAND by that
signal, as it would have got it bare, SIGTERM by its stop signal; a Python target by SIGTERM) and waits up to `--grace`
seconds (default 10, 0 = kill at once) before killing its process tree; a SIGINT while it
waits (a second one, or one after a SIGTERM) kills at once; one within 0.05 s of the first
SIGINT is the same one delivered twice (`timeout -s INT` signals mpvisor, then its group) and is
let go. Either way mpvisor then dies by
that signal (by SIGINT if one came), after printing the outcome (or, when a tree had to be
killed, what was killed and why). SIGUSR1, SIGUSR2, SIGQUIT
and SIGWINCH are passed on to the running attempt's process (not its group): the command
decides what they do (a SIGQUIT that kills it ends the run with status 131; httpd stops
gracefully on SIGWINCH); between attempts one line says that none runs (not for SIGWINCH, which
a terminal sends on every resize), and the run goes on; ignored when mpvisor started, they stay
ignored.

Option values: `--every` and `--timeout` are finite seconds > 0 (leave `--timeout` out for no
timeout); `--grace` finite seconds >= 0; `--max-retries` a whole number >= 0;
`--intensity N/SECONDS` at most N restarts within SECONDS (`TaskSpec.with_restart_intensity`);
`--memory SIZE` (bytes or `512M`, `1G`: the resident memory of the attempt's whole tree),
`--address-space SIZE` (each process's `RLIMIT_AS`), `--cpu SECONDS`, `--cpus N` and `--open-files N` each
attempt's limits (`TaskSpec.with_limits`, held to its rule: a SIZE and N at most 2**63 - 1,
`--cpus` from 0.01 to 100000; an attempt that runs into one fails, the reason naming it);
`--backoff FIRST[:MAX[:FACTOR]]` finite seconds (MAX defaults to 30 s or FIRST if larger,
FACTOR to 2) with `--jitter` (default `equal`; `--jitter` alone applies to the default
backoff); `--name` non-empty; `--ray ADDRESS` a Ray address, where Ray is installed (the
attempts then run on that cluster, `mpvisor.ray.RayLauncher(address=ADDRESS)`; a cluster that
cannot be reached ends the run with status 1 and one line saying why).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import IO, TYPE_CHECKING, Any

from mpvisor import _platform
from mpvisor._api.session import (
    STOPPING_SIGNALS,
    RunSession,
    ending_signal,
    run_session,
    serve_runtime,
)
from mpvisor._cli import statuses
from mpvisor._cli.options import (
    DEFAULT_GRACE,
    EVENTS,
    POLICIES,
    RESTARTS,
    RETRY_OPTIONS,
    SLOTS_VARIABLE,
    TASK_OPTIONS,
    account_events,
    backoff,
    build_spec,
    byte_size,
    check_cgroups_variable,
    choice,
    controller_config,
    cpus,
    event_writers,
    intensity,
    jitter,
    launcher_for,
    lease_ttl,
    limit_count,
    outcome_line,
    parse_arg,
    positive_count,
    ray_address,
    retries,
    run_target,
    say_problem,
    seconds,
    slot_name,
    slots_default,
    slots_url,
    stop_signal,
    store_missing,
    task_name,
    value_line,
)
from mpvisor._cli.shell import (
    redraws,
    take_stdout,
    watch_reader,
    when_reader_gone,
    write_line,
)
from mpvisor._model.errors import ConfigError, GraceExceeded, ShuttingDown
from mpvisor._model.events import Event, EventKind
from mpvisor._model.outcome import (
    FAILURES,
    OutcomeKind,
    RejectionKind,
    TaskOutcome,
    uncaught_traceback,
)
from mpvisor._model.spec import RestartPolicy, TaskDefaults, TaskSpec
from mpvisor._observe.progress import ProgressBar, duration
from mpvisor._runtime.config import SupervisorConfig
from mpvisor._runtime.runtime import Runtime
from mpvisor._services import startup_signals
from mpvisor._tasks.registry import TaskWaiter

if TYPE_CHECKING:
    from mpvisor._admission.config import ControllerConfig

NAME = "run"
DESCRIPTION = "Run one task, or the tasks of a task file, under supervision until it ends."
USAGE = """mpvisor run [OPTIONS] TARGET [ARG...]        (TARGET is "package.module:function")
       mpvisor run [OPTIONS] -- COMMAND [ARG...]
       mpvisor run --file FILE [OPTIONS]"""
EPILOG = "exit statuses:\n" + "\n".join(f"  {code:<27} {when}" for code, when in statuses.TABLE)
TAKES_COMMAND = True  # `-- COMMAND [ARG...]` after the options


def add_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--file", metavar="FILE", help="run the tasks of this task file (TOML) instead of one TARGET or COMMAND")
    run.add_argument("--name", help="the task name (default: the function or program name); with --file, "
                     "the run's name, which `mpvisor status --name N` and the other control commands take")
    run.add_argument("--restart", type=choice(*RESTARTS), metavar="|".join(RESTARTS), help="when to run again (default: never)")
    run.add_argument("--every", type=seconds(allow_zero=False), metavar="SECONDS",
                     help="run again this many seconds after each success (> 0)")
    run.add_argument("--max-retries", type=retries, metavar="N", help="retries after the first failure (default: unlimited)")
    run.add_argument("--memory", type=byte_size, metavar="SIZE",
                     help="the resident memory each attempt's whole tree may use: bytes, or with K, M, G, T (binary: 1G = 2**30); "
                          "a memory cgroup per attempt where one can be made, else a watcher (mpvisor doctor says which)")
    run.add_argument("--address-space", type=byte_size, metavar="SIZE",
                     help="each process's address-space limit (RLIMIT_AS), as SIZE for --memory")
    run.add_argument("--cpu", type=seconds(allow_zero=False), metavar="SECONDS",
                     help="the CPU time each attempt's whole tree may use (its cgroup's, else the launcher's count)")
    run.add_argument("--cpus", type=cpus, metavar="N",
                     help="at most N CPUs' worth of time at once for each attempt's whole tree (0.5, 2; the kernel's CPU "
                          "controller slows it down; refused where there is none: mpvisor doctor)")
    run.add_argument("--open-files", type=limit_count, metavar="N", help="each attempt's open-file limit")
    run.add_argument("--intensity", type=intensity, metavar="N/SECONDS",
                     help="fail the task on a restart that makes more than N restarts within SECONDS")
    run.add_argument("--timeout", type=seconds(allow_zero=False, hint=" (leave it out for no timeout)"),
                     metavar="SECONDS", help="each attempt's time limit in seconds (> 0), start-up and import included; "
                                             "exit status 124 when the last attempt timed out")
    run.add_argument("--start-timeout", type=seconds(allow_zero=False), metavar="SECONDS",
                     help="each attempt's limit for its start-up alone: process start, handshake and import (> 0; default 30); "
                          "exit status 124 when the last attempt's start-up timed out")
    run.add_argument("--backoff", type=backoff, metavar="FIRST[:MAX[:FACTOR]]",
                     help="seconds between retries: FIRST, doubling (or times FACTOR) up to MAX (default: 0.2:30)")
    run.add_argument("--jitter", type=jitter, metavar="none|full|equal|randomized-band",
                     help="jitter of the backoff (default: equal)")
    run.add_argument("--stop-signal", type=stop_signal, metavar="SIGNAL",
                     help="with -- COMMAND: the signal the program is asked to stop with (default TERM; QUIT for nginx's "
                          "graceful stop); a SIGINT, SIGHUP or SIGALRM... that interrupted mpvisor reaches it as it came")
    run.add_argument("--grace", type=seconds(allow_zero=True), metavar="SECONDS",
                     help=f"seconds to stop before a kill when interrupted (default {DEFAULT_GRACE:g}, 0 = at once)")
    run.add_argument("--max-concurrent", type=positive_count, metavar="N",
                     help="with --file: at most N of the file's attempts run at once (default: the file's, else no bound)")
    run.add_argument("--ray", type=ray_address, metavar="ADDRESS",
                     help="run the attempts on this Ray cluster (auto, HOST:PORT, ray://HOST:PORT, or local for a new one)")
    run.add_argument("--slot", type=slot_name, metavar="NAME",
                     help="run only while holding this slot, shared by every mpvisor process of this user on this host")
    run.add_argument("--slots", type=slots_url, metavar="URL",
                     help="with --slot, where slots are kept: a postgresql:// URL shares them across hosts "
                          "(default: $MPVISOR_SLOTS, else this user's slot server on this host)")
    run.add_argument("--lease-ttl", type=lease_ttl, metavar="SECONDS",
                     help="with --slots URL: how long a lease lives past its last renewal (2 to 86400; default 15); "
                          "a run that cannot renew it in time stops its task and exits 7")
    run.add_argument("--wait-timeout", type=seconds(allow_zero=False), metavar="SECONDS",
                     help="with --slot: give up waiting for a busy slot after SECONDS (exit 3, nothing ran)")
    run.add_argument("--policy", type=choice(*POLICIES), metavar="|".join(POLICIES),
                     help="with --slot, when the slot is busy: wait in its queue (default), replace its owner, or give up")
    run.add_argument("--events", type=choice(*EVENTS), metavar="|".join(EVENTS), default="none",
                     help="every event as a JSON line on stdout (json), as log lines on stderr (log), or none (default)")
    run.add_argument("--quiet", action="store_true",
                     help="print neither a failed Python target's traceback nor the outcome line, nor a --slot run's "
                          "'busy; waiting' note (the status says how it ended)")
    run.add_argument("--progress", action="store_true",
                     help="show done/total, rate, ETA and attempt (a bar on a terminal, periodic lines otherwise)")
    run.add_argument("target", nargs="?", type=run_target, metavar="TARGET", help='"package.module:function"')
    run.add_argument("args", nargs="*", type=parse_arg, metavar="ARG",
                     help="arguments: JSON literals (a bare word is a string, unless it reads as a number: "
                          "nan, inf, 01 are refused, JSON has no such numbers; '\"nan\"' is the string)")


def check(args: argparse.Namespace, run: argparse.ArgumentParser) -> None:
    """What argparse cannot check alone (a usage error through `run.error`); sets `args.spec`,
    the one task's spec (None with `--file`, whose tasks are in the file)."""
    args.spec = None
    # $MPVISOR_SLOTS is read only by a run that has a slot (a file's: once it is read, `run_file`)
    given_slots, args.slots = args.slots, args.slots or (slots_default(run) if args.slot is not None else None)
    check_cgroups_variable(run)  # what the launcher reads: refused here, before anything starts
    if args.file is not None:
        if args.command or args.target is not None:
            run.error("argument --file: give either --file FILE or TARGET [ARG...] or -- COMMAND [ARG...], not both")
        for option in TASK_OPTIONS:
            if option != "name" and getattr(args, option) is not None:  # --name names the run (its control socket)
                flag = "--" + option.replace("_", "-")
                run.error(f"argument {flag}: not with --file (a task file gives it per task, or in its [defaults])")
        if args.quiet:
            run.error("argument --quiet: not with --file (a file's run prints each task's outcome line)")
        if args.name is not None:  # the run's name: its control socket's
            from mpvisor._services.control import check_name

            try:
                check_name(args.name)
            except ValueError as exc:
                run.error(f"argument --name: {exc}")
        _store_usable(args.slots, given_slots, run)
        return
    if args.name is not None:  # the task's name (with --file, above, the run's: another rule)
        try:
            task_name(args.name)
        except argparse.ArgumentTypeError as exc:
            run.error(f"argument --name: {exc}")
    if args.max_concurrent is not None:
        run.error("argument --max-concurrent: only with --file (one task runs one attempt at a time)")
    if args.grace is None:
        args.grace = DEFAULT_GRACE
    if bool(args.command) == (args.target is not None):
        run.error("give either TARGET [ARG...] or -- COMMAND [ARG...]")
    if args.stop_signal is not None and not args.command:
        run.error("argument --stop-signal: needs -- COMMAND (a Python target is asked to stop by SIGTERM, "
                  "which raises Canceled in it)")
    if args.every is not None and args.restart in ("never", "on-failure"):  # as a task file's `every` says it
        run.error(f"argument --every: makes the task run again after each success: it needs --restart always "
                  f"or no --restart, got --restart {args.restart}")
    if args.every is None and args.restart in (None, "never"):  # as a task file's retry keys say it
        for option in RETRY_OPTIONS:
            if getattr(args, option) is not None:
                run.error(f"argument --{option.replace('_', '-')}: says how failed attempts are retried, but the "
                          f"task runs once: it needs --restart on-failure or always (or --every)")
    try:
        args.spec = build_spec(args)  # `--timeout` as timeout(1) reads it: the whole attempt
    except (TypeError, ValueError) as exc:
        run.error(str(exc))
    for option, value in (("policy", args.policy), ("lease_ttl", args.lease_ttl), ("wait_timeout", args.wait_timeout),
                          ("slots", given_slots)):  # ($MPVISOR_SLOTS is for the runs that have a slot)
        if value is not None and args.slot is None:
            run.error(f"argument --{option.replace('_', '-')}: needs --slot")
    if args.lease_ttl is not None and args.slots is None:
        run.error("argument --lease-ttl: needs --slots URL (or $MPVISOR_SLOTS): only a store across hosts has leases "
                  "that expire; this host's slot server holds one while its owner lives")
    _store_usable(args.slots, given_slots, run)


def _store_usable(slots: str | None, given: str | None, run: argparse.ArgumentParser) -> None:
    """A usage error when the slot store's URL (`--slots`, else `$MPVISOR_SLOTS`) needs what is
    not installed here: refused before anything runs, as `--ray` without Ray is."""
    if (missing := store_missing(slots)) is not None:
        run.error(f"argument --slots: {missing}" if given else f"${SLOTS_VARIABLE}: {missing}")


def run(args: argparse.Namespace) -> int:
    """Run the task (or the file): the exit status, or `-N` to die by signal N."""
    # what mpvisor itself imports comes before the working directory goes on sys.path: a json.py
    # or tomllib.py there is the targets' to import, never the value line's or the task file's
    if args.file is not None:
        from mpvisor._cli.filerun import run_file
    elif not args.command or args.events == "json":
        import json  # noqa: F401  # the value line, or the events
    here = _platform.current_dir()
    if here is not None and here not in sys.path:
        sys.path.insert(0, here)  # as `python -m` does: targets resolve from here
    if args.file is not None:
        return run_file(args)
    startup_signals.release(signal.SIGHUP)  # (held when the words looked like a file's run)
    spec: TaskSpec = args.spec
    machine: IO[str] | None = None  # stdout, kept for the events or the value while fd 1 goes to stderr
    if args.events == "json" or not args.command:
        machine = take_stdout()
    writers = event_writers(args, machine)
    subscribers: list[Any] = list(writers)
    if args.progress:
        subscribers.append(ProgressBar(sys.stderr, live=redraws(sys.stderr)))
    if not args.quiet and args.events != "log" and spec.restart != RestartPolicy.NEVER:  # (a log says it all already;
        subscribers.append(_RetriedAttempts(spec.name))  # a task that runs once has no subscriber thread to pay for)
    start = {"start_timeout": args.start_timeout} if args.start_timeout is not None else {}  # the launcher's (and Ray's connection) too
    config = SupervisorConfig(grace=args.grace, launcher=launcher_for(args), stdin="inherit", **start)
    controller = controller_config(args.slots, args.lease_ttl, args.wait_timeout) if args.slot is not None else None
    one = _OneTask(spec, args.slot, args.policy or "queue", machine if args.events == "json" else None, args.quiet)
    try:
        try:
            outcome = asyncio.run(one.run(config, subscribers, controller))
        finally:
            account_events(writers, machine, config.subscriber_shutdown_timeout)
    except (ConfigError, ShuttingDown) as exc:  # the launcher could not start, or was interrupted first
        say_problem(f"mpvisor: {exc}")
        return _ended(one.interrupts(), statuses.FAILED)
    except GraceExceeded as exc:  # a tree had to be killed: the outcome was FORCE_ABORTED
        if one.outcome is not None:  # which the outcome line says, with why (or --quiet, nothing)
            return _report(args, spec, one.outcome, one, machine)
        print(f"mpvisor: {exc}", file=sys.stderr)
        return _ended(one.interrupts(), statuses.FAILED)
    return _report(args, spec, outcome, one, machine)


def _report(args: argparse.Namespace, spec: TaskSpec, outcome: TaskOutcome, one: _OneTask, machine: IO[str] | None) -> int:
    interrupts = one.interrupts()
    refused = statuses.refused(outcome.rejection)
    if refused is not None:  # the slot's store refused the lease: nothing ran
        status, reason = refused[0], outcome.reason or refused[1]  # the kind's words, or its own (a silent store...)
        if outcome.rejection is RejectionKind.SLOT_BUSY and args.wait_timeout is not None and args.policy != "drop":
            # imported only here, not on a run's start-up path
            from mpvisor._admission.leases.driver import waited_out
            if outcome.reason == waited_out(args.slot, args.wait_timeout):  # in the option's words
                reason = f"the slot was still busy after --wait-timeout {args.wait_timeout:g} s"
        if not args.quiet:
            print(f"mpvisor: {spec.name}: rejected reason={reason!r} slot={args.slot!r}", file=sys.stderr)
        return status
    if outcome.rejection is RejectionKind.CONTROLLER_SHUTTING_DOWN and interrupts:
        # the kind's own words: the store took the withdrawal; else the reason says why it could not be told
        left = "left the queue" if outcome.reason == RejectionKind.CONTROLLER_SHUTTING_DOWN.words else outcome.reason
        queued = f"queued for slot {args.slot!r}: {left}" if args.policy != "drop" else f"asking for slot {args.slot!r}"
        print(f"mpvisor: interrupted while {queued}", file=sys.stderr)  # a drop never queues
        return _ended(interrupts, statuses.FAILED)
    if one.replaced:
        if not args.quiet:
            print(outcome_line(spec.name, outcome) + f" replaced_in_slot={args.slot!r}", file=sys.stderr)
        # granted, then replaced before an attempt started: nothing ran, as for one superseded in the queue
        return statuses.REPLACED if outcome.attempts else statuses.SUPERSEDED
    # `--quiet` leaves the status to say how the task ended; but a submission that could not even be
    # asked for (its slot's store refused: a wrong password, no such database) has a failed task's 1
    if not args.quiet or outcome.rejection is RejectionKind.ADMISSION_FAILED:
        uncaught = uncaught_traceback(outcome.reason, outcome.traceback) if outcome.kind in FAILURES else None
        if uncaught is not None:
            print(uncaught, file=sys.stderr)  # as `python script.py` would, then the outcome
        print(outcome_line(spec.name, outcome), file=sys.stderr)  # a store's refusal whole, on one line
    if outcome.kind is OutcomeKind.COMPLETED and args.events != "json" and machine is not None:
        write_line(machine, value_line(outcome.value))
    return _ended(interrupts, statuses.exit_status(outcome, slotted=args.slot is not None, dies=True))


def _ended(interrupts: list[signal.Signals], otherwise: int) -> int:
    """Die by the signal that interrupted the run (`ending_signal`), if one did."""
    ending = ending_signal(interrupts)
    return -ending if ending is not None else otherwise


class _OneTask:
    """One task's run: added at once, or, with a slot, submitted to a controller with shared slots."""

    def __init__(self, spec: TaskSpec, slot: str | None, policy: str, events: IO[str] | None = None,
                 quiet: bool = False) -> None:
        self.spec, self.slot, self.policy, self.quiet = spec, slot, policy, quiet
        self.events = events  # the kept stdout that `--events json` writes to
        self.runtime: Runtime | None = None
        self.replaced = False  # a replacement claimed it (never decided from an event)
        self.waiter: TaskWaiter | None = None
        self.outcome: TaskOutcome | None = None  # once known

    def interrupts(self) -> list[signal.Signals]:
        return list(self.runtime.interrupted) if self.runtime is not None else []

    async def run(self, config: SupervisorConfig, subscribers: list[Any],
                  controller: ControllerConfig | None) -> TaskOutcome:
        self.runtime = serve_runtime(config, subscribers, TaskDefaults(), controller)
        # a program gets the SIGINT, SIGHUP or SIGALRM... itself, as bare (SIGTERM: its stop signal)
        self.runtime.passes_on_interruption = frozenset((signal.SIGINT, signal.SIGHUP, *STOPPING_SIGNALS))
        await run_session(self.runtime, self._start, adds_work=True,  # raises GraceExceeded after a kill
                          passed_on=(signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT, signal.SIGWINCH),  # as tini does
                          stopped_by=STOPPING_SIGNALS, dies_by_it=True)
        assert self.waiter is not None
        return await self.waiter.wait()

    async def _start(self, session: RunSession) -> None:
        for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):  # one that came as the run started up:
            startup_signals.replay(signum)  # passed on now, or said not to be (no attempt runs yet)
        # no reader left (`--events json | head`): the run stops, then ends by SIGPIPE, as the pipeline expects
        when_reader_gone(lambda: session.stop(signal.SIGPIPE))
        if self.events is not None:  # found at once, not at the next event
            watch_reader(self.events, session.runtime.loop)
        if self.slot is None:
            (self.waiter,) = await session.add_batch([self.spec])
            self.waiter.when_resolved(self._resolved)
            return
        session.on_replaced(self._on_replaced)
        session.on_said(self._on_said)
        from mpvisor._admission.leases.store import POLICIES as POLICY_OF  # a slot's run only
        from mpvisor._admission.submission import ControllerSpec

        submission = ControllerSpec(self.spec, POLICY_OF[self.policy]).with_slot(self.slot)
        _, self.waiter = await session.handle.submit_and_watch(submission)
        self.waiter.when_resolved(self._resolved)

    def _resolved(self, outcome: TaskOutcome) -> None:
        self.outcome = outcome  # kept for when the shutdown raises (GraceExceeded) instead of returning it

    def _on_said(self, id: int, text: str, queued: bool) -> None:
        """The slot's store answered this run's one submission with words for a person (queued
        behind an owner, or silent): said at once, on the loop, as `_on_replaced` says its line
        (no subscriber's thread for lines that a run whose slot is free never has); `--quiet`
        says no "busy; waiting" note, only what is wrong (a store that does not answer)."""
        if queued and self.quiet:
            return
        write_line(sys.stderr, f"mpvisor: {text}")  # one write: a line a subscriber's thread writes stays whole

    def _on_replaced(self, id: int) -> None:
        if self.waiter is not None and id == self.waiter.id:
            self.replaced = True
            print(f"mpvisor: slot {self.slot!r}: replaced by a newer submission; stopping", file=sys.stderr, flush=True)


class _RetriedAttempts:
    """Says on stderr why an attempt failed when another follows it (the outcome line says why
    the last one did): its uncaught traceback, as the program would have printed it, then
    `mpvisor: NAME: attempt N failed: REASON; retry in 0.4s`. A retried or periodic task's
    failures are not silent (a file run says the same in its lines). A failure by SIGINT (or a
    target's `KeyboardInterrupt`) is said only once its retry starts: in a terminal it is a
    Ctrl-C, which ends the run a moment after the retry was scheduled, and no retry comes."""

    name = "retried-attempts"
    queue_capacity = 4096

    def __init__(self, task: str) -> None:
        self.task = task
        self.failed: Event | None = None  # the last attempt's failure, until the task says what follows
        self.interrupted: tuple[Event, float] | None = None  # a death by SIGINT, said once its retry starts

    def on_event(self, event: Event) -> None:
        if event.task != self.task:
            return
        if event.kind in (EventKind.ATTEMPT_FAILED, EventKind.ATTEMPT_TIMED_OUT):
            self.failed = event
        elif event.kind in (EventKind.BACKOFF_SCHEDULED, EventKind.TASK_FINISHED):
            failed, self.failed = self.failed, None
            if event.kind is EventKind.TASK_FINISHED:
                self.interrupted = None  # the run stopped (a Ctrl-C): no retry came
            elif failed is not None and (failed.exit_code == -signal.SIGINT
                                         or (failed.reason or "").startswith("KeyboardInterrupt")):
                # A Ctrl-C in the terminal ends the command by SIGINT and then the run, which learns
                # of it a moment after this retry was scheduled: said only if the retry starts.
                self.interrupted = (failed, event.delay or 0.0)
            elif failed is not None:
                self._say(failed, event.delay or 0.0)
        elif event.kind is EventKind.ATTEMPT_STARTING and self.interrupted is not None:
            failed, delay = self.interrupted
            self.interrupted = None
            self._say(failed, delay)

    def _say(self, failed: Event, delay: float) -> None:
        from mpvisor._cli.batchview import (
            attempt_failed_text,  # the file run's words (not on a run's start-up path)
        )

        shown = uncaught_traceback(failed.reason, failed.traceback)
        text = "" if shown is None else shown + "\n"
        text += f"mpvisor: {self.task}: {attempt_failed_text(failed, failed.attempt or 0)}; retry in {duration(delay)}\n"
        sys.stderr.write(text)
        sys.stderr.flush()
