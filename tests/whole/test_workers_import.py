"""The `workers/` fixtures are what the integration tests believe they are.

Checked in the test process (with a hand-installed `TaskContext`, no signals) or in a throwaway
`python` subprocess; nothing here starts a supervisor.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import ModuleType

import msgpack  # type: ignore[import-untyped]
import psutil  # type: ignore[import-untyped]
import pytest

from mpvisor._attempt.context import TaskContext, _install
from mpvisor._model.errors import Canceled, Fail, Fatal
from tests._support import (
    Collector,
    all_ended,
    pid_gone,
    read_markers,
    read_records,
    wait_for,
)
from workers import basic, coop, misbehave, overlap
from workers._marker import mark

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMPORTABLE = [basic, coop, misbehave, overlap]
IMPORT_TIME_MODULES = ["slow_import", "hanging_import", "own_sigterm_import", "callback_import"]


def _public_functions(module: ModuleType) -> list[tuple[str, object]]:
    return [
        (name, fn)
        for name, fn in vars(module).items()
        if inspect.isfunction(fn) and not name.startswith("_") and fn.__module__ == module.__name__
    ]


@pytest.mark.parametrize("module", IMPORTABLE, ids=lambda m: m.__name__)
def test_every_worker_is_module_level_and_takes_a_marker(module: ModuleType) -> None:
    """Fixtures: every public worker is a module-level function with `marker=None`."""
    functions = _public_functions(module)
    assert functions
    for name, fn in functions:
        assert inspect.isfunction(fn)
        assert fn.__qualname__ == name
        marker = inspect.signature(fn).parameters["marker"]
        assert marker.default is None, name
        assert marker.kind in (marker.POSITIONAL_OR_KEYWORD, marker.KEYWORD_ONLY), name


@pytest.mark.parametrize("name", IMPORT_TIME_MODULES)
def test_import_time_modules_offer_a_target_with_a_marker(name: str) -> None:
    """Fixtures: `slow_import`, `hanging_import`, `own_sigterm_import` and `callback_import` (read,
    never imported) define `target(marker=None)`."""
    tree = ast.parse((ROOT / "workers" / f"{name}.py").read_text())
    targets = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "target"
    ]
    assert len(targets) == 1
    assert [arg.arg for arg in targets[0].args.args] == ["marker"]


def _python(code: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_slow_import_takes_at_least_its_import_seconds() -> None:
    """Slow-import fixture: importing `workers.slow_import` takes at least its IMPORT_SECONDS (0.7 s)."""
    started = time.monotonic()
    result = _python("import workers.slow_import", timeout=30)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 0.7


def test_hanging_import_never_completes() -> None:
    """Fixtures: importing `workers.hanging_import` is still blocked after 0.4 s (its start-up takes about 0.1)."""
    with pytest.raises(subprocess.TimeoutExpired):
        _python("import workers.hanging_import; print('imported')", timeout=0.4)


def test_building_the_pickle_bomb_writes_nothing_and_loading_it_does(
    tmp_path: pathlib.Path,
) -> None:
    """No-unpickling fixture: `pickle_bomb` bytes are inert msgpack-able data until someone unpickles them."""
    bomb_path = tmp_path / "bomb"
    payload = basic.pickle_bomb(str(bomb_path))
    assert isinstance(payload, bytes)
    assert msgpack.unpackb(msgpack.packb(payload)) == payload
    assert not bomb_path.exists()
    loaded = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
        input=payload,
        capture_output=True,
        timeout=30,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert bomb_path.read_text() == "unpickled\n"


def test_value_workers_need_no_attempt_without_a_marker() -> None:
    """Fixtures: value workers return msgpack data (or, for `unencodable`, data msgpack refuses)."""
    assert basic.quick() == "ok"
    assert basic.quick({"a": [1, 2]}) == {"a": [1, 2]}
    assert basic.echo(1, b"x", marker=None, k=None) == [[1, b"x"], {"k": None}]
    assert misbehave.huge_result(1000) == b"x" * 1000
    assert basic.cpu_burn(0.02) >= 10_000
    with pytest.raises(TypeError):
        msgpack.packb(misbehave.unencodable())
    with pytest.raises(RuntimeError, match="kaboom"):
        basic.raising()
    with pytest.raises(PermissionError, match="nope"):
        basic.raise_exc("PermissionError", "nope")
    with pytest.raises(TypeError, match="type_name"):
        basic.raise_exc("KeyboardInterrupt", "not an Exception")


@pytest.fixture
def ctx() -> Iterator[TaskContext]:
    """A hand-installed context for attempt 2 of task "t" (id 7), recording progress calls."""
    sent: list[tuple[float, float | None, str | None]] = []
    context = TaskContext("t", 7, 2, send_progress=lambda *report: sent.append(report))
    context.sent = sent  # type: ignore[attr-defined]
    _install(context)
    yield context
    _install(None)


def _request_stop(context: TaskContext) -> None:
    """What the SIGTERM handler does, without a signal (unshielded, it raises `Canceled`)."""
    with pytest.raises(Canceled):
        context._on_sigterm(signal.SIGTERM, None)


def test_markers_name_the_word_task_attempt_and_pid(
    ctx: TaskContext, tmp_path: pathlib.Path
) -> None:
    """Fixtures: a marker line is `<word> <task> <attempt> <pid>`, one per `mark` call."""
    marker = str(tmp_path / "m")
    assert basic.quick(5, marker=marker) == 5
    mark(marker, "done")
    assert read_markers(marker) == [("started", "t", 2, os.getpid()), ("done", "t", 2, os.getpid())]


def test_attempt_driven_workers_follow_the_attempt_number(ctx: TaskContext) -> None:
    """Attempt-number fixtures: `flaky`, `sequence`, `attempt_info` and `fresh_process_check` read `attempt`."""
    assert basic.flaky(1) == 2
    with pytest.raises(Fail, match="transient-err"):
        basic.flaky(2)
    assert basic.sequence(["fail", "ok"]) == 2
    with pytest.raises(Fatal, match="unrecoverable"):
        basic.sequence(["ok", "fatal", "ok"])
    with pytest.raises(ValueError, match="outcomes"):
        basic.sequence(["explode"])
    assert basic.attempt_info() == {
        "pid": os.getpid(),
        "attempt": 2,
        "task_id": 7,
        "task_name": "t",
    }
    with pytest.raises(Fail) as failed:
        basic.failing(7)
    assert failed.value.exit_code == 7
    with pytest.raises(Fatal) as fatal:
        basic.fatal(3)
    assert fatal.value.exit_code == 3


def test_fresh_process_check_refuses_a_reused_process(
    ctx: TaskContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-process fixture: a second run in one process raises `Fatal`."""
    monkeypatch.setattr(basic, "_already_ran", False)
    assert basic.fresh_process_check(1) == 2
    with pytest.raises(Fatal, match="reused"):
        basic.fresh_process_check(1)


