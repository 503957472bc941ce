"""The command line's pure parts: option values, ARGs, exit statuses, the value and outcome lines.

Everything here runs in-process (no launcher, no child): `parse` either returns or raises the
`SystemExit(2)` of a one-line usage error."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal

import pytest

from mpvisor import BackoffPolicy, JitterPolicy, OutcomeKind, RejectionKind, TaskOutcome
from mpvisor._cli.main import parse, version
from mpvisor._cli.options import outcome_line, parse_arg, slot_name, task_name, value_line
from mpvisor._cli.statuses import RESERVED, exit_status
from mpvisor._model.events import REASON_MAX, shorten

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


# --- ARGs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("3", 3), ("-2", -2), ("1.5", 1.5), ("1e3", 1000.0), ("true", True), ("null", None),
        ('"x"', "x"), ('"NaN"', "NaN"), ("[1]", [1]), ('{"a": [1, 2]}', {"a": [1, 2]}),
        ("hello", "hello"), ("a b", "a b"), ("2024-01-01", "2024-01-01"), ("1.2.3", "1.2.3"),
        ("True", "True"), ("", ""), ("-", "-"), ("0x10", "0x10"),
    ],
)
def test_an_arg_is_a_json_literal_or_a_bare_word(text, value):
    """JSON literals parse; a text not meant as JSON stays the string it is."""
    assert parse_arg(text) == value


@pytest.mark.parametrize(
    "text", ["{bad json", "[1,", '"open', "NaN", "Infinity", "[NaN]", '{"a": Infinity}',
             "nan", "inf", "01", "+1", "1_000", "1e999999", " {"],
)
def test_an_arg_meant_as_json_that_does_not_parse_is_a_usage_error(text, capsys):
    """A text that starts like JSON, or reads as a number, must be valid JSON (no NaN/Infinity)."""
    with pytest.raises(SystemExit) as exit_:
        parse(["run", "workers.basic:echo", "ok", text])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("mpvisor run: error: argument ARG: ") and repr(text) in line, line


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_an_arg_nested_deeper_than_json_parses_is_a_usage_error(text, capsys):
    """Thousands of nested brackets are a one-line usage error, the text cut (they raised
    RecursionError: a traceback and status 1)."""
    with pytest.raises(SystemExit) as exit_:
        parse(["run", "workers.basic:echo", text])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("mpvisor run: error: argument ARG: not a JSON literal (nested too deep): ") and len(line) < 200, line


@pytest.mark.parametrize(
    "text, what",
    [("nan", "a number, and JSON has no NaN"), ("NaN", "a number, and JSON has no NaN"), ("+nan", "a number, and JSON has no NaN"),
     ("inf", "a number, and JSON has no infinity"), ("Infinity", "a number, and JSON has no infinity"),
     ("infinity", "a number, and JSON has no infinity"), (" INF ", "a number, and JSON has no infinity"),
     ("1e999", "a number beyond a float's range, and JSON has no infinity")],
)
def test_nan_and_infinities_in_any_spelling_get_one_message_saying_how_to_give_the_string(text, what, capsys):
    """Every text `float()` reads as NaN or an infinity is refused alike (`nan` and `inf` said
    `Expecting value: line 1 column 1 (char 0)`), and the message says how to pass the string."""
    with pytest.raises(SystemExit) as exit_:
        parse(["run", "workers.basic:echo", text])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"mpvisor run: error: argument ARG: {text!r} reads as {what}; "
                           f"quote it (\'{json.dumps(text)}\') for the string"), line
    assert parse(["run", "workers.basic:echo", json.dumps(text)])[1].task.args == (text,)  # quoted: the string


# --- option values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, option, value",
    [
        (["--grace", "-1"], "--grace", "-1"),
        (["--grace", "nan"], "--grace", "nan"),
        (["--grace", "inf"], "--grace", "inf"),
        (["--grace", "soon"], "--grace", "soon"),
        (["--every", "0"], "--every", "0"),
        (["--every", "-5"], "--every", "-5"),
        (["--every", "nan"], "--every", "nan"),
        (["--timeout", "0"], "--timeout", "0"),
        (["--timeout", "-0.5"], "--timeout", "-0.5"),
        (["--timeout", "1e400"], "--timeout", "1e400"),
        (["--backoff", "x"], "--backoff", "x"),
        (["--backoff", "1:2:3:4"], "--backoff", "1:2:3:4"),
        (["--backoff", "-1"], "--backoff", "-1"),
        (["--backoff", "5:1"], "--backoff", "5:1"),
        (["--backoff", "0.1:5:0.5"], "--backoff", "0.1:5:0.5"),
        (["--backoff", "nan"], "--backoff", "nan"),
        (["--jitter", "sometimes"], "--jitter", "sometimes"),
        (["--max-retries", "-1"], "--max-retries", "-1"),
        (["--max-retries", "1.5"], "--max-retries", "1.5"),
        (["--name", ""], "--name", ""),
        (["--restart", "maybe"], "--restart", "maybe"),
        (["--events", "xml"], "--events", "xml"),
        (["--intensity", "-1/5"], "--intensity", "-1/5"),  # a value that starts with "-", not an option
        (["--backoff", "-1:5"], "--backoff", "-1:5"),
        (["--memory", "-5M"], "--memory", "-5M"),
        (["--memory", "99999999999999999999999"], "--memory", "99999999999999999999999"),  # past what the kernel takes
        (["--memory", "9223372036854775808"], "--memory", "9223372036854775808"),  # 2**63
        (["--address-space", "99999999999999999999G"], "--address-space", "99999999999999999999G"),
        (["--cpus", "1e9"], "--cpus", "1e9"),
        (["--cpus", "100000.5"], "--cpus", "100000.5"),
        (["--open-files", "99999999999999999999999"], "--open-files", "99999999999999999999999"),
        (["--cpu", "-.5"], "--cpu", "-.5"),
        (["--max-retries", "-1.5"], "--max-retries", "-1.5"),
    ],
)
def test_a_bad_option_value_is_one_usage_line_naming_option_and_value(argv, option, value, capsys):
    """Status 2, one line on stderr, `mpvisor run: error: argument <option>: ... <value>`."""
    with pytest.raises(SystemExit) as exit_:
        parse(["run", *argv, "workers.basic:quick"])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"mpvisor run: error: argument {option}: "), line
    assert repr(value) in line, line


@pytest.mark.parametrize(
    "argv, words",
    [
        (["run", "os:"], ["argument TARGET", "'os:'"]),  # a colon: a target, no hint
        (["run", ":getpid"], ["argument TARGET", "':getpid'"]),
        (["run", "os.getpid"], ["argument TARGET", "'os.getpid'", "(a program? put -- before it: mpvisor run -- os.getpid ...)"]),
        (["run", "./deploy.sh", "prod"], ["argument TARGET", "put -- before it: mpvisor run -- ./deploy.sh ..."]),
        (["run", "my script"], ["mpvisor run -- 'my script' ..."]),
        # a task file's name: how to run the file, not a program (it said `put -- before it`)
        (["run", "tasks.toml"], ["argument TARGET", "'tasks.toml' (a task file? mpvisor run --file tasks.toml)"]),
        (["run", "my Tasks.TOML", "--grace", "5"], ["(a task file? mpvisor run --file 'my Tasks.TOML')"]),
        # a Python file's path for a target: its module's name, or the file run as a program (not `-- ./jobs.py`,
        # which a file without its executable bit refuses, 126)
        (["run", "./jobs.py"], ["'./jobs.py' (a Python file? a function of it: mpvisor run jobs:FUNCTION, from its "
                                "directory; or the file as a program: mpvisor run -- python3 ./jobs.py ...)"]),
        # a file's name where a command's is expected: what `mpvisor run` would say of it
        (["tasks.toml"], ["invalid choice: 'tasks.toml' (a task file? mpvisor run --file tasks.toml; choose from 'run'"]),
        (["jobs.py"], ["invalid choice: 'jobs.py' (a Python file? a function of it: mpvisor run jobs:FUNCTION, from its "
                       "directory; or the file as a program: mpvisor run -- python3 jobs.py ...; choose from 'run'"]),
        # a program given without `--`: its options are its own, not misspelt ones of mpvisor's
        (["run", "ls", "-la"], ["argument TARGET", "'ls'", "(a program? put -- before it: mpvisor run -- ls ...)"]),
        (["run", "git", "log", "--oneline"], ["argument TARGET", "'git'", "put -- before it: mpvisor run -- git ..."]),
        (["run"], ["TARGET [ARG...] or -- COMMAND"]),
        (["run", "workers.basic:quick", "--", "true"], ["TARGET [ARG...] or -- COMMAND"]),
        (["run", "workers.basic:echo", str(2**64)], ["args[0]", "msgpack"]),
        (["run", "workers.basic:echo", "-Infinity"], ["unrecognized arguments: -Infinity"]),
        # a misspelt option is named (with the option it resembles), not the value it left behind as TARGET
        (["run", "--timout", "5", "--", "true"], ["unrecognized arguments: --timout (did you mean --timeout?)"]),
        (["run", "-t", "5", "workers.basic:echo", "nan"], ["unrecognized arguments: -t "]),
        (["status", "--jsn"], ["mpvisor status: error: unrecognized arguments: --jsn (did you mean --json?)"]),
        # mpvisor's own option after the command: where it goes, not a command option it resembles (`--every`)
        (["run", "--ver", "--", "true"], ["mpvisor run: error: unrecognized arguments: --ver "
                                          "(--version is an option of mpvisor itself: mpvisor --version)"]),
        (["check", "--version", "x.toml"], ["(--version is an option of mpvisor itself: mpvisor --version)"]),
        (["--bogus", "run", "--", "true"], ["mpvisor: error: unrecognized arguments: --bogus"]),  # (a traceback)
        # an option's beginning is no option (`--ever 5` was `--every 5`: a task that runs forever)
        (["run", "--ever", "5", "--", "true"], ["unrecognized arguments: --ever", "(did you mean --every?)"]),
        (["run", "--max-retr", "2", "--restart", "always", "--", "true"], ["unrecognized arguments: --max-retr "]),
        (["slots", "--js"], ["mpvisor slots: error: unrecognized arguments: --js (did you mean --json?)"]),
        (["--vers"], ["mpvisor: error: unrecognized arguments: --vers (did you mean --version?)"]),  # (COMMAND missing)
        (["--bogus"], ["mpvisor: error: unrecognized arguments: --bogus"]),
        # a command's option before the command: where it goes (argparse said "invalid choice: 'x'", the option's value)
        (["--slot", "x", "run", "--", "true"], ["mpvisor: error: --slot is an option of mpvisor run: it goes after "
                                                "the command (mpvisor run --slot ...)"]),
        (["--time=5", "run", "--", "true"], ["mpvisor: error: --timeout is an option of mpvisor run"]),
        (["--json", "slots"], ["mpvisor: error: --json is an option of mpvisor slots"]),
        (["run", "--intensity", "3", "workers.basic:quick"], ["--intensity", "N/SECONDS", "'3'"]),
        (["run", "--intensity=-1/5", "workers.basic:quick"], ["--intensity", "'-1/5'"]),
        (["run", "--intensity", "3/0", "workers.basic:quick"], ["--intensity", "'3/0'"]),
        (["run", "--policy", "drop", "workers.basic:quick"], ["--policy", "needs --slot"]),
        (["run", "--wait-timeout", "5", "workers.basic:quick"], ["--wait-timeout", "needs --slot"]),
        (["run", "--lease-ttl", "30", "workers.basic:quick"], ["--lease-ttl", "needs --slot"]),
        (["run", "--slot", "s", "--lease-ttl", "1", "workers.basic:quick"], ["--lease-ttl", ">= 2", "'1'"]),
        (["run", "--slots", "postgresql://db/x", "--", "true"], ["argument --slots: needs --slot"]),  # (it ran, unslotted)
        (["run", "--slot", "s", "--lease-ttl", "30", "--", "true"], ["argument --lease-ttl", "needs --slots URL"]),
        (["run", "--slot", "s", "--wait-timeout", "0", "workers.basic:quick"], ["--wait-timeout", "'0'"]),
        (["run", "--slot", "s", "--slots", "mysql://x/y", "workers.basic:quick"], ["--slots", "'mysql://x/y'"]),
        (["run", "--memory", "lots", "workers.basic:quick"], ["--memory", "'lots'"]),
        (["run", "--memory", "0.0001K", "workers.basic:quick"], ["--memory", "'0.0001K'"]),
        (["run", "--ray", "foo", "--", "true"], ["--ray", "'foo'", "HOST:PORT"]),  # Ray itself would be reached (exit 1)
        (["run", "--ray", "head:99999", "--", "true"], ["--ray", "'head:99999'"]),
        (["run", "--open-files", "0", "workers.basic:quick"], ["--open-files", "'0'"]),
        (["run", "--cpu", "0", "workers.basic:quick"], ["--cpu", "'0'"]),
        (["run", "--every", "1", "--restart", "never", "--", "true"], ["argument --every", "--restart never"]),
        (["run", "--every", "1", "--restart", "on-failure", "--", "true"], ["argument --every", "--restart on-failure"]),
        (["run", "--max-retries", "3", "--", "true"], ["argument --max-retries", "runs once", "--restart on-failure or always"]),
        (["run", "--restart", "never", "--backoff", "1", "--", "true"], ["argument --backoff", "runs once"]),
        (["run", "--jitter", "full", "--", "true"], ["argument --jitter", "runs once"]),
        (["run", "--intensity", "3/5", "workers.basic:quick"], ["argument --intensity", "runs once"]),
        (["run", "--restart", "on-failure", "--backoff", "1x", "--", "true"], ["argument --backoff", "500ms", "'1x'"]),
        (["run", "--restart", "on-failure", "--intensity", "3/1d", "--", "true"], ["argument --intensity", "'3/1d'"]),
        ([], ["COMMAND"]),
        (["run", "--", ""], ["argument COMMAND: expected a program to run, got ''"]),
        (["run", "--name", "x", "--", "", "a"], ["argument COMMAND: expected a program to run, got ''"]),
        (["run", "--slot", "-x", "--", "true"], ["argument --slot: expected one argument", "written --slot=VALUE"]),
        (["slots", "serve", "--dir", ""], ["argument --dir: expected a directory, got ''"]),  # it served the default
        # a misspelt command (or choice) is named with the one it resembles, as a misspelt option is
        (["rnu", "--", "true"], ["argument COMMAND: invalid choice: 'rnu' (did you mean run? choose from 'run', 'check'"]),
        (["Status"], ["invalid choice: 'Status' (did you mean status? choose from"]),
        (["slots", "sevre"], ["mpvisor slots: error: argument [COMMAND]: invalid choice: 'sevre' (did you mean serve?"]),
        (["run", "--events", "JSON", "--", "true"], ["argument --events: expected one of json, log, none, got 'JSON' "
                                                     "(did you mean json?)"]),
        (["run", "--restart", "on_failure", "--", "true"], ["argument --restart: expected one of never, on-failure, "
                                                            "always, got 'on_failure' (did you mean on-failure?)"]),
        (["run", "--events", "xml", "--", "true"], ["argument --events: expected one of json, log, none, got 'xml' (see"]),
        # a jitter's name as every other choice's: as given (it was upper-cased, so FULL passed where JSON did not)
        (["run", "--restart", "on-failure", "--jitter", "FULL", "--", "true"],
         ["argument --jitter: expected one of none, full, equal, randomized-band, got 'FULL' (did you mean full?)"]),
        (["run", "--restart", "on-failure", "--jitter", "randomized_band", "--", "true"],
         ["got 'randomized_band' (did you mean randomized-band?)"]),
        (["zzz"], ["invalid choice: 'zzz' (choose from 'run', "]),
    ],
)
def test_a_bad_target_or_shape_is_one_usage_line_naming_it(argv, words, capsys):
    """A malformed TARGET is named as given (not as an empty task name)."""
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "error: " in line and all(word in line for word in words), line
    assert ("a program?" in line) == (argv[:1] == ["run"] and len(argv) > 1 and ":" not in argv[1]
                                      and not argv[1].startswith("-") and not argv[1].lower().endswith(".toml")
                                      and not argv[1].endswith(".py")), line


@pytest.mark.parametrize(("argv", "variable", "said"), [
    (["run", "--slot", "s", "--slots", "postgresql://h/db", "--", "true"], None, "mpvisor run: error: argument --slots: "),
    (["run", "--slot", "s", "--", "true"], "postgresql://h/db", "mpvisor run: error: $MPVISOR_SLOTS: "),
    (["run", "--file", "x.toml", "--slots", "postgresql://h/db"], None, "mpvisor run: error: argument --slots: "),
    (["slots", "--slots", "postgresql://h/db"], None, "mpvisor slots: error: argument --slots: "),
    (["slots"], "postgresql://h/db", "mpvisor slots: error: $MPVISOR_SLOTS: "),
])
def test_a_postgresql_store_without_psycopg_is_a_usage_error_as_ray_without_ray_is(argv, variable, said, monkeypatch,
                                                                                  capsys):
    """Where psycopg is not installed, `--slots URL` (or `$MPVISOR_SLOTS`) is refused before
    anything runs, status 2, naming the option (or the variable) and the extra to install, as
    `--ray` is without Ray: it was a task `rejected` after its start, status 1 (and `mpvisor
    slots`' error status 1)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "psycopg" else real(name, *a))
    if variable is not None:
        monkeypatch.setenv("MPVISOR_SLOTS", variable)
    else:
        monkeypatch.delenv("MPVISOR_SLOTS", raising=False)
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    (line,) = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 2 and line.startswith(said + "psycopg is not installed here"), line
    assert "install the `postgres` extra (`pip install '.[postgres]'` in a checkout)" in line, line


def test_an_unknown_option_is_guessed_first_as_the_start_of_one_then_by_spelling():
    """`--ver` begins `--version` (mpvisor's own): that, not `--every`, which it resembles."""
    from mpvisor._cli.shell import hints

    known, outer = ["--every", "--timeout", "--help"], ["--version"]
    assert hints(["--ver"], known, outer) == "--version is an option of mpvisor itself: mpvisor --version"
    assert hints(["--ever"], known, outer) == "did you mean --every?"
    assert hints(["--timout=5", "--verison"], known, outer) == \
        "did you mean --timeout?; --version is an option of mpvisor itself: mpvisor --version"
    assert hints(["--zzz", "-t"], known, outer) == ""


def test_an_unknown_option_or_key_that_adds_words_to_one_is_guessed_as_that_one(tmp_path):
    """`--cpu-time` and `--cpu-seconds` add words to `--cpu` (the Python API calls that limit
    `cpu_seconds`), which no spelling rule found: the hint names `--cpu`; so a task file's
    `cpu_seconds` names `cpu`. The longest stem wins; a word that only shares a start gets none."""
    from mpvisor._cli.shell import hints, stem
    from mpvisor._cli.taskfile import load

    known = ["--cpu", "--cpus", "--memory", "--slot", "--slots"]
    assert hints(["--cpu-time", "--cpu-seconds=1"], known, []) == "did you mean --cpu?"
    assert stem("--slots-url", known) == "--slots" and stem("--cputime", known) is None
    (tmp_path / "t.toml").write_text("[task.a]\ncommand = ['true']\ncpu_seconds = 3\nmemory_limit = '1G'\n")
    assert load(str(tmp_path / "t.toml")).errors == ('task "a".cpu_seconds: unknown key (did you mean cpu?)',
                                                    'task "a".memory_limit: unknown key (did you mean memory?)')


def test_a_task_files_key_that_leaves_letters_out_of_one_is_guessed_as_that_one(tmp_path):
    """`cmd` leaves letters out of `command`: the hint names `command`, not `cwd`, which is closer
    by spelling; a word that could shorten two keys, or whose first letter differs, gets the
    spelling rule's guess."""
    from mpvisor._cli.shell import abbreviated
    from mpvisor._cli.taskfile import load

    assert abbreviated("cmd", ["cwd", "command", "cpu"]) == "command"
    assert abbreviated("md", ["command"]) is None and abbreviated("c", ["command"]) is None
    assert abbreviated("cm", ["command", "comment"]) is None  # either
    assert abbreviated("cwd", ["cwd", "command"]) is None  # itself, not a shortening
    (tmp_path / "t.toml").write_text("[task.a]\ncmd = ['true']\n")
    errors = load(str(tmp_path / "t.toml")).errors
    assert 'task "a".cmd: unknown key (did you mean command?)' in errors, errors


def test_an_option_left_without_a_value_hints_at_the_equals_form_only_when_an_option_like_word_followed(capsys):
    with pytest.raises(SystemExit):
        parse(["run", "workers.basic:quick", "--slot"])
    assert "--slot=VALUE" not in capsys.readouterr().err  # nothing followed: no value to write otherwise


def test_a_word_starting_with_a_dash_and_a_digit_is_a_value_an_arg_included():
    _, spec = parse(["run", "workers.basic:echo", "-1/5", "-2", "-.5x"])
    assert spec.task.args == ("-1/5", -2, "-.5x")
    _, slotted = parse(["run", "--slot=-x", "--", "true"])  # the equals form takes any value
    assert slotted.name == "true"


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["check", "--", "-x.toml"], "file", "-x.toml"),
        (["status", "--json", "--", "-x.toml"], "file", "-x.toml"),
        (["logs", "--", "-web", "-x.toml"], "task", "-web"),
    ],
)
def test_a_double_dash_ends_the_options_of_a_command_that_takes_no_command(argv, dest, value):
    """`--` before a word that starts with a dash makes it the positional it is, as for any
    POSIX command (only `run` takes a COMMAND after it)."""
    args, _ = parse(argv)
    assert getattr(args, dest) == value and args.command == []


