"""Task files, without processes: what a file describes, every error with its location, and the
promise that a value means the same (and is refused with the same words) in a file as on the
command line (a property test against the real `mpvisor run` parser)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpvisor import BackoffPolicy, JitterPolicy, Limits, RestartIntensity, RestartPolicy
from mpvisor._cli.main import main, parse
from mpvisor._cli.taskfile import (
    DEFAULTS_ONLY,
    SETTINGS,
    TASK_ONLY,
    load,
    parse_dotenv,
    parse_text,
    summary,
    toml_text,
)
from mpvisor._model.work import CommandTask, TaskFn
from mpvisor._services.graph import diff
from mpvisor._services.settings import Check, LogSettings, ServiceSettings

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

ISSUE_EXAMPLE = """
[defaults]
grace = 5
restart = "on-failure"

[task.build]
target = "myapp.build:run"
args = ["main", 42]

[task.deploy]
command = ["./deploy.sh", "prod"]
slot = "deploy-prod"
policy = "queue"
timeout = 600
backoff = "0.5:30"
max_retries = 3
"""


def errors(text: str, base_dir: str = "/base") -> list[str]:
    return list(parse_text(text, base_dir).errors)


# --- what a valid file describes ----------------------------------------------------------------------


def test_a_file_describes_its_tasks_with_their_defaults_slots_and_the_runs_grace():
    parsed = parse_text(ISSUE_EXAMPLE, "/base")
    assert parsed.ok and parsed.grace == 5.0
    build, deploy = parsed.tasks
    assert build.spec.task == TaskFn("build", "myapp.build:run", ("main", 42))
    assert build.spec.restart == RestartPolicy.ON_FAILURE and (build.slot, build.policy) == (None, None)
    assert deploy.spec.task == CommandTask("deploy", ["./deploy.sh", "prod"])
    assert (deploy.spec.timeout, deploy.spec.max_retries, deploy.spec.restart) == (600.0, 3, RestartPolicy.ON_FAILURE)
    assert deploy.spec.backoff == BackoffPolicy.exponential(0.5, max=30).with_jitter(JitterPolicy.EQUAL)
    assert (deploy.slot, deploy.policy) == ("deploy-prod", "queue")


def test_the_runs_bound_on_attempts_is_read_from_the_defaults():
    parsed = parse_text("[defaults]\nmax_concurrent = 3\n[task.a]\ntarget = 'm:f'\n")
    assert (parsed.ok, parsed.max_concurrent, parsed.grace) == (True, 3, None)
    assert parse_text("[task.a]\ntarget = 'm:f'\n").max_concurrent is None
    run = parse_text("[defaults]\nslots = 'postgresql://ci@db/ops'\nlease_ttl = 30\nwait_timeout = 600\n[task.a]\ntarget = 'm:f'\nslot = 's'\n")
    assert (run.ok, run.slots, run.lease_ttl, run.wait_timeout) == (True, "postgresql://ci@db/ops", 30.0, 600.0)


def test_every_key_reaches_the_spec():
    """Limits, intensity, jitter, kwargs, a periodic task, env (merged with the defaults'; false
    removes a variable) and a cwd relative to the file's directory."""
    parsed = parse_text("""
        [defaults]
        env = {A = "1", B = "2"}
        jitter = "full"
        policy = "replace"
        [task.job]
        target = "workers.basic:echo"
        args = [1, [2.5, true], {k = "v"}]
        kwargs = {marker = "m"}
        every = 0.25
        memory = "1G"
        cpu = 60
        cpus = 1.5
        open_files = 128
        intensity = "3/60"
        env = {B = "3", C = false}
        cwd = "sub/dir"
        [task.cmd]
        command = ["sh", "-c", "true"]
        cwd = "/abs"
        slot = "s"
        restart = "always"
        backoff = 2
        timeout = 5
        start_timeout = 1.5
    """, "/base")
    assert parsed.ok, parsed.errors
    job, cmd = parsed.tasks
    assert job.spec.task == TaskFn("job", "workers.basic:echo", (1, [2.5, True], {"k": "v"}), {"marker": "m"},
                                   env={"A": "1", "B": "3", "C": None}, cwd="/base/sub/dir")
    assert job.spec.restart == RestartPolicy.always(0.25)
    assert job.spec.limits == Limits(memory=2**30, cpu_seconds=60.0, open_files=128, cpus=1.5)
    assert job.spec.restart_intensity == RestartIntensity(3, 60.0)
    assert job.spec.backoff == BackoffPolicy.exponential(0.2, max=30).with_jitter(JitterPolicy.FULL)
    assert job.slot is None and job.policy is None  # a default policy applies only to tasks with a slot
    assert cmd.spec.task == CommandTask("cmd", ["sh", "-c", "true"], {"A": "1", "B": "2"}, "/abs")
    assert cmd.spec.backoff == BackoffPolicy.exponential(2, max=30).with_jitter(JitterPolicy.FULL)
    assert (cmd.slot, cmd.policy, cmd.spec.restart) == ("s", "replace", RestartPolicy.always())
    assert (cmd.spec.timeout, cmd.spec.timeout_includes_start, cmd.spec.start_timeout) == (5.0, True, 1.5)  # as --timeout