def test_progress_workers_report_through_the_context(ctx: TaskContext) -> None:
    """Progress fixture: `progress_once` reports (3, 10, "x"); `progress_many` ends with (n, n)."""
    assert basic.progress_once() == "progressed"
    assert basic.progress_many(1000) == 1000
    sent = ctx.sent  # type: ignore[attr-defined]
    assert sent[0] == (3, 10, "x")
    assert sent[-1] == (1000, 1000, None)


def test_cooperative_raises_canceled_and_cleans_up(
    ctx: TaskContext, tmp_path: pathlib.Path
) -> None:
    """Cooperative-cancel fixture: once cancelled, `cooperative` raises `Canceled` and writes `finally`."""
    marker = str(tmp_path / "m")
    _request_stop(ctx)
    with pytest.raises(Canceled):
        coop.cooperative(marker=marker, finally_delay=0.01)
    assert [word for word, *_ in read_markers(marker)] == ["started", "finally"]


@pytest.mark.parametrize(
    ("action", "expected"),
    [("fail", Fail), ("fatal", Fatal), ("canceled", Canceled), ("exit3", SystemExit)],
)
def test_timeout_probe_ends_as_asked(
    ctx: TaskContext, action: str, expected: type[BaseException]
) -> None:
    """Timeout fixture: after the request, `timeout_probe` ends with the parametrized ending."""
    _request_stop(ctx)
    with pytest.raises(expected):
        coop.timeout_probe(action)