def test_a_slot_name_is_named_a_slot_name():
    """`slot_name` is `--slot`'s parser (and a task file's `slot`): its error says slot."""
    assert slot_name("deploy") == "deploy"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected a non-empty slot name, got ''$"):
        slot_name("")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected a slot name without control characters or line breaks, got 'a\\nb'$"):
        slot_name("a\nb")


def test_a_bad_slots_variable_is_named_and_an_unslotted_run_ignores_it(monkeypatch, capsys, tmp_path):
    """`$MPVISOR_SLOTS` is `--slots` where that is not given: a wrong value's usage error names
    the variable (it named `--slots`, which nobody gave), for a run with a slot, a file with a
    slot and for `slots`. A run without a slot, or a file without one, does not read it (a
    wrong value there was a usage error too: a CI configuration's variable stopped every run)."""
    from mpvisor._cli.filerun import run_file

    monkeypatch.setenv("MPVISOR_SLOTS", "mysql://x")
    for argv in (["run", "--slot", "s", "--", "true"], ["slots"]):
        with pytest.raises(SystemExit) as exit_:
            parse(argv)
        assert exit_.value.code == 2
        line = capsys.readouterr().err.strip()
        assert "$MPVISOR_SLOTS (what --slots is when not given): expected a postgresql:// URL, got 'mysql://x'" in line, line
    monkeypatch.setenv("MPVISOR_SLOTS", "postgresql://db/x")
    args, _ = parse(["run", "--slot", "s", "--", "true"])
    assert args.slots == "postgresql://db/x"
    args, _ = parse(["run", "--", "true"])  # a run without a slot uses no store
    assert args.slots is None and args.slot is None
    monkeypatch.setenv("MPVISOR_SLOTS", "mysql://x")
    for argv in (["run", "--", "true"], ["run", "--file", str(tmp_path / "f.toml")]):
        args, _ = parse(argv)  # nor reads a wrong value: no usage error
        assert args.slots is None, argv
    (tmp_path / "f.toml").write_text('[task.a]\ncommand = ["true"]\nslot = "s"\n')  # ... until its file has a slot
    assert run_file(args) == 2
    assert "$MPVISOR_SLOTS (what --slots is when not given): expected a postgresql:// URL" in capsys.readouterr().err


