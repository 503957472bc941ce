"""Shared fixtures: every test leaves no process behind, and async tests run on a fresh loop.

An `async def test_...` function runs on a fresh event loop of its own (`asyncio.Runner`, as
`asyncio.run` runs one), with its fixture arguments, exactly as pytest calls a plain test:
`pytest_pyfunc_call` below is the whole mechanism (no plugin needed). One difference from
`asyncio.run`: the tasks a test leaves get `CLEANUP_WAIT` s to end once canceled, and one that
does not fails the test with its stack, where `asyncio.run` would wait for it forever. `run(coro)` from tests/_support.py stays for the few sync
tests that run a coroutine for a reason (code that must run after the loop closed, or two
loops in one test). Pure tests that start no process are marked `unit` (`pytest -m unit`).

A module marked `both_start_methods` (`pytestmark`) runs each of its tests once per start method
(`pytest_generate_tests` below; `supervised(...)` applies it); `both_start_methods(spawn="slow")`
leaves the spawn runs to `-m slow`.

The autouse fixture `no_leftover_processes` fails a test that leaves a descendant of the test
process running (a launcher, an attempt, a descendant) once its own shutdown is done; it kills
those processes by pid first, so that one leaking test does not make every later test fail.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests import _prebuild, _support  # noqa: E402
from tests._support import kill_leftovers  # noqa: E402

LEFTOVER_WAIT = 3.0  # seconds a test's processes may take to go after the test ends


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile the checkout's packages once, as `pip install` does for an installed one:
    every attempt, launcher and `mpvisor` process of the suite imports `workers` (and, from an
    editable install, `mpvisor`) from here, and with `PYTHONDONTWRITEBYTECODE` set (as on the
    CI machine) each of them would otherwise compile those modules again from source."""
    import compileall

    for package in ("mpvisor", "workers", "examples"):
        compileall.compile_dir(os.path.join(ROOT, package), quiet=2)


CLEANUP_WAIT = 30.0  # seconds the tasks a test left get to end once canceled


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an `async def` test on a fresh event loop, passing its fixture arguments."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    funcargs = pyfuncitem.funcargs
    runner = asyncio.Runner()
    try:
        runner.run(pyfuncitem.obj(**{name: funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}))
    finally:
        _close(runner)
    return True


def _close(runner: asyncio.Runner) -> None:
    """`Runner.close`, as `asyncio.run` ends, but with the wait for the tasks the test left
    (canceled) bounded: a task that does not end within `CLEANUP_WAIT` s fails the test with
    its stack, where `asyncio.run` would wait for it forever (after a pytest-timeout too, whose
    alarm fires once), and the suite goes on."""
    loop = runner.get_loop()
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    if left:
        done, pending = loop.run_until_complete(asyncio.wait(left, timeout=CLEANUP_WAIT))
        for task in done:  # as `asyncio.run` says them: an error a task raised as it was canceled
            if not task.cancelled() and task.exception() is not None:
                loop.call_exception_handler({"message": "unhandled exception during asyncio.run() shutdown",
                                             "exception": task.exception(), "task": task})
        if pending:
            import io

            stacks = io.StringIO()
            for task in pending:
                print(f"{task!r:.300}", file=stacks)
                task.print_stack(file=stacks)
            raise AssertionError(f"tasks that did not end within {CLEANUP_WAIT:g} s of being canceled:\n{stacks.getvalue()}")
    runner.close()  # (nothing left to cancel) async generators, the default executor, the loop


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Whatever a test starts, it must be gone shortly after the test ends. If mpvisor leaves a
    process of the test running (a bug the test reports), kill it by pid after a short wait, so
    that later tests do not inherit it, and fail the test with its pids."""
    yield
    if left := kill_leftovers(LEFTOVER_WAIT):
        pytest.fail(f"processes left running after the test (killed now): {left}")


@pytest.fixture(scope="session")
def installs():
    """Virtual environments `A` and `B` with mpvisor and two user packages installed the way users
    install them (editable and not, flat and src layouts; see tests/_venv.py), built once per
    session, from the moment the tests that need them were collected (tests/_prebuild.py). A
    venv that cannot be built fails the tests that use it, with pip's output."""
    return _prebuild.take("installs", _prebuild.build_installs)


# the fixtures whose builds start as soon as collection shows a test that needs them, by build
PREBUILT = {"installs": "installs", "tools_venv": "tools", "frozen_app": "frozen"}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the builds the collected tests need (tests/_prebuild.py), in the order they will
    first be needed."""
    if session.config.option.collectonly:
        return
    names: list[str] = []
    for item in session.items:
        for fixture in getattr(item, "fixturenames", ()):
            build = PREBUILT.get(fixture)
            if build == "frozen" and item.path.name != "test_frozen.py":
                continue  # test_frozen_others.py's `frozen_app`: its own freezers' builds
            if build is not None and build not in names:
                names.append(build)
    _prebuild.start(names)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _prebuild.finish()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module marked `both_start_methods` runs each of its tests once per start method: the
    `supervised(...)` helper then serves its supervisor with that start method. Marked
    `both_start_methods(spawn="slow")`, its spawn runs are left to `-m slow` (a module whose
    tests decide in the parent what the start method does not change)."""
    marker = metafunc.definition.get_closest_marker("both_start_methods")
    if marker is not None:
        metafunc.fixturenames.append("each_start_method")
        methods = [pytest.param(method, marks=pytest.mark.slow) if marker.kwargs.get(method) == "slow" else method
                   for method in _support.START_METHODS]
        metafunc.parametrize("each_start_method", methods, indirect=True)


@pytest.fixture
def each_start_method(request):
    """The start method `supervised(...)` uses in this test (see `pytest_generate_tests`)."""
    _support.start_method_override = request.param
    yield request.param
    _support.start_method_override = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Ray tests (marked `ray`) run last, in their own order: the session's one Ray cluster
    starts at the first of them, so no other test shares the machine with it."""
    items.sort(key=lambda item: item.get_closest_marker("ray") is not None)


@pytest.fixture(scope="session")
def postgres_server():
    """The session's throwaway PostgreSQL cluster (tests/_pg_support.py), started on first use."""
    from tests import _pg_support

    server = _pg_support.start_server()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def ray_cluster():
    """The session's local Ray cluster (tests/_ray_support.py), started on first use."""
    from tests import _ray_support

    cluster = _ray_support.start_cluster()
    yield cluster
    _ray_support.stop_cluster(cluster)


@pytest.fixture
def on_ray(ray_cluster):
    """The Ray cluster, for one test; afterwards no fork server or attempt of mpvisor's may be
    left alive on it (killed, and the test failed, if one is)."""
    from tests import _ray_support
    from tests._support import wait_for

    yield ray_cluster
    try:
        wait_for(lambda: not _ray_support.mpvisor_leftovers(), timeout=LEFTOVER_WAIT + 5.0)
    except AssertionError:
        left = _ray_support.mpvisor_leftovers()
        _ray_support.kill_mpvisor_leftovers()
        pytest.fail(f"mpvisor processes left on the Ray cluster (killed now): {left}")