def test_timeout_probe_can_return_after_the_request(ctx: TaskContext) -> None:
    """Timeout fixture: `timeout_probe("return")` returns "late" after the request."""
    _request_stop(ctx)
    assert coop.timeout_probe("return") == "late"
    with pytest.raises(ValueError, match="action"):
        coop.timeout_probe("explode")


def test_gated_sees_the_request_and_leaves_its_shield_canceled(
    ctx: TaskContext, tmp_path: pathlib.Path
) -> None:
    """Fixtures: `gated` writes `cancel-seen` inside `shield()`; its released value is dropped."""
    marker, release = str(tmp_path / "m"), tmp_path / "release"

    def stop_then_release() -> None:
        wait_for(lambda: read_markers(marker))
        ctx._on_sigterm(signal.SIGTERM, None)  # shielded: sets `cancelled`, raises nothing
        wait_for(lambda: len(read_markers(marker)) == 2)
        release.touch()

    helper = threading.Thread(target=stop_then_release)
    helper.start()
    with pytest.raises(Canceled):
        coop.gated(str(release), marker=marker)
    helper.join()
    assert [word for word, *_ in read_markers(marker)] == ["started", "cancel-seen"]


def test_shield_defers_a_request_to_the_end_of_the_outermost_block(ctx: TaskContext) -> None:
    """`shield()`: a request inside is raised as `Canceled` when the outermost block is left,
    also by `return` (nested blocks defer it further); a `Canceled` raised inside (by
    `check_cancelled`) is the delivery, not raised again; another exception leaving the block
    goes on as it is, the request still pending; each call is a fresh block."""
    def leave_by_return() -> str:
        with ctx.shield():
            with ctx.shield():
                ctx._on_sigterm(signal.SIGTERM, None)  # shielded: sets `cancelled`, raises nothing
            assert ctx.cancelled  # the inner block's end does not deliver it
            return "dropped"

    with pytest.raises(Canceled):
        leave_by_return()
    with ctx.shield():  # delivered once: a later block raises nothing
        pass
    assert ctx.cancelled


def test_shield_lets_other_exceptions_and_its_own_delivery_through() -> None:
    """As above: another exception keeps the request pending for the next block's end; a
    `Canceled` from `check_cancelled` inside is that delivery."""
    for leaving in ("other", "check"):
        context = TaskContext("t", 7, 2)
        _install(context)
        try:
            with pytest.raises(ValueError if leaving == "other" else Canceled), context.shield():
                context._on_sigterm(signal.SIGTERM, None)
                if leaving == "other":
                    raise ValueError("its own")
                context.check_cancelled()
            if leaving == "other":  # still pending: the next block's end delivers it
                with pytest.raises(Canceled), context.shield():
                    pass
            else:
                with context.shield():
                    pass
        finally:
            _install(None)


def test_gated_returns_or_fails_on_release(ctx: TaskContext, tmp_path: pathlib.Path) -> None:
    """Fixtures: without a request, a released `gated` returns "released" or raises its verdict."""
    release = tmp_path / "release"
    release.touch()
    assert coop.gated(str(release)) == "released"
    with pytest.raises(Fail) as failed:
        coop.gated(str(release), on_release="fail")
    assert failed.value.exit_code == 5
    with pytest.raises(ValueError, match="on_release"):
        coop.gated(str(release), on_release="explode")


def test_the_overlap_probe_records_a_second_live_owner(
    ctx: TaskContext, tmp_path: pathlib.Path
) -> None:
    """Fixtures: a second `flock` holder (another process) is recorded as a violation."""
    lock, violations = str(tmp_path / "lock"), str(tmp_path / "violations")
    assert overlap.probe(lock, violations, value=1) == 1
    assert read_markers(violations) == []
    code = "import sys; from mpvisor._attempt.context import TaskContext, _install; _install(TaskContext('u', 1, 1)); from workers.overlap import probe; probe(*sys.argv[1:3])"
    result = _python(code, lock, violations, timeout=30)
    assert result.returncode == 0, result.stderr
    assert [(word, task) for word, task, *_ in read_markers(violations)] == [("violation", "u")]


def _ignores_sigterm(pid: int) -> bool:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    raise AssertionError(f"no SigIgn line for pid {pid}")