def test_good_options_build_the_spec_they_describe():
    """Durations, retries, backoff and jitter reach the spec; `--grace 0` is allowed."""
    args, spec = parse(["run", "--timeout", "2.5", "--max-retries", "0", "--backoff", "0.5:8:3", "--jitter", "full",
                        "--grace", "0", "--restart", "on-failure", "--name", "job", "workers.basic:echo", "1", "x"])
    assert (spec.name, spec.timeout, spec.max_retries, args.grace) == ("job", 2.5, 0, 0.0)
    assert spec.backoff == BackoffPolicy.exponential(0.5, max=8, factor=3).with_jitter(JitterPolicy.FULL)
    assert spec.task.args == (1, "x")
    _, alone = parse(["run", "--restart", "always", "--backoff", "60", "workers.basic:quick"])  # MAX follows a larger FIRST
    assert alone.backoff == BackoffPolicy.exponential(60, max=60).with_jitter(JitterPolicy.EQUAL)
    _, jitter_only = parse(["run", "--every", "1", "--jitter", "none", "workers.basic:quick"])  # the default backoff, no jitter
    assert jitter_only.backoff == BackoffPolicy.exponential(0.2, max=30).with_jitter(JitterPolicy.NONE)
    _, with_units = parse(["run", "--restart", "on-failure", "--backoff", "500ms:1m:3", "--intensity", "5/2m",
                           "workers.basic:quick"])  # FIRST, MAX and SECONDS take units, as every duration does
    assert with_units.backoff == BackoffPolicy.exponential(0.5, max=60, factor=3).with_jitter(JitterPolicy.EQUAL)
    assert (with_units.restart_intensity.max_restarts, with_units.restart_intensity.within) == (5, 120.0)
    _, periodic = parse(["run", "--every", "0.25", "workers.basic:quick"])
    assert periodic.restart.interval == 0.25
    _, command = parse(["run", "--timeout", "1", "--", "sh", "-c", "exit 3"])
    assert (command.name, command.task.argv) == ("sh", ("sh", "-c", "exit 3"))
    units, with_units = parse(["run", "--timeout", "1.5m", "--grace", "500ms", "--every", "1h", "--start-timeout", " 2 s",
                               "workers.basic:quick"])  # a unit may follow any option in seconds, as in a task file
    assert (with_units.timeout, units.grace, with_units.restart.interval, with_units.start_timeout) == (90.0, 0.5, 3600.0, 2.0)