# --- every error, with its location --------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[task.a]\ntarget = 'm:f'\nmax_retry = 2\n", ['task "a".max_retry: unknown key (did you mean max_retries?)']),
        ("[task.a]\ntarget = 'm:f'\nbackof = '1'\n", ['task "a".backof: unknown key (did you mean backoff?)']),
        ("[task.a]\ntarget = 'm:f'\nzzz = 1\n", ['task "a".zzz: unknown key']),
        ("[task.a]\ntarget = 'm:f'\nevents = 'json'\n", ['task "a".events: unknown key: events is an option of `mpvisor run`, not of a task file']),
        ("[task.a]\ntarget = 'm:f'\nname = 'b'\n", ['task "a".name: a task\'s name is its table\'s key: [task.NAME]']),
        ("[task.a]\ntarget = 'm:f'\ngrace = -1\n", ['task "a".grace: expected a finite number of seconds >= 0, got \'-1\'']),
        ("[task.a]\ntarget = 'm:f'\nstop_signal = 'QUIT'\n", ['task "a".stop_signal: is for a command: a Python target is asked to stop by SIGTERM, which raises Canceled in it']),
        ("[task.a]\ncommand = ['x']\nstop_signal = 'TSTP'\n", ['task "a".stop_signal: cannot be SIGTSTP: it pauses or continues a process, it does not ask it to stop']),
        ("[task.a]\ncommand = ['x']\nstop_signal = 'SIGNOPE'\n", ['task "a".stop_signal: must be a signal\'s name or number, such as SIGTERM or SIGQUIT, got \'SIGNOPE\'']),
        ("[task.a]\ncommand = ['x']\nstop_signal = 1.5\n", ['task "a".stop_signal: expected a signal\'s name (a string such as "SIGQUIT") or number, got a float: 1.5']),
        ("[defaults]\ntarget = 'm:f'\n[task.a]\ntarget = 'm:f'\n", ["defaults.target: target is a task's own key, not a default ([task.NAME])"]),
        ("[defaults]\ngrace = -1\n[task.a]\ntarget = 'm:f'\n", ["defaults.grace: expected a finite number of seconds >= 0, got '-1'"]),
        ("[defaults]\ngrace = 'soon'\n[task.a]\ntarget = 'm:f'\n", ["defaults.grace: expected a finite number of seconds >= 0, or one with a unit (500ms, 30s, 5m, 1h), got 'soon'"]),
        ("[defaults]\nmax_concurrent = 0\n[task.a]\ntarget = 'm:f'\n", ["defaults.max_concurrent: expected a whole number >= 1, got '0'"]),
        ("[defaults]\nslots = 'mysql://db/x'\n[task.a]\ntarget = 'm:f'\n", ["defaults.slots: expected a postgresql:// URL, got 'mysql://db/x'"]),
        ("[defaults]\nslots = 5\n[task.a]\ntarget = 'm:f'\n", ['defaults.slots: expected a string "postgresql://USER@HOST/DB", got an integer: 5']),
        ("[defaults]\nlease_ttl = 1\n[task.a]\ntarget = 'm:f'\n", ["defaults.lease_ttl: expected a finite number of seconds >= 2 and <= 86400, got '1'"]),
        # the same words whichever bound it misses (over a day, or not > 0, said "> 0 and >= 2 and <= 86400")
        ("[defaults]\nlease_ttl = 86401\n[task.a]\ntarget = 'm:f'\n", ["defaults.lease_ttl: expected a finite number of seconds >= 2 and <= 86400, got '86401'"]),
        ("[defaults]\nlease_ttl = 0\n[task.a]\ntarget = 'm:f'\n", ["defaults.lease_ttl: expected a finite number of seconds >= 2 and <= 86400, got '0'"]),
        ("[defaults]\nwait_timeout = 0\n[task.a]\ntarget = 'm:f'\n", ["defaults.wait_timeout: expected a finite number of seconds > 0, got '0'"]),
        ("[task.a]\ntarget = 'm:f'\nslots = 'postgresql://db/x'\n", ['task "a".slots: slots is the whole run\'s: set it in [defaults]']),
        ("[defaults]\nmax_concurrent = -2\n[task.a]\ntarget = 'm:f'\n", ["defaults.max_concurrent: expected a whole number >= 1, got '-2'"]),
        ("[defaults]\nmax_concurrent = 1.5\n[task.a]\ntarget = 'm:f'\n", ["defaults.max_concurrent: expected a whole number >= 1, got '1.5'"]),
        ("[defaults]\nmax_concurrent = '2'\n[task.a]\ntarget = 'm:f'\n", ['defaults.max_concurrent: expected a whole number >= 1, got a string: "2"']),
        ("[defaults]\nmax_concurrent = true\n[task.a]\ntarget = 'm:f'\n", ["defaults.max_concurrent: expected a whole number >= 1, got a boolean: true"]),
        ("[task.a]\ntarget = 'm:f'\nmax_concurrent = 2\n", ['task "a".max_concurrent: max_concurrent is the whole run\'s: set it in [defaults]']),
        ("[task.a]\ntarget = 'm:f'\ntimeout = '600s'\nstart_timeout = '1.5m'\ncpu = 'x'\n",
         ["task \"a\".cpu: expected a finite number of seconds > 0, or one with a unit (500ms, 30s, 5m, 1h), got 'x'"]),
        ("[task.a]\ntarget = 'm:f'\ntimeout = 0\n", ['task "a".timeout: expected a finite number of seconds > 0 (leave it out for no timeout), got \'0\'']),
        ("[task.a]\ntarget = 'm:f'\nmax_retries = true\n", ['task "a".max_retries: expected a whole number >= 0, got a boolean: true']),
        ("[task.a]\ntarget = 'm:f'\nmax_retries = 1.5\n", ['task "a".max_retries: expected a whole number >= 0, got \'1.5\'']),
        ("[task.a]\ntarget = 'm:f'\nbackoff = 'x'\n", ['task "a".backoff: expected FIRST[:MAX[:FACTOR]]: seconds, each a number or '
                                                     'one with a unit (500ms, 30s, 5m, 1h), and a number, got \'x\'']),
        ("[task.a]\ntarget = 'm:f'\nmax_retries = 3\n", ['task "a".max_retries: says how failed attempts are retried, but the task '
                                                        'runs once: it needs restart = "on-failure" or "always" (or every)']),
        ("[task.a]\ntarget = 'm:f'\nrestart = 'never'\nintensity = '3/5'\n", ['task "a".intensity: says how failed attempts are '
                                                                            'retried, but the task runs once: it needs restart = '
                                                                            '"on-failure" or "always" (or every)']),
        ("[task.a]\ntarget = 'm:f'\nbackoff = '5:1'\n", ['task "a".backoff: first (5.0) must not exceed max (1.0) (in \'5:1\')']),
        ("[task.a]\ntarget = 'm:f'\nrestart = 'maybe'\n", ['task "a".restart: expected one of never, on-failure, always, got \'maybe\'']),
        ("[task.a]\ntarget = 'm:f'\nrestart = 'on_failure'\n",
         ['task "a".restart: expected one of never, on-failure, always, got \'on_failure\' (did you mean on-failure?)']),
        ("[task.a]\ntarget = 'm:f'\npolicy = 'queue'\n", ['task "a".policy: needs slot (the slot whose admission the policy decides)']),
        ("[task.a]\ntarget = 'm:f'\nslot = ''\n", ['task "a".slot: expected a non-empty slot name, got \'\'']),
        ('[task."a\\nb"]\ntarget = \'m:f\'\n', ['task "a\\nb": name must be printable (no control characters or line breaks), got \'a\\nb\'']),
        # a line break that is no control character (U+2028) is escaped where the error is, as in what it got
        ('[task."a\\u2028b"]\ntarget = \'m:f\'\n', ['task "a\\u2028b": name must be printable (no control characters or line breaks), got \'a\\u2028b\'']),
        ("[task.a]\ntarget = 'm:f'\nevery = 5\nrestart = 'never'\n",
         ['task "a".every: makes the task run again after each success: it needs restart = "always" or no restart, got restart = "never"']),
        # every from [defaults], the task's own restart: said at the key the task has, naming the other's origin
        ("[defaults]\nevery = 30\nrestart = 'always'\n[task.a]\ntarget = 'm:f'\nrestart = 'never'\n",
         ['task "a".restart: "never" cannot go with the every of [defaults] (30.0 s), which makes the task run again after '
          'each success: give it restart = "always", or give every only to the tasks that repeat']),
        ("[task.a]\ntarget = 'nope'\n", ["task \"a\".target: target must have the form 'package.module:attr' (dotted identifiers, exactly one colon), got 'nope'"]),
        ("[task.a]\ntarget = 'm:f'\ncommand = ['x']\n", ['task "a": give either target (a Python function) or command (a program), not both']),
        ("[task.a]\ntimeout = 1\n", ['task "a": give either target (a Python function) or command (a program)']),
        ("[task.a]\ncommand = './deploy.sh prod'\n",
         ['task "a".command: expected an array of strings (the program and its arguments), got a string: "./deploy.sh prod"; write command = ["./deploy.sh", "prod"]']),
        ("[task.a]\ncommand = []\n", ['task "a".command: expected a non-empty array of strings (the program and its arguments), got an array: []']),
        ("[task.a]\ncommand = ['x', 1]\n", ['task "a".command: [1] must be a string, got an integer: 1']),
        ("[task.a]\ncommand = ['x', 1, true]\nenv = {A = 1, B = 'ok', C = 2}\n",  # every wrong item at once
         ['task "a".command: [1] must be a string, got an integer: 1; [2] must be a string, got a boolean: true',
          'task "a".env: A must be a string, or false to remove it, got an integer: 1; C must be a string, or false '
          'to remove it, got an integer: 2']),
        ("[task.a]\ncommand = ['x']\nargs = [1]\n", ['task "a".args: args is for a Python target; a command\'s arguments are the rest of its command array']),
        ("[task.a]\ntarget = 'm:f'\nargs = [1979-05-27]\n", ['task "a".args: [0] is a TOML date/time, which is not a msgpack value; quote it to pass it as a string']),
        ("[task.a]\ntarget = 'm:f'\nargs = 3\n", ['task "a".args: expected an array of arguments, got an integer: 3']),
        ("[task.a]\ntarget = 'm:f'\nenv = {A = 1}\n", ['task "a".env: A must be a string, or false to remove it, got an integer: 1']),
        ("[task.a]\ntarget = 'm:f'\nenv = {A = true}\n", ['task "a".env: A must be a string, or false to remove it, got a boolean: true']),
        ("[task.a]\ntarget = 'm:f'\nenv = {'A=B' = '1'}\n", ['task "a".env: "A=B": not a valid environment variable (a non-empty name without \'=\' or NUL)']),
        ("[task.a]\ntarget = 'm:f'\ncwd = ''\n", ['task "a".cwd: expected a directory (a non-empty string), got a string: ""']),
        # an empty program, a NUL: said at the key that holds it, and for what it is
        ("[task.a]\ncommand = ['', 'x']\n", ['task "a".command: [0] must name the program to run, got an empty string']),
        ('[task.a]\ntarget = "m:f"\nenv = {A = "x\\u0000"}\n',
         ['task "a".env: A: its value must not contain a NUL byte (\\u0000), which no variable can hold, got "x\\u0000"']),
        ('[task.a]\ntarget = "m:f"\ncwd = "a\\u0000"\n',
         ['task "a".cwd: a directory\'s name cannot contain a NUL byte (\\u0000), got "a\\u0000"']),
        ("[task.a]\ntarget = 'm:f'\nmemory = 'lots'\n", ['task "a".memory: expected a size in bytes (e.g. 1048576, 512M, 1G; from 1 to 2**63 - 1 bytes), got \'lots\'']),
        ("[task.a]\ntarget = 'm:f'\ncpus = 0.001\n", ['task "a".cpus: expected a number of CPUs from 0.01 to 100000 (e.g. 0.5, 2), got \'0.001\'']),
        # past what the kernel takes: a located error here, not a panic or a refusal when each attempt starts
        ("[task.a]\ntarget = 'm:f'\nmemory = '99999999999999G'\n", ['task "a".memory: expected a size in bytes (e.g. 1048576, 512M, 1G; from 1 to 2**63 - 1 bytes), got \'99999999999999G\'']),
        ("[task.a]\ntarget = 'm:f'\naddress_space = 9223372036854775808\n", ['task "a".address_space: expected a size in bytes (e.g. 1048576, 512M, 1G; from 1 to 2**63 - 1 bytes), got \'9223372036854775808\'']),
        ("[task.a]\ntarget = 'm:f'\ncpus = 1e9\n", ['task "a".cpus: expected a number of CPUs from 0.01 to 100000 (e.g. 0.5, 2), got \'1000000000.0\'']),
        ("[task.a]\ntarget = 'm:f'\nopen_files = 9223372036854775808\n", ['task "a".open_files: expected a whole number from 1 to 2**63 - 1, got \'9223372036854775808\'']),
        ("[task.a]\ntarget = 'm:f'\nargs = [18446744073709551616]\n", ['task "a": args[0] is out of msgpack\'s integer range']),
        ('[task.""]\ntarget = "m:f"\n', ['task "": a task\'s name must not be empty']),
        ("[task]\na = 1\n", ['task "a": expected a table ([task.a]), got an integer: 1']),
        ("task = 3\n", ["task: expected [task.NAME] tables, got an integer: 3"]),
        ("defaults = 3\n[task.a]\ntarget = 'm:f'\n", ["defaults: expected a table ([defaults]), got an integer: 3"]),
        ("", ["task: no tasks: add a [task.NAME] table for each"]),
        ("[task]\n", ["task: no tasks: add a [task.NAME] table for each"]),
        ("[tasks.a]\ntarget = 'm:f'\n", ["tasks: unknown key (did you mean task?) (a task file has [defaults] and [task.NAME] tables)",
                                          "task: no tasks: add a [task.NAME] table for each"]),
        ("[task.a]\nretries 3\n", ["line 2, column 9: Expected '=' after a key in a key/value pair: 'retries 3'"]),
        # tomllib names no key: the line says which one was given twice
        ("[task.a]\ntarget = 'm:f'\ntarget = 'm:g'\n\n", ["line 3, column 15: Cannot overwrite a value: \"target = 'm:g'\""]),
        ("a = [", ["line 1, column 6 (the end of the file): Invalid value"]),
        ("[task.a]\ncommand = ['true']\nx = [\n", ["line 4, column 1 (the end of the file): Invalid value"]),
        ("[task.a]\ntarget = 'm:f'\nargs = " + "[" * 3000 + "]" * 3000 + "\n",  # tomllib reads by recursion
         ["TOML: arrays or inline tables nested too deep to read"]),
    ],
)
def test_each_error_names_its_location_and_the_value(text, expected):
    found = errors(text)
    if expected[0].startswith('task "a": args[0]'):  # the message is msgpack's check: its words may vary
        assert len(found) == 1 and found[0].startswith('task "a": args[0]') and "msgpack" in found[0], found
        return
    assert found == expected