_RUN_IN_ATTEMPT = """
import os, sys
from mpvisor._attempt.context import TaskContext, _install
_install(TaskContext("tree", 1, 1))
from workers import misbehave
print(getattr(misbehave, sys.argv[1])(sys.argv[2], marker=sys.argv[3]), flush=True)
os._exit(0)
"""


def _start(worker: str, tmp_path: pathlib.Path) -> tuple[subprocess.Popen[bytes], str]:
    records = str(tmp_path / "records")
    args = [sys.executable, "-c", _RUN_IN_ATTEMPT, worker, records, str(tmp_path / "m")]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE), records


def _kill_all(process: subprocess.Popen[bytes], records: str) -> None:
    for record in read_records(records):
        if not pid_gone(record["pid"], record["create_time"]):
            os.kill(record["pid"], signal.SIGKILL)
    process.kill()
    process.wait()
    assert process.stdout is not None
    process.stdout.close()
    wait_for(lambda: all_ended(read_records(records)))  # killed; init reaps the orphans late


def test_stubborn_tree_records_four_sigterm_ignoring_descendants(tmp_path: pathlib.Path) -> None:
    """Tree-kill fixture: child, grandchild, `setsid()` grandchild and orphan, all recorded."""
    process, records = _start("stubborn_tree", tmp_path)
    try:
        found = {r["role"]: r["pid"] for r in wait_for(lambda: read_records(records))}
        assert sorted(found) == ["child", "grandchild", "orphan", "setsid-grandchild"]
        parent = {role: psutil.Process(pid).ppid() for role, pid in found.items()}
        assert parent["child"] == process.pid
        assert parent["grandchild"] == parent["setsid-grandchild"] == found["child"]
        assert parent["orphan"] != process.pid
        assert os.getsid(found["setsid-grandchild"]) == found["setsid-grandchild"]
        assert os.getsid(found["grandchild"]) == os.getsid(process.pid)
        assert all(_ignores_sigterm(pid) for pid in found.values())
        assert process.poll() is None
    finally:
        _kill_all(process, records)


def test_leaver_returns_at_once_and_leaves_three_sleepers(tmp_path: pathlib.Path) -> None:
    """Leftover-descendants fixture: `leaver` returns "left" with a multiprocessing, a Popen and a setsid child alive."""
    process, records = _start("leaver", tmp_path)
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == b"left\n"
        found = {r["role"]: r for r in read_records(records)}
        assert sorted(found) == ["mp-worker", "popen", "setsid-daemon"]
        assert not any(pid_gone(r["pid"], r["create_time"]) for r in found.values())
        daemon = found["setsid-daemon"]["pid"]
        assert os.getsid(daemon) == daemon
    finally:
        _kill_all(process, records)


def test_pid_gone_counts_a_zombie_as_present() -> None:
    """Support: an unreaped child is not gone; once reaped it is, and a wrong create time is too."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        create_time = wait_for(lambda: _zombie_create_time(pid))
        assert create_time is not None
        assert not pid_gone(pid, create_time)
        assert pid_gone(pid, create_time + 100.0)
    finally:
        os.waitpid(pid, 0)
    assert pid_gone(pid, create_time)


def _zombie_create_time(pid: int) -> float | None:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    if stat.split(")")[1].split()[0] != "Z":
        return None
    return float(psutil.Process(pid).create_time())


def test_collector_wait_for_wakes_on_a_matching_event() -> None:
    """Support: `Collector.wait_for` returns the first matching event delivered from another thread."""

    class Event:
        def __init__(self, kind: str, task: str) -> None:
            self.kind, self.task = kind, task

    def deliver() -> None:
        for name in ("a", "b"):
            collector.on_event(Event("k", name))

    collector = Collector()
    threading.Thread(target=deliver).start()
    assert collector.wait_for("k", task="b").task == "b"
    assert [e.task for e in collector.of("k")] == ["a", "b"]
    with pytest.raises(AssertionError, match="no other"):
        collector.wait_for("other", timeout=0.05)
    with pytest.raises(AssertionError, match="still false"):
        wait_for(lambda: [], timeout=0.05)
    assert json.dumps(collector.kinds()) == '["k", "k"]'
