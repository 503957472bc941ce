"""Task files, without processes: what a file describes, every error with its location, and the
promise that a value means the same (and is refused with the same words) in a file as on the
command line (a property test against the real `mpvisor run` parser)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpvisor import BackoffPolicy, JitterPolicy, Limits, RestartIntensity, RestartPolicy
from mpvisor._cli.main import parse
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
        ("[task.a]\ntarget = 'm:f'\ngrace = 1\n", ['task "a".grace: grace is the whole run\'s: set it in [defaults]']),
        ("[defaults]\ntarget = 'm:f'\n[task.a]\ntarget = 'm:f'\n", ["defaults.target: target is a task's own key, not a default ([task.NAME])"]),
        ("[defaults]\ngrace = -1\n[task.a]\ntarget = 'm:f'\n", ["defaults.grace: expected a finite number of seconds >= 0, got '-1'"]),
        ("[defaults]\ngrace = 'soon'\n[task.a]\ntarget = 'm:f'\n", ['defaults.grace: expected a number of seconds, got a string: "soon"']),
        ("[defaults]\nmax_concurrent = 0\n[task.a]\ntarget = 'm:f'\n", ["defaults.max_concurrent: expected a whole number >= 1, got '0'"]),
        ("[defaults]\nslots = 'mysql://db/x'\n[task.a]\ntarget = 'm:f'\n", ["defaults.slots: expected a postgresql:// URL, got 'mysql://db/x'"]),
        ("[defaults]\nslots = 5\n[task.a]\ntarget = 'm:f'\n", ['defaults.slots: expected a string "postgresql://USER@HOST/DB", got an integer: 5']),
        ("[defaults]\nlease_ttl = 1\n[task.a]\ntarget = 'm:f'\n", ["defaults.lease_ttl: expected a finite number of seconds >= 2, got '1'"]),
        ("[defaults]\nwait_timeout = 0\n[task.a]\ntarget = 'm:f'\n", ["defaults.wait_timeout: expected a finite number of seconds > 0, got '0'"]),
        ("[task.a]\ntarget = 'm:f'\nslots = 'postgresql://db/x'\n", ['task "a".slots: slots is the whole run\'s: set it in [defaults]']),
        ("[defaults]\nmax_concurrent = -2\n[task.a]\ntarget = 'm:f'\n", ["defaults.max_concurrent: expected a whole number >= 1, got '-2'"]),
        ("[defaults]\nmax_concurrent = 1.5\n[task.a]\ntarget = 'm:f'\n", ["defaults.max_concurrent: expected a whole number >= 1, got '1.5'"]),
        ("[defaults]\nmax_concurrent = '2'\n[task.a]\ntarget = 'm:f'\n", ['defaults.max_concurrent: expected a whole number >= 1, got a string: "2"']),
        ("[defaults]\nmax_concurrent = true\n[task.a]\ntarget = 'm:f'\n", ["defaults.max_concurrent: expected a whole number >= 1, got a boolean: true"]),
        ("[task.a]\ntarget = 'm:f'\nmax_concurrent = 2\n", ['task "a".max_concurrent: max_concurrent is the whole run\'s: set it in [defaults]']),
        ("[task.a]\ntarget = 'm:f'\ntimeout = '600'\n", ['task "a".timeout: expected a number of seconds, got a string: "600"']),
        ("[task.a]\ntarget = 'm:f'\ntimeout = 0\n", ['task "a".timeout: expected a finite number of seconds > 0 (leave it out for no timeout), got \'0\'']),
        ("[task.a]\ntarget = 'm:f'\nmax_retries = true\n", ['task "a".max_retries: expected a whole number >= 0, got a boolean: true']),
        ("[task.a]\ntarget = 'm:f'\nmax_retries = 1.5\n", ['task "a".max_retries: expected a whole number >= 0, got \'1.5\'']),
        ("[task.a]\ntarget = 'm:f'\nbackoff = 'x'\n", ['task "a".backoff: expected FIRST[:MAX[:FACTOR]] as finite numbers, got \'x\'']),
        ("[task.a]\ntarget = 'm:f'\nbackoff = '5:1'\n", ['task "a".backoff: first (5.0) must not exceed max (1.0) (in \'5:1\')']),
        ("[task.a]\ntarget = 'm:f'\nrestart = 'maybe'\n", ['task "a".restart: expected one of never, on-failure, always, got \'maybe\'']),
        ("[task.a]\ntarget = 'm:f'\npolicy = 'queue'\n", ['task "a".policy: needs slot (the slot whose admission the policy decides)']),
        ("[task.a]\ntarget = 'm:f'\nslot = ''\n", ['task "a".slot: expected a non-empty slot name, got \'\'']),
        ("[task.a]\ntarget = 'm:f'\nevery = 5\nrestart = 'never'\n",
         ['task "a".every: makes the task run again after each success: it needs restart = "always" or no restart, got restart = "never"']),
        ("[task.a]\ntarget = 'nope'\n", ["task \"a\".target: target must have the form 'package.module:attr' (dotted identifiers, exactly one colon), got 'nope'"]),
        ("[task.a]\ntarget = 'm:f'\ncommand = ['x']\n", ['task "a": give either target (a Python function) or command (a program), not both']),
        ("[task.a]\ntimeout = 1\n", ['task "a": give either target (a Python function) or command (a program)']),
        ("[task.a]\ncommand = './deploy.sh prod'\n",
         ['task "a".command: expected an array of strings (the program and its arguments), got a string: "./deploy.sh prod"; write command = ["./deploy.sh", "prod"]']),
        ("[task.a]\ncommand = []\n", ['task "a".command: expected a non-empty array of strings (the program and its arguments), got an array: []']),
        ("[task.a]\ncommand = ['x', 1]\n", ['task "a".command: [1] must be a string, got an integer: 1']),
        ("[task.a]\ncommand = ['x']\nargs = [1]\n", ['task "a".args: args is for a Python target; a command\'s arguments are the rest of its command array']),
        ("[task.a]\ntarget = 'm:f'\nargs = [1979-05-27]\n", ['task "a".args: [0] is a TOML date/time, which is not a msgpack value; quote it to pass it as a string']),
        ("[task.a]\ntarget = 'm:f'\nargs = 3\n", ['task "a".args: expected an array of arguments, got an integer: 3']),
        ("[task.a]\ntarget = 'm:f'\nenv = {A = 1}\n", ['task "a".env: A must be a string, or false to remove it, got an integer: 1']),
        ("[task.a]\ntarget = 'm:f'\nenv = {A = true}\n", ['task "a".env: A must be a string, or false to remove it, got a boolean: true']),
        ("[task.a]\ntarget = 'm:f'\nenv = {'A=B' = '1'}\n", ['task "a".env: "A=B": not a valid environment variable (a non-empty name without \'=\' or NUL)']),
        ("[task.a]\ntarget = 'm:f'\ncwd = ''\n", ['task "a".cwd: expected a directory (a non-empty string), got a string: ""']),
        ("[task.a]\ntarget = 'm:f'\nmemory = 'lots'\n", ['task "a".memory: expected a size in bytes (e.g. 1048576, 512M, 1G), got \'lots\'']),
        ("[task.a]\ntarget = 'm:f'\ncpus = 0.001\n", ['task "a".cpus: expected a number of CPUs >= 0.01 (e.g. 0.5, 2), got \'0.001\'']),
        ("[task.a]\ntarget = 'm:f'\nargs = [18446744073709551616]\n", ['task "a": args[0] is out of msgpack\'s integer range']),
        ('[task.""]\ntarget = "m:f"\n', ['task "": a task\'s name must not be empty']),
        ("[task]\na = 1\n", ['task "a": expected a table ([task.a]), got an integer: 1']),
        ("task = 3\n", ["task: expected [task.NAME] tables, got an integer: 3"]),
        ("defaults = 3\n[task.a]\ntarget = 'm:f'\n", ["defaults: expected a table ([defaults]), got an integer: 3"]),
        ("", ["task: no tasks: add a [task.NAME] table for each"]),
        ("[task]\n", ["task: no tasks: add a [task.NAME] table for each"]),
        ("[tasks.a]\ntarget = 'm:f'\n", ["tasks: unknown key (did you mean task?) (a task file has [defaults] and [task.NAME] tables)",
                                          "task: no tasks: add a [task.NAME] table for each"]),
        ("[task.a]\nretries 3\n", ["line 2, column 9: Expected '=' after a key in a key/value pair"]),
        ("[task.a]\ntarget = 'm:f'\ntarget = 'm:g'\n\n", ["line 3, column 15: Cannot overwrite a value"]),
        ("a = [", ["end of document: Invalid value"]),
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
        timeout = "600"
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
        timeout = "600"
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
                         'task "one".timeout: expected a number of seconds, got a string: "600"'], found
    assert found[2] == 'task "one".backof: unknown key (did you mean backoff?)', found
    assert found[3].startswith('task "one": args[0] ') and "msgpack" in found[3], found
    assert found[4:] == ["task \"two\".cwd: no such directory: '/base/gone'",
                         "task \"two\".jitter: expected one of none, full, equal, randomized-band, got 'sometimes'",
                         "task \"two\": argv[1] must not contain a NUL byte, got 'a\\x00b'"], found
    assert [t.name for t in parse_text(text, "/base", dirs.__contains__).tasks] == ["three"]
    inherited = parse_text('[defaults]\ncwd = "nowhere"\n[task.a]\ntarget = "m:f"\n[task.b]\ncommand = ["x"]\n',
                           "/base", dirs.__contains__)
    assert inherited.errors == ("defaults.cwd: no such directory: '/base/nowhere'",)
    assert parse_text(text, "/base").errors == tuple(e for e in found if "no such directory" not in e)  # no check asked


# --- the same as on the command line ---------------------------------------------------------------------

FLAGS = {"every": "--every", "timeout": "--timeout", "start_timeout": "--start-timeout", "cpu": "--cpu",
         "max_retries": "--max-retries", "open_files": "--open-files", "memory": "--memory", "intensity": "--intensity", "backoff": "--backoff",
         "jitter": "--jitter", "restart": "--restart"}
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
    file_text = "[task.t]\ntarget = 'workers.basic:quick'\n" + "".join(f"{k} = {toml_text(v)}\n" for k, v in options.items())
    parsed = parse_text(file_text)
    expected_errors = []
    for key, value in options.items():
        _, message = cli_result({key: value})
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
    prefixes = ("defaults", "task", "line ", "end of document")
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
    (tmp_path / "bad.toml").write_bytes(b"a = '\xff'\n")
    (error,) = load(str(tmp_path / "bad.toml")).errors
    assert error.startswith("cannot read the file: 'utf-8' codec can't decode byte 0xff"), error
    valid = tmp_path / "ok.toml"
    valid.write_text(ISSUE_EXAMPLE)
    assert summary("ok.toml", load(str(valid))) == "ok.toml: valid, 2 tasks: build, deploy (slot 'deploy-prod', queue)"
    assert os.path.isabs(loaded.tasks[0].spec.task.cwd or "")


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
