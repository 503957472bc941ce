"""Does a target defined in the program's main script run, however that script was started?

Each test runs a real program (`python ...`) whose `__main__` defines the targets, and reads the
outcome it writes. The attempt imports the main script under another name (`__mp_main__`), as
multiprocessing's spawn does; a script the attempt cannot import from a file (`python -c`) is
tested in `tests/launchers/test_processes.py`, beside the plain script's tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
import zipapp

import psutil
import pytest

from tests._support import START_METHODS, wait_for

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "workers", "scripts")


def _marked(mark: str) -> list[str]:
    """`"pid cmdline"` of every process whose environment carries `MPVISOR_TEST_MARK=mark`."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.environ().get("MPVISOR_TEST_MARK") == mark:
                found.append(f"{process.info['pid']} {' '.join(process.info['cmdline'] or [])}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_target_in_a_zipapps_main_runs_and_can_supervise_another_of_it(start_method, tmp_path):
    """`python app.pyz` whose `__main__.py` defines the targets: its `__file__` is
    `app.pyz/__main__.py`, no file of its own, and every attempt ended FATAL, `the main program
    (python -c, a script read from stdin, ...) has no file the attempt can import`. Now the
    attempt imports it from the archive; a target of it that runs `mpvisor.run` on another of
    its targets (nested use) runs too, and nothing is left once the program has exited."""
    source = tmp_path / "app"
    source.mkdir()
    shutil.copyfile(os.path.join(SCRIPTS, "nested_main.py"), source / "__main__.py")
    archive, out = tmp_path / "app.pyz", tmp_path / "outcome.json"
    zipapp.create_archive(source, archive)
    mark = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": ROOT, "MPVISOR_TEST_MARK": mark}
    done = subprocess.run([sys.executable, str(archive), start_method, str(out)], env=env, cwd=tmp_path,
                          timeout=45, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(out.read_text())
    assert (outcome["kind"], outcome["value"]) == ("COMPLETED", ["COMPLETED", 40, None, "__main__:inner"]), outcome
    assert wait_for(lambda: not _marked(mark), timeout=5), _marked(mark)


AFTER_THE_SCRIPT = """
import atexit
import json
import sys
import threading
import time

import mpvisor
from mpvisor import TaskFn, TaskSpec


def work(where):
    return f"{where} ran as {__name__}"


def run_and_record(where, out):
    while threading.main_thread().is_alive():  # the script's end: once it ran to its last line
        time.sleep(0.01)
    try:
        outcome = mpvisor.run([TaskSpec.once(TaskFn("work", work, (where,)))])["work"]
        record = [where, outcome.kind.name, outcome.value, outcome.reason]
    except Exception as exc:
        record = [where, type(exc).__name__, str(exc)]
    with open(out, "a", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\\n")


if __name__ == "__main__":
    out = sys.argv[1]
    atexit.register(run_and_record, "atexit", out)
    threading.Thread(target=run_and_record, args=("thread", out)).start()
    # the script ends here: the interpreter waits for the thread, then runs atexit
"""


# Whether this interpreter refuses a new thread where AFTER_THE_SCRIPT supervises: printed as JSON.
THREADS_AFTER_THE_SCRIPT = """
import atexit, json, os, threading, time

refused = {}


def try_a_thread(where):
    while threading.main_thread().is_alive():  # the script's end, as in AFTER_THE_SCRIPT
        time.sleep(0.01)
    try:
        started = threading.Thread(target=lambda: None)
        started.start()
        started.join()
        refused[where] = False
    except RuntimeError:
        refused[where] = True


def report():
    try_a_thread("atexit")
    os.write(1, json.dumps(refused).encode())


atexit.register(report)
threading.Thread(target=try_a_thread, args=("thread",)).start()
"""


def test_a_main_script_target_runs_from_a_thread_or_atexit_after_the_script_ended(tmp_path):
    """Once the main script has run, CPython takes `__file__` away from `__main__`, while its
    non-daemon threads go on (the interpreter waits for them) and its `atexit` functions run
    after. A supervisor started there sent no script path, so every attempt of a target of the
    script ended FATAL blaming `python -c`, stdin or a REPL. The script's path is read from its
    loader then, and the target runs. Where the interpreter starts no thread at that point
    (CPython 3.12.0 and 3.12.1 in both places), `mpvisor.run` raises an error that says so and
    what to do instead."""
    (tmp_path / "prog.py").write_text(AFTER_THE_SCRIPT)
    out = tmp_path / "outcomes.jsonl"
    mark = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": ROOT, "MPVISOR_TEST_MARK": mark}
    done = subprocess.run([sys.executable, "prog.py", str(out)], env=env, cwd=tmp_path, timeout=45,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    found = [json.loads(line) for line in out.read_text().splitlines()]
    probe = subprocess.run([sys.executable, "-c", THREADS_AFTER_THE_SCRIPT], timeout=30, capture_output=True, text=True)
    refused = json.loads(probe.stdout)  # where this interpreter starts no thread: {"thread": bool, "atexit": bool}
    for record in found:
        where = record[0]
        if not refused[where]:
            assert record == [where, "COMPLETED", f"{where} ran as __mp_main__", None], found
        else:
            assert record[:2] == [where, "ConfigError"], found
            assert record[2].startswith("cannot start the launcher: can't create new thread at interpreter shutdown: "
                                        "this Python starts no thread or process once the interpreter is shutting "
                                        "down"), record
    assert [record[0] for record in found] == ["thread", "atexit"], found
    assert wait_for(lambda: not _marked(mark), timeout=5), _marked(mark)


PARSES_AT_ITS_TOP = """
import argparse
import json
import sys

import mpvisor
from mpvisor import SupervisorConfig, TaskFn, TaskSpec

parser = argparse.ArgumentParser()
parser.add_argument("--scale", type=int, default=1)
parser.add_argument("--out")
parser.add_argument("method")
args = parser.parse_args()  # at the top level, as many scripts do


def scaled(x):
    return [x * args.scale, sys.argv[1:]]


if __name__ == "__main__":
    outcome = mpvisor.run([TaskSpec.once(TaskFn("scaled", scaled, (2,)))], SupervisorConfig(start_method=args.method))
    with open(args.out, "w", encoding="utf-8") as file:
        json.dump([outcome["scaled"].kind.name, outcome["scaled"].value, outcome["scaled"].reason], file)
"""


@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_script_that_parses_its_arguments_at_its_top_level_sees_them_in_its_attempts(start_method, tmp_path):
    """The attempt imports the main script, whose top level runs again there; its `sys.argv`
    was the launcher's (`['-c', PID, FD, FD]`), so a script that parses its arguments at its
    top level ended FATAL (`SystemExit: 2`, argparse's usage on stderr) under the launcher, and
    silently ran with its defaults under spawn (`--scale 10` ignored: 2, not 20). An attempt's
    `sys.argv` is now the parent's, as multiprocessing's spawn gives it."""
    (tmp_path / "prog.py").write_text(PARSES_AT_ITS_TOP)
    out = tmp_path / "outcome.json"
    argv = ["--scale", "10", "--out", str(out), start_method]
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "prog.py", *argv], env=env, cwd=tmp_path, timeout=45,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == ["COMPLETED", [20, argv], None]


UNDER_A_RUNNER = """
import json
import sys

import mpvisor
from mpvisor import SupervisorConfig, TaskFn, TaskSpec


def work(x):
    return [x * 2, __name__]


class Jobs:
    @staticmethod
    def plus_one(x):
        return x + 1


def nested():
    return mpvisor.run([TaskSpec.once(TaskFn("inner", work, (5,)))])["inner"].value


if __name__ == "__main__":
    method, out = sys.argv[1:3]
    specs = [TaskSpec.once(TaskFn("work", work, (21,))), TaskSpec.once(TaskFn("static", Jobs.plus_one, (1,))),
             TaskSpec.once(TaskFn("nested", nested))]
    outcomes = mpvisor.run(specs, SupervisorConfig(start_method=method))
    with open(out, "w", encoding="utf-8") as file:
        json.dump({name: [o.kind.name, o.value, o.reason] for name, o in outcomes.items()}, file)
"""


@pytest.mark.parametrize("runner", [
    pytest.param(["-m", "cProfile", "-o", os.devnull], id="cProfile"),
    # the same namespace as cProfile's; the whole supervisor runs traced, 1.2 s: left to `-m slow`
    pytest.param(["-m", "trace", "--count", "--missing"], id="trace", marks=pytest.mark.slow),
])  # trace's .cover files go to the test's directory (below)
@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_script_run_under_a_profiler_or_trace_runs_its_targets(runner, start_method, tmp_path):
    """`python -m cProfile script.py` (or `profile`, `trace`) executes the script in a namespace of
    its own, named `__main__`, while `sys.modules["__main__"]` is the runner's module. Every
    `TaskFn` of a function of the script was refused (`target ... is not reachable as
    '__main__:work'`), so a supervisor's program could not be profiled. The function's own
    namespace is checked now, and the attempt imports the script it came from."""
    (tmp_path / "prog.py").write_text(UNDER_A_RUNNER)
    out = tmp_path / "outcomes.json"
    env = {**os.environ, "PYTHONPATH": ROOT}
    if "trace" in runner:
        runner = [*runner, "--coverdir", str(tmp_path / "cover")]  # not beside mpvisor's own modules
    done = subprocess.run([sys.executable, *runner, "prog.py", start_method, str(out)], env=env, cwd=tmp_path,
                          timeout=45, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == {"work": ["COMPLETED", [42, "__mp_main__"], None],
                                           "static": ["COMPLETED", 2, None],
                                           "nested": ["COMPLETED", [10, "__mp_main__"], None]}


DEFINED_UNDER_THE_GUARD = """
import json
import sys

import mpvisor
from mpvisor import TaskFn, TaskSpec


def at_top(x):
    return x


if __name__ == "__main__":
    def under_guard(x):  # where a pool's code often has it: beside the code that starts the work
        return x

    outcomes = mpvisor.run([TaskSpec.once(TaskFn("top", at_top, (1,))), TaskSpec.once(TaskFn("guarded", under_guard, (2,)))])
    with open(sys.argv[1], "w", encoding="utf-8") as file:
        json.dump({name: [o.kind.name, o.value, o.reason] for name, o in outcomes.items()}, file)
"""


@pytest.mark.parametrize("how", ["script", "python -m"])
def test_a_target_defined_under_the_main_guard_is_fatal_saying_where_to_define_it(how, tmp_path):
    """A target defined under the program's `if __name__ == "__main__":` (or at the prompt of
    `python -i script.py`) is in the parent's `__main__` but not in the script (or the module run
    with `python -m`) as the attempt imports it: the attempt ended FATAL `AttributeError: module
    '__mp_main__' has no attribute 'under_guard'` (`module 'prog' has no ...`), which says neither
    why nor what to do. The reason now names the script or module and the target, says why it is
    not there and where to define it; a target at the top level runs."""
    (tmp_path / "prog.py").write_text(DEFINED_UNDER_THE_GUARD)
    out = tmp_path / "outcomes.json"
    program = ["prog.py"] if how == "script" else ["-m", "prog"]
    done = subprocess.run([sys.executable, *program, str(out)], env={**os.environ, "PYTHONPATH": ROOT},
                          cwd=tmp_path, timeout=45, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    outcomes = json.loads(out.read_text())
    assert outcomes["top"] == ["COMPLETED", 1, None], outcomes
    if how == "script":
        script = str(tmp_path / "prog.py")
        reason = (f"cannot import target '__main__:under_guard': AttributeError: the main script {script!r} defines "
                  "no 'under_guard' when the attempt imports it (as `__mp_main__`: its `if __name__ == \"__main__\":` "
                  "block does not run): a target defined in that block, at the prompt of `python -i` or by `exec` is "
                  "not there; define it at the script's top level, or in a module")
    else:
        reason = ("cannot import target 'prog:under_guard': AttributeError: the main module 'prog' (python -m) defines "
                  "no 'under_guard' when the attempt imports it (as 'prog': its `if __name__ == \"__main__\":` block "
                  "does not run): a target defined in that block or by `exec` is not there; define it at the module's "
                  "top level")
    assert outcomes["guarded"] == ["FATAL", None, reason], outcomes


RAISES_ITS_OWN_CLASSES = """
import json
import sys

import mpvisor
from mpvisor import TaskFn, TaskSpec


class QuotaError(Exception):
    pass


class JobFailed(Exception):
    pass


def chained():
    try:
        raise QuotaError("inner")
    except QuotaError as exc:
        raise JobFailed("outer") from exc


def grouped():
    raise ExceptionGroup("several", [QuotaError("first"), ValueError("second")])


if __name__ == "__main__":
    outcomes = mpvisor.run([TaskSpec.once(TaskFn(name, target)) for name, target in
                            [("chained", chained), ("grouped", grouped)]])
    with open(sys.argv[1], "w", encoding="utf-8") as file:
        json.dump({name: [o.reason, o.traceback] for name, o in outcomes.items()}, file)
"""


def test_an_exception_class_of_the_main_script_is_named_as_the_script_names_it(tmp_path):
    """A target of the main script that raises a class of the script: the attempt imports the
    script as `__mp_main__`, and its traceback said `__mp_main__.JobFailed: outer` (the cause
    and a group's members too), a module the user never wrote, where `python prog.py` says
    `JobFailed: outer`. Each is now named as the script's own traceback names it."""
    (tmp_path / "prog.py").write_text(RAISES_ITS_OWN_CLASSES)
    out = tmp_path / "outcomes.json"
    done = subprocess.run([sys.executable, "prog.py", str(out)], env={**os.environ, "PYTHONPATH": ROOT},
                          cwd=tmp_path, timeout=45, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    outcomes = json.loads(out.read_text())
    reason, traceback = outcomes["chained"]
    assert reason == "JobFailed: outer" and "__mp_main__" not in traceback, traceback
    assert "\nQuotaError: inner\n" in traceback and traceback.endswith("\nJobFailed: outer\n"), traceback
    reason, traceback = outcomes["grouped"]
    assert reason == "ExceptionGroup: several (2 sub-exceptions)" and "__mp_main__" not in traceback, traceback
    assert "| QuotaError: first\n" in traceback and "| ValueError: second\n" in traceback, traceback


@pytest.mark.unit
def test_a_main_script_missing_where_the_attempt_runs_is_named_as_missing(tmp_path):
    """A target defined in the main script is loaded from the script's path; where that path
    does not exist (a Ray node without the script there) the error says so, naming the path
    (it said `cannot load the main script ... from its zip archive: not a Zip file`)."""
    from mpvisor._attempt import child

    missing = str(tmp_path / "app" / "main.py")
    with pytest.raises(ImportError) as raised:
        child._import_main_script(missing)
    assert str(raised.value).startswith(f"the main script {missing!r} is not here: "), raised.value


@pytest.mark.parametrize("pool_method", ["spawn", "forkserver"])
@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_main_script_target_runs_a_spawn_or_forkserver_pool_of_its_own(start_method, pool_method, tmp_path):
    """A target of the main script maps a function of that script over a `multiprocessing` pool
    of the spawn or forkserver context (spawn: macOS's default; forkserver: Linux's from CPython
    3.14), whose workers load the script again to find it, as under the script run alone. (The
    attempt's `__main__` had a module spec named `__mp_main__`, so the workers were sent to import
    a module of that name, failed, and the pool waited for them until the task's timeout.)"""
    out = tmp_path / "outcome.json"
    done = subprocess.run([sys.executable, os.path.join(SCRIPTS, "nested_pool.py"), start_method, pool_method, str(out)],
                          env={**os.environ, "PYTHONPATH": ROOT}, cwd=tmp_path, timeout=45, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == {"kind": "COMPLETED", "value": 285, "reason": None}, done.stderr