def test_every_error_of_a_file_is_reported_at_once_in_file_order():
    text = """
        [defaults]
        grace = -1
        retries = 3
        [task.build]
        target = "myapp.build:run"
        backoff = "x"
        timeout = "10 minutes"
        [task.deploy]
        command = ["./deploy.sh"]
        max_retries = -1
        jitter = "sometimes"
        [task.ok]
        target = "m:f"
    """
    found = errors(text)
    locations = [line.split(": ", 1)[0] for line in found]
    assert locations == ["defaults.grace", "defaults.retries", 'task "build".backoff', 'task "build".timeout',
                         'task "deploy".max_retries', 'task "deploy".jitter'], found
    assert parse_text(text).tasks[-1].name == "ok"  # the valid task is still described


def test_no_error_of_a_task_hides_another_of_the_same_task():
    """A missing cwd, a bad value, an unknown key and an argument msgpack cannot carry, in one
    task and in the next, each with its location; a [defaults] cwd that is missing is said once,
    at its own key (the tasks inheriting it say nothing more)."""
    dirs = {"/base/here"}
    text = """
        [task.one]
        target = "m:f"
        cwd = "missing"
        timeout = "10 minutes"
        args = [18446744073709551616]
        backof = 1
        [task.two]
        command = ["x", "a\\u0000b"]
        cwd = "gone"
        jitter = "sometimes"
        [task.three]
        target = "m:f"
        cwd = "here"
    """
    found = list(parse_text(text, "/base", dirs.__contains__).errors)
    assert found[:2] == ["task \"one\".cwd: no such directory: '/base/missing'",
                         'task "one".timeout: expected a finite number of seconds > 0 (leave it out for no timeout), or one with a unit (500ms, 30s, 5m, 1h), got \'10 minutes\''], found
    assert found[2] == 'task "one".backof: unknown key (did you mean backoff?)', found
    assert found[3].startswith('task "one": args[0] ') and "msgpack" in found[3], found
    assert found[4:] == ['task "two".command: [1] must not contain a NUL byte (\\u0000), which no program\'s argument can hold, got "a\\u0000b"',
                         "task \"two\".cwd: no such directory: '/base/gone'",
                         "task \"two\".jitter: expected one of none, full, equal, randomized-band, got 'sometimes'"], found
    assert [t.name for t in parse_text(text, "/base", dirs.__contains__).tasks] == ["three"]
    inherited = parse_text('[defaults]\ncwd = "nowhere"\n[task.a]\ntarget = "m:f"\n[task.b]\ncommand = ["x"]\n',
                           "/base", dirs.__contains__)
    assert inherited.errors == ("defaults.cwd: no such directory: '/base/nowhere'",)
    assert parse_text(text, "/base").errors == tuple(e for e in found if "no such directory" not in e)  # no check asked
    latin1 = parse_text('[task.a]\ncommand = ["x"]\ncwd = "missing"\n', os.fsdecode(b"/caf\xe9"), dirs.__contains__)
    assert latin1.errors == ("task \"a\".cwd: no such directory: '/caf\\xe9/missing'",)  # the byte, not '\udce9'


# --- the same as on the command line ---------------------------------------------------------------------

FLAGS = {"every": "--every", "timeout": "--timeout", "start_timeout": "--start-timeout", "cpu": "--cpu",
         "max_retries": "--max-retries", "open_files": "--open-files", "memory": "--memory", "intensity": "--intensity", "backoff": "--backoff",
         "jitter": "--jitter", "restart": "--restart"}
RETRY_OPTIONS = {"max_retries", "backoff", "jitter", "intensity"}
_numbers = st.one_of(st.integers(-3, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                     st.sampled_from([0, 0.0, -0.0, 1e-9, 1e300, 0.5, 1, 3, 30.0]))
_texts = st.text(alphabet="0123456789.:/-eKMGTiB", max_size=8)
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "every": _numbers, "timeout": _numbers, "start_timeout": _numbers, "cpu": _numbers,
    "max_retries": _numbers, "open_files": _numbers,
    "memory": st.one_of(st.integers(-1, 2**50), _texts, st.sampled_from(["512M", "1G", "1GiB", "0.5K", "1.5G"])),
    "intensity": st.one_of(_texts, st.sampled_from(["3/60", "0/1", "3/0", "-1/5", "x/y"])),
    "backoff": st.one_of(_texts, _numbers, st.sampled_from(["0.5:30", "5:1", "0.1:5:0.5", "1:2:3:4"])),
    "jitter": st.one_of(st.sampled_from(["none", "full", "equal", "randomized-band", "EQUAL", "sometimes"]), _texts),
    "restart": st.sampled_from(["never", "on-failure", "always", "maybe", ""]),
}


def cli_text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def cli_result(options: dict[str, Any]) -> tuple[Any, str | None]:
    """The spec `mpvisor run --name t OPTIONS workers.basic:quick` describes, or its error text."""
    argv = ["run", "--name", "t", *(f"{FLAGS[k]}={cli_text(v)}" for k, v in options.items()), "workers.basic:quick"]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            _, spec = parse(argv)
    except SystemExit:
        line = err.getvalue().strip()
        found = re.fullmatch(r"mpvisor run: error: argument --[a-z-]+: (.*) \(see mpvisor run --help\)", line)
        assert found, line
        return None, found[1]
    return spec, None


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(FLAGS)), st.data(), max_size=5), st.data())
def test_a_value_means_the_same_and_is_refused_alike_in_a_file_and_on_the_command_line(keys, data):
    """Each option alone: the file's error for it is the command line's, word for word. All of
    them together: a file without errors describes exactly the spec the command line builds."""
    options = {key: data.draw(VALUES[key], label=key) for key in keys}
    if "every" in options:
        options.pop("restart", None)  # the file refuses that pair; the command line lets --every win
    elif RETRY_OPTIONS & options.keys():  # without a restart both refuse them, each in its own words (the
        options["restart"] = "on-failure"  # parsing tests and the table of file errors check those)
    file_text = "[task.t]\ntarget = 'workers.basic:quick'\n" + "".join(f"{k} = {toml_text(v)}\n" for k, v in options.items())
    parsed = parse_text(file_text)
    expected_errors = []
    for key, value in options.items():
        _, message = cli_result({key: value, "restart": "on-failure"} if key in RETRY_OPTIONS else {key: value})
        if message is not None:
            expected_errors.append(f'task "t".{key}: {message}')
    assert list(parsed.errors) == expected_errors
    if not expected_errors:
        spec, message = cli_result(options)
        assert message is None and parsed.tasks[0].spec == spec