def test_version_names_mpvisor_and_its_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out == f"{version()}\n"
    assert out.startswith("mpvisor ") and out.split()[1][0].isdigit(), out


# --- exit statuses ----------------------------------------------------------------------------------


def failed(**fields) -> TaskOutcome:
    return TaskOutcome(OutcomeKind.FAILED, **fields)


@pytest.mark.parametrize(
    "outcome, status",
    [
        (TaskOutcome(OutcomeKind.COMPLETED, value=5), 0),
        (failed(exit_code=7), 7),
        (failed(exit_code=255), 255),
        (failed(exit_code=256), 1),
        (failed(exit_code=0), 1),
        (failed(exit_code=None), 1),
        (failed(exit_code=-9), 128 + 9),
        (failed(exit_code=-11), 128 + 11),
        (failed(exit_code=-65), 1),
        (failed(timed_out=True), 124),
        (TaskOutcome(OutcomeKind.FATAL, exit_code=3), 3),
        (TaskOutcome(OutcomeKind.FATAL), 1),
        (TaskOutcome(OutcomeKind.CANCELED), 1),
        (TaskOutcome(OutcomeKind.FORCE_ABORTED), 1),
        (TaskOutcome(OutcomeKind.PANICKED), 1),
        (TaskOutcome.rejected(RejectionKind.SLOT_BUSY), 1),
    ],
)
def test_exit_status_follows_the_outcome(outcome, status):
    assert exit_status(outcome) == status


@pytest.mark.parametrize("code, status", [(1, 1), (2, 2), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1), (10, 10), (-9, 137)])
def test_with_a_slot_a_tasks_exit_code_never_reads_as_the_slots_answer(code, status):
    """3..9 say a slot's answer (busy, queue full, superseded, replaced, lease lost): with a slot,
    a task's own exit code there is 1; without one, it is the status."""
    assert exit_status(failed(exit_code=code), slotted=True) == status
    assert exit_status(failed(exit_code=code)) == (code if code > 0 else 128 - code)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("kind", [OutcomeKind.COMPLETED, OutcomeKind.CANCELED, OutcomeKind.FORCE_ABORTED])
def test_an_interruption_wins_over_the_outcome(signum, kind):
    """Interrupted: 128 + N whatever the outcome (the CLI dies by N; this is the fallback)."""
    assert exit_status(TaskOutcome(kind), interrupted_by=signum) == 128 + signum


def test_the_statuses_for_admission_stay_free():
    """3..9 are reserved: none of the fixed statuses uses them."""
    fixed = [exit_status(TaskOutcome(OutcomeKind.COMPLETED)), exit_status(failed()), exit_status(failed(timed_out=True)),
             2, exit_status(TaskOutcome(OutcomeKind.CANCELED), interrupted_by=signal.SIGINT)]
    assert not set(fixed) & set(RESERVED) and list(RESERVED) == list(range(3, 10))