# --- anything at all -------------------------------------------------------------------------------------

_scalars = st.one_of(st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=6),
                     st.dates(), st.datetimes())
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                       max_leaves=6)
_keys = st.one_of(st.sampled_from(sorted({**SETTINGS, **TASK_ONLY, **DEFAULTS_ONLY, "name": None, "zz": None})), st.text(max_size=5))
_tables = st.dictionaries(_keys, _values, max_size=5)


@settings(max_examples=150, deadline=None)
@given(st.one_of(_tables, st.none()), st.dictionaries(st.text(max_size=5), _tables, max_size=3))
def test_any_document_gives_tasks_or_located_errors_and_never_raises(defaults, tasks):
    lines = []
    if defaults is not None:
        lines += ["[defaults]", *(f"{json.dumps(k)} = {toml_text(v)}" for k, v in defaults.items())]
    for name, table in tasks.items():
        lines += [f"[task.{json.dumps(name)}]", *(f"{json.dumps(k)} = {toml_text(v)}" for k, v in table.items())]
    parsed = parse_text("\n".join(lines) + "\n")
    prefixes = ("defaults", "task", "line ")
    assert all(error.startswith(prefixes) and ": " in error for error in parsed.errors), parsed.errors
    if parsed.ok:
        assert [t.name for t in parsed.tasks] == list(tasks)


# --- reading the file (the shell's part) ------------------------------------------------------------------


def test_loading_a_file_checks_its_cwd_and_reports_what_cannot_be_read(tmp_path):
    """A relative cwd is the file's directory's; one that is not a directory is an error; an
    unreadable or non-UTF-8 file is one error line."""
    (tmp_path / "work").mkdir()
    path = tmp_path / "tasks.toml"
    path.write_text("[task.a]\ntarget = 'm:f'\ncwd = 'work'\n[task.b]\ntarget = 'm:f'\ncwd = 'missing'\n")
    loaded = load(str(path))
    assert loaded.tasks[0].spec.task.cwd == str(tmp_path / "work")
    assert loaded.errors == (f'task "b".cwd: no such directory: {str(tmp_path / "missing")!r}',)
    assert load(str(tmp_path / "none.toml")).errors == ("cannot read the file: No such file or directory",)
    (tmp_path / "bad.toml").write_bytes(b"[task.a]\ncommand = ['true']\n" * 600 + b"# caf\xe9\n")  # latin-1, past a chunk
    (error,) = load(str(tmp_path / "bad.toml")).errors
    assert error == "cannot read the file: not UTF-8 text: line 1201, column 6: byte 0xe9 (save it as UTF-8)", error
    valid = tmp_path / "ok.toml"
    valid.write_text(ISSUE_EXAMPLE)
    assert summary("ok.toml", load(str(valid))) == "ok.toml: valid, 2 tasks: build, deploy (slot 'deploy-prod', queue)"
    assert os.path.isabs(loaded.tasks[0].spec.task.cwd or "")


def test_a_path_with_a_newline_or_an_escape_code_is_printed_escaped_as_a_reason_is(capsys):
    """`mpvisor check`, a run's summary line and `mpvisor status` print a task file's path: one
    with a newline or an escape code would break or restyle the line, so it is escaped
    (`printable`); a plain path prints as before."""
    from mpvisor._cli.batchview import summary_line
    from mpvisor._cli.status import header
    from mpvisor._cli.taskfile import TaskFile, report_errors

    parsed = parse_text("[task.a]\ncommand = ['true']\n", "/")
    assert summary("a\nb\x1b[31m.toml", parsed) == "a\\nb\\x1b[31m.toml: valid, 1 task: a"
    assert summary("a b.toml", parsed) == "a b.toml: valid, 1 task: a"
    report_errors("a\nb.toml", TaskFile((), None, ("line 1: bad",)))
    assert capsys.readouterr().err == "a\\nb.toml: line 1: bad\n"
    assert summary_line("a\nb.toml", [], 0) == "mpvisor: a\\nb.toml: 0 tasks: ; exit status 0"
    assert header({"name": "a\x1b[31m-12345678", "pid": 7, "file": "/t/a\x1b[31m.toml"}) == \
        "a\\x1b[31m-12345678  pid 7  /t/a\\x1b[31m.toml"
    assert header({"name": "a-1", "pid": 7, "file": "/t/a.toml"}) == "a-1  pid 7  /t/a.toml"


# --- `--file` on the command line ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, words",
    [
        (["run", "--file", "t.toml", "workers.basic:quick"], ["argument --file", "not both"]),
        (["run", "--file", "t.toml", "--", "true"], ["argument --file", "not both"]),
        (["run", "--file", "t.toml", "--timeout", "3"], ["argument --timeout: not with --file", "[defaults]"]),
        (["run", "--file", "t.toml", "--slot", "s"], ["argument --slot: not with --file"]),
        (["run", "--file", "t.toml", "--restart", "always"], ["argument --restart: not with --file"]),
        (["check"], ["FILE"]),
        (["run", "--file", "t.toml", "--max-concurrent", "0"], ["argument --max-concurrent", "'0'"]),
        (["run", "--file", "t.toml", "--max-concurrent", "1.5"], ["argument --max-concurrent", "'1.5'"]),
        (["run", "--max-concurrent", "2", "workers.basic:quick"], ["argument --max-concurrent", "only with --file"]),
    ],
)
def test_file_with_a_task_of_its_own_or_task_options_is_a_usage_error(argv, words):
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_, contextlib.redirect_stderr(err):
        parse(argv)
    assert exit_.value.code == 2
    (line,) = err.getvalue().splitlines()
    assert "error: " in line and all(word in line for word in words), line


def test_file_takes_the_run_options_and_check_its_file():
    args, spec = parse(["run", "--file", "t.toml", "--grace", "3", "--progress", "--events", "json"])
    assert (spec, args.file, args.grace, args.progress, args.events) == (None, "t.toml", 3.0, True, "json")
    args, spec = parse(["run", "--file", "t.toml"])
    assert args.grace is None and args.max_concurrent is None  # the file's [defaults], else 10 s and no bound
    args, spec = parse(["run", "--file", "t.toml", "--max-concurrent", "2"])
    assert args.max_concurrent == 2
    args, spec = parse(["check", "t.toml"])
    assert (args.verb, args.file, spec) == ("check", "t.toml", None)


# --- env_file ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("A=1\n", {"A": "1"}),
    ("# a comment\n\nexport A=1\n  B = two words # note\n", {"A": "1", "B": "two words"}),
    ("A='literal $X \\n # kept'\n", {"A": "literal $X \\n # kept"}),
    ('A="x\\ny \\"q\\" \\\\ \\$"\n', {"A": 'x\ny "q" \\ $'}),
    ('A="first\nsecond"\nB=2\n', {"A": "first\nsecond", "B": "2"}),
    ("A=\nB=${A}\n", {"A": "", "B": "${A}"}),  # no interpolation
    ("A=1\nA=2\n", {"A": "2"}),  # the last one wins
    ("A=a#b\n", {"A": "a#b"}),  # a comment begins with " #"
])
def test_dotenv_lines_are_read_as_docker_and_python_dotenv_read_them(text: str, expected: dict[str, str]) -> None:
    assert parse_dotenv(text) == expected