# --- what is printed --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, line",
    [
        (None, "null"), (3, "3"), ("é", '"é"'), ([1, "a", None], '[1,"a",null]'),
        (b"\x00\xff", '"AP8="'), ({b"k": b"v"}, '{"aw==":"dg=="}'),
        (math.nan, '"NaN"'), ([math.inf, -math.inf], '["Infinity","-Infinity"]'),
        ({"a": (1, 2.5)}, '{"a":[1,2.5]}'), (2**64 - 1, str(2**64 - 1)),
    ],
)
def test_a_value_is_one_line_of_strict_json(value, line):
    assert value_line(value) == line
    assert "\n" not in value_line(value)


def test_the_outcome_line_names_the_kind_not_the_label():
    line = outcome_line("job", failed(reason="boom", exit_code=7, attempts=2))
    assert line == "mpvisor: job: failed reason='boom' exit_code=7 attempts=2"
    assert outcome_line("x", TaskOutcome(OutcomeKind.FORCE_ABORTED)).startswith("mpvisor: x: force_aborted ")


def test_a_reason_is_shown_escaped_once_and_a_byte_that_is_not_utf8_as_the_byte():
    """A reason is text made for a line: a child's `cannot execute 'caf\\xe9/x'` was shown with
    its backslash doubled (`'caf\\\\udce9/x'` once repr had named the byte by its surrogate), and a
    `--name` with such a byte was echoed as `\\udcff`; both now show `\\xe9`, as the rest of the CLI."""
    made = "cannot execute 'caf\\xe9/x': No such file or directory"  # as the child makes it
    assert outcome_line("x", failed(reason=made, exit_code=127, attempts=1)) == (
        "mpvisor: x: failed reason=\"cannot execute 'caf\\xe9/x': No such file or directory\" exit_code=127 attempts=1")
    held = os.fsdecode(b"caf\xe9\n'q\"")  # a lone surrogate, a line break and both quotes
    assert outcome_line("x", failed(reason=held)) == "mpvisor: x: failed reason='caf\\xe9\\n\\'q\"' exit_code=None attempts=0"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected a task name of UTF-8 text \(.*\), got 'n\\xffx'$"):
        task_name(os.fsdecode(b"n\xffx"))  # it said "without control characters or line breaks", which it has none of


def test_a_long_reason_is_cut_and_its_length_said_a_short_one_is_as_it_is():
    reason = "the result[0]" + "[0]" * 600 + " is nested too deep"
    line = outcome_line("job", failed(reason=reason, attempts=1))
    assert line == f"mpvisor: job: failed reason={reason[:REASON_MAX]!r}… ({len(reason)} characters) exit_code=None attempts=1"
    assert len(line) < 300 < len(reason)
    exactly = "é" * REASON_MAX
    assert outcome_line("job", failed(reason=exactly)) == f"mpvisor: job: failed reason={exactly!r} exit_code=None attempts=0"
    assert shorten(exactly) == exactly and shorten(exactly + "x") == f"{exactly}… ({REASON_MAX + 1} characters)"
    assert shorten("abcdef", 3) == "abc… (6 characters)"


def test_a_value_line_is_data_and_never_cut():
    value = ["x" * 5000, list(range(1000))]
    assert json.loads(value_line(value)) == value


def test_intensity_becomes_the_specs_restart_intensity():
    """`--intensity 3/60` is `with_restart_intensity(3, 60)`."""
    from mpvisor import RestartIntensity

    _, spec = parse(["run", "--restart", "on-failure", "--intensity", "3/60", "workers.basic:quick"])
    assert spec.restart_intensity == RestartIntensity(3, 60.0)


@pytest.mark.parametrize(("size", "expected"), [("9223372036854775807", 2**63 - 1), ("9007199254740993", 2**53 + 1), ("1048576", 2**20), ("512M", 512 * 2**20), ("1G", 2**30), ("1GiB", 2**30), ("1Gi", 2**30), ("512Mi", 512 * 2**20), ("1.5gi", 3 * 2**29), ("64k", 64 * 2**10), ("1.5G", 3 * 2**29), ("0.1G", 107374182)])
def test_limits_become_the_specs_limits(size, expected):
    """`--memory SIZE --cpu S --open-files N` is `with_limits(memory, cpu_seconds, open_files)`."""
    from mpvisor import Limits

    _, spec = parse(["run", "--memory", size, "--cpu", "60", "--open-files", "128", "--cpus", "0.5", "workers.basic:quick"])
    assert spec.limits == Limits(memory=expected, cpu_seconds=60.0, open_files=128, cpus=0.5)


def test_the_largest_limits_are_taken_exactly():
    """The most each limit may be reaches the spec as given: a long number of bytes is read
    exactly (it went through a float: 2**63 - 1 became 2**63, which no process could set)."""
    from mpvisor import Limits

    _, spec = parse(["run", "--memory", str(2**63 - 1), "--address-space", str(2**63 - 1), "--open-files", str(2**63 - 1),
                     "--cpus", "100000", "workers.basic:quick"])
    assert spec.limits == Limits(memory=2**63 - 1, address_space=2**63 - 1, open_files=2**63 - 1, cpus=100000)


def test_an_empty_slot_is_refused_as_a_slot_name(capsys):
    with pytest.raises(SystemExit) as refused:
        parse(["run", "--slot", "", "--", "true"])
    assert refused.value.code == 2
    assert "argument --slot: expected a non-empty slot name, got ''" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["local", "etcd://a/b", "postgresql", ""])
def test_slots_takes_a_store_url_and_nothing_else(capsys, value):
    with pytest.raises(SystemExit) as refused:
        parse(["run", "--slot", "s", "--slots", value, "--", "true"])
    assert refused.value.code == 2
    assert f"argument --slots: expected a postgresql:// URL, got {value!r}" in capsys.readouterr().err


def test_slots_keeps_a_postgresql_url():
    args, _ = parse(["run", "--slot", "s", "--slots", "postgresql://ci@db/ops", "--", "true"])
    assert args.slots == "postgresql://ci@db/ops"


def test_the_command_lines_policies_are_the_lease_stores() -> None:
    """`--policy` and a task file's `policy` offer exactly the names a lease store knows, in its order."""
    from mpvisor._admission.leases import store
    from mpvisor._cli import options

    assert tuple(store.POLICIES) == options.POLICIES


@pytest.mark.parametrize("columns", [None, "", "abc", "0", "-5", "57", "200"])
def test_help_is_as_wide_as_shutil_would_make_it(monkeypatch: pytest.MonkeyPatch, columns: str | None) -> None:
    """The width `mpvisor --help` wraps at, found without importing shutil, is the one
    `shutil.get_terminal_size()` gives, whatever `$COLUMNS` says (nothing, junk, 0, a width)."""
    import shutil

    from mpvisor._cli import shell

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert shell._columns() == shutil.get_terminal_size().columns
    assert shell.HelpFormatter("mpvisor")._width == shutil.get_terminal_size().columns - 2