@pytest.mark.parametrize(("text", "error"), [
    ("A=1\nnonsense\n", "line 2: expected KEY=VALUE (KEY a name of letters, digits and _), got 'nonsense'"),
    ("1A=x\n", "line 1: expected KEY=VALUE (KEY a name of letters, digits and _), got '1A=x'"),
    ("A='open\n", "line 1: A: the single quote is never closed"),
    ('A="open\nstill\n', "line 1: A: the double quote is never closed"),
])
def test_a_bad_dotenv_line_is_an_error_naming_its_line(text: str, error: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_dotenv(text)
    assert str(caught.value) == error


def test_an_env_file_goes_under_the_env_tables_and_a_tasks_own_replaces_the_defaults() -> None:
    """`[defaults] env_file` for every task; a task's `env_file` instead of it; every `env`
    entry (the defaults' and the task's) wins over a file's; paths from the file's directory;
    a file that cannot be read, or a bad line, is an error at the key that names it."""
    files = {"/base/.env": "A=file\nB=file\nC=file\n", "/base/conf/own.env": "A=own\n", "/base/bad.env": "oops\n"}

    def read(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(2, "No such file or directory")
        return files[path]

    parsed = parse_text("""
        [defaults]
        env_file = ".env"
        env = {B = "defaults"}
        [task.shared]
        command = ["true"]
        env = {C = "task"}
        [task.own]
        command = ["true"]
        env_file = "conf/own.env"
    """, "/base", read_text=read)
    assert parsed.ok, parsed.errors
    shared, own = parsed.tasks
    assert shared.spec.task.env == {"A": "file", "B": "defaults", "C": "task"}
    assert own.spec.task.env == {"A": "own", "B": "defaults"}
    broken = parse_text("[task.a]\ncommand = ['true']\nenv_file = 'bad.env'\n[task.b]\ncommand = ['true']\nenv_file = 'gone.env'\n"
                        "[task.c]\ncommand = ['true']\nenv_file = 3\n", "/base", read_text=read)
    assert broken.errors == (
        "task \"a\".env_file: '/base/bad.env' line 1: expected KEY=VALUE (KEY a name of letters, digits and _), got 'oops'",
        "task \"b\".env_file: cannot read '/base/gone.env': No such file or directory",
        'task "c".env_file: expected a file name (a non-empty string), got an integer: 3',
    )


def test_a_file_that_is_not_utf8_is_an_error_at_its_line_and_column_not_a_codecs_offset(tmp_path):
    """A task file or an env file saved in Latin-1 (an editor's default elsewhere): the error
    names the line and column of the first byte that is not UTF-8, as a syntax error does (it
    gave the codec's message, a byte offset into whatever chunk was being read)."""
    (tmp_path / "latin.env").write_bytes(b"NAME=ok\nCITY=Montr\xe9al\n")
    (tmp_path / "tasks.toml").write_text("[task.a]\ncommand = ['true']\nenv_file = 'latin.env'\n")
    assert load(str(tmp_path / "tasks.toml")).errors == (
        f"task \"a\".env_file: cannot read {str(tmp_path / 'latin.env')!r}: not UTF-8 text: line 2, column 11: "
        "byte 0xe9 (save it as UTF-8)",)


# --- the keys of services -----------------------------------------------------------------------------

SERVICES = """
[defaults]
log = "logs/{task}.log"
log_backups = 3
health_interval = "5s"

[task.db]
command = ["postgres", "-D", "data"]
ready = "tcp:127.0.0.1:5432"
ready_timeout = 90

[task.api]
target = "myapp.api:serve"
after = ["db"]
ready = "notify"
watchdog = "30s"
stdout = "out/{task}.out"
log_rotate = "daily"
log_compress = true

[task.web]
command = ["web"]
after = ["api", "db", "api"]
health = "cmd:curl -fs http://127.0.0.1:8080/health"
health_failures = 5
log_max_bytes = "1M"
"""


def service_of(text: str, name: str = "a", base_dir: str = "/base") -> ServiceSettings:
    parsed = parse_text(text, base_dir)
    assert parsed.ok, parsed.errors
    return {task.name: task for task in parsed.tasks}[name].service


def test_the_keys_of_services_become_each_tasks_service_settings():
    """Checks, seconds with units, `after` (each name once, in the order given), log paths
    from the file's directory with `{task}` filled in; a task's own log path replaces all of
    the [defaults] ones (`stdout` alone: its stderr stays on the run's)."""
    parsed = parse_text(SERVICES, "/base")
    assert parsed.ok, parsed.errors
    db, api, web = parsed.tasks
    assert db.service == ServiceSettings(
        ready=Check("tcp", "tcp:127.0.0.1:5432", host="127.0.0.1", port=5432), ready_timeout=90.0, health_interval=5.0,
        logs=LogSettings("/base/logs/db.log", "/base/logs/db.log", backups=3))
    assert api.service == ServiceSettings(
        after=("db",), ready=Check("notify", "notify"), watchdog=30.0, health_interval=5.0,
        logs=LogSettings("/base/out/api.out", None, backups=3, daily=True, compress=True))
    assert api.service.notify and not db.service.notify
    assert web.service == ServiceSettings(
        after=("api", "db"), health=Check("cmd", "cmd:curl -fs http://127.0.0.1:8080/health",
                                          argv=("curl", "-fs", "http://127.0.0.1:8080/health")),
        health_failures=5, health_interval=5.0,
        logs=LogSettings("/base/logs/web.log", "/base/logs/web.log", max_bytes=2**20, backups=3))
    assert parse_text(ISSUE_EXAMPLE).tasks[0].service == ServiceSettings()  # a plain task
    assert summary("svc.toml", parsed) == "svc.toml: valid, 3 tasks: db, api (after db), web (after api, db)"
    slotted = parse_text("[task.a]\ncommand = ['x']\nslot = 's'\n[task.b]\ncommand = ['x']\nslot = 's'\nafter = ['a']\n")
    assert slotted.ok, slotted.errors  # `after` a task that has a slot
    assert summary("t.toml", slotted) == "t.toml: valid, 2 tasks: a (slot 's', queue), b (slot 's', queue; after a)"


GOOD = [
    ("ready", '"notify"', "ready", Check("notify", "notify")),
    ("ready", '"tcp:localhost:8080"', "ready", Check("tcp", "tcp:localhost:8080", host="localhost", port=8080)),
    ("ready", '"tcp:[::1]:80"', "ready", Check("tcp", "tcp:[::1]:80", host="::1", port=80)),
    ("ready", "\"cmd:pg_isready -h 'db host'\"", "ready", Check("cmd", "cmd:pg_isready -h 'db host'", argv=("pg_isready", "-h", "db host"))),
    ("ready", '"file:run/ready"', "ready", Check("file", "file:run/ready", path="/base/run/ready")),
    ("ready", '"file:/tmp/x/../ready"', "ready", Check("file", "file:/tmp/x/../ready", path="/tmp/ready")),
    ("ready", '"completed"', "ready", Check("completed", "completed")),
    ("health", '"tcp:db:5432"', "health", Check("tcp", "tcp:db:5432", host="db", port=5432)),
    ("health", '"cmd:true"', "health", Check("cmd", "cmd:true", argv=("true",))),
    ("ready_timeout", "5", "ready_timeout", 5.0),
    ("ready_timeout", "2.5", "ready_timeout", 2.5),
    ("ready_timeout", '"500ms"', "ready_timeout", 0.5),
    ("ready_timeout", '"30s"', "ready_timeout", 30.0),
    ("ready_timeout", '"5m"', "ready_timeout", 300.0),
    ("ready_timeout", '"1h"', "ready_timeout", 3600.0),
    ("ready_timeout", '"1.5h"', "ready_timeout", 5400.0),
    ("ready_timeout", '"90"', "ready_timeout", 90.0),
    ("ready_timeout", '" 10 s "', "ready_timeout", 10.0),
    ("health_interval", '"250ms"', "health_interval", 0.25),
    ("health_interval", "0.1", "health_interval", 0.1),
    ("watchdog", '"30s"', "watchdog", 30.0),
    ("watchdog", "1", "watchdog", 1.0),
    ("health_failures", "1", "health_failures", 1),
    ("health_failures", "10", "health_failures", 10),
    ("log_max_bytes", "0", "logs.max_bytes", 0),
    ("log_max_bytes", '"0"', "logs.max_bytes", 0),
    ("log_max_bytes", "1024", "logs.max_bytes", 1024),
    ("log_max_bytes", '"50M"', "logs.max_bytes", 50 * 2**20),
    ("log_max_bytes", '"1GiB"', "logs.max_bytes", 2**30),
    ("log_backups", "0", "logs.backups", 0),
    ("log_backups", "7", "logs.backups", 7),
    ("log_rotate", '"daily"', "logs.daily", True),
    ("log_rotate", '"never"', "logs.daily", False),
    ("log_compress", "true", "logs.compress", True),
    ("log_compress", "false", "logs.compress", False),
]


def _attribute(service: ServiceSettings, path: str) -> Any:
    value: Any = service
    for name in path.split("."):
        value = getattr(value, name)
    return value


@pytest.mark.parametrize("table", ["task", "defaults"])
@pytest.mark.parametrize("key, value, attribute, expected", GOOD)
def test_each_service_key_takes_its_good_values_in_a_task_and_in_the_defaults(table, key, value, attribute, expected):
    line = f"{key} = {value}\n"
    text = ("[defaults]\n" + line if table == "defaults" else "") + "[task.a]\ncommand = ['x']\nlog = 'a.log'\n"
    text += FEATURE.get(key, "") + (line if table == "task" else "")
    assert _attribute(service_of(text), attribute) == expected


FEATURE = {"ready_timeout": "ready = 'notify'\n", "health_interval": "health = 'cmd:true'\n",
           "health_failures": "health = 'cmd:true'\n"}  # (a key about a feature needs it in a task's own table)


BAD = [
    ("ready", "5", 'expected a check (a string: "notify", "tcp:HOST:PORT", "cmd:COMMAND ARGS", "file:PATH", "completed"), got an integer: 5'),
    ("ready", '""', 'expected a check (a string: "notify", "tcp:HOST:PORT", "cmd:COMMAND ARGS", "file:PATH", "completed"), got a string: ""'),
    ("ready", '"http://x"', "expected \"notify\", \"tcp:HOST:PORT\", \"cmd:COMMAND ARGS\", \"file:PATH\", \"completed\", got 'http://x'"),
    ("ready", '"notify:x"', "expected \"notify\", \"tcp:HOST:PORT\", \"cmd:COMMAND ARGS\", \"file:PATH\", \"completed\", got 'notify:x'"),
    ("ready", '"completed:x"', "expected \"notify\", \"tcp:HOST:PORT\", \"cmd:COMMAND ARGS\", \"file:PATH\", \"completed\", got 'completed:x'"),
    ("ready", '"tcp:localhost"', "'tcp:localhost': expected tcp:HOST:PORT"),
    ("ready", '"tcp:h:99999"', "'tcp:h:99999': the port must be a number from 1 to 65535, got '99999'"),
    ("ready", '"tcp::80"', "'tcp::80': no host (write tcp:127.0.0.1:80)"),
    ("ready", '"cmd:"', "'cmd:': no command after cmd:"),
    ("ready", "\"cmd:'open\"", "\"cmd:'open\": No closing quotation"),
    ("ready", '"file:"', "'file:': no path after file:"),
    ("ready", '"file:a\\u0000b"', 'a check must not hold NUL, got "file:a\\u0000b"'),
    ("health", '"notify"', "expected \"tcp:HOST:PORT\", \"cmd:COMMAND ARGS\", got 'notify'"),
    ("health", '"completed"', "expected \"tcp:HOST:PORT\", \"cmd:COMMAND ARGS\", got 'completed'"),
    ("health", '"file:x"', "expected \"tcp:HOST:PORT\", \"cmd:COMMAND ARGS\", got 'file:x'"),
    ("health", "[]", 'expected a check (a string: "tcp:HOST:PORT", "cmd:COMMAND ARGS"), got an array: []'),
    *((key, value, expected)  # as every duration of a file and of the command line is read
      for key in ("ready_timeout", "health_interval", "watchdog")
      for value, expected in (
          ("0", "expected a finite number of seconds > 0, got '0'"), ("-1", "expected a finite number of seconds > 0, got '-1'"),
          ('""', "expected a finite number of seconds > 0, got ''"),
          *((text, f"expected a finite number of seconds > 0, or one with a unit (500ms, 30s, 5m, 1h), got {text[1:-1]!r}")
            for text in ('"soon"', '"30x"', '"-5s"', '"0ms"')),
          ("nan", "expected a finite number of seconds > 0, or one with a unit (500ms, 30s, 5m, 1h), got 'nan'"),
          ("inf", "expected a finite number of seconds > 0, or one with a unit (500ms, 30s, 5m, 1h), got 'inf'"),
          ("true", "expected a number of seconds or a string with a unit (500ms, 30s, 5m, 1h), got a boolean: true"),
          ("[30]", "expected a number of seconds or a string with a unit (500ms, 30s, 5m, 1h), got an array: [30]"))),
    ("health_failures", "0", "expected a whole number >= 1, got '0'"),
    ("health_failures", "1.5", "expected a whole number >= 1, got '1.5'"),
    ("health_failures", '"3"', 'expected a whole number >= 1, got a string: "3"'),
    ("health_failures", "true", "expected a whole number >= 1, got a boolean: true"),
    ("log_max_bytes", "-1", "expected a size in bytes (e.g. 52428800, 50M, 1G) or 0 (never rotate by size), got '-1'"),
    ("log_max_bytes", '"lots"', "expected a size in bytes (e.g. 52428800, 50M, 1G) or 0 (never rotate by size), got 'lots'"),
    ("log_max_bytes", "1.5", "expected a size in bytes (e.g. 52428800, 50M, 1G) or 0 (never rotate by size), got '1.5'"),
    ("log_max_bytes", "true", 'expected a size in bytes (an integer, or a string such as "50M"), or 0, got a boolean: true'),
    ("log_backups", "-1", "expected a whole number >= 0, got '-1'"),
    ("log_backups", "1.5", "expected a whole number >= 0, got '1.5'"),
    ("log_backups", '"2"', 'expected a whole number >= 0, got a string: "2"'),
    ("log_rotate", '"weekly"', "expected one of daily, never, got 'weekly'"),
    ("log_rotate", "1", "expected a string: daily, never, got an integer: 1"),
    ("log_compress", '"yes"', 'expected a boolean (true or false), got a string: "yes"'),
    ("log_compress", "1", "expected a boolean (true or false), got an integer: 1"),
    *((key, value, message) for key in ("stdout", "stderr", "log") for value, message in (
        ('""', 'expected a file path (a non-empty string; {task} is the task\'s name), got a string: ""'),
        ("5", "expected a file path (a non-empty string; {task} is the task's name), got an integer: 5"),
        ('"logs/{name}.log"', 'unknown placeholder {name} in "logs/{name}.log" (only {task}, the task\'s name, is replaced)'),
        ('"{task}-{pid}.log"', 'unknown placeholder {pid} in "{task}-{pid}.log" (only {task}, the task\'s name, is replaced)'),
        ('"{}"', 'unknown placeholder {} in "{}" (only {task}, the task\'s name, is replaced)'),
        ('"logs/"', 'expected a file path, got a directory: "logs/" (write "logs/{task}.log")'),
    )),
]


@pytest.mark.parametrize("table", ["task", "defaults"])
@pytest.mark.parametrize("key, value, message", BAD)
def test_a_bad_value_of_a_service_key_is_an_error_at_its_key(table, key, value, message):
    line = f"{key} = {value}\n"
    path = "" if key in ("stdout", "stderr", "log") else "log = 'a.log'\n"
    if table == "task":
        text, where = f"[task.a]\ncommand = ['x']\n{path}{line}", 'task "a"'
    else:
        text, where = f"[defaults]\n{line}[task.a]\ncommand = ['x']\n{path}", "defaults"
    assert errors(text) == [f"{where}.{key}: {message}"]


@pytest.mark.parametrize("value, message", [
    ('"db"', 'expected an array of task names, got a string: "db"; write after = ["db"]'),
    ("5", "expected an array of task names (strings), got an integer: 5"),
    ('["db", 1]', "[1] must be a task name (a string), got an integer: 1"),
    ('["dbb"]', 'unknown task "dbb" (did you mean "db"?)'),
    ('["cache"]', 'unknown task "cache"'),
    ('["db", "cache", "dbx"]', 'unknown task "cache"'),
])
def test_after_names_tasks_of_the_file(value, message):
    found = errors(f"[task.db]\ncommand = ['x']\n[task.api]\ncommand = ['x']\nafter = {value}\n")
    assert found[0] == f'task "api".after: {message}', found
    if value == '["db", "cache", "dbx"]':  # each unknown name, at its task's after
        assert found == ['task "api".after: unknown task "cache"', 'task "api".after: unknown task "dbx" (did you mean "db"?)']
    else:
        assert len(found) == 1, found


@pytest.mark.parametrize("dep", ["WEBSERVER", "webServr"])
def test_an_unknown_dependency_is_told_the_task_it_meant_whatever_its_case(dep):
    """Task names keep their case: a dependency that differs from one only in case, or in case
    and a letter, is told that task (case alone once found nothing)."""
    found = errors(f"[task.WebServer]\ncommand = ['x']\n[task.api]\ncommand = ['x']\nafter = [\"{dep}\"]\n")
    assert found == [f'task "api".after: unknown task "{dep}" (did you mean "WebServer"?)'], found


def test_tasks_that_write_one_log_file_must_give_it_the_same_rotation_settings(tmp_path):
    """One file has one writer, so one set of rotation settings: a task whose settings differ
    from the first task that names the file is an error naming both; the same settings, or a
    file of its own, are fine."""
    found = errors("[task.a]\ncommand = ['x']\nlog = 'all.log'\n"
                   "[task.b]\ncommand = ['x']\nstdout = 'all.log'\nlog_max_bytes = 100\n"
                   "[task.c]\ncommand = ['x']\nlog = 'all.log'\n"
                   "[task.d]\ncommand = ['x']\nlog = 'own.log'\nlog_compress = true\n")
    assert len(found) == 1 and found[0].startswith('task "b": writes the log file ') and 'as task "a" does' in found[0], found
    assert "log_max_bytes, log_backups, log_rotate and log_compress" in found[0]
    assert errors("[defaults]\nlog = 'all.log'\nlog_backups = 2\n[task.a]\ncommand = ['x']\n[task.b]\ncommand = ['x']\n") == []


def test_after_is_a_tasks_own_key():
    assert errors("[defaults]\nafter = ['a']\n[task.a]\ncommand = ['x']\n") == [
        "defaults.after: after is a task's own key, not a default ([task.NAME])"]


@pytest.mark.parametrize("text, expected", [
    ("[task.a]\ncommand = ['x']\nafter = ['a']\n", ['task "a".after: a cycle: a -> a']),
    ("[task.a]\ncommand = ['x']\nafter = ['b']\n[task.b]\ncommand = ['x']\nafter = ['a']\n",
     ['task "a".after: a cycle: a -> b -> a']),
    # found from x, through b: still said once, at the cycle's first task in file order
    ("[task.x]\ncommand = ['x']\nafter = ['b']\n[task.a]\ncommand = ['x']\nafter = ['c']\n"
     "[task.b]\ncommand = ['x']\nafter = ['a']\n[task.c]\ncommand = ['x']\nafter = ['b']\n",
     ['task "a".after: a cycle: a -> c -> b -> a']),
    ("[task.a]\ncommand = ['x']\nafter = ['b', 'zz']\n[task.b]\ncommand = ['x']\nafter = ['a']\n",
     ['task "a".after: unknown task "zz"', 'task "a".after: a cycle: a -> b -> a']),
    # a bad value of a task's own is said at its key; the task is still in the graph
    ("[task.a]\ncommand = ['x']\nafter = ['b']\ntimeout = 0\n[task.b]\ncommand = ['x']\nafter = ['a']\n",
     ["task \"a\".timeout: expected a finite number of seconds > 0 (leave it out for no timeout), got '0'",
      'task "a".after: a cycle: a -> b -> a']),
    # cycles that share no task are each said, in the order they are found; a task after itself too
    ("[task.a]\ncommand = ['x']\nafter = ['b']\n[task.b]\ncommand = ['x']\nafter = ['a']\n"
     "[task.d]\ncommand = ['x']\nafter = ['d']\n[task.x]\ncommand = ['x']\nafter = ['y']\n"
     "[task.y]\ncommand = ['x']\nafter = ['x']\n",
     ['task "a".after: a cycle: a -> b -> a', 'task "d".after: a cycle: d -> d', 'task "x".after: a cycle: x -> y -> x']),
])
def test_a_cycle_of_after_is_one_error_at_its_first_task(text, expected):
    assert errors(text) == expected


def test_after_keeps_the_first_of_each_name_and_may_name_a_broken_task():
    assert service_of("[task.a]\ncommand = ['x']\n[task.b]\ncommand = ['x']\n"
                      "[task.c]\ncommand = ['x']\nafter = ['b', 'a', 'b', 'a']\n", "c").after == ("b", "a")
    broken = errors("[task.a]\ncommand = ['x']\ntimeout = 0\n[task.b]\ncommand = ['x']\nafter = ['a']\n")
    assert broken == ["task \"a\".timeout: expected a finite number of seconds > 0 (leave it out for no timeout), got '0'"]


def test_notify_and_a_watchdog_go_with_targets_commands_and_any_check():
    service = service_of("[task.py]\ntarget = 'm:f'\nready = 'notify'\nwatchdog = 10\n"
                         "[task.a]\ncommand = ['x']\nready = 'tcp:localhost:1'\nwatchdog = '2s'\n")
    assert (service.watchdog, service.ready, service.notify) == (2.0, Check("tcp", "tcp:localhost:1", host="localhost", port=1), True)
    assert service_of("[task.py]\ntarget = 'm:f'\nready = 'notify'\n", "py").notify


# --- log paths ---


@pytest.mark.parametrize("defaults, own, expected", [
    ("", "log = 'logs/{task}.log'", ("/base/logs/a.log", "/base/logs/a.log")),
    ("", "stdout = '/var/log/{task}/{task}.out'", ("/var/log/a/a.out", None)),
    ("", "stderr = '../{task}.err'", (None, "/a.err")),
    ("", "stdout = 'a.out'\nstderr = 'a.err'", ("/base/a.out", "/base/a.err")),
    ("log = '{task}.log'", "", ("/base/a.log", "/base/a.log")),
    ("stdout = 'o/{task}'\nstderr = 'e/{task}'", "", ("/base/o/a", "/base/e/a")),
    # a task's own path replaces all of the [defaults] ones: its other stream stays on the run's stderr
    ("log = '{task}.log'", "stdout = 'own.out'", ("/base/own.out", None)),
    ("stdout = 'o'\nstderr = 'e'", "log = 'own.log'", ("/base/own.log", "/base/own.log")),
    ("stderr = 'e'", "stdout = 'o'", ("/base/o", None)),
])
def test_log_paths_are_templates_from_the_files_directory(defaults, own, expected):
    text = f"[defaults]\n{defaults}\n[task.a]\ncommand = ['x']\n{own}\n"
    logs = service_of(text).logs
    assert logs is not None and (logs.stdout, logs.stderr) == expected


def test_log_paths_fill_in_each_tasks_own_name_and_none_means_no_log_files():
    parsed = parse_text("[defaults]\nlog = 'logs/{task}.log'\n[task.one]\ncommand = ['x']\n[task.\"two words\"]\ncommand = ['x']\n",
                        "/srv/app")
    assert [t.service.logs.stdout for t in parsed.tasks if t.service.logs] == ["/srv/app/logs/one.log", "/srv/app/logs/two words.log"]
    assert service_of("[task.a]\ncommand = ['x']\n").logs is None
    assert service_of("[task.a]\ncommand = ['x']\nlog = 'a.log'\n").logs == LogSettings("/base/a.log", "/base/a.log")  # 50 MiB, 10 kept


@pytest.mark.parametrize("text, expected", [
    ("[task.a]\ncommand = ['x']\nlog = 'a'\nstdout = 'b'\n",
     ['task "a".log: log sends both streams to one file: give either log, or stdout and stderr, not both']),
    ("[defaults]\nstderr = 'b'\nlog = 'a'\n[task.a]\ncommand = ['x']\n",
     ['defaults.log: log sends both streams to one file: give either log, or stdout and stderr, not both']),
    ("[task.a]\ncommand = ['x']\nlog_max_bytes = '1M'\nlog_rotate = 'daily'\n",
     ['task "a".log_max_bytes: there is no log file to rotate: set log, stdout or stderr',
      'task "a".log_rotate: there is no log file to rotate: set log, stdout or stderr']),
    ("[task.a]\ncommand = ['x']\nlog_backups = 2\nlog_compress = true\n",
     ['task "a".log_backups: there is no log file to rotate: set log, stdout or stderr',
      'task "a".log_compress: there is no log file to rotate: set log, stdout or stderr']),
    ("[task.a]\ncommand = ['x']\nlog_backups = -1\n", ["task \"a\".log_backups: expected a whole number >= 0, got '-1'"]),  # said once
    ("[task.a]\ncommand = ['x']\nlog = 5\nlog_backups = 2\n",  # a path given, if a bad one: that is the error
     ["task \"a\".log: expected a file path (a non-empty string; {task} is the task's name), got an integer: 5"]),
    ("[task.\"a\\u0000b\"]\ncommand = ['x']\nstdout = '{task}.out'\n",  # a name's NUL never reaches a log path
     ['task "a\\u0000b": name must be printable (no control characters or line breaks), got \'a\\x00b\'']),
])
def test_log_keys_that_cannot_apply_are_errors(text, expected):
    assert errors(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("[task.a]\ncommand = ['x']\nhealth_interval = 5\nhealth_failures = 2\n",
     ['task "a".health_interval: says how the health check runs, but the task has none: set health',
      'task "a".health_failures: says how the health check runs, but the task has none: set health']),
    ("[task.a]\ncommand = ['x']\nready_timeout = 5\n",
     ['task "a".ready_timeout: says how long readiness may take, but the task has no ready check (it is ready once '
      'started): set ready']),
    ("[task.a]\ncommand = ['x']\nready = 'completed'\nready_timeout = 5\n",
     ['task "a".ready_timeout: has no meaning with ready = "completed" (the task\'s timeout bounds an attempt)']),
    ("[defaults]\nready = 'completed'\n[task.a]\ncommand = ['x']\nready_timeout = 5\n",
     ['task "a".ready_timeout: has no meaning with ready = "completed" (the task\'s timeout bounds an attempt)']),
    ("[task.a]\ncommand = ['x']\nhealth = 'notify'\nhealth_failures = 2\n",  # a bad health: that is the error
     ["task \"a\".health: expected \"tcp:HOST:PORT\", \"cmd:COMMAND ARGS\", got 'notify'"]),
    ("[task.a]\ncommand = ['x']\nready = 'soon'\nready_timeout = 5\n",  # a bad ready: likewise
     ["task \"a\".ready: expected \"notify\", \"tcp:HOST:PORT\", \"cmd:COMMAND ARGS\", \"file:PATH\", \"completed\", got 'soon'"]),
])
def test_service_keys_about_a_check_the_task_does_not_have_are_errors(text, expected):
    """As log keys without a log file and retry keys without a restart: in a task's own table."""
    assert errors(text) == expected


def test_service_keys_in_the_defaults_apply_to_the_tasks_that_have_the_check():
    parsed = parse_text("[defaults]\nhealth_interval = 5\nhealth_failures = 2\nready_timeout = 7\n"
                        "[task.plain]\ncommand = ['x']\n[task.checked]\ncommand = ['x']\nready = 'notify'\n"
                        "health = 'cmd:true'\n[task.done]\ncommand = ['x']\nready = 'completed'\n")
    assert parsed.ok, parsed.errors
    assert parsed.tasks[1].service == ServiceSettings(ready=Check("notify", "notify"), ready_timeout=7.0,
                                                      health=Check("cmd", "cmd:true", argv=("true",)),
                                                      health_interval=5.0, health_failures=2)


@pytest.mark.parametrize("name, why", [("bad/name", 'holds "/"'), ("../up", 'holds "/"'), ("..", 'is ".."'), (".", 'is "."')])
def test_a_task_name_that_cannot_be_a_file_name_is_refused_where_task_fills_one_in(name, why):
    """`{task}` fills in a file's name: a task named `../up` would write outside `logs/`, one
    named `a/b` into a directory of its own. A path of the task's own, without `{task}`, is fine."""
    quoted = json.dumps(name)
    text = f"[defaults]\nlog = 'logs/{{task}}.log'\n[task.{quoted}]\ncommand = ['x']\n"
    assert errors(text) == [f"task {quoted}.log: {{task}} makes a file name of the task's name, which {why}: "
                            "rename the task, or give it a path of its own"]
    own = f"[task.{quoted}]\ncommand = ['x']\nstdout = 'logs/{{task}}.out'\nstderr = 'err.log'\n"
    assert errors(own) == [f"task {quoted}.stdout: {{task}} makes a file name of the task's name, which {why}: "
                           "rename the task, or give it a path of its own"]
    both = f"[task.{quoted}]\ncommand = ['x']\nstdout = '{{task}}.out'\nstderr = '{{task}}.err'\n"
    assert [e.split(":")[0] for e in errors(both)] == [f"task {quoted}.stdout", f"task {quoted}.stderr"]  # each said
    assert errors(f"[task.{quoted}]\ncommand = ['x']\nlog = 'logs/own.log'\n") == []


def test_log_keys_in_the_defaults_apply_to_the_tasks_that_have_a_path():
    parsed = parse_text("[defaults]\nlog_max_bytes = 0\nlog_backups = 2\nlog_rotate = 'daily'\nlog_compress = true\n"
                        "[task.quiet]\ncommand = ['x']\n[task.logged]\ncommand = ['x']\nstderr = 'e.log'\nlog_backups = 9\n", "/base")
    assert parsed.ok, parsed.errors
    quiet, logged = parsed.tasks
    assert quiet.service.logs is None
    assert logged.service.logs == LogSettings(None, "/base/e.log", max_bytes=0, backups=9, daily=True, compress=True)
    with_path = parse_text("[defaults]\nlog = '{task}.log'\n[task.a]\ncommand = ['x']\nlog_backups = 1\n")
    assert with_path.ok and with_path.tasks[0].service.logs is not None  # the [defaults] path is the task's


# --- a reload compares two parses, task by task ---

RELOADED = """
[defaults]
{default}
[task.db]
command = ["postgres"]
ready = "tcp:127.0.0.1:5432"
health = "tcp:127.0.0.1:5432"
health_interval = 2
[task.api]
target = "myapp.api:serve"
args = [1, {{k = [2, 3]}}]
kwargs = {{opts = {{deep = true}}}}
env = {{A = "1"}}
after = ["db"]
{api}
[task.worker]
command = ["worker"]
stdout = "{{task}}.out"
"""


def test_two_parses_of_a_file_compare_task_by_task():
    """The same text: every task equal (specs with arguments, env, checks and log settings
    compare by value). A task's own key changed: that task alone. A [defaults] key changed:
    the tasks that take it (db sets its own health_interval; worker has no log file to rotate)."""

    def tasks(default: str = "", api: str = "") -> dict[str, Any]:
        parsed = parse_text(RELOADED.format(default=default, api=api), "/base")
        assert parsed.ok, parsed.errors
        return {task.name: task for task in parsed.tasks}

    first, again = tasks(), tasks()
    assert all(first[name] == again[name] for name in first) and not diff(first, again)
    assert diff(first, tasks(api="watchdog = 5")).changed == ("api",)
    assert diff(first, tasks(api='ready = "notify"')).changed == ("api",)
    assert diff(first, tasks(default='health_interval = "30s"')).changed == ("api", "worker")
    assert diff(first, tasks(default="log_backups = 1")).changed == ("worker",)
    assert diff(tasks(default="log_backups = 1"), tasks(default="log_backups = 1")).unchanged == ("db", "api", "worker")
    checked = 'health = "cmd:true"'
    assert diff(tasks(api=checked), tasks(default="health_failures = 4", api=f"{checked}\nhealth_failures = 3")).changed == ("db", "worker")


def test_a_reload_that_only_reorders_or_repeats_the_names_of_after_changes_nothing():
    """`after` is a set of tasks: the same names in another order, or one given twice (it counts
    once), is the same task, which a reload leaves running (it was stopped and started anew);
    another name is a change. Messages keep the order the file gives."""
    text = "[task.a]\ncommand = ['a']\n[task.b]\ncommand = ['b']\n[task.c]\ncommand = ['c']\nafter = {after}\n"

    def tasks(after: str) -> dict[str, Any]:
        parsed = parse_text(text.format(after=after), "/base")
        assert parsed.ok, parsed.errors
        return {task.name: task for task in parsed.tasks}

    first = tasks('["a", "b"]')
    assert diff(first, tasks('["b", "a"]')).unchanged == ("a", "b", "c")
    assert diff(first, tasks('["b", "a", "b"]')).unchanged == ("a", "b", "c")
    assert diff(first, tasks('["a"]')).changed == ("c",)
    assert tasks('["b", "a", "b"]')["c"].service.after == ("b", "a")


# --- `mpvisor check` of a file with services ---


def test_check_reports_every_service_error_with_its_location_and_status_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "svc.toml").write_text(
        '[defaults]\nwatchdog = "30x"\n'
        '[task.db]\ncommand = ["db"]\nafter = ["api"]\nready = "tcp:localhost"\n'
        '[task.api]\ncommand = ["api"]\nafter = ["db", "cahce"]\nhealth = "notify"\nlog_backups = 2\n'
        '[task.cache]\ncommand = ["cache"]\nstdout = "logs/{name}.log"\nlog = "cache.log"\n')
    assert main(["check", "svc.toml"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "svc.toml: defaults.watchdog: expected a finite number of seconds > 0, or one with a unit (500ms, 30s, 5m, 1h), got '30x'",
        "svc.toml: task \"db\".ready: 'tcp:localhost': expected tcp:HOST:PORT",
        'svc.toml: task "db".after: a cycle: db -> api -> db',
        "svc.toml: task \"api\".health: expected \"tcp:HOST:PORT\", \"cmd:COMMAND ARGS\", got 'notify'",
        'svc.toml: task "api".after: unknown task "cahce" (did you mean "cache"?)',
        'svc.toml: task "api".log_backups: there is no log file to rotate: set log, stdout or stderr',
        'svc.toml: task "cache".stdout: unknown placeholder {name} in "logs/{name}.log" (only {task}, the task\'s name, is replaced)',
        'svc.toml: task "cache".log: log sends both streams to one file: give either log, or stdout and stderr, not both',
    ]
    (tmp_path / "ok.toml").write_text(SERVICES)
    assert main(["check", "ok.toml"]) == 0
    out, err = capsys.readouterr()  # the file's programs and module are examples: warned of, not errors
    assert out == "ok.toml: valid, 3 tasks: db, api (after db), web (after api, db)\n"
    warned = [line.partition(": warning: ")[0] for line in err.splitlines()]  # postgres and curl: where the host has them
    assert all(": warning: " in line for line in err.splitlines()), err
    assert {'ok.toml: task "api".target', 'ok.toml: task "web".command'} <= set(warned), err


def test_a_tasks_own_grace_and_a_commands_stop_signal_reach_its_spec():
    """`grace` in a task's own table is that task's (`TaskSpec.grace`), in [defaults] the run's;
    `stop_signal` is a command's (`CommandTask.stop_signal`), and a [defaults] one reaches the
    commands only, as a name or a number."""
    parsed = parse_text("""
        [defaults]
        grace = 3
        stop_signal = "quit"
        [task.web]
        command = ["nginx"]
        grace = "1m"
        [task.db]
        command = ["postgres"]
        stop_signal = 2
        [task.job]
        target = "workers.basic:quick"
    """.replace("\n        ", "\n"))
    assert parsed.ok, parsed.errors
    web, db, job = (task.spec for task in parsed.tasks)
    assert parsed.grace == 3.0
    assert (web.grace, db.grace, job.grace) == (60.0, None, None)
    assert isinstance(web.task, CommandTask) and web.task.stop_signal is signal.SIGQUIT
    assert isinstance(db.task, CommandTask) and db.task.stop_signal is signal.SIGINT
    assert isinstance(job.task, TaskFn)