def test_a_slots_refusals_map_to_their_statuses_and_nothing_else_does() -> None:
    """`statuses.refused`, which names rejection kinds by value (so that every command need not
    import the task model): the three refusals of a slot are 3, 4 and 5; every other kind, and
    no rejection at all, is None."""
    from mpvisor import RejectionKind
    from mpvisor._cli import statuses

    assert {kind: statuses.refused(kind) for kind in RejectionKind if statuses.refused(kind) is not None} == {
        RejectionKind.SLOT_BUSY: (3, "the slot is busy (policy drop)"),
        RejectionKind.QUEUE_FULL: (4, "the slot's queue is full"),
        RejectionKind.SUPERSEDED_BY_REPLACE: (5, "superseded by a replacement while queued"),
    }
    assert statuses.refused(None) is None


def test_a_rejection_without_a_reason_of_its_own_says_its_kind_in_words() -> None:
    """A rejection's default reason is its kind in words, not its label: the outcome line, a
    service's LAST column and the events all say it (a file run said `rejected
    reason='controller_shutting_down'`, `mpvisor status` `rejected: removed_from_queue`); one
    with a reason of its own keeps it."""
    from mpvisor import RejectionKind, TaskOutcome
    from mpvisor._cli.options import outcome_line

    words = {kind: outcome_line("t", TaskOutcome.rejected(kind)).split("reason=")[1].split(" exit_code")[0]
             for kind in RejectionKind}
    assert words[RejectionKind.CONTROLLER_SHUTTING_DOWN] == "'the run stopped before the slot was free'"
    assert words[RejectionKind.SLOT_BUSY] == "'the slot is busy (policy drop)'"
    assert words[RejectionKind.REMOVED_FROM_QUEUE] == '"removed from the slot\'s queue before it was admitted"'
    for kind in RejectionKind:
        assert TaskOutcome.rejected(kind).reason == kind.words and " " in kind.words and "_" not in kind.words, kind
    own = TaskOutcome.rejected(RejectionKind.ADMISSION_FAILED, "the store refused: no such database")
    assert "reason='the store refused: no such database'" in outcome_line("t", own)


def test_the_memory_help_names_every_unit_a_size_takes() -> None:
    """`mpvisor run --help` lists the units `--memory` reads (it left out T, which the docs name)."""
    from mpvisor._cli.main import make_parser
    from mpvisor._cli.options import _UNITS

    _, parsers = make_parser("run")
    (memory,) = [a for a in parsers["run"]._actions if "--memory" in a.option_strings]
    assert f"bytes, or with {', '.join(unit for unit in _UNITS if unit)} (binary" in (memory.help or "")


def test_the_slots_help_says_what_it_shows_and_waits_for_with_a_store_across_hosts() -> None:
    """`mpvisor slots --help` says that with `--slots URL` it shows every slot of that database,
    and that `--wait` bounds that store's answer too (it named only this user's slot server)."""
    from mpvisor._cli.main import make_parser

    _, parsers = make_parser("slots")
    (wait,) = [a for a in parsers["slots"]._actions if "--wait" in a.option_strings]
    assert "the slot server, or the --slots store, may take to answer" in (wait.help or "")
    assert "with --slots URL: every slot of that database" in (parsers["slots"].description or "")


@pytest.mark.parametrize("value", [1e9, 1024.0, 2.0**52, 1.5, 0.5, 1e-3, 0.0, -1024.0, 2.0**63, math.nan, math.inf])
def test_a_size_is_one_rule_in_the_library_on_the_command_line_and_in_a_task_file(value):
    """A float given as a size: `with_limits(memory=1e9)`, `mpvisor run --memory 1e9` and a task
    file's `memory = 1e9` all take a whole number of bytes (1e9, 1024.0: the `int`), and all
    refuse a fraction of a byte (1.5), 0, a negative, more than 2**63 - 1, NaN and inf, each
    naming the field or option and the value (the library took 1e9 nowhere, while the command
    line and the file did)."""
    import contextlib
    import io

    from mpvisor import ConfigError, TaskSpec
    from mpvisor._cli.taskfile import parse_text
    from tests._support import fn

    try:
        api: int | None = TaskSpec.once(fn("t", "workers.basic:quick")).with_limits(memory=value).limits.memory
    except ConfigError as exc:
        api = None
        assert str(exc) == f"memory must be a whole number of bytes from 1 to 2**63 - 1, got {value!r}", exc
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            _, spec = parse(["run", f"--memory={value!r}", "workers.basic:quick"])
        cli: int | None = spec.limits.memory
    except SystemExit:
        cli = None
        assert "argument --memory: expected a size in bytes" in err.getvalue() and repr(value) in err.getvalue(), err.getvalue()
    found = parse_text(f"[task.a]\ntarget = 'workers.basic:quick'\nmemory = {value!r}\n")
    in_file = found.tasks[0].spec.limits.memory if not found.errors else None
    assert found.errors == () or 'task "a".memory: expected a size in bytes' in found.errors[0], found.errors
    assert api == cli == in_file and (api is None or type(api) is int), (api, cli, in_file)
    assert (api is not None) == (value in (1e9, 1024.0, 2.0**52)), api
